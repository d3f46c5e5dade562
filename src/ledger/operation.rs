//! The operations ledger: side-effect intents, claims, settlement, unknown
//! outcomes and evidence (the read side, the fate of a call, is in
//! `read.rs`). One SQL function call each (`sql/operation.sql`), so the proxy's hot path costs two
//! round trips: `operation_register_claim` before the upstream call (which
//! also checks the run's tenant, and on a replay samples the WAL position)
//! and `CALL operation_settle_acknowledged` after it (the settle committed,
//! then the WAL position read: the durability gate's sample, in the same
//! round trip). A replay served from the ledger costs one. With group
//! commit on ([`super::LedgerOptions::group_commit`], `group/`) both go
//! through the group committer, which sends many callers' calls as one
//! `operation_register_claim_batch` / `CALL
//! operation_settle_acknowledged_batch` and decodes each caller's verdict
//! here exactly as the single answer is decoded.
//!
//! # Failure handling (at each durability boundary)
//!
//! - Crash after `operation_register_claim` committed, before the upstream
//!   call: the row is `dispatching` under a claim nobody holds; when the
//!   claim expires `operation_mark_unknown` (reconciler) makes it `unknown`,
//!   and its adapter's capability decides how it converges. It is never
//!   re-sent as if new and never returns to `prepared`.
//! - Crash after the upstream call, before `operation_settle`: same, and the
//!   remote side effect exists; convergence finds it by operation id.
//! - A response that arrives after its claim lost validity is stored as
//!   evidence by `operation_settle` and settles nothing.
//! - A lost connection during any of these calls is
//!   [`LedgerError::OutcomeUnknown`]: read the operation back with
//!   [`Ledger::operation_get`] before acting.

use serde_json::Value;
use sqlx::types::Json;

use super::durability::WalPosition;
use super::error::protocol;
use super::group::{RegisterArgs, SettleArgs};
use super::operation_rows::{
    ClaimRow, IntentParams, OpRow, SettleRow, TableRow, opened, plain, sealing, skip_unopenable,
};
use super::stored_json::{self, Raw};
use super::verdict::{Expected, Outcome};
use super::{
    ClaimedOperation, Converge, ConvergeEvidence, ConvergeOutcome, DispatchClaim, Fenced,
    InlineClaim, InvalidInput, LeaseClaim, Ledger, LedgerError, MAX_OWNER_LEN, MarkUnknown,
    MarkUnknownOutcome, Registered, ReleaseUnsentOutcome, RunStatus, SettleOutcome, Settlement,
    StaleReason, SupersedeOutcome, ToolRoute, UnknownBy, check_text,
};
use crate::intent::{Intent, OperationId};
use crate::policy::Bodies;

/// Most intents registered in one call.
const MAX_INTENTS_PER_CALL: usize = 1_000;

impl Ledger {
    pub(super) fn bodies(&self) -> &Bodies {
        &self.options.bodies
    }

    /// Whether a planned intent can be stored: it is sent later from what
    /// the ledger stores, and a policy that keeps less than the request
    /// (masked fields present, digest only) could only ever send a
    /// placeholder (`encrypted` keeps it without plaintext at rest).
    pub(super) fn keeps(&self, intent: &Intent) -> bool {
        self.bodies().keeps_request(&intent.request_body)
    }

    pub(super) fn unplannable(&self, intent: &Intent) -> LedgerError {
        let policy = match self.bodies().request {
            crate::policy::RequestBodyPolicy::DigestOnly => "request_body = \"digest_only\" keeps",
            _ => "request_body = \"masked\" and a masked field in its arguments keep",
        };
        InvalidInput::Request(format!(
            "planned intent {} v{} cannot be stored: {policy} no sendable copy of its arguments (use \"encrypted\", or leave masked fields out of planned intents)",
            intent.step_id, intent.effect_version
        ))
        .into()
    }

    /// The stored form of `result` of `operation_id` (policy `result_body`).
    pub(super) fn stored_result(
        &self,
        result: &Value,
        operation_id: &str,
    ) -> Result<Value, LedgerError> {
        self.bodies()
            .store_result(result, operation_id, &plain)
            .map_err(|e| sealing(operation_id, e))
    }

    /// The stored form of evidence about `operation_id`.
    pub(super) fn stored_evidence(
        &self,
        evidence: &Value,
        operation_id: &str,
    ) -> Result<Value, LedgerError> {
        self.bodies()
            .store_evidence(evidence, operation_id, &plain)
            .map_err(|e| sealing(operation_id, e))
    }
}

