//! Lease calls (seed 5): acquire or take over, renew, release. One SQL
//! function call each (`sql/lease.sql`); one statement, one short
//! transaction, one round trip once prepared on the pooled connection (the
//! first use on a new connection adds one Parse/Describe round trip).

use super::token::bind_hash;
use super::verdict::{Expected, Outcome, WriteRow, missing};
use super::{
    AcquireOutcome, Applied, Fenced, LeaseClaim, LeaseGrant, LeaseToken, Ledger, LedgerError,
    MAX_OWNER_LEN, Rejection, RunId, check_text,
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

    /// Takes the lease over now, held or not (epoch + 1): the session and
    /// key modes' "this agent restarted" (`sql/lease.sql`,
    /// `lease_takeover`). Never `Busy`.
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
        const CALL: &str = "lease_renew";
        self.check_ttl(ttl_ms)?;
        let row: WriteRow = self
            .invoke(CALL, true, || {
                sqlx::query_as("SELECT * FROM lease_renew($1, $2, $3, $4, $5)")
                    .bind(claim.run_id.as_uuid())
                    .bind(claim.owner.as_str())
                    .bind(claim.epoch)
                    .bind(bind_hash(claim.token.as_ref()))
                    .bind(ttl_ms)
            })
            .await
            .inspect_err(|error| {
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
        const CALL: &str = "lease_release";
        let row: WriteRow = self
            .invoke(CALL, true, || {
                sqlx::query_as("SELECT * FROM lease_release($1, $2, $3, $4)")
                    .bind(claim.run_id.as_uuid())
                    .bind(claim.owner.as_str())
                    .bind(claim.epoch)
                    .bind(bind_hash(claim.token.as_ref()))
            })
            .await?;
        row.into_fenced(CALL, Expected::claim(claim))
    }
}
