//! One decoder for what the ledger's functions answer.
//!
//! Every function returns an outcome word (`sql/*.sql` lists them per
//! function). It is parsed once into [`Outcome`]; a word this build does not
//! know is a [`LedgerError::Protocol`], never a silent fallthrough. The
//! rejections every fenced call can meet (lease lost, terminal run, revision
//! conflict, wrong status, not found) are built in [`fence_rejection`] from
//! what the caller asked for ([`Expected`]) and what the database found
//! ([`Found`]), and counted in `protected_write_rejected_total` in
//! [`rejected`] — one place for run writes and operation writes alike.

use chrono::{DateTime, Utc};

use sqlx::FromRow;

use super::{
    Applied, Fenced, LeaseClaim, LeaseState, LedgerError, Rejection, RunStatus, TokenFault,
};

/// Every outcome word the SQL functions answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Outcome {
    // Applied, per function.
    Applied,
    Acquired,
    TakenOver,
    Created,
    Exists,
    Registered,
    Claimed,
    Settled,
    MarkedUnknown,
    Converged,
    Superseded,
    // Rejections shared by fenced calls.
    NotFound,
    LeaseLost,
    LeaseTokenInvalid,
    LeaseTokenUnset,
    Terminal,
    Conflict,
    WrongStatus,
    // Rejections of one call family.
    Busy,
    ActiveRunLive,
    RunIdTaken,
    IntentConflict,
    StaleClaim,
    DigestMismatch,
    NotClaimed,
    ClaimLive,
    NotUnknown,
    NotChangeable,
    // operation_reconcile_attempt.
    Attempt,
    WindowPassed,
    BudgetSpent,
    // operation_reconcile_resend.
    Resent,
    Settling,
    // operation_reconcile_refund, operation_reconcile_release.
    Refunded,
    Released,
    // operation_reconcile_reset.
    Reset,
}

impl Outcome {
    pub(super) fn parse(call: &'static str, word: &str) -> Result<Outcome, LedgerError> {
        use Outcome::*;
        Ok(match word {
            "applied" => Applied,
            "acquired" => Acquired,
            "taken_over" => TakenOver,
            "created" => Created,
            "exists" => Exists,
            "registered" => Registered,
            "claimed" => Claimed,
            "settled" => Settled,
            "marked_unknown" => MarkedUnknown,
            "converged" => Converged,
            "superseded" => Superseded,
            "not_found" => NotFound,
            "lease_lost" => LeaseLost,
            "lease_token_invalid" => LeaseTokenInvalid,
            "lease_token_unset" => LeaseTokenUnset,
            "terminal" => Terminal,
            "conflict" => Conflict,
            "wrong_status" => WrongStatus,
            "busy" => Busy,
            "active_run_live" => ActiveRunLive,
            "run_id_taken" => RunIdTaken,
            "intent_conflict" => IntentConflict,
            "stale_claim" => StaleClaim,
            "digest_mismatch" => DigestMismatch,
            "not_claimed" => NotClaimed,
            "claim_live" => ClaimLive,
            "not_unknown" => NotUnknown,
            "not_changeable" => NotChangeable,
            "attempt" => Attempt,
            "window_passed" => WindowPassed,
            "budget_spent" => BudgetSpent,
            "resent" => Resent,
            "settling" => Settling,
            "refunded" => Refunded,
            "released" => Released,
            "reset" => Reset,
            other => {
                return Err(LedgerError::Protocol {
                    call,
                    detail: format!("unknown outcome {other:?}"),
                });
            }
        })
    }

    /// The error for an outcome that the call named cannot answer.
    pub(super) fn unexpected(self, call: &'static str) -> LedgerError {
        LedgerError::Protocol {
            call,
            detail: format!("outcome {self:?} is not one this call answers"),
        }
    }
}

/// What the caller asked for, so rejections name expected and found values.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Expected<'a> {
    pub claim: Option<&'a LeaseClaim>,
    pub revision: Option<i64>,
    /// The run status the write needs.
    pub status: Option<RunStatus>,
}

impl<'a> Expected<'a> {
    /// A write under `claim` that carries no revision or status check.
    pub(super) fn claim(claim: &'a LeaseClaim) -> Self {
        Expected {
            claim: Some(claim),
            ..Expected::default()
        }
    }

    /// A run-state write: lease `claim`, revision CAS at `revision`, and the
    /// run status the write needs.
    pub(super) fn run_write(claim: &'a LeaseClaim, revision: i64, status: RunStatus) -> Self {
        Expected {
            claim: Some(claim),
            revision: Some(revision),
            status: Some(status),
        }
    }
}

/// The run and lease as the database found them.
#[derive(Debug, Clone, Copy)]
pub(super) struct Found<'a> {
    pub run_status: Option<&'a str>,
    pub run_revision: Option<i64>,
    pub lease_owner: Option<&'a str>,
    pub lease_epoch: Option<i64>,
    pub lease_expires_at: Option<DateTime<Utc>>,
    pub db_now: DateTime<Utc>,
}