/// A checkpoint written in the same transaction as planned intents.
#[derive(Debug, Clone, Copy)]
pub struct PlannedCheckpoint<'a> {
    pub expected_revision: i64,
    pub checkpoint: &'a Value,
}

impl Ledger {
    /// Registers intents as `prepared` under the caller's lease — the
    /// "step planned" write — optionally with a checkpoint CAS in the same
    /// transaction. All or nothing: one conflicting intent (same identity,
    /// different request) rejects the call with
    /// [`Rejection::IntentConflict`] and nothing is written. Intents that
    /// already exist with the same request come back as replays.
    pub async fn operation_register(
        &self,
        claim: &LeaseClaim,
        intents: &[Intent],
        checkpoint: Option<PlannedCheckpoint<'_>>,
    ) -> Result<Fenced<Vec<Registered>>, LedgerError> {
        const CALL: &str = "operation_register";
        if intents.is_empty() || intents.len() > MAX_INTENTS_PER_CALL {
            return Err(InvalidInput::Request(format!(
                "register 1 to {MAX_INTENTS_PER_CALL} intents per call, got {}",
                intents.len()
            ))
            .into());
        }
        for (index, intent) in intents.iter().enumerate() {
            if intents[..index].iter().any(|earlier| {
                earlier.operation_id == intent.operation_id
                    || (earlier.step_id == intent.step_id
                        && earlier.effect_version == intent.effect_version)
            }) {
                return Err(InvalidInput::Request(format!(
                    "step {} v{} appears twice in one registration",
                    intent.step_id, intent.effect_version
                ))
                .into());
            }
        }
        if let Some(intent) = intents.iter().find(|i| !self.keeps(i)) {
            return Err(self.unplannable(intent));
        }
        let batch: Vec<IntentParams> = intents
            .iter()
            .map(|i| IntentParams::new(i, None, self.bodies()))
            .collect::<Result<_, _>>()?;
        let rows: Vec<OpRow> = self
            .invoke_all(CALL, true, || {
                sqlx::query_as("SELECT * FROM operation_register($1, $2, $3, $4, $5, $6, $7)")
                    .bind(claim.run_id.as_uuid())
                    .bind(claim.owner.as_str())
                    .bind(claim.epoch)
                    .bind(super::lease_token::bind_hash(claim.token.as_ref()))
                    .bind(&batch)
                    .bind(checkpoint.map(|c| c.expected_revision))
                    .bind(checkpoint.map(|c| Json(stored_json::encode(c.checkpoint))))
            })
            .await?;
        let expected_revision = checkpoint.map(|c| c.expected_revision);
        let mut registered = Vec::with_capacity(rows.len());
        for row in &rows {
            let expected = intents.iter().find(|intent| {
                row.operation_id.as_deref() == Some(intent.operation_id.as_str())
                    || (row.step_id.as_deref() == Some(intent.step_id.as_str())
                        && row.effect_version == Some(intent.effect_version))
            });
            let fence = Expected {
                claim: Some(claim),
                revision: expected_revision,
                status: Some(RunStatus::Running),
            };
            if let Some(rejection) = row.rejection(CALL, fence, expected, self.bodies())? {
                return Ok(Fenced::Rejected(rejection));
            }
            let newly_registered = match row.outcome(CALL)? {
                Outcome::Registered => true,
                Outcome::Exists => false,
                other => return Err(other.unexpected(CALL)),
            };
            registered.push(Registered {
                operation: row.record(CALL, self.bodies())?,
                newly_registered,
                run_revision: row
                    .run_revision
                    .ok_or_else(|| protocol(CALL, "run revision missing from the answer"))?,
            });
        }
        if registered.len() != intents.len() {
            return Err(protocol(
                CALL,
                format!("{} rows for {} intents", registered.len(), intents.len()),
            ));
        }
        Ok(Fenced::Applied(registered))
    }

    /// The proxy's hot path, one transaction: validate the lease, register
    /// or find the intent (comparing run, tool and digest on every path),
    /// and claim it under `dispatch_owner` for `claim_ttl_ms`. Any tenant's
    /// run; see [`Ledger::operation_register_claim_in`].
    pub async fn operation_register_claim(
        &self,
        claim: &LeaseClaim,
        intent: &Intent,
        route: Option<&ToolRoute>,
        dispatch_owner: &str,
        claim_ttl_ms: i64,
    ) -> Result<Fenced<InlineClaim>, LedgerError> {
        self.operation_register_claim_in(None, claim, intent, route, dispatch_owner, claim_ttl_ms)
            .await
            .map(|(outcome, _)| outcome)
    }

