//! The ledger's vocabulary: identities, the run state machine, and the typed
//! outcomes of fenced writes.
//!
//! # State model
//!
//! ```text
//!              start (lease + CAS)          complete (lease + CAS)
//!   pending ─────────────────────▶ running ─────────────────────▶ succeeded
//!      │                          │  ▲  │  fail (lease + CAS)
//!      │                          │  └──┘ ─────────────────────▶ failed
//!      │      cancel (control)    │ save_checkpoint
//!      └──────────────┬───────────┘ (lease + CAS)
//!                     ▼
//!                 cancelled
//! ```
//!
//! Terminal statuses never return to `running`: a retry is a new run.

use std::fmt;

pub use super::lease_token::LeaseToken;
pub use crate::ids::RunId;
use crate::intent::{OperationId, RequestDigest};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// Status of a run. The strings are the database's CHECK.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    Pending,
    Running,
    Succeeded,
    Failed,
    Cancelled,
}

/// What can happen to a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RunEvent {
    /// pending → running, by the lease holder.
    Start,
    /// running → running with a new checkpoint, by the lease holder.
    SaveCheckpoint,
    /// running → succeeded, by the lease holder.
    Complete,
    /// running → failed (a deterministic business failure), by the lease holder.
    Fail,
    /// pending/running → cancelled, by the control plane (no lease).
    Cancel,
}

impl RunEvent {
    pub const ALL: [RunEvent; 5] = [
        RunEvent::Start,
        RunEvent::SaveCheckpoint,
        RunEvent::Complete,
        RunEvent::Fail,
        RunEvent::Cancel,
    ];
}

/// Why the state machine refuses an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForbiddenTransition {
    /// The run is terminal; nothing moves it again.
    Terminal(RunStatus),
    /// The event needs the run in `expected`, it is in `found`.
    WrongStatus {
        expected: RunStatus,
        found: RunStatus,
    },
}

impl RunStatus {
    pub const ALL: [RunStatus; 5] = [
        RunStatus::Pending,
        RunStatus::Running,
        RunStatus::Succeeded,
        RunStatus::Failed,
        RunStatus::Cancelled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Pending => "pending",
            RunStatus::Running => "running",
            RunStatus::Succeeded => "succeeded",
            RunStatus::Failed => "failed",
            RunStatus::Cancelled => "cancelled",
        }
    }

    pub fn parse(value: &str) -> Option<RunStatus> {
        RunStatus::ALL.into_iter().find(|s| s.as_str() == value)
    }

    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            RunStatus::Succeeded | RunStatus::Failed | RunStatus::Cancelled
        )
    }

    /// The run transition table as a pure function. The SQL functions
    /// implement the same table; `tests/integration/run_state_machine.rs` checks that the
    /// database agrees with this function for every (status, event) pair.
    pub fn transition(self, event: RunEvent) -> Result<RunStatus, ForbiddenTransition> {
        use RunEvent::*;
        use RunStatus::*;
        if self.is_terminal() {
            return Err(ForbiddenTransition::Terminal(self));
        }
        let needs = |expected: RunStatus, to: RunStatus| {
            if self == expected {
                Ok(to)
            } else {
                Err(ForbiddenTransition::WrongStatus {
                    expected,
                    found: self,
                })
            }
        };
        match event {
            Start => needs(Pending, Running),
            SaveCheckpoint => needs(Running, Running),
            Complete => needs(Running, Succeeded),
            Fail => needs(Running, Failed),
            Cancel => Ok(Cancelled),
        }
    }
}

impl fmt::Display for RunStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a worker presents on every protected write: the run, its session
/// (owner) and its term (epoch) — the lease's public identity — and the
/// secret lease token its taker was given. Only the current pair with its
/// token may write (invariant 1). The token is never serialized: a claim
/// in an answer or an error names run, owner and epoch only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseClaim {
    pub run_id: RunId,
    pub owner: String,
    pub epoch: i64,
    /// `None`: the caller presented no token (its writes are refused as
    /// [`Rejection::LeaseTokenInvalid`]).
    #[serde(skip)]
    pub token: Option<LeaseToken>,
}

/// Why the current owner and epoch were refused for their token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TokenFault {
    /// No lease token was presented.
    Missing,
    /// The token presented is not this lease's.
    Wrong,
    /// The lease was taken before lease tokens existed (migration 0005) and
    /// has none: acquire it again (once expired) or take it over.
    Unset,
}

impl TokenFault {
    pub fn as_str(self) -> &'static str {
        match self {
            TokenFault::Missing => "missing",
            TokenFault::Wrong => "wrong",
            TokenFault::Unset => "unset",
        }
    }
}

/// The lease as the database holds it, reported on rejections.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseState {
    /// `None` when the lease is free (released, or never acquired).
    pub owner: Option<String>,
    pub epoch: i64,
    pub expires_at: DateTime<Utc>,
    /// Judged on the database clock at the time of the call.
    pub expired: bool,
}

