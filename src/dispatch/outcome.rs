//! What a claimed call's end writes: its answer settled (or, where the
//! provider said nothing was done, the claim released), or its failure
//! recorded — released as provably unsent, or marked unknown. Shared by a
//! claim's execution (`execute`) and a followed task's end (`tasks`).
//!
//! Crash points: before either write commits the row stays `dispatching`
//! until its claim expires into `unknown`; an answer the ledger cannot take
//! yet is kept in the process (`keeper`).

use std::time::Duration;

use serde_json::{Value, json};
use tracing::Instrument;

use super::call::{CallError, CallReply, OperationNote};
use super::keeper::{self, Fact};
use crate::adapter::{ToolAdapter, ToolAnswer, UpstreamDelivery, UpstreamError};
use crate::ledger::{
    DispatchClaim, Ledger, LedgerError, MarkUnknown, MarkUnknownOutcome, ReleaseUnsentOutcome,
    SettleOutcome, Settlement, UnknownBy, UnknownCause, WalPosition,
};

/// A request that got no answer: released back to `prepared` when nothing
/// provably left (`attempts` tries), else marked unknown under the claim.
/// The agent hears "not sent" only after the release committed.
pub(super) async fn record_failure(
    ledger: &Ledger,
    dispatch_owner: &str,
    claim: DispatchClaim,
    failure: UpstreamError,
    attempt: u32,
) -> Result<(CallReply, Option<WalPosition>), CallError> {
    if failure.delivery() == UpstreamDelivery::NotSent {
        // Proof that no byte left: the operation goes back to prepared (the
        // same operation id may be sent again) instead of unknown.
        let evidence = json!({"error": failure.to_string(), "attempts": attempt});
        match ledger
            .operation_release_unsent(&claim, &evidence)
            .instrument(tracing::info_span!("ledger.operation_release_unsent"))
            .await
        {
            Ok(ReleaseUnsentOutcome::Released { .. }) => {
                metrics::counter!("tool_operation_not_sent_total").increment(1);
                tracing::warn!(error = %crate::logfield::clip_display(&failure), "nothing was sent: the operation is prepared again");
                return Err(CallError::NotSent {
                    operation_id: claim.operation_id,
                    reason: failure.to_string(),
                });
            }
            // The ledger could not take the proof: it is kept and written
            // when the ledger is back (marking the claim unknown now would
            // only make that write stale).
            Err(error) if keep_not_sent(ledger, &claim, &evidence, &error) => {
                tracing::warn!(error = %crate::logfield::clip_display(&failure), ledger = %crate::logfield::clip_display(&error),
                    "nothing was sent, but the ledger cannot record it yet: kept until it can");
                return Ok((
                    CallReply::Unknown {
                        operation_id: claim.operation_id,
                        reason: format!(
                            "{failure}; nothing was sent, but the ledger could not record that yet ({}): \
                             leasegate records it as soon as the ledger takes it and the operation is prepared again — call again",
                            error.summary()
                        ),
                    },
                    None,
                ));
            }
            // Moved on (or the ledger refused): fall through to unknown,
            // which the claim's expiry reaches anyway.
            Ok(other) => {
                tracing::warn!(error = %crate::logfield::clip_display(&failure), outcome = ?other, "releasing an unsent claim found it moved on");
            }
            Err(error) => {
                tracing::warn!(error = %crate::logfield::clip_display(&failure), ledger = %crate::logfield::clip_display(&error), "releasing an unsent claim failed");
            }
        }
    }
    let (cause, evidence) = match &failure {
        UpstreamError::TimedOut(after) => (
            UnknownCause::TimedOut,
            json!({"error": failure.to_string(), "timeout_ms": after.as_millis() as u64}),
        ),
        UpstreamError::NotSent(reason) => (
            UnknownCause::SendError,
            json!({"error": reason, "not_sent": true, "attempts": attempt}),
        ),
        other => (UnknownCause::SendError, json!({"error": other.to_string()})),
    };
    // If we crash here the row stays dispatching; when the claim expires it
    // becomes unknown all the same.
    let outcome = ledger
        .operation_mark_unknown(MarkUnknown {
            claim: &claim,
            by: UnknownBy::ClaimHolder,
            actor: dispatch_owner,
            cause,
            evidence: &evidence,
        })
        .instrument(tracing::info_span!("ledger.operation_mark_unknown"))
        .await;
    let reason = match outcome {
        Ok(MarkUnknownOutcome::MarkedUnknown { .. }) => {
            metrics::counter!("tool_operation_unknown_total", "cause" => cause.as_str())
                .increment(1);
            tracing::warn!(error = %crate::logfield::clip_display(&failure), "no answer from the upstream: operation is unknown");
            failure.to_string()
        }
        Ok(MarkUnknownOutcome::ClaimStillLive(found) | MarkUnknownOutcome::StaleClaim(found)) => {
            format!(
                "{failure}; the operation had already moved on (it is {} now)",
                found.status
            )
        }
        Ok(MarkUnknownOutcome::NotFound) => {
            format!("{failure}; the operation is no longer on record")
        }
        // The claim stays dispatching and expires into unknown: the agent is
        // told unknown either way, never "not sent".
        Err(error) => {
            tracing::warn!(error = %crate::logfield::clip_display(&error), "recording a failure failed");
            format!(
                "{failure}; recording it failed ({}): the claim will expire into unknown",
                error.summary()
            )
        }
    };
    Ok((
        CallReply::Unknown {
            operation_id: claim.operation_id,
            reason,
        },
        None,
    ))
}