    /// [`Ledger::operation_register_claim`] for a run of `tenant` (`None`:
    /// any): a run of another tenant is [`Rejection::NotFound`], judged in
    /// the same statement, so the proxy's first call of a run costs no
    /// tenant lookup. On a replay ([`InlineClaim::Existing`]) the answer also
    /// carries where the WAL stood after the recorded row was read: an upper
    /// bound of the write being replayed (`crate::durability`).
    pub async fn operation_register_claim_in(
        &self,
        tenant: Option<&str>,
        claim: &LeaseClaim,
        intent: &Intent,
        route: Option<&ToolRoute>,
        dispatch_owner: &str,
        claim_ttl_ms: i64,
    ) -> Result<(Fenced<InlineClaim>, Option<WalPosition>), LedgerError> {
        const CALL: &str = "operation_register_claim";
        check_text("dispatch_owner", dispatch_owner, MAX_OWNER_LEN)?;
        self.check_claim_ttl(claim_ttl_ms)?;
        let params = IntentParams::new(intent, route, self.bodies())?;
        let token_sha256 = super::lease_token::bind_hash(claim.token.as_ref());
        let args = RegisterArgs {
            run_id: claim.run_id.as_uuid(),
            owner: &claim.owner,
            epoch: claim.epoch,
            token_sha256: token_sha256.as_deref(),
            intent: &params,
            dispatch_owner,
            claim_ttl_ms,
            tenant,
        };
        let ClaimRow { row, wal } = self.grouped(|group| &group.registers, &args).await?;
        let expected = Expected::claim(claim);
        if let Some(rejection) = row.rejection(CALL, expected, Some(intent), self.bodies())? {
            return Ok((Fenced::Rejected(rejection), None));
        }
        let operation = row.record(CALL, self.bodies())?;
        Ok(match row.outcome(CALL)? {
            Outcome::Claimed => {
                let claim = operation
                    .claim()
                    .ok_or_else(|| protocol(CALL, "claimed without a claim"))?;
                (
                    Fenced::Applied(InlineClaim::Claimed { operation, claim }),
                    None,
                )
            }
            Outcome::Exists => (
                Fenced::Applied(InlineClaim::Existing(operation)),
                wal.position(CALL)?,
            ),
            other => return Err(other.unexpected(CALL)),
        })
    }

    /// The dispatcher's claim: up to `limit` prepared operations of live
    /// runs, skipping rows other claimers hold (`FOR UPDATE SKIP LOCKED`)
    /// and operations routed to an `unavailable` upstream (nothing could
    /// reach it: they wait instead of collecting "not sent" backoff).
    pub async fn operation_claim(
        &self,
        dispatch_owner: &str,
        claim_ttl_ms: i64,
        limit: u16,
        tenants: Option<&[String]>,
        unavailable: &[String],
    ) -> Result<Vec<ClaimedOperation>, LedgerError> {
        const CALL: &str = "operation_claim";
        check_text("dispatch_owner", dispatch_owner, MAX_OWNER_LEN)?;
        self.check_claim_ttl(claim_ttl_ms)?;
        let rows: Vec<TableRow> = self
            .invoke_all(CALL, true, || {
                sqlx::query_as("SELECT * FROM operation_claim($1, $2, $3, $4, $5)")
                    .bind(dispatch_owner)
                    .bind(claim_ttl_ms)
                    .bind(i32::from(limit))
                    .bind(tenants)
                    .bind(unavailable)
            })
            .await?;
        rows.into_iter()
            .filter_map(|row| {
                let item = (|| {
                    let operation = row.record(CALL, self.bodies())?;
                    let claim = operation
                        .claim()
                        .ok_or_else(|| protocol(CALL, "claimed row without a claim"))?;
                    Ok(ClaimedOperation {
                        operation,
                        claim,
                        request_body: row.request(self.bodies())?,
                    })
                })();
                skip_unopenable(CALL, item)
            })
            .collect()
    }

