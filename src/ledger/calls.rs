//! The protected transitions: one SQL function call each.
//!
//! Round trips: each call below is one statement. On a pooled connection
//! that has prepared the statement before, that is one round trip; the first
//! use on a new connection adds one Parse/Describe round trip.

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::FromRow;
use sqlx::types::Json;
use uuid::Uuid;

use super::stored_json;
use super::verdict::{
    Expected, Found, Outcome, fence_rejection, missing, parse_run_status, rejected,
};
use super::{
    AcquireOutcome, Applied, Fenced, LeaseClaim, LeaseGrant, Ledger, LedgerError, MAX_OWNER_LEN,
    MAX_TASK_LEN, MAX_TENANT_LEN, Rejection, RunCreateOutcome, RunId, RunStatus, RunSummary,
    check_text,
};

/// The `ledger_write_result` composite every fenced function returns.
#[derive(Debug, FromRow)]
struct WriteRow {
    outcome: String,
    run_status: Option<String>,
    revision: Option<i64>,
    lease_owner: Option<String>,
    lease_epoch: Option<i64>,
    lease_expires_at: Option<DateTime<Utc>>,
    db_now: DateTime<Utc>,
    /// How long the call waited for the lease row lock.
    lock_wait_ms: Option<f64>,
    /// On a takeover: how long the lease had been expired.
    takeover_after_ms: Option<f64>,
}

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

impl WriteRow {
    fn outcome(&self, call: &'static str) -> Result<Outcome, LedgerError> {
        Outcome::parse(call, &self.outcome)
    }

