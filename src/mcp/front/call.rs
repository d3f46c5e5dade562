//! One `tools/call`: a read-only tool straight to its upstream, a
//! side-effecting one through the ledger under the caller's lease — given
//! per call, or the process's session lease, or the lease of an
//! `Idempotency-Key` — and the refusals that come before anything is
//! registered or sent (no lease, a capability the agent did not declare).

use super::cancel::{CallWatch, cancelled_by_the_agent};
use super::request::{CallCredentials, invalid_params, session_refusal};
use super::tally::{Replayed, Tally};
use super::tasks::agent_follows_tasks;
use super::{Front, ToolCall, upstream_failure};
use crate::adapter::{PeerError, ToolReply, Upstream, UpstreamCall};
use crate::dispatch::{CallContext, CallError, CallReply, CallRequest};
use crate::ids::{MAX_IDEMPOTENCY_KEY_LEN, MAX_TASK_LEN, check_identifier};
use crate::intent::StepRef;
use crate::ledger::LeaseClaim;
use crate::mcp::convert::{self};
use crate::mcp::wire::*;
use rmcp::model::{CallToolRequestParams, CallToolResponse, CallToolResult, ErrorCode};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer};
use serde_json::{Value, json};
use tracing::Instrument;

impl Front {
    /// The upstream call of a read-only tool, as a future that owns
    /// everything it needs (an stateless MCP call may outlive the request
    /// that started it; see [`Front::drive_modern`]).
    pub(super) fn read_only(
        &self,
        resolved: crate::adapter::ResolvedTool,
        request: CallToolRequestParams,
        context: &RequestContext<RoleServer>,
        credentials: CallCredentials<'_>,
        agent: crate::adapter::AgentSink,
        watch: &CallWatch,
    ) -> ToolCall {
        let tally = Tally::new(context, "read_only", &request.name);
        let upstream = resolved.upstream;
        let cancel = watch.cancel.clone();
        self.watch_request(
            context,
            &CallWatch {
                explicit_only: false,
                ..watch.clone()
            },
        );
        let call = UpstreamCall {
            upstream: upstream.clone(),
            tool: resolved.tool,
            arguments: request.arguments.unwrap_or_default(),
            meta: credentials.meta,
            timeout: resolved.adapter.timeout,
            agent: Some(agent),
            cancel: cancel.clone(),
            tasks: agent_follows_tasks(context),
        };
        let front = self.clone();
        Box::pin(async move {
            // The agent's cancel answers at once (the upstream is told, and
            // its late answer is dropped): no late result.
            let answer = tokio::select! {
                biased;
                answer = front.state.upstreams.call(call) => answer,
                _ = cancel.cancelled() => {
                    tally.ended("cancelled", Replayed::No);
                    return Err(cancelled_by_the_agent());
                }
            };
            cancel.cancel();
            let outcome = match &answer {
                Ok(ToolReply::Task(_)) => "task",
                Ok(ToolReply::Answer(answer)) if answer.is_error => "tool_error",
                Ok(_) => "answered",
                Err(_) => "upstream_error",
            };
            tally.ended(outcome, Replayed::No);
            tracing::debug!(upstream = %crate::logfield::clip(&upstream), outcome, "read-only call");
            match answer {
                Ok(ToolReply::Answer(mut answer)) => {
                    front.expose_uris(&upstream, &mut answer.result);
                    convert::tool_result(answer.result).map(CallToolResponse::Complete)
                }
                Ok(ToolReply::Task(started)) => {
                    convert::create_task_result(started.handle).map(CallToolResponse::Task)
                }
                Err(error) => Err(upstream_failure(&upstream, error)),
            }
        })
    }
}

pub(super) fn refusal(message: String) -> PeerError {
    PeerError {
        code: ErrorCode::INVALID_REQUEST.0,
        message,
        data: None,
    }
}