    /// `upstream` answers again: its prepared operations (of runs of
    /// `tenants`) that wait out a "not sent" backoff may be claimed at
    /// once. Returns how many were woken.
    pub async fn operation_wake_prepared(
        &self,
        upstream: &str,
        tenants: Option<&[String]>,
    ) -> Result<i64, LedgerError> {
        const CALL: &str = "operation_wake_prepared";
        let (woken,): (i64,) = self
            .invoke(CALL, true, || {
                sqlx::query_as("SELECT operation_wake_prepared($1, $2)")
                    .bind(upstream)
                    .bind(tenants)
            })
            .await?;
        Ok(woken)
    }

    /// Records a verified response: `succeeded` (with the remote id and
    /// result) or `failed_final` (e.g. the tool answered `isError: true`).
    /// Only the live claim settles; anything else is kept as evidence.
    pub async fn operation_settle(
        &self,
        claim: &DispatchClaim,
        settlement: Settlement,
        remote_id: Option<&str>,
        result: &Value,
    ) -> Result<SettleOutcome, LedgerError> {
        self.operation_settle_acknowledged(claim, settlement, remote_id, result)
            .await
            .map(|(outcome, _)| outcome)
    }

    /// [`Ledger::operation_settle`], and where the WAL stood once the settle
    /// had committed (`CALL operation_settle_acknowledged`: the commit and
    /// the reading in one statement, one round trip): an upper bound of
    /// this acknowledgement for the durability gate. `None` on a server
    /// that reports no position (a standby).
    pub async fn operation_settle_acknowledged(
        &self,
        claim: &DispatchClaim,
        settlement: Settlement,
        remote_id: Option<&str>,
        result: &Value,
    ) -> Result<(SettleOutcome, Option<WalPosition>), LedgerError> {
        const CALL: &str = "operation_settle";
        let result = self.stored_result(result, claim.operation_id.as_str())?;
        let args = SettleArgs {
            operation_id: claim.operation_id.as_str(),
            dispatch_owner: claim.dispatch_owner.as_str(),
            expected_revision: claim.revision,
            request_digest: claim.request_digest.as_str(),
            status: settlement.as_str(),
            remote_id,
            result: &result,
        };
        let answer: SettleRow = self.grouped(|group| &group.settles, &args).await?;
        let position = answer.wal.position(CALL)?;
        let row = answer.into_op_row();
        let outcome = match row.outcome(CALL)? {
            Outcome::Settled => {
                let mut record = row.record(CALL, self.bodies())?;
                // What was stored, as every read shows it (not sent back).
                record.result = Some(opened(
                    self.bodies(),
                    &Raw(result),
                    claim.operation_id.as_str(),
                )?);
                SettleOutcome::Settled(record)
            }
            outcome @ (Outcome::StaleClaim | Outcome::DigestMismatch) => {
                SettleOutcome::KeptAsEvidence {
                    reason: if outcome == Outcome::StaleClaim {
                        StaleReason::StaleClaim
                    } else {
                        StaleReason::DigestMismatch
                    },
                    found: row.record(CALL, self.bodies())?,
                    evidence_id: row.evidence_id(CALL)?,
                }
            }
            Outcome::NotClaimed => SettleOutcome::NotClaimed(row.record(CALL, self.bodies())?),
            Outcome::NotFound => SettleOutcome::NotFound,
            other => return Err(other.unexpected(CALL)),
        };
        Ok((outcome, position))
    }

    /// `dispatching` → `unknown`, guarded by the claim's owner and revision;
    /// the evidence is kept with its cause as kind. A reconciler
    /// ([`UnknownBy::Reconciler`]) only marks an expired claim.
    pub async fn operation_mark_unknown(
        &self,
        mark: MarkUnknown<'_>,
    ) -> Result<MarkUnknownOutcome, LedgerError> {
        const CALL: &str = "operation_mark_unknown";
        check_text("actor", mark.actor, MAX_OWNER_LEN)?;
        let evidence = self.stored_evidence(mark.evidence, mark.claim.operation_id.as_str())?;
        let row: OpRow = self
            .invoke(CALL, true, || {
                sqlx::query_as("SELECT * FROM operation_mark_unknown($1, $2, $3, $4, $5, $6, $7)")
                    .bind(mark.claim.operation_id.as_str())
                    .bind(mark.claim.dispatch_owner.as_str())
                    .bind(mark.claim.revision)
                    .bind(mark.by == UnknownBy::ClaimHolder)
                    .bind(mark.actor)
                    .bind(mark.cause.as_str())
                    .bind(Json(&evidence))
            })
            .await?;
        Ok(match row.outcome(CALL)? {
            Outcome::MarkedUnknown => MarkUnknownOutcome::MarkedUnknown {
                operation: row.record(CALL, self.bodies())?,
                evidence_id: row.evidence_id(CALL)?,
            },
            Outcome::ClaimLive => {
                MarkUnknownOutcome::ClaimStillLive(row.record(CALL, self.bodies())?)
            }
            Outcome::StaleClaim => MarkUnknownOutcome::StaleClaim(row.record(CALL, self.bodies())?),
            Outcome::NotFound => MarkUnknownOutcome::NotFound,
            other => return Err(other.unexpected(CALL)),
        })
    }

