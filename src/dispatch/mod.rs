//! The inline path of a side-effecting call: claim → call → settle.
//!
//! ```text
//!  register+claim (1 tx) ──▶ upstream call (no tx open) ──▶ settle | mark unknown (1 tx)
//! ```
//!
//! # Invariants
//!
//! - Nothing reaches the upstream without a claim committed under the
//!   caller's valid lease (ledger invariant 1; invariant 5 of docs/architecture.md: no
//!   transaction is open during the call).
//! - The upstream call runs in a task owned by leasegate, not by the agent's
//!   request: if the agent disconnects, the answer is still recorded.
//! - A timeout or a transport error after the request may have left is
//!   `unknown`, never `failed_final`. An error proven to happen before
//!   anything was sent (`UpstreamDelivery::NotSent`) is retried while the
//!   claim is valid; in the end the claim's holder releases the operation
//!   back to `prepared` with the proof kept as `not_sent` evidence, and the
//!   agent hears "not sent" (the same operation id goes out on its re-call,
//!   or by the outbox after a backoff).
//! - Once the tool has answered, the agent never hears "not sent": a settle
//!   that fails is retried within the claim, and then answered `unknown`.
//!
//! # Crash points
//!
//! - After the claim commits, before or during the call: the row stays
//!   `dispatching` until its claim expires; then it becomes `unknown` (by
//!   the next call of the same intent here, or the reconciler).
//! - After the upstream answered, before settle commits: the same, and the
//!   side effect exists; the tool's capability decides how it converges.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::adapter::{
    AgentSink, OperationIdPlacement, ResolvedTool, ToolAdapter, ToolAnswer, Upstream, UpstreamCall,
    UpstreamDelivery, UpstreamError,
};
use crate::durability::Gate;
use crate::intent::{Intent, IntentError, OperationId, StepRef};
use crate::ledger::{
    DispatchClaim, Fenced, InlineClaim, LeaseClaim, Ledger, LedgerError, MarkUnknown,
    MarkUnknownOutcome, OperationRecord, OperationStatus, Rejection, ReleaseUnsentOutcome,
    SettleOutcome, Settlement, ToolRoute, UnknownBy, UnknownCause, WalPosition,
};
use crate::policy::{Policy, StepIdentity};

/// The `_meta` key under which the upstream always receives the operation id.
pub const OPERATION_ID_META: &str = "dev.leasegate/operation_id";

/// One side-effecting call as the front received it.
#[derive(Debug)]
pub struct CallRequest {
    pub lease: LeaseClaim,
    pub step: Option<StepRef>,
    /// The name the agent called (namespaced); part of the digest.
    pub exposed_name: String,
    /// Where it goes and what the tool promises.
    pub tool: ResolvedTool,
    pub arguments: Map<String, Value>,
    pub context: CallContext,
}

/// What travels with a call besides its arguments: `_meta` to pass on
/// (trace context), where the upstream's messages for the agent go, and the
/// agent's cancellation.
#[derive(Debug, Default)]
pub struct CallContext {
    pub meta: Map<String, Value>,
    /// `None`: nobody listens (background work).
    pub agent: Option<AgentSink>,
    /// Fired when the agent explicitly cancels; forwarded upstream.
    pub cancel: CancellationToken,
}

/// A fresh identity for one leasegate process: every claim it takes carries
/// it, and its liveness is renewed under it (`Ledger::process_heartbeat`).
pub fn process_owner() -> String {
    format!(
        "leasegate-{}-{}",
        std::process::id(),
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    )
}

/// The operation a reply is about, as the agent sees it in `_meta`.
#[derive(Debug, Clone, PartialEq)]
pub struct OperationNote {
    pub operation_id: OperationId,
    pub status: OperationStatus,
    pub replayed: bool,
}

impl OperationNote {
    pub fn to_json(&self) -> Value {
        json!({
            "operation_id": self.operation_id.as_str(),
            "status": self.status.as_str(),
            "replayed": self.replayed,
        })
    }
}

/// What the agent gets back.
#[derive(Debug, Clone, PartialEq)]
pub enum CallReply {
    /// The upstream's answer (fresh or recorded).
    Answer {
        result: Value,
        is_error: bool,
        operation: OperationNote,
    },
    /// The outcome is unknown: reported as a tool result with isError and
    /// the operation named, never as a failure.
    Unknown {
        operation_id: OperationId,
        reason: String,
    },
}