/// Refuses a request the agent did not declare it can answer.
pub(super) fn check_capability(
    method: &str,
    params: &Value,
    capabilities: &rmcp::model::ClientCapabilities,
) -> Result<(), PeerError> {
    let missing = match method {
        "sampling/createMessage" => capabilities.sampling.is_none().then_some("sampling"),
        "roots/list" => capabilities.roots.is_none().then_some("roots"),
        "elicitation/create" => {
            let url_mode = params.get("mode").and_then(Value::as_str) == Some("url");
            match &capabilities.elicitation {
                None => Some("elicitation"),
                Some(e) if url_mode && e.url.is_none() => Some("elicitation.url"),
                _ => None,
            }
        }
        _ => None,
    };
    match missing {
        Some(capability) => Err(refusal(format!(
            "the agent did not declare the {capability} capability"
        ))),
        None => Ok(()),
    }
}

impl Front {
    /// A side-effecting call through the ledger, as a future that owns
    /// everything it needs.
    pub(super) fn gated(
        &self,
        resolved: crate::adapter::ResolvedTool,
        request: CallToolRequestParams,
        context: &RequestContext<RoleServer>,
        credentials: CallCredentials<'_>,
        agent: crate::adapter::AgentSink,
        watch: &CallWatch,
    ) -> Result<ToolCall, McpError> {
        let mut tally = Tally::new(context, "gated", &request.name);
        let name = request.name.to_string();
        let upstream = resolved.upstream.clone();
        let trace_id = credentials.trace_id().to_owned();
        // A tool with an output schema keeps its structured content exactly
        // as declared (`convert::OutcomeShown`); one not in the catalog too.
        let shown = convert::OutcomeShown {
            content: self.state.config.policy.outcome_in_content,
            structured: self
                .catalog()
                .entries
                .get(request.name.as_ref())
                .is_some_and(|entry| entry.tool.output_schema.is_none()),
        };
        let over_http = credentials.over_http;
        let started = credentials.arrived.unwrap_or_else(std::time::Instant::now);
        let CallCredentials {
            lease: own_lease,
            keyed,
            step,
            meta,
            traceparent,
            tracestate,
            ..
        } = credentials;
        let session_lease = self
            .session
            .lease
            .get()
            .or_else(|| self.state.session_lease.get());
        tally.mode = match (&own_lease, &keyed, session_lease) {
            (Err(CallError::LeaseRequired), Some(_), _) => "key",
            (Err(CallError::LeaseRequired), None, Some(_)) => "session",
            (Err(CallError::LeaseRequired), None, None) => "none",
            _ => "explicit",
        };
        // The run is known once a lease carries the call.
        let mut answered = Answered {
            run_id: String::new(),
            step_id: String::new(),
            effect_version: 1,
            tool: name.clone(),
            started,
        };
        let lease =
            match (own_lease, session_lease) {
                // A lease the agent sent wins; without one, its idempotency
                // key's (lease mode key), or the session's.
                (Err(CallError::LeaseRequired), _) if keyed.is_some() => {
                    Ok(keyed.clone().expect("checked"))
                }
                (Err(CallError::LeaseRequired), Some(session)) => session
                    .current()
                    .cloned()
                    .map_err(|cause| CallError::SessionLost {
                        task: session.task().to_owned(),
                        cause,
                    }),
                (lease, _) => lease,
            }
            .map_err(|error| {
                // Refused before the ledger saw it: counted beside the
                // ledger's own fence refusals.
                let reason = match &error {
                    CallError::LeaseRequired => "lease_missing",
                    CallError::SessionLost { .. } => "session_lost",
                    _ => "lease_malformed",
                };
                metrics::counter!("protected_write_rejected_total", "reason" => reason, "call" => "mcp_tools_call")
                    .increment(1);
                tally.refused(reason);
                answered.log("refused", Replayed::No, None, reason);
                match error {
                    CallError::LeaseRequired => {
                        self.lease_required(&name, &resolved, over_http)
                    }
                    other => convert::error_from_call(&other),
                }
            })?;
        answered.run_id = lease.run_id.to_string();
        let mut step = step.map_err(|error| {
            answered.log(
                "refused",
                Replayed::No,
                None,
                &crate::logfield::clip_display(&error).to_string(),
            );
            tally.refused_with(convert::error_from_call(&error))
        })?;
        if keyed.is_some() && step.is_none() && resolved.adapter.identity.is_none() {
            // The key stands for one request: one step per key's run. (A
            // tool with a declared identity derives its step from those
            // fields, in the run of the caller's identity scope.)
            step = Some(StepRef {
                step_id: KEY_STEP.to_owned(),
                effect_version: 1,
            });
        }
        if let Some(step) = &step {
            answered.step_id = step.step_id.clone();
            answered.effect_version = step.effect_version;
        }
        let cancel = watch.cancel.clone();
        self.watch_request(context, watch);
        let call = CallRequest {
            lease,
            lease_held_for_agent: matches!(tally.mode, "session" | "key"),
            step,
            exposed_name: name,
            tool: resolved,
            arguments: request.arguments.unwrap_or_default(),
            context: CallContext {
                meta,
                agent: Some(agent),
                cancel: cancel.clone(),
                gone: watch.gone.clone(),
                tasks: agent_follows_tasks(context).then(|| self.state.dispatcher.tasks().clone()),
            },
        };
        let span = tracing::info_span!("tools/call", tool = %crate::logfield::clip(&call.exposed_name), run_id = %call.lease.run_id,
            owner = %crate::logfield::clip(&call.lease.owner), epoch = call.lease.epoch, trace_id = %crate::logfield::clip(&trace_id),
            operation_id = tracing::field::Empty, outcome = tracing::field::Empty);
        // The agent's trace is this span's parent (`telemetry`).
        crate::telemetry::set_parent(&span, traceparent.as_deref(), tracestate.as_deref());
        let front = self.clone();
        Ok(Box::pin(async move {
            // The agent's cancel answers at once; the dispatch runs on in
            // its own task (`Dispatcher::call`) and records the outcome
            // (unknown, as the upstream may have acted).
            let outcome = tokio::select! {
                biased;
                outcome = front.state.dispatcher.call(call).instrument(span.clone()) => outcome,
                _ = cancel.cancelled() => {
                    tally.ended("cancelled", Replayed::No);
                    span.in_scope(|| answered.log("cancelled", Replayed::No, None,
                        "cancelled by the agent; its dispatch runs on and records the outcome"));
                    return Err(cancelled_by_the_agent());
                }
            };
            // The call is over: release the cancel watcher.
            cancel.cancel();
            let traced = crate::dispatch::trace_outcome(outcome.as_ref());
            let replayed = match &outcome {
                Ok(CallReply::Answer { operation, .. } | CallReply::Task { operation, .. }) => {
                    Replayed::of(operation)
                }
                _ => Replayed::No,
            };
            span.record("outcome", traced);
            let operation_id = match &outcome {
                Ok(CallReply::Answer { operation, .. } | CallReply::Task { operation, .. }) => {
                    Some(operation.operation_id.as_str().to_owned())
                }
                Ok(CallReply::Unknown { operation_id, .. })
                | Err(
                    CallError::InProgress { operation_id }
                    | CallError::Cancelled { operation_id }
                    | CallError::NotSent { operation_id, .. },
                ) => Some(operation_id.as_str().to_owned()),
                Ok(CallReply::Shown { .. }) | Err(_) => None,
            };
            if let Some(operation_id) = &operation_id {
                span.record("operation_id", operation_id.as_str());
            }
            // No guard held in this future: the span is entered for the
            // synchronous rest only.
            span.in_scope(|| match outcome {
                Ok(mut reply) => {
                    tally.ended(traced, replayed);
                    answered.log(traced, replayed, operation_id.as_deref(), "");
                    // Resource links in the (recorded) result name the
                    // upstream's URIs; the agent reads them under their
                    // exposed names.
                    if let CallReply::Answer { result, .. } = &mut reply {
                        front.expose_uris(&upstream, result);
                    }
                    convert::response_from_reply(reply, shown)
                }
                Err(error) => {
                    let answer = convert::error_from_call(&error);
                    if traced == "refused" {
                        tally.refused(super::tally::reason_of(&answer));
                    } else {
                        tally.ended(traced, Replayed::No);
                    }
                    // The agent hears the value; the log names only where
                    // it is (argument values never reach the log).
                    let detail = match &error {
                        CallError::Intent(crate::intent::IntentError::UnsafeInteger {
                            path,
                            ..
                        }) => format!("integer beyond ±2^53 at {}", crate::logfield::clip(path)),
                        _ => crate::logfield::clip_display(&error).to_string(),
                    };
                    answered.log(traced, Replayed::No, operation_id.as_deref(), &detail);
                    Err(answer)
                }
            })
        }))
    }
}

