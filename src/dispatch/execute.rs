//! A claimed operation's execution: the request leaves under the claim
//! (the operation id injected where the adapter says), each attempt is
//! classified by what it proves, and the answer is settled — or the claim
//! released as provably unsent, or the operation marked unknown. Shared by
//! the inline path (`Dispatcher::call`) and the outbox.
//!
//! Crash points are those of the module above: a row stays `dispatching`
//! until its claim expires, whatever happened to the request.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value, json};
use tracing::Instrument;

use super::call::{
    CallContext, CallError, CallReply, OPERATION_ID_META, OperationNote, trace_outcome,
};
use super::keeper::{self, Fact};
use super::rounds;
use crate::adapter::{
    OperationIdPlacement, ResolvedTool, ToolAdapter, ToolAnswer, Upstream, UpstreamCall,
    UpstreamDelivery, UpstreamError,
};
use crate::intent::OperationId;
use crate::ledger::{
    DispatchClaim, Ledger, LedgerError, MarkUnknown, MarkUnknownOutcome, ReleaseUnsentOutcome,
    SettleOutcome, Settlement, UnknownBy, UnknownCause, WalPosition,
};

/// How often a provably unsent request is tried again within its claim.
const NOT_SENT_ATTEMPTS: u32 = 3;

/// A claimed operation, ready to send: where, with what, in which context.
#[derive(Debug)]
pub struct Claimed {
    pub tool: ResolvedTool,
    /// The request's arguments, before the operation id is injected.
    pub arguments: Map<String, Value>,
    pub context: CallContext,
}

/// Puts the operation id where the adapter says, and always in `_meta`.
pub fn inject_operation_id(
    operation_id: &OperationId,
    placement: &OperationIdPlacement,
    arguments: &mut Map<String, Value>,
    meta: &mut Map<String, Value>,
) {
    meta.insert(OPERATION_ID_META.to_owned(), json!(operation_id.as_str()));
    match placement {
        OperationIdPlacement::Argument(name) => {
            arguments.insert(name.clone(), json!(operation_id.as_str()));
        }
        OperationIdPlacement::Meta(key) => {
            meta.insert(key.clone(), json!(operation_id.as_str()));
        }
        OperationIdPlacement::Header(name) => {
            meta.insert(
                crate::adapter::HTTP_HEADERS_META.to_owned(),
                json!({ name.as_str(): operation_id.as_str() }),
            );
        }
        OperationIdPlacement::Omitted => {}
    }
}

/// Sends a claimed operation and settles it (or marks it unknown): the
/// inline path and the background dispatcher share it.
pub async fn execute_claim<U: Upstream>(
    ledger: Ledger,
    upstream: Arc<U>,
    dispatch_owner: String,
    claim: DispatchClaim,
    claimed: Claimed,
) -> Result<CallReply, CallError> {
    execute_claim_acknowledged(ledger, upstream, dispatch_owner, claim, claimed)
        .await
        .map(|(reply, _)| reply)
}

/// [`execute_claim`], and where the WAL stood after the settle committed
/// (read by the settle's own statement), for the durability gate.
pub async fn execute_claim_acknowledged<U: Upstream>(
    ledger: Ledger,
    upstream: Arc<U>,
    dispatch_owner: String,
    claim: DispatchClaim,
    claimed: Claimed,
) -> Result<(CallReply, Option<WalPosition>), CallError> {
    let span = tracing::info_span!("dispatch", operation_id = %claim.operation_id, revision = claim.revision,
        dispatch_owner = %crate::logfield::clip(&claim.dispatch_owner), tool = %crate::logfield::clip(&claimed.tool.tool),
        upstream = %crate::logfield::clip(&claimed.tool.upstream), outcome = tracing::field::Empty);
    let result = send_and_settle(ledger, upstream, dispatch_owner, claim, claimed)
        .instrument(span.clone())
        .await;
    span.record(
        "outcome",
        trace_outcome(result.as_ref().map(|(reply, _)| reply)),
    );
    result
}

/// The `_meta` of one attempt: the upstream sees this attempt's span as its
/// parent when traces are on (`telemetry`, invariant 2), else the agent's
/// own trace context as it came.
fn attempt_meta(meta: &Map<String, Value>, attempt: &tracing::Span) -> Map<String, Value> {
    let mut meta = meta.clone();
    if let Some((traceparent, tracestate)) = crate::telemetry::upstream_trace_context(attempt) {
        meta.insert("traceparent".to_owned(), Value::String(traceparent));
        match tracestate {
            Some(state) => meta.insert("tracestate".to_owned(), Value::String(state)),
            None => meta.remove("tracestate"),
        };
    }
    meta
}

