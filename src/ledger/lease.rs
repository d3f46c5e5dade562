//! Lease calls: acquire or take over, renew, release. One SQL
//! function call each (`sql/lease.sql`); one statement, one short
//! transaction, one round trip once prepared on the pooled connection (the
//! first use on a new connection adds one Parse/Describe round trip).
//!
//! With group commit on, concurrent single renews of different runs share
//! one `lease_renew_batch` statement (`group/renew.rs`): each is judged and
//! answered exactly as its own `lease_renew`.
//!
//! [`Ledger::lease_renew_batch`] renews many leases (one worker host's) in
//! one call: each lease is judged by the same fence as `lease_renew` and
//! answered on its own, in the order given; a crash mid-call leaves either
//! every renewal of the batch or none (one transaction), and an answer lost
//! with the connection is `Delivery::Unknown` for the whole batch, which a
//! heartbeat treats as unconfirmed (stop, let the leases expire).

use super::group::RenewArgs;
use super::lease_token::bind_hash;
use super::verdict::{Expected, Outcome, WriteRow, missing};
use super::{
    AcquireOutcome, Applied, Fenced, InvalidInput, LeaseClaim, LeaseGrant, LeaseToken, Ledger,
    LedgerError, MAX_OWNER_LEN, Rejection, RunId, check_text,
};

impl Ledger {
    /// Acquires a free lease or takes over an expired one (epoch + 1). Waits
    /// for a protected write in flight on the same run, then judges the
    /// lease as that write left it. The grant's claim carries the new
    /// secret lease token (only its hash is stored; hand it to the holder
    /// once).
    pub async fn lease_acquire(
        &self,
        run_id: RunId,
        owner: &str,
        ttl_ms: i64,
    ) -> Result<AcquireOutcome, LedgerError> {
        const SQL: &str = "SELECT * FROM lease_acquire($1, $2, $3, $4)";
        self.lease_take("lease_acquire", SQL, run_id, owner, ttl_ms)
            .await
    }

    /// Takes the lease over now, held or not (epoch + 1): an operator's act
    /// (`sql/lease.sql`, `lease_takeover`), executable only by a ledger
    /// connected as [`super::OPERATOR_ROLE`]; as the application role it is
    /// refused (SQLSTATE 42501) and nothing is written. Never `Busy`.
    pub async fn lease_takeover(
        &self,
        run_id: RunId,
        owner: &str,
        ttl_ms: i64,
    ) -> Result<AcquireOutcome, LedgerError> {
        const SQL: &str = "SELECT * FROM lease_takeover($1, $2, $3, $4)";
        self.lease_take("lease_takeover", SQL, run_id, owner, ttl_ms)
            .await
    }

    /// `call` (its `statement`) is `lease_acquire` or `lease_takeover`: same
    /// arguments, same result.
    async fn lease_take(
        &self,
        call: &'static str,
        statement: &'static str,
        run_id: RunId,
        owner: &str,
        ttl_ms: i64,
    ) -> Result<AcquireOutcome, LedgerError> {
        check_text("owner", owner, MAX_OWNER_LEN)?;
        self.check_ttl(ttl_ms)?;
        // One token per call: a retried statement stores the same hash.
        let token = LeaseToken::generate();
        let hash = token.sha256();
        let row: WriteRow = self
            .invoke(call, true, || {
                sqlx::query_as(statement)
                    .bind(run_id.as_uuid())
                    .bind(owner)
                    .bind(ttl_ms)
                    .bind(hash.as_slice())
            })
            .await
            .inspect_err(|_| {
                metrics::counter!("lease_acquire_total", "outcome" => "db_error").increment(1)
            })?;
        row.observe(call);
        if let Some(after) = row.takeover_after_ms {
            metrics::histogram!("workflow_takeover_duration_seconds").record(after / 1000.0);
        }
        let outcome = Self::acquire_outcome(run_id, owner, token, row)?;
        metrics::counter!("lease_acquire_total", "outcome" => outcome.label()).increment(1);
        Ok(outcome)
    }