/// The one info line of a gated call (`gated call`): what the front knows
/// of it, and how long it took.
struct Answered {
    /// Empty until a lease carries the call.
    run_id: String,
    /// The agent's step, or empty when the ledger derives it from the request.
    step_id: String,
    effect_version: i32,
    tool: String,
    started: std::time::Instant,
}

impl Answered {
    fn log(&self, outcome: &str, replayed: Replayed, operation_id: Option<&str>, detail: &str) {
        let duration_ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        tracing::info!(
            operation_id = operation_id.unwrap_or(""),
            run_id = %self.run_id,
            step_id = %crate::logfield::clip(&self.step_id),
            effect_version = self.effect_version,
            tool = %crate::logfield::clip(&self.tool),
            outcome,
            replayed = replayed.as_str(),
            duration_ms,
            detail,
            "gated call"
        );
    }
}

impl Front {
    /// The -31001 answer for `name`: how to get a lease over this
    /// transport, and how to mark the tool read-only.
    /// Lease mode `session`: the lease a side-effecting call that brings
    /// none of its own is sent under, once this process's membership may
    /// register (`SessionLease::ready`). Over stdio the process's own; over
    /// HTTP the membership of the caller's principal for the task key (the
    /// `Leasegate-Task` header, else `[session] task`), kept for this MCP
    /// session. Without a task key the call goes on and is refused as
    /// needing a lease.
    pub(super) async fn begin_session_lease(
        &self,
        credentials: &CallCredentials<'_>,
    ) -> Result<(), McpError> {
        let config = &self.state.config;
        if config.lease.mode != crate::config::LeaseMode::Session || !credentials.brings_no_lease()
        {
            return Ok(());
        }
        let lease = match self
            .state
            .session_lease
            .get()
            .or_else(|| self.session.lease.get())
        {
            Some(lease) => lease.clone(),
            None => {
                if !credentials.over_http {
                    return Ok(());
                }
                let Some(task) = self.task_key(credentials)? else {
                    return Ok(());
                };
                let namespace = credentials.lease_namespace("session")?;
                let arrived = credentials.arrived.unwrap_or_else(std::time::Instant::now);
                self.session
                    .lease
                    .get_or_try_init(|| self.state.session_leases.get(namespace, &task, arrived))
                    .await
                    .map_err(|error| {
                        tracing::warn!(error = %crate::logfield::clip_display(&error), task = %crate::logfield::clip(&task), "the session lease could not begin");
                        session_refusal(&task, error)
                    })?
                    .clone()
            }
        };
        lease
            .ready()
            .await
            .map_err(|error| session_refusal(lease.task(), error))
    }

