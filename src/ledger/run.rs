//! Run calls: create, start, checkpoint, complete, fail (under the lease)
//! and cancel (control plane). One SQL function call each
//! (`sql/run.sql`), with the same round-trip cost as the lease calls.

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::FromRow;
use sqlx::types::Json;
use uuid::Uuid;

use super::lease_token::bind_hash;
use super::stored_json;
use super::verdict::{Expected, Outcome, WriteRow, missing, parse_run_status};
use super::{
    Applied, Fenced, LeaseClaim, LeaseToken, Ledger, LedgerError, MAX_OWNER_LEN, MAX_TASK_LEN,
    MAX_TENANT_LEN, RunCreateOutcome, RunId, RunStatus, RunSummary, check_text,
};

/// The `run_create_result` composite.
#[derive(Debug, FromRow)]
struct CreateRow {
    outcome: String,
    run_id: Option<Uuid>,
    attempt: Option<i32>,
    run_status: Option<String>,
    lease_owner: Option<String>,
    lease_epoch: Option<i64>,
    lease_expires_at: Option<DateTime<Utc>>,
}

impl CreateRow {
    fn summary(&self, call: &'static str) -> Result<RunSummary, LedgerError> {
        Ok(RunSummary {
            run_id: RunId::from_uuid(self.run_id.ok_or_else(|| missing(call, "run_id"))?),
            attempt: self.attempt.ok_or_else(|| missing(call, "attempt"))?,
            status: parse_run_status(call, self.run_status.as_deref())?,
            lease_owner: self.lease_owner.clone(),
            lease_epoch: self.lease_epoch.unwrap_or(0),
            lease_expires_at: self.lease_expires_at.unwrap_or(DateTime::<Utc>::UNIX_EPOCH),
            lease_token: None,
        })
    }
}

/// A lease to hold from the moment the run exists.
#[derive(Debug, Clone, Copy)]
pub struct InitialLease<'a> {
    pub owner: &'a str,
    pub ttl_ms: i64,
}

impl Ledger {
    /// Creates the task if new, a pending run with id `run_id`, and its lease
    /// row, in one transaction; the run becomes the task's active run. Pick
    /// `run_id` with [`RunId::generate`] before the call and reuse it when
    /// retrying after [`LedgerError::OutcomeUnknown`]: the replay answers
    /// [`RunCreateOutcome::Exists`]. With `lease`, a `Created` run's summary
    /// carries the new lease's secret token (a replay's does not: the token
    /// was shown once).
    pub async fn run_create(
        &self,
        run_id: RunId,
        tenant_id: &str,
        task_id: &str,
        lease: Option<InitialLease<'_>>,
    ) -> Result<RunCreateOutcome, LedgerError> {
        const CALL: &str = "run_create";
        check_text("tenant_id", tenant_id, MAX_TENANT_LEN)?;
        check_text("task_id", task_id, MAX_TASK_LEN)?;
        if let Some(lease) = lease {
            check_text("owner", lease.owner, MAX_OWNER_LEN)?;
            self.check_ttl(lease.ttl_ms)?;
        }
        let token = lease.map(|_| LeaseToken::generate());
        let hash = bind_hash(token.as_ref());
        let row: CreateRow = self
            .invoke(CALL, true, || {
                sqlx::query_as("SELECT * FROM run_create($1, $2, $3, $4, $5, $6)")
                    .bind(tenant_id)
                    .bind(task_id)
                    .bind(run_id.as_uuid())
                    .bind(lease.map(|l| l.owner))
                    .bind(lease.map(|l| l.ttl_ms))
                    .bind(hash.as_deref())
            })
            .await?;
        Ok(match Outcome::parse(CALL, &row.outcome)? {
            Outcome::Created => RunCreateOutcome::Created(RunSummary {
                lease_token: token,
                ..row.summary(CALL)?
            }),
            Outcome::Exists => RunCreateOutcome::Exists(row.summary(CALL)?),
            Outcome::ActiveRunLive => RunCreateOutcome::ActiveRunLive(row.summary(CALL)?),
            Outcome::RunIdTaken => RunCreateOutcome::RunIdTaken,
            other => return Err(other.unexpected(CALL)),
        })
    }

    /// Saves a checkpoint: lease check, then revision CAS on a running run.
    pub async fn checkpoint_save(
        &self,
        claim: &LeaseClaim,
        expected_revision: i64,
        checkpoint: &Value,
    ) -> Result<Fenced<Applied>, LedgerError> {
        const CALL: &str = "checkpoint_save";
        let row: WriteRow = self
            .invoke(CALL, true, || {
                sqlx::query_as("SELECT * FROM checkpoint_save($1, $2, $3, $4, $5, $6)")
                    .bind(claim.run_id.as_uuid())
                    .bind(claim.owner.as_str())
                    .bind(claim.epoch)
                    .bind(bind_hash(claim.token.as_ref()))
                    .bind(expected_revision)
                    .bind(Json(stored_json::encode(checkpoint)))
            })
            .await?;
        row.into_fenced(
            CALL,
            Expected::run_write(claim, expected_revision, RunStatus::Running),
        )
    }

