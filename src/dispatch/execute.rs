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

use super::call::{CallContext, CallError, CallReply, OPERATION_ID_META, trace_outcome};
use super::outcome::{record_failure, settle};
use super::rounds;
use crate::adapter::{
    OperationIdPlacement, ResolvedTool, ToolAnswer, ToolReply, Upstream, UpstreamCall,
    UpstreamDelivery, UpstreamError,
};
use crate::intent::OperationId;
use crate::ledger::{DispatchClaim, Ledger, WalPosition};

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
    let followers = context.tasks;
    let call = UpstreamCall {
        upstream: tool.upstream,
        tool: tool.tool,
        arguments,
        meta,
        timeout: tool.adapter.timeout,
        agent,
        cancel: context.cancel,
        tasks: followers.is_some(),
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
                Ok(ToolReply::Task(_)) => "task",
                Ok(ToolReply::Answer(answer)) if answer.is_error => "error_answer",
                Ok(_) => "answered",
                Err(error) => match error.delivery() {
                    UpstreamDelivery::Rejected => "rejected",
                    UpstreamDelivery::NotSent => "not_sent",
                    UpstreamDelivery::MaybeSent => "maybe_sent",
                },
            },
        );
        match answer {
            Ok(ToolReply::Task(started)) => {
                let Some(followers) = followers else {
                    break ToolReply::Task(started)
                        .into_answer()
                        .expect_err("a task is no answer");
                };
                let reply = super::tasks::follow(super::tasks::Follower {
                    followers,
                    ledger,
                    upstream,
                    dispatch_owner,
                    claim,
                    adapter,
                    upstream_name: call.upstream,
                    started,
                })
                .await;
                return Ok((reply, None));
            }
            // After the agent cancelled, a tool's error answer ("cancelled")
            // says nothing about whether it acted: unknown, never failed.
            Ok(ToolReply::Answer(answer)) if answer.is_error && call.cancel.is_cancelled() => {
                break UpstreamError::MaybeSent(
                    "cancelled by the agent; the tool then answered with an error".into(),
                );
            }
            Ok(ToolReply::Answer(answer)) => {
                return settle(&ledger, &claim, &adapter, answer).await;
            }
            Err(error) => match error.delivery() {
                UpstreamDelivery::Rejected => {
                    // By protocol nothing executed: a final failure, recorded
                    // and replayed.
                    let UpstreamError::Refused { code, message, .. } = &error else {
                        unreachable!("only a refusal is rejected")
                    };
                    let answer = ToolAnswer::refused("upstream refused the call", *code, message);
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