impl Found<'_> {
    pub(super) fn run_status(&self, call: &'static str) -> Result<RunStatus, LedgerError> {
        parse_run_status(call, self.run_status)
    }

    pub(super) fn lease_state(&self) -> LeaseState {
        let expires_at = self.lease_expires_at.unwrap_or(DateTime::<Utc>::UNIX_EPOCH);
        LeaseState {
            owner: self.lease_owner.map(str::to_owned),
            epoch: self.lease_epoch.unwrap_or(0),
            expires_at,
            expired: expires_at <= self.db_now,
        }
    }
}

pub(super) fn parse_run_status(
    call: &'static str,
    value: Option<&str>,
) -> Result<RunStatus, LedgerError> {
    value
        .and_then(RunStatus::parse)
        .ok_or_else(|| LedgerError::Protocol {
            call,
            detail: format!("run status {value:?} is not one this build knows"),
        })
}

pub(super) fn missing(call: &'static str, field: &str) -> LedgerError {
    LedgerError::Protocol {
        call,
        detail: format!("{field} missing from the answer"),
    }
}

/// The rejection a shared fence or run-state outcome stands for; `None` for
/// every other outcome (the caller decodes those).
pub(super) fn fence_rejection(
    call: &'static str,
    outcome: Outcome,
    expected: Expected<'_>,
    found: Found<'_>,
) -> Result<Option<Rejection>, LedgerError> {
    Ok(Some(match outcome {
        Outcome::NotFound => Rejection::NotFound,
        Outcome::LeaseLost => Rejection::LeaseLost {
            expected: expected
                .claim
                .cloned()
                .ok_or_else(|| missing(call, "claim"))?,
            found: found.lease_state(),
        },
        Outcome::LeaseTokenInvalid | Outcome::LeaseTokenUnset => {
            let claim = expected
                .claim
                .cloned()
                .ok_or_else(|| missing(call, "claim"))?;
            let fault = match (outcome, &claim.token) {
                (Outcome::LeaseTokenUnset, _) => TokenFault::Unset,
                (_, None) => TokenFault::Missing,
                (_, Some(_)) => TokenFault::Wrong,
            };
            Rejection::LeaseTokenInvalid { claim, fault }
        }
        Outcome::Terminal => Rejection::Terminal {
            status: found.run_status(call)?,
        },
        Outcome::Conflict => Rejection::Conflict {
            expected_revision: expected
                .revision
                .ok_or_else(|| missing(call, "expected revision"))?,
            found: found
                .run_revision
                .ok_or_else(|| missing(call, "revision"))?,
        },
        Outcome::WrongStatus => Rejection::WrongStatus {
            expected: expected
                .status
                .ok_or_else(|| missing(call, "expected status"))?,
            found: found.run_status(call)?,
        },
        _ => return Ok(None),
    }))
}

/// Counts a rejection of a protected write and hands it on.
pub(super) fn rejected(call: &'static str, rejection: Rejection) -> Rejection {
    metrics::counter!("protected_write_rejected_total", "reason" => rejection.reason(), "call" => call)
        .increment(1);
    rejection
}

/// The `ledger_write_result` composite every fenced function returns.
#[derive(Debug, FromRow)]
pub(super) struct WriteRow {
    pub(super) outcome: String,
    pub(super) run_status: Option<String>,
    pub(super) revision: Option<i64>,
    pub(super) lease_owner: Option<String>,
    pub(super) lease_epoch: Option<i64>,
    pub(super) lease_expires_at: Option<DateTime<Utc>>,
    pub(super) db_now: DateTime<Utc>,
    /// How long the call waited for the lease row lock.
    pub(super) lock_wait_ms: Option<f64>,
    /// On a takeover: how long the lease had been expired.
    pub(super) takeover_after_ms: Option<f64>,
}

impl WriteRow {
    pub(super) fn outcome(&self, call: &'static str) -> Result<Outcome, LedgerError> {
        Outcome::parse(call, &self.outcome)
    }

    pub(super) fn found(&self) -> Found<'_> {
        Found {
            run_status: self.run_status.as_deref(),
            run_revision: self.revision,
            lease_owner: self.lease_owner.as_deref(),
            lease_epoch: self.lease_epoch,
            lease_expires_at: self.lease_expires_at,
            db_now: self.db_now,
        }
    }

    pub(super) fn applied(&self, call: &'static str) -> Result<Applied, LedgerError> {
        Ok(Applied {
            run_status: self.found().run_status(call)?,
            revision: self.revision.ok_or_else(|| missing(call, "revision"))?,
            lease_expires_at: self
                .lease_expires_at
                .ok_or_else(|| missing(call, "lease_expires_at"))?,
        })
    }

    /// Records the lock wait of this call.
    pub(super) fn observe(&self, call: &'static str) {
        if let Some(wait) = self.lock_wait_ms {
            metrics::histogram!("lease_row_lock_wait_seconds", "call" => call)
                .record(wait / 1000.0);
        }
    }

    /// Turns the function's verdict into a typed outcome; `expected` is what
    /// the caller asked for, so that rejections name expected and found.
    pub(super) fn into_fenced(
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