/// Why a call was refused; nothing reached the upstream.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// The front names how to send one (its transport's words).
    #[error("this tool has side effects and needs a lease")]
    LeaseRequired,
    /// A malformed lease or step in `_meta` or the headers.
    #[error("{0}")]
    BadRequestMeta(String),
    #[error(
        "{0}; stop this worker: another worker owns the run now, or the lease expired (re-acquire to continue)"
    )]
    LeaseLost(Box<Rejection>),
    /// The current owner and epoch without that lease's secret token.
    #[error(
        "{0}; send the lease token you were given when the lease was taken (header \
         Leasegate-Lease-Token, or token in _meta \"dev.leasegate/lease\")"
    )]
    LeaseTokenInvalid(Box<Rejection>),
    /// Lease mode `session`: the session's lease is gone.
    #[error(
        "the session lease of task {task:?} is gone ({cause}): this leasegate stopped renewing its \
         share of the task's lease (was it paused?) and the task's other holders moved on, or it \
         could not renew it. Nothing was sent; start a new session (restart the agent's \
         leasegate) to take the task back"
    )]
    SessionLost { task: String, cause: String },
    #[error("{0}")]
    RunTerminal(Box<Rejection>),
    #[error("run not found: create the run and acquire its lease first")]
    RunNotFound,
    #[error("{0}")]
    IntentConflict(Box<Rejection>),
    #[error("operation {operation_id} is in progress under another claim; ask again later")]
    InProgress { operation_id: OperationId },
    #[error("operation {operation_id} was cancelled (its run was cancelled or its plan changed)")]
    Cancelled { operation_id: OperationId },
    /// Provably nothing reached the tool; the operation is `prepared` again
    /// under the same id.
    #[error(
        "operation {operation_id} was not sent: {reason}. Nothing reached the tool; call again \
         with the same step to send it (leasegate's outbox also sends it once the upstream is back)"
    )]
    NotSent {
        operation_id: OperationId,
        reason: String,
    },
    /// The front names how to send one (its transport's words).
    #[error("policy requires an explicit step")]
    StepRequired,
    #[error(
        "arguments are {size} bytes, above the policy limit of {limit} (policy max_arguments_bytes; the request was not recorded or sent)"
    )]
    ArgumentsTooLarge { size: usize, limit: usize },
    #[error(transparent)]
    Intent(#[from] IntentError),
    #[error("ledger: {0}")]
    Ledger(#[from] LedgerError),
    /// The durability contract is not met, or a lossy failover is
    /// unresolved (`crate::durability`): nothing was registered or sent.
    #[error("durability hold: {reason}. Nothing was registered or sent; call again later")]
    Held { reason: String },
}

/// Runs side-effecting calls through the ledger.
pub struct Dispatcher<U> {
    ledger: Ledger,
    upstream: Arc<U>,
    policy: Policy,
    /// The tenant this proxy serves; runs of other tenants are not found.
    tenant: String,
    /// Unique per process: the claims this process takes.
    dispatch_owner: String,
    /// Asked before anything is registered; told what was acknowledged.
    gate: Arc<Gate>,
}

impl<U> Dispatcher<U> {
    /// The ledger this dispatcher writes to.
    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    /// This process's identity on the claims it takes.
    pub fn owner(&self) -> &str {
        &self.dispatch_owner
    }
}

impl<U: Upstream> Dispatcher<U> {
    /// A dispatcher whose claims carry `dispatch_owner` (the process's
    /// identity, see [`process_owner`]).
    pub fn new(
        ledger: Ledger,
        upstream: Arc<U>,
        policy: Policy,
        tenant: String,
        dispatch_owner: String,
    ) -> Self {
        Self {
            ledger,
            upstream,
            policy,
            tenant,
            dispatch_owner,
            gate: Arc::new(Gate::unchecked()),
        }
    }

    /// Dispatch under `gate` (the process's durability gate).
    pub fn with_gate(mut self, gate: Arc<Gate>) -> Self {
        self.gate = gate;
        self
    }

    /// Registers, claims, calls and settles one side-effecting call.
    ///
    /// Refused before anything is registered while the durability gate
    /// holds. An answer is sampled into the gate's acknowledged high-water
    /// before the agent hears it — from the settle's (or the replay's) own
    /// statement when it carries the position, so a gated call costs two
    /// round trips and a replay one; a ledger error makes the gate re-check.
    pub async fn call(&self, request: CallRequest) -> Result<CallReply, CallError> {
        if self.policy.step_identity == StepIdentity::Explicit && request.step.is_none() {
            return Err(CallError::StepRequired);
        }
        let size = serialized_len(&request.arguments);
        if size > self.policy.max_arguments_bytes {
            return Err(CallError::ArgumentsTooLarge {
                size,
                limit: self.policy.max_arguments_bytes,
            });
        }
        if let Some(reason) = self.gate.admit(&self.ledger).await {
            return Err(CallError::Held { reason });
        }
        // The high-water before this call's reading began (Gate::acknowledged_at).
        let baseline = self.gate.baseline();
        let reply = self.call_unchecked(request).await;
        match &reply {
            Ok((_, sampled)) => {
                self.gate
                    .acknowledged_at(&self.ledger, baseline, sampled.clone())
                    .await
            }
            // The connection broke: the next one may reach another server.
            Err(CallError::Ledger(
                error @ (LedgerError::Unavailable { .. } | LedgerError::OutcomeUnknown { .. }),
            )) => self.gate.suspect(&error.to_string()),
            Err(_) => {}
        }
        reply.map(|(reply, _)| reply)
    }

    /// The reply, and where the WAL stood after the write it reports, when
    /// the call's own statement read it.
    async fn call_unchecked(
        &self,
        request: CallRequest,
    ) -> Result<(CallReply, Option<WalPosition>), CallError> {
        let arguments = Value::Object(request.arguments);
        let mut intent = Intent::identify(
            &self.tenant,
            request.lease.run_id,
            request.step,
            &request.exposed_name,
            &arguments,
            self.policy.integers,
        )?;
        // As sent: the ledger stores what the policy keeps of it (masked,
        // digest only, sealed; `LedgerOptions::bodies`).
        intent.request_body = arguments.clone();
        let claim_ttl_ms = i64::try_from(self.policy.claim_ttl.as_millis()).unwrap_or(i64::MAX);
        let route = ToolRoute {
            upstream: request.tool.upstream.clone(),
            tool: request.tool.tool.clone(),
        };
        // Runs of other tenants are not found (their existence is not this
        // tenant's business; operation ids derive from the run's tenant):
        // judged by the same statement.
        let (outcome, sampled) = self
            .ledger
            .operation_register_claim_in(
                Some(&self.tenant),
                &request.lease,
                &intent,
                Some(&route),
                &self.dispatch_owner,
                claim_ttl_ms,
            )
            .instrument(tracing::info_span!("ledger.operation_register_claim"))
            .await?;
        match outcome {
            Fenced::Rejected(rejection) => Err(refusal(rejection)),
            Fenced::Applied(InlineClaim::Existing(record)) => {
                // The position covers the row as this statement read it: only
                // an answer from that row (not one polled later) may use it.
                let as_read = matches!(
                    record.status,
                    OperationStatus::Succeeded
                        | OperationStatus::FailedFinal
                        | OperationStatus::Unknown
                );
                let reply = self.existing(record).await?;
                Ok((reply, sampled.filter(|_| as_read)))
            }
            Fenced::Applied(InlineClaim::Claimed { claim, .. }) => {
                let Value::Object(arguments) = arguments else {
                    unreachable!("built from an object above")
                };
                // From here on the call belongs to leasegate, not to the agent.
                let task = tokio::spawn(
                    execute_claim_acknowledged(
                        self.ledger.clone(),
                        self.upstream.clone(),
                        self.dispatch_owner.clone(),
                        claim,
                        Claimed {
                            tool: request.tool,
                            arguments,
                            context: request.context,
                        },
                    )
                    .in_current_span(),
                );
                task.await.map_err(|e| {
                    CallError::Ledger(LedgerError::Protocol {
                        call: "dispatch",
                        detail: format!("dispatch task failed: {e}"),
                    })
                })?
            }
        }
    }

    /// The intent exists: replay, wait for it, or report it.
    async fn existing(&self, mut record: OperationRecord) -> Result<CallReply, CallError> {
        let deadline = tokio::time::Instant::now() + self.policy.in_flight_wait;
        let mut pause = Duration::from_millis(25);
        loop {
            match record.status {
                OperationStatus::Succeeded | OperationStatus::FailedFinal => {
                    return Ok(CallReply::Answer {
                        is_error: record.status == OperationStatus::FailedFinal,
                        result: record.result.clone().unwrap_or(Value::Null),
                        operation: OperationNote {
                            operation_id: record.operation_id.clone(),
                            status: record.status,
                            replayed: true,
                        },
                    });
                }
                OperationStatus::Unknown => {
                    return Ok(CallReply::Unknown {
                        operation_id: record.operation_id,
                        reason:
                            "the outcome of an earlier attempt is unknown; it is being reconciled"
                                .into(),
                    });
                }
                OperationStatus::Cancelled => {
                    return Err(CallError::Cancelled {
                        operation_id: record.operation_id,
                    });
                }
                OperationStatus::Prepared | OperationStatus::Dispatching => {}
            }
            // A claim whose deadline passed, or whose holder is provably
            // gone, will never be settled by its holder: turn it unknown
            // (the database judges both).
            let claim = record.claim();
            let lapsed = match &claim {
                Some(claim) if claim.until <= chrono::Utc::now() => true,
                Some(claim) => self.ledger.process_gone(&claim.dispatch_owner).await?,
                None => false,
            };
            if let Some(claim) = claim
                && lapsed
                && let MarkUnknownOutcome::MarkedUnknown { operation, .. } = self
                    .ledger
                    .operation_mark_unknown(MarkUnknown {
                        claim: &claim,
                        by: UnknownBy::Reconciler,
                        actor: &self.dispatch_owner,
                        cause: UnknownCause::TimedOut,
                        evidence: &json!({"reason": "claim expired or its holder is gone; found by a later call"}),
                    })
                    .await?
            {
                record = operation;
                continue;
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(CallError::InProgress {
                    operation_id: record.operation_id,
                });
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(250));
            record = match self.ledger.operation_record(&record.operation_id).await? {
                Some(found) => found,
                None => {
                    return Err(CallError::InProgress {
                        operation_id: record.operation_id,
                    });
                }
            };
        }
    }
}

/// The length of `value` as compact JSON, without building the text.
fn serialized_len(value: &Map<String, Value>) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0 += bytes.len();
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    match serde_json::to_writer(&mut count, value) {
        Ok(()) => count.0,
        Err(_) => usize::MAX,
    }
}