    /// `dispatching` → `prepared` by the claim's holder, with proof that no
    /// byte of the request left (kept as `not_sent` evidence): the same
    /// operation id may be sent again — at once by the agent's re-call, by
    /// the outbox after a backoff.
    pub async fn operation_release_unsent(
        &self,
        claim: &DispatchClaim,
        evidence: &Value,
    ) -> Result<ReleaseUnsentOutcome, LedgerError> {
        const CALL: &str = "operation_release_unsent";
        let evidence = self.stored_evidence(evidence, claim.operation_id.as_str())?;
        let row: OpRow = self
            .invoke(CALL, true, || {
                sqlx::query_as("SELECT * FROM operation_release_unsent($1, $2, $3, $4)")
                    .bind(claim.operation_id.as_str())
                    .bind(claim.dispatch_owner.as_str())
                    .bind(claim.revision)
                    .bind(Json(&evidence))
            })
            .await?;
        Ok(match row.outcome(CALL)? {
            Outcome::Released => ReleaseUnsentOutcome::Released {
                operation: row.record(CALL, self.bodies())?,
                evidence_id: row.evidence_id(CALL)?,
            },
            Outcome::StaleClaim => {
                ReleaseUnsentOutcome::StaleClaim(row.record(CALL, self.bodies())?)
            }
            Outcome::NotFound => ReleaseUnsentOutcome::NotFound,
            other => return Err(other.unexpected(CALL)),
        })
    }

    /// Records one round of a call that asked its agent something, as
    /// `input_round` evidence under `claim` (no status change). `false`:
    /// the claim is no longer the operation's, and nothing was recorded.
    pub async fn operation_note_round(
        &self,
        claim: &DispatchClaim,
        round: &Value,
    ) -> Result<bool, LedgerError> {
        const CALL: &str = "operation_note_round";
        let (recorded,): (bool,) = self
            .invoke(CALL, true, || {
                sqlx::query_as("SELECT operation_note_round($1, $2, $3, $4)")
                    .bind(claim.operation_id.as_str())
                    .bind(claim.dispatch_owner.as_str())
                    .bind(claim.revision)
                    .bind(Json(round))
            })
            .await?;
        Ok(recorded)
    }

    /// Records the task the upstream made of the call under `claim` as
    /// `task` evidence (`task` given), and extends the claim to now +
    /// `extend` while this process follows the task (no status change).
    /// `false`: the claim is no longer the operation's or has lapsed, and
    /// nothing was written.
    pub async fn operation_follow_task(
        &self,
        claim: &DispatchClaim,
        task: Option<&Value>,
        extend: std::time::Duration,
    ) -> Result<bool, LedgerError> {
        const CALL: &str = "operation_follow_task";
        let extend_ms = i64::try_from(extend.as_millis()).unwrap_or(i64::MAX);
        let (recorded,): (bool,) = self
            .invoke(CALL, true, || {
                sqlx::query_as("SELECT operation_follow_task($1, $2, $3, $4, $5)")
                    .bind(claim.operation_id.as_str())
                    .bind(claim.dispatch_owner.as_str())
                    .bind(claim.revision)
                    .bind(task.map(Json))
                    .bind(extend_ms)
            })
            .await?;
        Ok(recorded)
    }