    /// Lease mode `key`: the lease of the run that stands for this call's
    /// idempotency key (`_meta`, else the `Idempotency-Key` header), when
    /// the call brings no lease of its own. `None`: no key, or not key mode.
    ///
    /// A tool with a declared identity (`identity_scope`) is not identified
    /// by the key, which an agent framework mints anew on every model turn:
    /// its calls go to the run of the caller's identity scope (the
    /// principal, and the task key when one is given), where the declared
    /// fields name the step.
    pub(super) async fn key_lease(
        &self,
        credentials: &CallCredentials<'_>,
        identity_scope: bool,
    ) -> Result<Option<LeaseClaim>, McpError> {
        let config = &self.state.config;
        if config.lease.mode != crate::config::LeaseMode::Key || !credentials.brings_no_lease() {
            return Ok(None);
        }
        let Some(key) = credentials.idempotency_key.clone()? else {
            return Ok(None);
        };
        check_identifier("idempotency key", &key, MAX_IDEMPOTENCY_KEY_LEN)
            .map_err(|e| invalid_params(e.to_string()))?;
        if key.starts_with(crate::agent_leases::RESERVED_KEY_PREFIX) {
            return Err(invalid_params(format!(
                "idempotency keys starting {:?} are leasegate's own; choose another key. \
                 Nothing was recorded or sent",
                crate::agent_leases::RESERVED_KEY_PREFIX
            )));
        }
        let key = if identity_scope {
            crate::agent_leases::identity_scope_key(self.task_key(credentials)?.as_deref())
        } else {
            key
        };
        let dispatcher = &self.state.dispatcher;
        crate::agent_leases::key_lease(
            dispatcher.ledger(),
            &self.state.key_leases,
            &config.tenant,
            credentials.lease_namespace("key")?,
            &key,
            dispatcher.owner(),
            i64::try_from(config.policy.claim_ttl.as_millis()).unwrap_or(i64::MAX),
            config.lease.key_retention,
        )
        .await
        .map(Some)
        .map_err(|error| match error {
            crate::agent_leases::SessionError::Ledger(inner) => {
                convert::error_from_call(&CallError::Ledger(inner))
            }
            other => invalid_params(other.to_string()),
        })
    }