fn refusal(rejection: Rejection) -> CallError {
    match rejection {
        Rejection::LeaseLost { .. } => CallError::LeaseLost(Box::new(rejection)),
        Rejection::LeaseTokenInvalid { .. } => CallError::LeaseTokenInvalid(Box::new(rejection)),
        Rejection::Terminal { .. } | Rejection::WrongStatus { .. } | Rejection::Conflict { .. } => {
            CallError::RunTerminal(Box::new(rejection))
        }
        Rejection::NotFound => CallError::RunNotFound,
        Rejection::IntentConflict { .. } => CallError::IntentConflict(Box::new(rejection)),
    }
}

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

/// A call's outcome as a trace records it (span attribute `outcome`).
pub fn trace_outcome(result: Result<&CallReply, &CallError>) -> &'static str {
    match result {
        Ok(CallReply::Answer {
            operation,
            is_error,
            ..
        }) => match operation.status {
            OperationStatus::Succeeded | OperationStatus::FailedFinal => operation.status.as_str(),
            // Provider said nothing was done: prepared again.
            _ if *is_error => "not_sent",
            other => other.as_str(),
        },
        Ok(CallReply::Unknown { .. }) => "unknown",
        Err(CallError::NotSent { .. }) => "not_sent",
        Err(_) => "refused",
    }
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
    let call = UpstreamCall {
        upstream: tool.upstream,
        tool: tool.tool,
        arguments,
        meta,
        timeout: tool.adapter.timeout,
        agent: context.agent,
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
            // Moved on (or the ledger failed): fall through to unknown,
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
            actor: &dispatch_owner,
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
            format!("{failure}; recording it failed ({error}): the claim will expire into unknown")
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

/// How long settle keeps trying while the ledger is unavailable (within
/// the claim): the tool has answered, so the answer must not be dropped.
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
        if let Ok(ReleaseUnsentOutcome::Released { operation, .. }) = ledger
            .operation_release_unsent(claim, &evidence)
            .instrument(tracing::info_span!("ledger.operation_release_unsent"))
            .await
        {
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
        // Moved on, or the ledger failed: record the answer as usual.
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
            Err(error)
                if attempt < SETTLE_ATTEMPTS
                    && error.is_retryable()
                    && chrono::Utc::now() < claim.until =>
            {
                tracing::warn!(attempt, error = %crate::logfield::clip_display(&error), "settle failed after the tool answered; retrying");
                tokio::time::sleep(Duration::from_millis(200 * u64::from(attempt))).await;
                attempt += 1;
            }
            Err(error) => {
                // The request was sent and answered: whatever the ledger
                // says now, the agent hears "unknown", never "not sent".
                tracing::error!(error = %crate::logfield::clip_display(&error), "the tool answered but settling failed: the operation will turn unknown");
                metrics::counter!("tool_operation_unknown_total", "cause" => "settle_failed")
                    .increment(1);
                let reply = CallReply::Unknown {
                    operation_id: claim.operation_id.clone(),
                    reason: format!(
                        "the tool answered but the ledger could not record it ({error}); the outcome is being reconciled"
                    ),
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
    }
}