    /// pending → running.
    pub async fn run_start(
        &self,
        claim: &LeaseClaim,
        expected_revision: i64,
    ) -> Result<Fenced<Applied>, LedgerError> {
        const CALL: &str = "run_start";
        let row: WriteRow = self
            .invoke(CALL, true, || {
                sqlx::query_as("SELECT * FROM run_start($1, $2, $3, $4, $5)")
                    .bind(claim.run_id.as_uuid())
                    .bind(claim.owner.as_str())
                    .bind(claim.epoch)
                    .bind(bind_hash(claim.token.as_ref()))
                    .bind(expected_revision)
            })
            .await?;
        row.into_fenced(
            CALL,
            Expected::run_write(claim, expected_revision, RunStatus::Pending),
        )
    }

    /// running → succeeded, optionally replacing the checkpoint with a final one.
    pub async fn run_complete(
        &self,
        claim: &LeaseClaim,
        expected_revision: i64,
        final_checkpoint: Option<&Value>,
    ) -> Result<Fenced<Applied>, LedgerError> {
        const CALL: &str = "run_complete";
        let row: WriteRow = self
            .invoke(CALL, true, || {
                sqlx::query_as("SELECT * FROM run_complete($1, $2, $3, $4, $5, $6)")
                    .bind(claim.run_id.as_uuid())
                    .bind(claim.owner.as_str())
                    .bind(claim.epoch)
                    .bind(bind_hash(claim.token.as_ref()))
                    .bind(expected_revision)
                    .bind(final_checkpoint.map(Json))
            })
            .await?;
        row.into_fenced(
            CALL,
            Expected::run_write(claim, expected_revision, RunStatus::Running),
        )
    }

    /// running → failed: a deterministic business failure, with its reason
    /// kept in the event history. Not for lease loss or unknown outcomes.
    pub async fn run_fail(
        &self,
        claim: &LeaseClaim,
        expected_revision: i64,
        reason: &Value,
    ) -> Result<Fenced<Applied>, LedgerError> {
        const CALL: &str = "run_fail";
        let row: WriteRow = self
            .invoke(CALL, true, || {
                sqlx::query_as("SELECT * FROM run_fail($1, $2, $3, $4, $5, $6)")
                    .bind(claim.run_id.as_uuid())
                    .bind(claim.owner.as_str())
                    .bind(claim.epoch)
                    .bind(bind_hash(claim.token.as_ref()))
                    .bind(expected_revision)
                    .bind(Json(stored_json::encode(reason)))
            })
            .await?;
        row.into_fenced(
            CALL,
            Expected::run_write(claim, expected_revision, RunStatus::Running),
        )
    }

    /// The lease holder ends its own run: pending/running → cancelled,
    /// fenced like every worker write (owner, epoch, lease token); its
    /// prepared operations are cancelled with it. Lease mode `key` retires
    /// a run past its retention this way, after taking its lease over.
    pub async fn run_retire(
        &self,
        claim: &LeaseClaim,
        reason: &str,
    ) -> Result<Fenced<Applied>, LedgerError> {
        const CALL: &str = "run_retire";
        let row: WriteRow = self
            .invoke(CALL, true, || {
                sqlx::query_as("SELECT * FROM run_retire($1, $2, $3, $4, $5)")
                    .bind(claim.run_id.as_uuid())
                    .bind(claim.owner.as_str())
                    .bind(claim.epoch)
                    .bind(bind_hash(claim.token.as_ref()))
                    .bind(reason)
            })
            .await?;
        row.into_fenced(CALL, Expected::claim(claim))
    }

    /// Control plane: pending/running → cancelled, without a lease. `actor`
    /// (who asked) and `reason` go to the event history. An operator act:
    /// only a ledger connected as [`super::OPERATOR_ROLE`] may run it (the
    /// application role is refused, SQLSTATE 42501, nothing written).
    pub async fn run_cancel(
        &self,
        run_id: RunId,
        actor: &str,
        reason: Option<&str>,
    ) -> Result<Fenced<Applied>, LedgerError> {
        const CALL: &str = "run_cancel";
        check_text("actor", actor, MAX_OWNER_LEN)?;
        let row: WriteRow = self
            .invoke(CALL, true, || {
                sqlx::query_as("SELECT * FROM run_cancel($1, $2, $3)")
                    .bind(run_id.as_uuid())
                    .bind(actor)
                    .bind(reason)
            })
            .await?;
        row.into_fenced(CALL, Expected::default())
    }
}