/// A lease acquired or taken over.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseGrant {
    pub claim: LeaseClaim,
    pub expires_at: DateTime<Utc>,
    /// True when an expired lease of another owner was taken over.
    pub took_over: bool,
    /// The run as the new owner finds it: where to resume from.
    pub run_status: RunStatus,
    pub revision: i64,
}

/// What a fenced write that applied reports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Applied {
    pub run_status: RunStatus,
    /// The run's revision after the write.
    pub revision: i64,
    pub lease_expires_at: DateTime<Utc>,
}

/// Why a fenced write did not apply. These are expected outcomes, not
/// errors of the ledger: callers must handle each one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    /// The caller has no write authority any more: another owner or epoch
    /// holds the lease, it expired, or it was released. Cancel execution; do
    /// not write a terminal state.
    #[error("{}", lease_lost_message(expected, found))]
    LeaseLost {
        expected: LeaseClaim,
        found: LeaseState,
    },
    /// The caller named the current owner and epoch but did not present
    /// that lease's token (none, a wrong one, or the lease has none yet).
    /// Nothing was written. Owner and epoch are public; the token is the
    /// credential.
    #[error("{}", token_message(claim, *fault))]
    LeaseTokenInvalid {
        claim: LeaseClaim,
        fault: TokenFault,
    },
    /// Same epoch, stale snapshot: read back and decide per step semantics.
    #[error("revision conflict: expected revision {expected_revision}, found {found}")]
    Conflict { expected_revision: i64, found: i64 },
    /// The run is not in the status this write needs (e.g. a checkpoint on a
    /// run that was never started).
    #[error("run is {found}, this write needs it {expected}")]
    WrongStatus {
        expected: RunStatus,
        found: RunStatus,
    },
    /// The run is succeeded, failed or cancelled; nothing moves it again.
    #[error("run is {status}: terminal runs never change; retry with a new run")]
    Terminal { status: RunStatus },
    #[error("run not found")]
    NotFound,
    /// The intent's identity (operation id, or run + step + effect_version)
    /// is registered with a different request: a bug or a corrupted request,
    /// never a retry. Nothing was written.
    #[error(
        "intent conflict on operation {operation_id}: {}, \
         found {found_digest} (tool {found_tool}, step {found_step} v{found_effect_version})",
        match expected_digest {
            Some(digest) => format!("expected digest {digest}"),
            None => "another intent of this call".to_owned(),
        }
    )]
    IntentConflict {
        operation_id: OperationId,
        /// The digest the caller sent for this operation; `None` when the
        /// conflicting row is not one the caller named (another intent of a
        /// batch collided with it).
        expected_digest: Option<RequestDigest>,
        found_digest: RequestDigest,
        found_tool: String,
        found_step: String,
        found_effect_version: i32,
    },
}

fn lease_lost_message(expected: &LeaseClaim, found: &LeaseState) -> String {
    match &found.owner {
        Some(owner) if *owner == expected.owner && found.epoch == expected.epoch => format!(
            "lease lost: epoch {} of owner {} expired at {}",
            found.epoch, owner, found.expires_at
        ),
        Some(owner) => format!(
            "lease lost: this write holds owner {} epoch {}, but the lease is now owner {} epoch {}",
            expected.owner, expected.epoch, owner, found.epoch
        ),
        None => format!(
            "lease lost: this write holds owner {} epoch {}, but the lease was released at epoch {}",
            expected.owner, expected.epoch, found.epoch
        ),
    }
}

fn token_message(claim: &LeaseClaim, fault: TokenFault) -> String {
    let what = match fault {
        TokenFault::Missing => "no lease token was presented".to_owned(),
        TokenFault::Wrong => "the lease token presented is not this lease's".to_owned(),
        TokenFault::Unset => "this lease was taken before lease tokens existed and has none; \
             acquire it again once it expires, or take it over, to get one"
            .to_owned(),
    };
    format!(
        "lease token invalid for run {} owner {} epoch {}: {what}. Nothing was written",
        claim.run_id, claim.owner, claim.epoch
    )
}

impl Rejection {
    /// A stable, low-cardinality name for metrics labels and API codes.
    pub fn reason(&self) -> &'static str {
        match self {
            Rejection::LeaseLost { .. } => "lease_lost",
            Rejection::LeaseTokenInvalid { .. } => "lease_token_invalid",
            Rejection::Conflict { .. } => "revision_conflict",
            Rejection::WrongStatus { .. } => "wrong_status",
            Rejection::Terminal { .. } => "terminal_run",
            Rejection::NotFound => "not_found",
            Rejection::IntentConflict { .. } => "intent_conflict",
        }
    }
}

/// The outcome of a fenced write: applied, or rejected for a named reason.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "a rejected fenced write must be handled"]
pub enum Fenced<T> {
    Applied(T),
    Rejected(Rejection),
}

