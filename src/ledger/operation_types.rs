//! Types of the operations ledger: the operation state machine and the
//! typed outcomes of its transitions.
//!
//! # State model
//!
//! ```text
//!  register ─▶ prepared ──claim──▶ dispatching ──settle──▶ succeeded | failed_final
//!                 │                    │
//!   run cancelled │                    │ claim expired / holder gave up
//!   plan changed  ▼                    ▼
//!             cancelled             unknown ──converge (evidence)──▶ succeeded | failed_final
//! ```
//!
//! `dispatching` never returns to `prepared`; cancelling a run leaves
//! `dispatching` and `unknown` as they are.

use std::fmt;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::RunId;
use crate::intent::{OperationId, RequestDigest};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OperationStatus {
    Prepared,
    Dispatching,
    Unknown,
    Succeeded,
    FailedFinal,
    Cancelled,
}

impl OperationStatus {
    pub const ALL: [OperationStatus; 6] = [
        OperationStatus::Prepared,
        OperationStatus::Dispatching,
        OperationStatus::Unknown,
        OperationStatus::Succeeded,
        OperationStatus::FailedFinal,
        OperationStatus::Cancelled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            OperationStatus::Prepared => "prepared",
            OperationStatus::Dispatching => "dispatching",
            OperationStatus::Unknown => "unknown",
            OperationStatus::Succeeded => "succeeded",
            OperationStatus::FailedFinal => "failed_final",
            OperationStatus::Cancelled => "cancelled",
        }
    }

    pub fn parse(value: &str) -> Option<OperationStatus> {
        OperationStatus::ALL
            .into_iter()
            .find(|s| s.as_str() == value)
    }

    /// Settled: the remote fact is recorded (or the intent was never sent).
    pub fn is_final(self) -> bool {
        matches!(
            self,
            OperationStatus::Succeeded | OperationStatus::FailedFinal | OperationStatus::Cancelled
        )
    }
}

impl fmt::Display for OperationStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An operation as the ledger holds it (without its request body).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OperationRecord {
    pub operation_id: OperationId,
    pub run_id: RunId,
    pub step_id: String,
    pub effect_version: i32,
    pub tool_name: String,
    pub request_digest: RequestDigest,
    pub status: OperationStatus,
    pub revision: i64,
    pub dispatch_owner: Option<String>,
    pub dispatch_until: Option<DateTime<Utc>>,
    pub dispatch_count: i32,
    pub remote_id: Option<String>,
    pub result: Option<serde_json::Value>,
    /// Where the call goes, when the registrar knew it.
    pub route: Option<ToolRoute>,
}

/// The upstream and its own tool name behind an exposed tool name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolRoute {
    pub upstream: String,
    pub tool: String,
}

impl ToolRoute {
    fn from_columns(upstream: Option<String>, tool: Option<String>) -> Option<ToolRoute> {
        Some(ToolRoute {
            upstream: upstream?,
            tool: tool?,
        })
    }
}

pub(super) fn route_of(upstream: Option<&String>, tool: Option<&String>) -> Option<ToolRoute> {
    ToolRoute::from_columns(upstream.cloned(), tool.cloned())
}

/// What the holder of a claim needs to settle or give it up: the guard of
/// every later write.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DispatchClaim {
    pub operation_id: OperationId,
    pub dispatch_owner: String,
    pub revision: i64,
    pub request_digest: RequestDigest,
    pub until: DateTime<Utc>,
}

impl OperationRecord {
    /// The claim this record shows, when it is `dispatching`.
    pub fn claim(&self) -> Option<DispatchClaim> {
        match (self.status, &self.dispatch_owner, self.dispatch_until) {
            (OperationStatus::Dispatching, Some(owner), Some(until)) => Some(DispatchClaim {
                operation_id: self.operation_id.clone(),
                dispatch_owner: owner.clone(),
                revision: self.revision,
                request_digest: self.request_digest.clone(),
                until,
            }),
            _ => None,
        }
    }
}

/// One intent of an `operation_register` call.
#[derive(Debug, Clone, PartialEq)]
pub struct Registered {
    pub operation: OperationRecord,
    /// False when the intent already existed (same digest): a replay.
    pub newly_registered: bool,
    /// The run's revision after the call (moved by a checkpoint saved with
    /// the intents), as the database reports it.
    pub run_revision: i64,
}

/// The outcome of the inline register-and-claim.
#[derive(Debug, Clone, PartialEq)]
pub enum InlineClaim {
    /// The caller holds the claim and may send.
    Claimed {
        operation: OperationRecord,
        claim: DispatchClaim,
    },
    /// The intent exists and is not claimable: settled (replay its result),
    /// in flight under another claim, unknown, or cancelled. Do not send.
    Existing(OperationRecord),
}

/// A prepared operation claimed by a dispatcher, with what it must send.
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimedOperation {
    pub operation: OperationRecord,
    pub claim: DispatchClaim,
    pub request_body: serde_json::Value,
}