async fn send_and_settle<U: Upstream>(
    ledger: Ledger,
    upstream: Arc<U>,
    dispatch_owner: String,
    claim: DispatchClaim,
    claimed: Claimed,
) -> Result<(CallReply, Option<WalPosition>), CallError> {
    let Claimed {
        tool,
        mut arguments,
        context,
    } = claimed;
    let mut meta = context.meta;
    inject_operation_id(
        &claim.operation_id,
        &tool.adapter.placement,
        &mut arguments,
        &mut meta,
    );
    // The rounds of a call that asks its agent something are evidence.
    let (agent, rounds) = match context.agent {
        Some(agent) => {
            let (agent, flush) = rounds::recorded(ledger.clone(), claim.clone(), agent);
            (Some(agent), Some(flush))
        }
        None => (None, None),
    };
    let call = UpstreamCall {
        upstream: tool.upstream,
        tool: tool.tool,
        arguments,
        meta,
        timeout: tool.adapter.timeout,
        agent,
        cancel: context.cancel,
    };
    let adapter = tool.adapter;
    let mut attempt = 1;
    let failure = loop {
        // A process paused between its claim and the send (SIGSTOP, a long
        // GC-like stall, a frozen VM) must not send once its claim has
        // lapsed: another process may own the operation by now. Nothing has
        // left, so this is a provable "not sent".
        if chrono::Utc::now() >= claim.until {
            break UpstreamError::NotSent(
                "the dispatch claim lapsed before the request was sent (was this process paused?)"
                    .into(),
            );
        }
        let span = tracing::info_span!("upstream.attempt", attempt, upstream = %crate::logfield::clip(&call.upstream),
            tool = %crate::logfield::clip(&call.tool), outcome = tracing::field::Empty);
        let mut sent = call.clone();
        sent.meta = attempt_meta(&call.meta, &span);
        let answer = upstream.call(sent).instrument(span.clone()).await;
        if let Some(rounds) = &rounds {
            rounds.flush().await;
        }
        span.record(
            "outcome",
            match &answer {
                Ok(answer) if answer.is_error => "error_answer",
                Ok(_) => "answered",
                Err(error) => match error.delivery() {
                    UpstreamDelivery::Rejected => "rejected",
                    UpstreamDelivery::NotSent => "not_sent",
                    UpstreamDelivery::MaybeSent => "maybe_sent",
                },
            },
        );
        match answer {
            // After the agent cancelled, a tool's error answer ("cancelled")
            // says nothing about whether it acted: unknown, never failed.
            Ok(answer) if answer.is_error && call.cancel.is_cancelled() => {
                break UpstreamError::MaybeSent(
                    "cancelled by the agent; the tool then answered with an error".into(),
                );
            }
            Ok(answer) => return settle(&ledger, &claim, &adapter, answer).await,
            Err(error) => match error.delivery() {
                UpstreamDelivery::Rejected => {
                    // By protocol nothing executed: a final failure, recorded
                    // and replayed.
                    let UpstreamError::Refused { code, message, .. } = &error else {
                        unreachable!("only a refusal is rejected")
                    };
                    let result = json!({
                        "content": [{"type": "text", "text": format!("upstream refused the call: {message}")}],
                        "isError": true,
                        "structuredContent": {"upstream_error": {"code": code, "message": message}},
                    });
                    let answer = ToolAnswer {
                        is_error: true,
                        result,
                    };
                    return settle(&ledger, &claim, &adapter, answer).await;
                }
                UpstreamDelivery::NotSent
                    if attempt < NOT_SENT_ATTEMPTS
                        && chrono::Utc::now() + call.timeout < claim.until =>
                {
                    tracing::warn!(attempt, error = %crate::logfield::clip_display(&error), "upstream unreachable, nothing sent; retrying");
                    tokio::time::sleep(Duration::from_millis(100 * u64::from(attempt))).await;
                    attempt += 1;
                }
                UpstreamDelivery::NotSent | UpstreamDelivery::MaybeSent => break error,
            },
        }
    };
    record_failure(&ledger, &dispatch_owner, claim, failure, attempt).await
}

/// A request that got no answer: released back to `prepared` when nothing
/// provably left (`attempts` tries), else marked unknown under the claim.
/// The agent hears "not sent" only after the release committed.
async fn record_failure(
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
            Err(error)
                if keeper::keep(
                    ledger.clone(),
                    claim.clone(),
                    Fact::NotSent {
                        evidence: evidence.clone(),
                    },
                    &error,
                ) =>
            {
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

async fn settle(
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
                    },
                };
                return Ok((reply, None));
            }
            Err(error)
                if keeper::keep(
                    ledger.clone(),
                    claim.clone(),
                    Fact::NotSent {
                        evidence: evidence.clone(),
                    },
                    &error,
                ) =>
            {
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