    /// `unknown` → `succeeded` / `failed_final` from verified evidence. An
    /// operator resolution ([`ConvergeEvidence::Operator`]) needs a `note`;
    /// both who and why are recorded. It runs `operation_resolve`, which
    /// only a ledger connected as [`super::OPERATOR_ROLE`] may execute: as
    /// the application role it is refused (`LedgerError::Database`,
    /// SQLSTATE 42501) and nothing is written.
    pub async fn operation_converge(
        &self,
        converge: Converge<'_>,
    ) -> Result<ConvergeOutcome, LedgerError> {
        const CALL: &str = "operation_converge";
        let Converge {
            operation_id,
            expected_revision,
            settlement,
            remote_id,
            result,
            kind,
            actor,
            note,
            evidence,
        } = converge;
        check_text("actor", actor, MAX_OWNER_LEN)?;
        if kind == ConvergeEvidence::Operator && note.is_none_or(|n| n.trim().is_empty()) {
            return Err(InvalidInput::Request("an operator resolution needs a note".into()).into());
        }
        let result = result
            .map(|r| self.stored_result(r, operation_id.as_str()))
            .transpose()?;
        let evidence = self.stored_evidence(evidence, operation_id.as_str())?;
        // An operator's resolution is its own function, which only the
        // operator role may execute (`OPERATOR_ROLE`; migrations/0007): the
        // application role's `operation_converge` refuses the kind.
        let row: OpRow = if kind == ConvergeEvidence::Operator {
            self.invoke("operation_resolve", true, || {
                sqlx::query_as("SELECT * FROM operation_resolve($1, $2, $3, $4, $5, $6, $7, $8)")
                    .bind(operation_id.as_str())
                    .bind(expected_revision)
                    .bind(settlement.as_str())
                    .bind(remote_id)
                    .bind(result.as_ref().map(Json))
                    .bind(actor)
                    .bind(note)
                    .bind(Json(&evidence))
            })
            .await?
        } else {
            self.invoke(CALL, true, || {
                sqlx::query_as(
                    "SELECT * FROM operation_converge($1, $2, $3, $4, $5, $6, $7, $8, $9)",
                )
                .bind(operation_id.as_str())
                .bind(expected_revision)
                .bind(settlement.as_str())
                .bind(remote_id)
                .bind(result.as_ref().map(Json))
                .bind(kind.as_str())
                .bind(actor)
                .bind(note)
                .bind(Json(&evidence))
            })
            .await?
        };
        Ok(match row.outcome(CALL)? {
            Outcome::Converged => ConvergeOutcome::Converged {
                operation: row.record(CALL, self.bodies())?,
                evidence_id: row.evidence_id(CALL)?,
            },
            Outcome::NotUnknown => ConvergeOutcome::NotUnknown(row.record(CALL, self.bodies())?),
            Outcome::Conflict => ConvergeOutcome::Conflict {
                expected_revision,
                found: row.record(CALL, self.bodies())?,
            },
            Outcome::StaleClaim => ConvergeOutcome::NotClaimed(row.record(CALL, self.bodies())?),
            Outcome::NotFound => ConvergeOutcome::NotFound,
            other => return Err(other.unexpected(CALL)),
        })
    }

    /// Replaces a planned (still `prepared`) intent with `revised` — the same
    /// step with a higher effect_version. The old row is kept, `cancelled`,
    /// pointing at its successor.
    pub async fn operation_supersede(
        &self,
        claim: &LeaseClaim,
        old: &OperationId,
        revised: &Intent,
    ) -> Result<Fenced<SupersedeOutcome>, LedgerError> {
        const CALL: &str = "operation_supersede";
        if !self.keeps(revised) {
            return Err(self.unplannable(revised));
        }
        let params = IntentParams::new(revised, None, self.bodies())?;
        let row: OpRow = self
            .invoke(CALL, true, || {
                sqlx::query_as("SELECT * FROM operation_supersede($1, $2, $3, $4, $5, $6)")
                    .bind(claim.run_id.as_uuid())
                    .bind(claim.owner.as_str())
                    .bind(claim.epoch)
                    .bind(super::lease_token::bind_hash(claim.token.as_ref()))
                    .bind(old.as_str())
                    .bind(&params)
            })
            .await?;
        let expected = Expected::claim(claim);
        if let Some(rejection) = row.rejection(CALL, expected, Some(revised), self.bodies())? {
            return Ok(Fenced::Rejected(rejection));
        }
        Ok(Fenced::Applied(match row.outcome(CALL)? {
            Outcome::Superseded => SupersedeOutcome::Superseded(row.record(CALL, self.bodies())?),
            Outcome::NotChangeable => {
                SupersedeOutcome::NotChangeable(row.record(CALL, self.bodies())?)
            }
            other => return Err(other.unexpected(CALL)),
        }))
    }
}