/// Why a write guarded by a claim did not apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StaleReason {
    /// The operation is no longer `dispatching` under this owner and
    /// revision (marked unknown, re-claimed, settled or cancelled).
    StaleClaim,
    /// The response is for another request than the one recorded.
    DigestMismatch,
}

/// The outcome of `operation_settle`.
#[derive(Debug, Clone, PartialEq)]
pub enum SettleOutcome {
    Settled(OperationRecord),
    /// Kept as evidence (`evidence_id`); nothing was settled.
    KeptAsEvidence {
        reason: StaleReason,
        found: OperationRecord,
        evidence_id: i64,
    },
    /// The owner and revision named never claimed the operation: nothing
    /// kept (evidence of a claim that never was would let the reconciler
    /// converge without one).
    NotClaimed(OperationRecord),
    NotFound,
}

/// How a settle or a convergence ends an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Settlement {
    Succeeded,
    /// A definitive failure (e.g. the tool answered `isError: true`).
    FailedFinal,
}

impl Settlement {
    pub fn as_str(self) -> &'static str {
        match self {
            Settlement::Succeeded => "succeeded",
            Settlement::FailedFinal => "failed_final",
        }
    }
}

/// Who moves a claim to `unknown`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnknownBy {
    /// The claim's holder gives its live claim up at once: it alone knows
    /// its request timed out or broke after bytes may have left.
    ClaimHolder,
    /// A reconciler: only a claim that has expired.
    Reconciler,
}

/// Why an outcome is unknown (the kind of evidence kept).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnknownCause {
    TimedOut,
    SendError,
}

impl UnknownCause {
    pub fn as_str(self) -> &'static str {
        match self {
            UnknownCause::TimedOut => "timeout",
            UnknownCause::SendError => "send_error",
        }
    }
}

/// `operation_mark_unknown`'s parameters.
#[derive(Debug, Clone, Copy)]
pub struct MarkUnknown<'a> {
    pub claim: &'a DispatchClaim,
    pub by: UnknownBy,
    /// Who writes it (dispatch owner, reconciler name).
    pub actor: &'a str,
    pub cause: UnknownCause,
    /// Kept as evidence (error text, timeout).
    pub evidence: &'a serde_json::Value,
}

/// `operation_converge`'s parameters.
#[derive(Debug, Clone, Copy)]
pub struct Converge<'a> {
    pub operation_id: &'a OperationId,
    /// The revision the caller read (a reconcile claim's, or the operator's).
    pub expected_revision: i64,
    pub settlement: Settlement,
    pub remote_id: Option<&'a str>,
    pub result: Option<&'a serde_json::Value>,
    pub kind: ConvergeEvidence,
    pub actor: &'a str,
    /// Required for [`ConvergeEvidence::Operator`].
    pub note: Option<&'a str>,
    pub evidence: &'a serde_json::Value,
}

/// What a piece of evidence is (`operation_evidence.kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EvidenceKind {
    /// A response that came after its claim lost validity.
    LateResponse,
    /// Proof that no byte of the request left.
    NotSent,
    SendError,
    Timeout,
    QueryResult,
    RetryResult,
    Operator,
    /// One round of a call that asked its agent something before it
    /// answered: what was asked and whether it was answered, by digest.
    /// Says nothing about the outcome.
    InputRound,
    /// The upstream made a task of the call (MCP Tasks extension): the
    /// upstream and its task id, to follow by `tasks/get`. Says nothing
    /// about the outcome until the task is terminal.
    Task,
}

impl EvidenceKind {
    pub fn as_str(self) -> &'static str {
        match self {
            EvidenceKind::LateResponse => "late_response",
            EvidenceKind::NotSent => "not_sent",
            EvidenceKind::SendError => "send_error",
            EvidenceKind::Timeout => "timeout",
            EvidenceKind::QueryResult => "query_result",
            EvidenceKind::RetryResult => "retry_result",
            EvidenceKind::Operator => "operator",
            EvidenceKind::InputRound => "input_round",
            EvidenceKind::Task => "task",
        }
    }

    pub fn parse(value: &str) -> Option<EvidenceKind> {
        Some(match value {
            "late_response" => EvidenceKind::LateResponse,
            "not_sent" => EvidenceKind::NotSent,
            "send_error" => EvidenceKind::SendError,
            "timeout" => EvidenceKind::Timeout,
            "query_result" => EvidenceKind::QueryResult,
            "retry_result" => EvidenceKind::RetryResult,
            "operator" => EvidenceKind::Operator,
            "input_round" => EvidenceKind::InputRound,
            "task" => EvidenceKind::Task,
            _ => return None,
        })
    }
}

/// The outcome of `operation_reconcile_reset`.
#[derive(Debug, Clone, PartialEq)]
pub enum RetryResetOutcome {
    /// The retry budget starts over; the next reconciler pass takes it.
    Reset(OperationRecord),
    /// Only unknown operations are retried.
    NotUnknown(OperationRecord),
    NotFound,
}