impl<T> Fenced<T> {
    pub fn into_result(self) -> Result<T, Rejection> {
        match self {
            Fenced::Applied(value) => Ok(value),
            Fenced::Rejected(rejection) => Err(rejection),
        }
    }

    pub fn is_applied(&self) -> bool {
        matches!(self, Fenced::Applied(_))
    }

    pub fn rejection(&self) -> Option<&Rejection> {
        match self {
            Fenced::Applied(_) => None,
            Fenced::Rejected(rejection) => Some(rejection),
        }
    }
}

/// The outcome of `lease_acquire`. A fenced UPDATE that changes no row has
/// three causes, told apart here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AcquireOutcome {
    Acquired(LeaseGrant),
    /// Another owner holds an unexpired lease. Not a task failure: wait for
    /// expiry or give up.
    Busy {
        owner: String,
        expires_at: DateTime<Utc>,
    },
    NotFound,
    Terminal {
        status: RunStatus,
    },
}

impl AcquireOutcome {
    pub fn label(&self) -> &'static str {
        match self {
            AcquireOutcome::Acquired(grant) if grant.took_over => "taken_over",
            AcquireOutcome::Acquired(_) => "acquired",
            AcquireOutcome::Busy { .. } => "busy",
            AcquireOutcome::NotFound => "not_found",
            AcquireOutcome::Terminal { .. } => "terminal",
        }
    }
}

/// A run as `run_create` reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunSummary {
    pub run_id: RunId,
    pub attempt: i32,
    pub status: RunStatus,
    pub lease_owner: Option<String>,
    pub lease_epoch: i64,
    pub lease_expires_at: DateTime<Utc>,
    /// The secret token of the lease this create took (`Created` with an
    /// initial lease only; shown once, never serialized).
    #[serde(skip)]
    pub lease_token: Option<LeaseToken>,
}

/// The outcome of `run_create`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunCreateOutcome {
    /// A new run (pending, revision 0) is the task's active run.
    Created(RunSummary),
    /// This run id already exists for this task: a replay of the same create
    /// (e.g. after an unknown COMMIT outcome). Nothing was changed.
    Exists(RunSummary),
    /// The task's active run is still pending or running. Take over its
    /// lease, or cancel it, before creating a retry.
    ActiveRunLive(RunSummary),
    /// The run id belongs to another task or tenant.
    RunIdTaken,
}

/// A run as read back from the ledger.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunView {
    pub run_id: RunId,
    pub tenant_id: String,
    /// `task`: the tenant's shared namespace (the control API's);
    /// `session` or `key`: the namespace of `principal` in that lease mode.
    pub kind: String,
    /// The principal whose namespace holds the task ("" for kind `task`).
    pub principal: String,
    pub task_id: String,
    pub attempt: i32,
    pub status: RunStatus,
    pub revision: i64,
    pub checkpoint: serde_json::Value,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub lease: LeaseState,
    /// Whether this run is its task's active run.
    pub active: bool,
}

/// One row of the append-only event history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LedgerEvent {
    pub event_id: i64,
    pub at: DateTime<Utc>,
    pub run_id: RunId,
    pub operation_id: Option<String>,
    pub subject: String,
    pub from_status: Option<String>,
    pub to_status: String,
    pub actor_kind: String,
    pub actor: Option<String>,
    pub epoch: Option<i64>,
    pub revision: Option<i64>,
    pub detail: serde_json::Value,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transition_table_matches_the_documented_one() {
        use RunEvent::*;
        use RunStatus::*;
        // (from, event) -> Some(to) when allowed, None when forbidden.
        let allowed = |from: RunStatus, event: RunEvent| -> Option<RunStatus> {
            match (from, event) {
                (Pending, Start) => Some(Running),
                (Running, SaveCheckpoint) => Some(Running),
                (Running, Complete) => Some(Succeeded),
                (Running, Fail) => Some(Failed),
                (Pending | Running, Cancel) => Some(Cancelled),
                _ => None,
            }
        };
        for from in RunStatus::ALL {
            for event in RunEvent::ALL {
                let got = from.transition(event);
                assert_eq!(got.ok(), allowed(from, event), "{from} + {event:?}");
                if from.is_terminal() {
                    assert_eq!(got, Err(ForbiddenTransition::Terminal(from)));
                }
            }
        }
    }

    #[test]
    fn lease_lost_messages_name_what_the_write_held_and_what_the_lease_is() {
        let expected = LeaseClaim {
            run_id: RunId::generate(),
            owner: "a".into(),
            epoch: 100,
            token: None,
        };
        let found = LeaseState {
            owner: Some("b".into()),
            epoch: 101,
            expires_at: DateTime::<Utc>::UNIX_EPOCH,
            expired: false,
        };
        let rejection = Rejection::LeaseLost { expected, found };
        assert_eq!(
            rejection.to_string(),
            "lease lost: this write holds owner a epoch 100, but the lease is now owner b epoch 101"
        );
        assert_eq!(rejection.reason(), "lease_lost");
    }
}