    /// The caller's task key: the `Leasegate-Task` header, else the
    /// configuration's `[session] task`; checked as an identifier.
    fn task_key(&self, credentials: &CallCredentials<'_>) -> Result<Option<String>, McpError> {
        let task = credentials
            .task
            .clone()
            .or_else(|| self.state.config.session.task.clone());
        if let Some(task) = &task {
            check_identifier("Leasegate-Task", task, MAX_TASK_LEN)
                .map_err(|e| invalid_params(e.to_string()))?;
        }
        Ok(task)
    }

    pub(super) fn lease_required(
        &self,
        name: &str,
        resolved: &crate::adapter::ResolvedTool,
        over_http: bool,
    ) -> McpError {
        let read_only_hint = self
            .catalog()
            .entries
            .get(name)
            .and_then(|entry| entry.tool.annotations.as_ref())
            .and_then(|annotations| annotations.read_only_hint);
        convert::lease_required(&convert::LeaseRequired {
            tool: name,
            upstream: &resolved.upstream,
            upstream_tool: &resolved.tool,
            over_http,
            read_only_hint,
            trust_annotations: self
                .state
                .config
                .adapter(&resolved.upstream)
                .trust_annotations,
            lease_mode: self.state.config.lease.mode,
        })
    }
}

/// `{"operation_id", "status", "replayed"}` from a result's `_meta`, for clients.
pub fn operation_of(result: &CallToolResult) -> Option<Value> {
    result
        .meta
        .as_ref()
        .and_then(|meta| meta.get("dev.leasegate/operation").cloned())
}

/// The JSON of the lease `_meta` entry, for clients.
/// Carries the lease's token when the claim has one: hand it only to the
/// lease's holder.
pub fn lease_meta(lease: &LeaseClaim) -> Value {
    let mut meta =
        json!({ "run_id": lease.run_id.to_string(), "owner": lease.owner, "epoch": lease.epoch });
    if let Some(token) = &lease.token {
        meta["token"] = json!(token.expose());
    }
    meta
}
