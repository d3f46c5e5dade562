//! The operator acts — resolve an unknown operation, start its same-key
//! retries over, cancel a run — written once for both faces: the JSON API
//! (`operations`, `runs`) and the console's forms (`console::forms`). Each
//! act is its input checks, its one ledger call as the database role
//! `leasegate_operator` ([`OperatorLedger`]: the proxy's role cannot), and
//! its outcome; the callers decide only when to check (the API before its
//! ownership reads, the console after its form token and revision) and how
//! to say the outcome (JSON or a page).
//!
//! # Invariants
//!
//! 1. Nothing is written unless the act reaches its one ledger call: a
//!    process without an operator ledger is refused
//!    ([`ActError::NoOperatorRole`]) before it.
//! 2. Every act carries the audited actor and, for resolve and retry, the
//!    note the checks require; the ledger keeps both in `ledger_events`.
//!
//! Each act is one ledger call (one short transaction): if the process
//! dies before it nothing was written; after it, the change and its event
//! are in the ledger.

use serde_json::Value;

use super::error::{ApiError, ErrorCode};
use super::state::OperatorLedger;
use crate::adapter::SharedDirectory;
use crate::adapter::retry_budget_matters;
use crate::dispatch::recorded_tool;
use crate::intent::OperationId;
use crate::ledger::{
    Applied, Converge, ConvergeEvidence, ConvergeOutcome, Fenced, LedgerError, OperationStatus,
    RetryResetOutcome, RunId, Settlement,
};

/// Why an act did not reach the ledger, or what the ledger said instead
/// of an outcome.
#[derive(Debug)]
pub(super) enum ActError {
    /// This process cannot act as `leasegate_operator`: why, and the fix
    /// (`OperatorLedger::ready`'s message). Nothing was written.
    NoOperatorRole(String),
    /// A retry was asked where none can happen (its tool's capability, or
    /// no upstream offers it): why, and what to do instead. Nothing was
    /// written.
    NothingToRetry(String),
    /// The ledger call failed (unreachable, outcome unknown, bad input).
    Ledger(LedgerError),
}

impl From<LedgerError> for ActError {
    fn from(error: LedgerError) -> Self {
        ActError::Ledger(error)
    }
}

/// The JSON API's answer: 503 `role_not_granted`, or the ledger error's.
impl From<ActError> for ApiError {
    fn from(error: ActError) -> Self {
        match error {
            ActError::NoOperatorRole(message) => ApiError::new(ErrorCode::RoleNotGranted, message),
            ActError::NothingToRetry(message) => ApiError::new(ErrorCode::NothingToRetry, message),
            ActError::Ledger(error) => ApiError::from(error),
        }
    }
}

/// The settlement a resolution asks for: `succeeded` or `failed_final`,
/// nothing else.
pub(super) fn settlement(outcome: &str) -> Option<Settlement> {
    match outcome {
        "succeeded" => Some(Settlement::Succeeded),
        "failed_final" => Some(Settlement::FailedFinal),
        _ => None,
    }
}

/// The note an act requires (why), trimmed; `None` when there is none.
pub(super) fn note(note: &str) -> Option<&str> {
    Some(note.trim()).filter(|note| !note.is_empty())
}

/// A resolution of an unknown operation by an operator.
pub(super) struct Resolution<'a> {
    pub operation_id: &'a OperationId,
    /// The revision the resolution was decided on: the ledger's
    /// compare-and-swap answers `Conflict` when the row moved on.
    pub expected_revision: i64,
    pub settlement: Settlement,
    pub remote_id: Option<&'a str>,
    pub result: Option<&'a Value>,
    /// The audited actor.
    pub actor: &'a str,
    pub note: &'a str,
    /// What is kept as the operator's evidence besides the note.
    pub evidence: &'a Value,
}

/// Resolves an unknown operation: settles it with the operator's evidence
/// and event.
pub(super) async fn resolve(
    operator: &OperatorLedger,
    resolution: Resolution<'_>,
) -> Result<ConvergeOutcome, ActError> {
    let ledger = operator.ready().map_err(ActError::NoOperatorRole)?;
    Ok(ledger
        .operation_converge(Converge {
            operation_id: resolution.operation_id,
            expected_revision: resolution.expected_revision,
            settlement: resolution.settlement,
            remote_id: resolution.remote_id,
            result: resolution.result,
            kind: ConvergeEvidence::Operator,
            actor: resolution.actor,
            note: Some(resolution.note),
            evidence: resolution.evidence,
        })
        .await?)
}

/// Starts an unknown operation's same-key retry budget over — refused
/// ([`ActError::NothingToRetry`]) when `tools` (the serving process's
/// directory; `None`: not judged) shows that no retry can follow.
pub(super) async fn retry(
    operator: &OperatorLedger,
    tools: Option<&SharedDirectory>,
    operation_id: &OperationId,
    actor: &str,
    note: &str,
) -> Result<RetryResetOutcome, ActError> {
    let ledger = operator.ready().map_err(ActError::NoOperatorRole)?;
    if let Some(tools) = tools
        && let Some(operation) = ledger.operation_record(operation_id).await?
        && operation.status == OperationStatus::Unknown
    {
        let tool = recorded_tool(tools, &operation);
        if let Err(why) = retry_budget_matters(tool.as_ref().map(|t| &t.adapter)) {
            return Err(ActError::NothingToRetry(format!(
                "operation {operation_id} cannot be retried: {why}. Nothing was written"
            )));
        }
    }
    Ok(ledger
        .operation_reconcile_reset(operation_id, actor, note)
        .await?)
}

/// Cancels a run (pending or running) without its lease; its planned
/// operations are cancelled with it.
pub(super) async fn cancel(
    operator: &OperatorLedger,
    run: RunId,
    actor: &str,
    reason: Option<&str>,
) -> Result<Fenced<Applied>, ActError> {
    let ledger = operator.ready().map_err(ActError::NoOperatorRole)?;
    Ok(ledger.run_cancel(run, actor, reason).await?)
}