    fn found(&self) -> Found<'_> {
        Found {
            run_status: self.run_status.as_deref(),
            run_revision: self.revision,
            lease_owner: self.lease_owner.as_deref(),
            lease_epoch: self.lease_epoch,
            lease_expires_at: self.lease_expires_at,
            db_now: self.db_now,
        }
    }

    fn applied(&self, call: &'static str) -> Result<Applied, LedgerError> {
        Ok(Applied {
            run_status: self.found().run_status(call)?,
            revision: self.revision.ok_or_else(|| missing(call, "revision"))?,
            lease_expires_at: self
                .lease_expires_at
                .ok_or_else(|| missing(call, "lease_expires_at"))?,
        })
    }

    /// Records the lock wait of this call.
    fn observe(&self, call: &'static str) {
        if let Some(wait) = self.lock_wait_ms {
            metrics::histogram!("lease_row_lock_wait_seconds", "call" => call)
                .record(wait / 1000.0);
        }
    }

    /// Turns the function's verdict into a typed outcome; `expected` is what
    /// the caller asked for, so that rejections name expected and found.
    fn into_fenced(
        self,
        call: &'static str,
        expected: Expected<'_>,
    ) -> Result<Fenced<Applied>, LedgerError> {
        self.observe(call);
        let outcome = self.outcome(call)?;
        if outcome == Outcome::Applied {
            return Ok(Fenced::Applied(self.applied(call)?));
        }
        match fence_rejection(call, outcome, expected, self.found())? {
            Some(rejection) => Ok(Fenced::Rejected(rejected(call, rejection))),
            None => Err(outcome.unexpected(call)),
        }
    }
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
    /// [`RunCreateOutcome::Exists`].
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
        let row: CreateRow = self
            .invoke(CALL, true, || {
                sqlx::query_as("SELECT * FROM run_create($1, $2, $3, $4, $5)")
                    .bind(tenant_id)
                    .bind(task_id)
                    .bind(run_id.as_uuid())
                    .bind(lease.map(|l| l.owner))
                    .bind(lease.map(|l| l.ttl_ms))
            })
            .await?;
        Ok(match Outcome::parse(CALL, &row.outcome)? {
            Outcome::Created => RunCreateOutcome::Created(row.summary(CALL)?),
            Outcome::Exists => RunCreateOutcome::Exists(row.summary(CALL)?),
            Outcome::ActiveRunLive => RunCreateOutcome::ActiveRunLive(row.summary(CALL)?),
            Outcome::RunIdTaken => RunCreateOutcome::RunIdTaken,
            other => return Err(other.unexpected(CALL)),
        })
    }

    /// Acquires a free lease or takes over an expired one (epoch + 1). Waits
    /// for a protected write in flight on the same run, then judges the
    /// lease as that write left it.
    pub async fn lease_acquire(
        &self,
        run_id: RunId,
        owner: &str,
        ttl_ms: i64,
    ) -> Result<AcquireOutcome, LedgerError> {
        const CALL: &str = "lease_acquire";
        check_text("owner", owner, MAX_OWNER_LEN)?;
        self.check_ttl(ttl_ms)?;
        let row: WriteRow = self
            .invoke(CALL, true, || {
                sqlx::query_as("SELECT * FROM lease_acquire($1, $2, $3)")
                    .bind(run_id.as_uuid())
                    .bind(owner)
                    .bind(ttl_ms)
            })
            .await
            .inspect_err(|_| {
                metrics::counter!("lease_acquire_total", "outcome" => "db_error").increment(1)
            })?;
        row.observe(CALL);
        if let Some(after) = row.takeover_after_ms {
            metrics::histogram!("workflow_takeover_duration_seconds").record(after / 1000.0);
        }
        let outcome = Self::acquire_outcome(run_id, owner, row)?;
        metrics::counter!("lease_acquire_total", "outcome" => outcome.label()).increment(1);
        Ok(outcome)
    }

    fn acquire_outcome(
        run_id: RunId,
        owner: &str,
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
                sqlx::query_as("SELECT * FROM lease_renew($1, $2, $3, $4)")
                    .bind(claim.run_id.as_uuid())
                    .bind(claim.owner.as_str())
                    .bind(claim.epoch)
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
        let fenced = row.into_fenced(
            CALL,
            Expected {
                claim: Some(claim),
                ..Expected::default()
            },
        )?;
        let outcome = match &fenced {
            Fenced::Applied(_) => "success",
            Fenced::Rejected(Rejection::Terminal { .. }) => "terminal",
            Fenced::Rejected(_) => "lost",
        };
        metrics::counter!("lease_renew_total", "outcome" => outcome).increment(1);
        Ok(fenced)
    }

    /// Gives the lease up; the epoch is kept so the next acquire is epoch + 1.
    pub async fn lease_release(&self, claim: &LeaseClaim) -> Result<Fenced<Applied>, LedgerError> {
        const CALL: &str = "lease_release";
        let row: WriteRow = self
            .invoke(CALL, true, || {
                sqlx::query_as("SELECT * FROM lease_release($1, $2, $3)")
                    .bind(claim.run_id.as_uuid())
                    .bind(claim.owner.as_str())
                    .bind(claim.epoch)
            })
            .await?;
        row.into_fenced(
            CALL,
            Expected {
                claim: Some(claim),
                ..Expected::default()
            },
        )
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
                sqlx::query_as("SELECT * FROM checkpoint_save($1, $2, $3, $4, $5)")
                    .bind(claim.run_id.as_uuid())
                    .bind(claim.owner.as_str())
                    .bind(claim.epoch)
                    .bind(expected_revision)
                    .bind(Json(stored_json::encode(checkpoint)))
            })
            .await?;
        row.into_fenced(
            CALL,
            Expected {
                claim: Some(claim),
                revision: Some(expected_revision),
                status: Some(RunStatus::Running),
            },
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
                sqlx::query_as("SELECT * FROM run_start($1, $2, $3, $4)")
                    .bind(claim.run_id.as_uuid())
                    .bind(claim.owner.as_str())
                    .bind(claim.epoch)
                    .bind(expected_revision)
            })
            .await?;
        row.into_fenced(
            CALL,
            Expected {
                claim: Some(claim),
                revision: Some(expected_revision),
                status: Some(RunStatus::Pending),
            },
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
                sqlx::query_as("SELECT * FROM run_complete($1, $2, $3, $4, $5)")
                    .bind(claim.run_id.as_uuid())
                    .bind(claim.owner.as_str())
                    .bind(claim.epoch)
                    .bind(expected_revision)
                    .bind(final_checkpoint.map(Json))
            })
            .await?;
        row.into_fenced(
            CALL,
            Expected {
                claim: Some(claim),
                revision: Some(expected_revision),
                status: Some(RunStatus::Running),
            },
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
                sqlx::query_as("SELECT * FROM run_fail($1, $2, $3, $4, $5)")
                    .bind(claim.run_id.as_uuid())
                    .bind(claim.owner.as_str())
                    .bind(claim.epoch)
                    .bind(expected_revision)
                    .bind(Json(stored_json::encode(reason)))
            })
            .await?;
        row.into_fenced(
            CALL,
            Expected {
                claim: Some(claim),
                revision: Some(expected_revision),
                status: Some(RunStatus::Running),
            },
        )
    }

    /// Control plane: pending/running → cancelled, without a lease. `actor`
    /// (who asked) and `reason` go to the event history.
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