/// The outcome of `operation_release_unsent`.
#[derive(Debug, Clone, PartialEq)]
pub enum ReleaseUnsentOutcome {
    /// Back to `prepared` with the proof kept (`evidence_id`): the same
    /// operation id may be sent again.
    Released {
        operation: OperationRecord,
        evidence_id: i64,
    },
    /// Not `dispatching` under this owner and revision any more.
    StaleClaim(OperationRecord),
    NotFound,
}

/// The outcome of `operation_mark_unknown`.
#[derive(Debug, Clone, PartialEq)]
pub enum MarkUnknownOutcome {
    MarkedUnknown {
        operation: OperationRecord,
        evidence_id: i64,
    },
    /// The claim has not expired and the caller is not its holder.
    ClaimStillLive(OperationRecord),
    /// Not `dispatching` under this owner and revision any more.
    StaleClaim(OperationRecord),
    NotFound,
}

/// Evidence that settles an unknown operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConvergeEvidence {
    /// The tool's query operation, asked by operation id.
    QueryResult,
    /// A retry with the same idempotency key inside its retention window.
    RetryResult,
    /// An operator's resolution (needs a note).
    Operator,
    /// A response that came after its claim lapsed, kept as evidence.
    LateResponse,
}

impl ConvergeEvidence {
    pub fn as_str(self) -> &'static str {
        match self {
            ConvergeEvidence::QueryResult => "query_result",
            ConvergeEvidence::RetryResult => "retry_result",
            ConvergeEvidence::Operator => "operator",
            ConvergeEvidence::LateResponse => "late_response",
        }
    }
}

/// The outcome of `operation_converge`.
#[derive(Debug, Clone, PartialEq)]
pub enum ConvergeOutcome {
    Converged {
        operation: OperationRecord,
        evidence_id: i64,
    },
    /// Only `unknown` operations converge.
    NotUnknown(OperationRecord),
    /// The operation changed since it was read.
    Conflict {
        expected_revision: i64,
        found: OperationRecord,
    },
    /// Evidence converges an `unknown` operation only under the caller's
    /// live reconcile claim (`operation_reconcile_claim`), which it lacks.
    NotClaimed(OperationRecord),
    NotFound,
}

/// The outcome of `operation_supersede` past the lease fence.
#[derive(Debug, Clone, PartialEq)]
pub enum SupersedeOutcome {
    /// The new intent (registered or found); the old one is cancelled.
    Superseded(OperationRecord),
    /// The old intent is no longer prepared: its side effect may be under way.
    NotChangeable(OperationRecord),
}

/// An unknown operation claimed by a reconciler.
#[derive(Debug, Clone, PartialEq)]
pub struct ReconcileItem {
    /// Its revision is the reconcile claim's: converge with it.
    pub operation: OperationRecord,
    pub request_body: serde_json::Value,
    pub reconcile_attempts: i32,
    pub first_dispatched_at: Option<DateTime<Utc>>,
}

/// Whether a same-key retry may go out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryVerdict {
    /// Go: converge with this revision afterwards.
    Attempt {
        revision: i64,
    },
    /// Past the provider's key retention window: a retry would be a new
    /// request at the provider. Never retried.
    WindowPassed,
    BudgetSpent,
    /// The reconcile claim is gone (another reconciler, or it lapsed).
    StaleClaim,
}

/// Whether an unknown operation the tool does not know was handed back to
/// the dispatcher (`operation_reconcile_resend`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResendVerdict {
    /// unknown -> prepared: it goes out again under the same operation id.
    Resent,
    /// Sent too recently: a first request may still land. Look again later.
    Settling,
    BudgetSpent,
    /// The reconcile claim is gone (another reconciler, or it lapsed).
    StaleClaim,
}

/// One piece of evidence kept for an operation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Evidence {
    pub evidence_id: i64,
    pub at: DateTime<Utc>,
    pub kind: EvidenceKind,
    pub source: String,
    pub claim_owner: Option<String>,
    pub claim_revision: Option<i64>,
    pub outcome: Option<String>,
    pub remote_id: Option<String>,
    pub body: serde_json::Value,
}

/// An operation with everything known about it: the fate of a call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OperationView {
    pub operation: OperationRecord,
    pub request_body: serde_json::Value,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub superseded_by: Option<OperationId>,
    pub events: Vec<super::LedgerEvent>,
    pub evidence: Vec<Evidence>,
    /// Read from the archive: retention moved this settled operation of a
    /// terminal run out of the live tables (`leasegate ops archive`).
    #[serde(default)]
    pub archived: bool,
}

/// How many operations are `unknown`, and for how long the oldest has been.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UnknownSummary {
    pub count: i64,
    pub oldest_operation_id: Option<OperationId>,
    /// Seconds since the oldest unknown operation last changed (database clock).
    pub oldest_age_seconds: Option<f64>,
}