    fn acquire_outcome(
        run_id: RunId,
        owner: &str,
        token: LeaseToken,
        row: WriteRow,
    ) -> Result<AcquireOutcome, LedgerError> {
        const CALL: &str = "lease_acquire";
        let outcome = row.outcome(CALL)?;
        Ok(match outcome {
            Outcome::Acquired | Outcome::TakenOver => {
                let applied = row.applied(CALL)?;
                AcquireOutcome::Acquired(LeaseGrant {
                    claim: LeaseClaim {
                        run_id,
                        owner: owner.to_owned(),
                        epoch: row
                            .lease_epoch
                            .ok_or_else(|| missing(CALL, "lease_epoch"))?,
                        token: Some(token),
                    },
                    expires_at: applied.lease_expires_at,
                    took_over: outcome == Outcome::TakenOver,
                    run_status: applied.run_status,
                    revision: applied.revision,
                })
            }
            Outcome::Busy => AcquireOutcome::Busy {
                owner: row
                    .lease_owner
                    .clone()
                    .ok_or_else(|| missing(CALL, "lease_owner"))?,
                expires_at: row
                    .lease_expires_at
                    .ok_or_else(|| missing(CALL, "lease_expires_at"))?,
            },
            Outcome::NotFound => AcquireOutcome::NotFound,
            Outcome::Terminal => AcquireOutcome::Terminal {
                status: row.found().run_status(CALL)?,
            },
            other => return Err(other.unexpected(CALL)),
        })
    }

    /// Extends the lease by `ttl_ms` from now (database clock). Rejected as
    /// lease lost once expired, even if nobody took over: a lost lease is
    /// never resurrected. A terminal run answers [`Rejection::Terminal`].
    pub async fn lease_renew(
        &self,
        claim: &LeaseClaim,
        ttl_ms: i64,
    ) -> Result<Fenced<Applied>, LedgerError> {
        self.lease_renew_for_tenant(claim, ttl_ms, None).await
    }

    /// [`Ledger::lease_renew`] scoped to `tenant` (`None`: any) in the same
    /// statement: a run of another tenant is [`Rejection::NotFound`] with
    /// nothing locked or written, exactly as one that does not exist (the
    /// control API's renew route: one round trip, not a tenant lookup and
    /// then the renew).
    pub async fn lease_renew_for_tenant(
        &self,
        claim: &LeaseClaim,
        ttl_ms: i64,
        tenant: Option<&str>,
    ) -> Result<Fenced<Applied>, LedgerError> {
        const CALL: &str = "lease_renew";
        self.check_ttl(ttl_ms)?;
        let token_sha256 = bind_hash(claim.token.as_ref());
        let args = RenewArgs {
            run_id: claim.run_id.as_uuid(),
            owner: claim.owner.as_str(),
            epoch: claim.epoch,
            token_sha256: token_sha256.as_deref(),
            ttl_ms,
            tenant,
        };
        let answer = self.grouped(|group| &group.renews, &args).await;
        let row: WriteRow = answer.inspect_err(|error| {
            let outcome = match error.delivery() {
                super::Delivery::Unknown => "result_unknown",
                _ => "db_error",
            };
            metrics::counter!("lease_renew_total", "outcome" => outcome).increment(1);
        })?;
        let fenced = row.into_fenced(CALL, Expected::claim(claim))?;
        let outcome = match &fenced {
            Fenced::Applied(_) => "success",
            Fenced::Rejected(Rejection::Terminal { .. }) => "terminal",
            Fenced::Rejected(Rejection::LeaseTokenInvalid { .. }) => "token_invalid",
            Fenced::Rejected(_) => "lost",
        };
        metrics::counter!("lease_renew_total", "outcome" => outcome).increment(1);
        Ok(fenced)
    }

    /// Gives the lease up; the epoch is kept so the next acquire is epoch + 1.
    /// Needs the lease's token, like every fenced write.
    pub async fn lease_release(&self, claim: &LeaseClaim) -> Result<Fenced<Applied>, LedgerError> {
        self.claim_write(
            "lease_release",
            "SELECT * FROM lease_release($1, $2, $3, $4)",
            claim,
        )
        .await
    }

    /// A fenced write whose only arguments are the claim (run, owner,
    /// epoch, token hash): `statement` takes them as `$1`–`$4`.
    pub(super) async fn claim_write(
        &self,
        call: &'static str,
        statement: &'static str,
        claim: &LeaseClaim,
    ) -> Result<Fenced<Applied>, LedgerError> {
        let row: WriteRow = self
            .invoke(call, true, || {
                sqlx::query_as(statement)
                    .bind(claim.run_id.as_uuid())
                    .bind(claim.owner.as_str())
                    .bind(claim.epoch)
                    .bind(bind_hash(claim.token.as_ref()))
            })
            .await?;
        row.into_fenced(call, Expected::claim(claim))
    }

