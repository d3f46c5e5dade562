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
    /// Every claim the operation had, oldest first: who took it, when,
    /// under which lease epoch, with which dispatch number, and how it
    /// ended. A claim writes no event of its own; its facts are on the
    /// operation row while it is in flight and in the event that ends it
    /// (see [`OperationClaim`]).
    #[serde(default)]
    pub claims: Vec<OperationClaim>,
    pub evidence: Vec<Evidence>,
    /// Read from the archive: retention moved this settled operation of a
    /// terminal run out of the live tables (`leasegate ops archive`).
    #[serde(default)]
    pub archived: bool,
}

/// One claim of an operation (a dispatch handed out). Read from the event
/// that ended it (its `detail.claim`), from the operation row while it is
/// in flight, or, for a claim taken before the ledger kept claims on the
/// row (migration 0017), from the claim's own `dispatching` event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OperationClaim {
    /// The dispatcher (leasegate process) that held the claim.
    pub dispatch_owner: Option<String>,
    /// The lease owner whose call it was; `None` for the outbox's claims,
    /// which hold no lease.
    pub worker: Option<String>,
    pub at: Option<DateTime<Utc>>,
    /// The lease epoch the claim was taken under (`None`: the outbox).
    pub epoch: Option<i64>,
    /// Which dispatch of the operation this was (1 for the first). `None`
    /// for a claim recorded only by its own event.
    pub dispatch_count: Option<i64>,
    /// The operation's revision under the claim: what its settle is guarded by.
    pub revision: Option<i64>,
    pub dispatch_until: Option<DateTime<Utc>>,
    /// The status the claim ended in (`succeeded`, `failed_final`,
    /// `unknown`, `prepared` when released unsent); `None` while in flight.
    pub ended: Option<String>,
    /// The event that ended it.
    pub ended_by_event: Option<i64>,
}

/// The claims of an operation from its events and, for a claim in flight,
/// the row's claim columns (`live`: status dispatching and `claimed_at`
/// set). Pure, so the rule is unit-tested without a database.
pub(super) fn claims_of(
    events: &[super::LedgerEvent],
    live: Option<OperationClaim>,
) -> Vec<OperationClaim> {
    let text = |v: &serde_json::Value| v.as_str().map(str::to_owned);
    let time = |v: &serde_json::Value| serde_json::from_value::<DateTime<Utc>>(v.clone()).ok();
    let mut claims: Vec<OperationClaim> = Vec::new();
    for e in events.iter().filter(|e| e.subject == "operation") {
        if e.to_status == "dispatching" {
            // A claim of its own event (taken before migration 0017).
            claims.push(OperationClaim {
                dispatch_owner: e.actor.clone(),
                worker: text(&e.detail["worker"]),
                at: Some(e.at),
                epoch: e.epoch,
                dispatch_count: None,
                revision: e.revision,
                dispatch_until: time(&e.detail["dispatch_until"]),
                ended: None,
                ended_by_event: None,
            });
            continue;
        }
        if e.from_status.as_deref() != Some("dispatching") {
            continue;
        }
        let facts = &e.detail["claim"];
        if facts.is_object() && !facts["at"].is_null() {
            claims.push(OperationClaim {
                dispatch_owner: text(&facts["dispatch_owner"]),
                worker: text(&facts["worker"]),
                at: time(&facts["at"]),
                epoch: facts["epoch"].as_i64(),
                dispatch_count: facts["dispatch_count"].as_i64(),
                revision: facts["revision"].as_i64(),
                dispatch_until: time(&facts["dispatch_until"])
                    .or_else(|| time(&e.detail["dispatch_until"])),
                ended: Some(e.to_status.clone()),
                ended_by_event: Some(e.event_id),
            });
        } else if let Some(open) = claims.iter_mut().rev().find(|c| c.ended.is_none()) {
            open.ended = Some(e.to_status.clone());
            open.ended_by_event = Some(e.event_id);
            if open.dispatch_count.is_none() {
                open.dispatch_count = facts["dispatch_count"].as_i64();
            }
        }
    }
    // The row and the events are read apart: a claim that ended in
    // between is in both, and counts once, as ended.
    if let Some(live) = live
        && !claims
            .iter()
            .any(|c| c.revision == live.revision && c.dispatch_owner == live.dispatch_owner)
    {
        claims.push(live);
    }
    claims
}