/// The remote id an adapter points at in a tool answer.
pub fn remote_id_of(pointer: Option<&str>, answer: &Value) -> Option<String> {
    pointer.and_then(|pointer| {
        answer
            .get("structuredContent")
            .and_then(|s| s.pointer(pointer))
            .map(|v| match v {
                // A text column cannot hold U+0000; a remote id never needs it.
                Value::String(s) => s.replace('\0', "\u{FFFD}"),
                other => other.to_string(),
            })
    })
}

/// How often settle is tried in place before the answer is kept for the
/// background (`keeper`) and the agent hears `unknown`.
const SETTLE_ATTEMPTS: u32 = 4;

pub(super) async fn settle(
    ledger: &Ledger,
    claim: &DispatchClaim,
    adapter: &ToolAdapter,
    answer: ToolAnswer,
) -> Result<(CallReply, Option<WalPosition>), CallError> {
    if adapter.says_nothing_was_done(&answer) {
        // The provider documents this error as "nothing was done": the
        // operation stays sendable under the same id, not failed_final.
        let evidence = json!({"provider_said_nothing_was_done": answer.result});
        match ledger
            .operation_release_unsent(claim, &evidence)
            .instrument(tracing::info_span!("ledger.operation_release_unsent"))
            .await
        {
            Ok(ReleaseUnsentOutcome::Released { operation, .. }) => {
                metrics::counter!("tool_operation_not_sent_total").increment(1);
                let reply = CallReply::Answer {
                    result: answer.result,
                    is_error: true,
                    operation: OperationNote {
                        operation_id: operation.operation_id,
                        status: operation.status,
                        replayed: false,
                        waited: false,
                        remarks: Default::default(),
                    },
                };
                return Ok((reply, None));
            }
            Err(error) if keep_not_sent(ledger, claim, &evidence, &error) => {
                let reply = CallReply::Unknown {
                    operation_id: claim.operation_id.clone(),
                    reason: format!(
                        "the tool said nothing was done, but the ledger could not record that yet ({}): \
                         leasegate records it as soon as the ledger takes it — call again",
                        error.summary()
                    ),
                };
                return Ok((reply, None));
            }
            // Moved on, or the ledger refused: record the answer as usual.
            _ => {}
        }
    }
    let remote_id = remote_id_of(adapter.remote_id_pointer.as_deref(), &answer.result);
    let settlement = if answer.is_error {
        Settlement::FailedFinal
    } else {
        Settlement::Succeeded
    };
    // If we crash before this commits, the side effect exists and the row is
    // dispatching: the claim expires into unknown, and evidence converges it.
    let mut attempt = 1;
    let (outcome, sampled) = loop {
        match ledger
            .operation_settle_acknowledged(claim, settlement, remote_id.as_deref(), &answer.result)
            .instrument(tracing::info_span!(
                "ledger.operation_settle",
                attempt,
                settlement = settlement.as_str()
            ))
            .await
        {
            Ok(settled) => break settled,
            Err(error) if attempt < SETTLE_ATTEMPTS && error.is_transient() => {
                tracing::warn!(attempt, error = %crate::logfield::clip_display(&error), "settle failed after the tool answered; retrying");
                tokio::time::sleep(Duration::from_millis(200 * u64::from(attempt))).await;
                attempt += 1;
            }
            Err(error) => {
                // The request was sent and answered: whatever the ledger
                // says now, the agent hears "unknown", never "not sent".
                metrics::counter!("tool_operation_unknown_total", "cause" => "settle_failed")
                    .increment(1);
                let kept = keeper::keep(
                    ledger.clone(),
                    claim.clone(),
                    Fact::Answer {
                        settlement,
                        remote_id: remote_id.clone(),
                        result: answer.result.clone(),
                    },
                    &error,
                );
                let reason = if kept {
                    tracing::warn!(error = %crate::logfield::clip_display(&error), "the tool answered but the ledger cannot record it yet: the answer is kept until it can");
                    format!(
                        "the tool answered but the ledger could not record it yet ({}); \
                         leasegate keeps the answer and records it as soon as the ledger takes it — call again for the outcome",
                        error.summary()
                    )
                } else {
                    tracing::error!(error = %crate::logfield::clip_display(&error), "the tool answered but settling failed: the operation will turn unknown");
                    format!(
                        "the tool answered but the ledger could not record it ({}); the outcome is being reconciled",
                        error.summary()
                    )
                };
                let reply = CallReply::Unknown {
                    operation_id: claim.operation_id.clone(),
                    reason,
                };
                return Ok((reply, None));
            }
        }
    };
    match outcome {
        SettleOutcome::Settled(record) => Ok((
            CallReply::Answer {
                result: answer.result,
                is_error: answer.is_error,
                operation: OperationNote {
                    operation_id: record.operation_id,
                    status: record.status,
                    replayed: false,
                    waited: false,
                    remarks: Default::default(),
                },
            },
            sampled,
        )),
        // An earlier try committed before its connection broke.
        SettleOutcome::KeptAsEvidence { found, .. }
            if attempt > 1
                && keeper::settled_by_this_claim(
                    claim,
                    settlement,
                    found.status,
                    found.revision,
                ) =>
        {
            Ok((
                CallReply::Answer {
                    result: answer.result,
                    is_error: answer.is_error,
                    operation: OperationNote {
                        operation_id: found.operation_id,
                        status: found.status,
                        replayed: false,
                        waited: false,
                        remarks: Default::default(),
                    },
                },
                sampled,
            ))
        }
        SettleOutcome::KeptAsEvidence { found, .. } => Ok((
            CallReply::Unknown {
                operation_id: found.operation_id,
                reason: format!(
                    "the answer came after the claim lapsed (operation is {}); it is kept as evidence",
                    found.status
                ),
            },
            sampled,
        )),
        SettleOutcome::NotFound => Err(CallError::Ledger(LedgerError::Protocol {
            call: "operation_settle",
            detail: format!("operation {} vanished", claim.operation_id),
        })),
        SettleOutcome::NotClaimed(_) => Err(CallError::Ledger(LedgerError::Protocol {
            call: "operation_settle",
            detail: format!(
                "operation {} has no claim of {} at revision {} on record",
                claim.operation_id, claim.dispatch_owner, claim.revision
            ),
        })),
    }
}

/// Keeps a "nothing was sent" proof the ledger could not take, to be
/// written when it can (`keeper`); whether it was kept.
fn keep_not_sent(
    ledger: &Ledger,
    claim: &DispatchClaim,
    evidence: &Value,
    error: &LedgerError,
) -> bool {
    keeper::keep(
        ledger.clone(),
        claim.clone(),
        Fact::NotSent {
            evidence: evidence.clone(),
        },
        error,
    )
}