    /// Renews every lease of `claims` by `ttl_ms` from now (database clock)
    /// in one call (`sql/lease.sql`, `lease_renew_batch`), each judged as
    /// [`Ledger::lease_renew`] judges one, and answers each lease on its
    /// own, in the order given. `tenant` scopes the batch (`None`: any): a
    /// run of another tenant is [`Rejection::NotFound`] with nothing
    /// written, exactly as one that does not exist. An empty batch answers
    /// at once without a round trip.
    ///
    /// Refused before anything is sent: more than [`MAX_RENEW_BATCH`]
    /// leases, a run named twice, an owner that no acquire could have
    /// handed out, a ttl outside (0, ceiling].
    pub async fn lease_renew_batch(
        &self,
        claims: &[LeaseClaim],
        ttl_ms: i64,
        tenant: Option<&str>,
    ) -> Result<Vec<BatchRenewal>, LedgerError> {
        const CALL: &str = "lease_renew_batch";
        self.check_ttl(ttl_ms)?;
        check_batch(claims)?;
        if claims.is_empty() {
            return Ok(Vec::new());
        }
        let run_ids: Vec<uuid::Uuid> = claims.iter().map(|c| c.run_id.as_uuid()).collect();
        let owners: Vec<&str> = claims.iter().map(|c| c.owner.as_str()).collect();
        let epochs: Vec<i64> = claims.iter().map(|c| c.epoch).collect();
        let hashes: Vec<Option<Vec<u8>>> =
            claims.iter().map(|c| bind_hash(c.token.as_ref())).collect();
        let rows: Vec<BatchRow> = self
            .invoke_all(CALL, true, || {
                sqlx::query_as("SELECT * FROM lease_renew_batch($1, $2, $3, $4, $5, $6)")
                    .bind(&run_ids)
                    .bind(&owners)
                    .bind(&epochs)
                    .bind(&hashes)
                    .bind(ttl_ms)
                    .bind(tenant)
            })
            .await
            .inspect_err(|error| {
                let outcome = match error.delivery() {
                    super::Delivery::Unknown => "result_unknown",
                    _ => "db_error",
                };
                metrics::counter!("lease_renew_total", "outcome" => outcome)
                    .increment(claims.len() as u64);
            })?;
        if rows.len() != claims.len() {
            return Err(LedgerError::Protocol {
                call: CALL,
                detail: format!("{} answers for {} leases", rows.len(), claims.len()),
            });
        }
        if let Some(first) = rows.first() {
            first.row.observe(CALL);
        }
        let mut answers = Vec::with_capacity(rows.len());
        let (mut renewed, mut lost, mut terminal, mut token_invalid) = (0u64, 0u64, 0u64, 0u64);
        for (claim, row) in claims.iter().zip(rows) {
            if row.run_id != claim.run_id.as_uuid() {
                return Err(LedgerError::Protocol {
                    call: CALL,
                    detail: format!(
                        "answer for run {} where run {} was asked",
                        row.run_id, claim.run_id
                    ),
                });
            }
            let outcome = row.row.into_fenced(CALL, Expected::claim(claim))?;
            match &outcome {
                Fenced::Applied(_) => renewed += 1,
                Fenced::Rejected(Rejection::Terminal { .. }) => terminal += 1,
                Fenced::Rejected(Rejection::LeaseTokenInvalid { .. }) => token_invalid += 1,
                Fenced::Rejected(_) => lost += 1,
            }
            answers.push(BatchRenewal {
                run_id: claim.run_id,
                outcome,
            });
        }
        for (label, count) in [
            ("success", renewed),
            ("lost", lost),
            ("terminal", terminal),
            ("token_invalid", token_invalid),
        ] {
            if count > 0 {
                metrics::counter!("lease_renew_total", "outcome" => label).increment(count);
            }
        }
        Ok(answers)
    }
}

/// The most leases one [`Ledger::lease_renew_batch`] call renews (the
/// control API's `POST /v1/leases/renew` answers 413 above it).
pub const MAX_RENEW_BATCH: usize = 10_000;

/// One lease's answer in a batch renewal: renewed (the new expiry in
/// [`Applied::lease_expires_at`]) or rejected for its own reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchRenewal {
    pub run_id: RunId,
    pub outcome: Fenced<Applied>,
}

/// A row of `lease_renew_batch`: the run it answers, then the same columns
/// as every fenced write's `ledger_write_result`.
#[derive(Debug, sqlx::FromRow)]
struct BatchRow {
    run_id: uuid::Uuid,
    #[sqlx(flatten)]
    row: WriteRow,
}

fn check_batch(claims: &[LeaseClaim]) -> Result<(), InvalidInput> {
    if claims.len() > MAX_RENEW_BATCH {
        return Err(InvalidInput::Request(format!(
            "a batch renewal holds at most {MAX_RENEW_BATCH} leases, got {}",
            claims.len()
        )));
    }
    let mut seen = std::collections::HashSet::with_capacity(claims.len());
    for claim in claims {
        check_text("owner", &claim.owner, MAX_OWNER_LEN)?;
        if !seen.insert(claim.run_id) {
            return Err(InvalidInput::Request(format!(
                "run {} appears twice in the batch renewal",
                claim.run_id
            )));
        }
    }
    Ok(())
}