/// How many operations are `unknown`, and for how long the oldest has been.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UnknownSummary {
    pub count: i64,
    pub oldest_operation_id: Option<OperationId>,
    /// Seconds since the oldest unknown operation last changed (database clock).
    pub oldest_age_seconds: Option<f64>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::RunId;
    use serde_json::json;

    fn event(
        id: i64,
        from: Option<&str>,
        to: &str,
        actor: &str,
        detail: serde_json::Value,
    ) -> super::super::LedgerEvent {
        super::super::LedgerEvent {
            event_id: id,
            at: DateTime::from_timestamp(1_700_000_000 + id, 0).unwrap(),
            run_id: RunId::from_uuid(uuid::Uuid::nil()),
            operation_id: Some("op".into()),
            subject: "operation".into(),
            from_status: from.map(str::to_owned),
            to_status: to.into(),
            actor_kind: "dispatcher".into(),
            actor: Some(actor.into()),
            epoch: Some(7),
            revision: Some(id),
            detail,
        }
    }

    #[test]
    fn claims_come_from_the_events_that_end_them_the_row_and_legacy_claim_events() {
        let at = "1999-01-02T03:04:05Z";
        let facts = |owner: &str, n: i64, rev: i64| {
            json!({"dispatch_owner": owner, "worker": "w", "at": at, "epoch": 3,
                   "dispatch_count": n, "revision": rev, "inline": true})
        };
        let events = vec![
            // A claim taken before the row kept claims: its own event, ended by
            // an unknown whose claim object has no time.
            event(
                1,
                None,
                "dispatching",
                "p0",
                json!({"worker": "w0", "dispatch_until": at}),
            ),
            event(
                2,
                Some("dispatching"),
                "unknown",
                "p0",
                json!({"claim": {"at": null, "dispatch_count": 1}}),
            ),
            // Not a claim's end.
            event(3, Some("unknown"), "prepared", "r", json!({})),
            // A claim that wrote no event, ended by a not-sent release.
            event(
                4,
                Some("dispatching"),
                "prepared",
                "p1",
                json!({"claim": facts("p1", 2, 4)}),
            ),
            // Settled: the one event of the claim.
            event(
                5,
                Some("dispatching"),
                "succeeded",
                "p2",
                json!({"claim": facts("p2", 3, 5)}),
            ),
        ];
        let live = OperationClaim {
            dispatch_owner: Some("p3".into()),
            worker: None,
            at: None,
            epoch: None,
            dispatch_count: Some(4),
            revision: Some(9),
            dispatch_until: None,
            ended: None,
            ended_by_event: None,
        };
        let claims = claims_of(&events, Some(live.clone()));
        let summary: Vec<_> = claims
            .iter()
            .map(|c| {
                (
                    c.dispatch_owner.as_deref(),
                    c.worker.as_deref(),
                    c.epoch,
                    c.dispatch_count,
                    c.revision,
                    c.ended.as_deref(),
                    c.ended_by_event,
                )
            })
            .collect();
        assert_eq!(
            summary,
            vec![
                (
                    Some("p0"),
                    Some("w0"),
                    Some(7),
                    Some(1),
                    Some(1),
                    Some("unknown"),
                    Some(2)
                ),
                (
                    Some("p1"),
                    Some("w"),
                    Some(3),
                    Some(2),
                    Some(4),
                    Some("prepared"),
                    Some(4)
                ),
                (
                    Some("p2"),
                    Some("w"),
                    Some(3),
                    Some(3),
                    Some(5),
                    Some("succeeded"),
                    Some(5)
                ),
                (Some("p3"), None, None, Some(4), Some(9), None, None),
            ]
        );
        assert_eq!(claims[0].dispatch_until, Some(at.parse().unwrap()));
        // The row read before the settle, its events after: one claim, ended.
        let settled_meanwhile = OperationClaim {
            dispatch_owner: Some("p2".into()),
            revision: Some(5),
            ..live
        };
        assert_eq!(claims_of(&events, Some(settled_meanwhile)), claims[..3]);
        assert_eq!(claims[2].at, Some(at.parse().unwrap()));
        assert_eq!(claims_of(&events[..0], None), vec![]);
    }
}
