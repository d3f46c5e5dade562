//! The MCP server agents talk to: `tools/list` from the aggregated catalog,
//! `tools/call` through the ledger (side-effecting) or straight through
//! (read-only).
//!
//! The caller's lease comes per call in `_meta["dev.leasegate/lease"]` =
//! `{run_id, owner, epoch}`, or from the HTTP headers `Leasegate-Run-Id`,
//! `Leasegate-Owner`, `Leasegate-Epoch`; `_meta` wins. The step comes from
//! `_meta["dev.leasegate/step"]` = `{step_id, effect_version}`.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CancelledNotificationParam, ErrorCode,
    Implementation, ListToolsResult, PaginatedRequestParams, ProgressNotificationParam, RequestId,
    ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::{NotificationContext, RequestContext};
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::convert::{self, codes};
use super::upstream::{CatalogEntry, Upstreams};
use crate::adapter::{Progress, ToolDirectory, Upstream, UpstreamCall, UpstreamError};
use crate::dispatch::{CallError, CallRequest, Dispatcher};
use crate::intent::StepRef;
use crate::ledger::{LeaseClaim, RunId};

pub const LEASE_META: &str = "dev.leasegate/lease";
pub const STEP_META: &str = "dev.leasegate/step";
pub const RUN_ID_HEADER: &str = "leasegate-run-id";
pub const OWNER_HEADER: &str = "leasegate-owner";
pub const EPOCH_HEADER: &str = "leasegate-epoch";

struct State {
    catalog: BTreeMap<String, CatalogEntry>,
    /// Exposed name → upstream, upstream tool and adapter.
    directory: Arc<ToolDirectory>,
    /// Tools per `tools/list` page.
    page_size: usize,
    /// The catalog's tools in name order, for pagination.
    tools: Vec<Tool>,
    upstreams: Arc<Upstreams>,
    dispatcher: Dispatcher<Upstreams>,
    /// Request ids the agent cancelled explicitly (as opposed to going away).
    explicit_cancels: Mutex<HashSet<String>>,
}

/// The MCP front. Cheap to clone: rmcp builds one per session or request.
#[derive(Clone)]
pub struct Front {
    state: Arc<State>,
}

impl Front {
    /// `directory` is the resolution of `catalog` (see
    /// `upstream::directory`), shared with the background loops.
    pub fn new(
        catalog: BTreeMap<String, CatalogEntry>,
        directory: Arc<ToolDirectory>,
        page_size: usize,
        upstreams: Arc<Upstreams>,
        dispatcher: Dispatcher<Upstreams>,
    ) -> Self {
        let tools = catalog.values().map(|entry| entry.tool.clone()).collect();
        Self {
            state: Arc::new(State {
                catalog,
                directory,
                page_size,
                tools,
                upstreams,
                dispatcher,
                explicit_cancels: Mutex::new(HashSet::new()),
            }),
        }
    }
}

fn request_key(id: &RequestId) -> String {
    serde_json::to_string(id).unwrap_or_default()
}

fn invalid_params(message: impl Into<String>) -> McpError {
    McpError::new(ErrorCode(codes::INVALID_PARAMS), message.into(), None)
}

/// The caller's lease: `_meta` first, then the HTTP headers.
fn lease_of(context: &RequestContext<RoleServer>) -> Result<LeaseClaim, CallError> {
    if let Some(value) = context.meta.get(LEASE_META) {
        let bad = |what: &str| CallError::BadRequestMeta(format!("_meta \"{LEASE_META}\": {what}"));
        let run_id = value
            .get("run_id")
            .and_then(Value::as_str)
            .ok_or_else(|| bad("run_id must be a UUID string"))?;
        let owner = value
            .get("owner")
            .and_then(Value::as_str)
            .ok_or_else(|| bad("owner must be a string"))?;
        let epoch = value
            .get("epoch")
            .and_then(Value::as_i64)
            .ok_or_else(|| bad("epoch must be an integer"))?;
        let run_id: RunId = run_id
            .parse()
            .map_err(|e: crate::ids::InvalidRunId| bad(&e.to_string()))?;
        return Ok(LeaseClaim {
            run_id,
            owner: owner.to_owned(),
            epoch,
        });
    }
    let Some(parts) = context.extensions.get::<http::request::Parts>() else {
        return Err(CallError::LeaseRequired);
    };
    let header = |name: &str| {
        parts
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    };
    match (
        header(RUN_ID_HEADER),
        header(OWNER_HEADER),
        header(EPOCH_HEADER),
    ) {
        (None, None, None) => Err(CallError::LeaseRequired),
        (Some(run_id), Some(owner), Some(epoch)) => {
            let bad = |what: String| CallError::BadRequestMeta(what);
            let run_id: RunId = run_id.parse().map_err(|e: crate::ids::InvalidRunId| {
                bad(format!("header Leasegate-Run-Id: {e}"))
            })?;
            let epoch: i64 = epoch.parse().map_err(|_| {
                bad(format!(
                    "header Leasegate-Epoch: {epoch:?} is not an integer"
                ))
            })?;
            Ok(LeaseClaim {
                run_id,
                owner: owner.to_owned(),
                epoch,
            })
        }
        _ => Err(CallError::BadRequestMeta(
            "headers Leasegate-Run-Id, Leasegate-Owner and Leasegate-Epoch go together".into(),
        )),
    }
}

fn step_of(context: &RequestContext<RoleServer>) -> Result<Option<StepRef>, CallError> {
    let Some(value) = context.meta.get(STEP_META) else {
        return Ok(None);
    };
    let bad = |what: &str| CallError::BadRequestMeta(format!("_meta \"{STEP_META}\": {what}"));
    let step_id = value
        .get("step_id")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("step_id must be a string"))?;
    let effect_version = match value.get("effect_version") {
        None => 1,
        Some(v) => v
            .as_i64()
            .and_then(|n| i32::try_from(n).ok())
            .ok_or_else(|| bad("effect_version must be a positive integer"))?,
    };
    Ok(Some(StepRef {
        step_id: step_id.to_owned(),
        effect_version,
    }))
}

/// `_meta` worth passing upstream: W3C trace context.
fn passthrough_meta(context: &RequestContext<RoleServer>) -> Map<String, Value> {
    let mut meta = Map::new();
    for key in ["traceparent", "tracestate"] {
        if let Some(value) = context.meta.get(key) {
            meta.insert(key.to_owned(), value.clone());
        }
    }
    meta
}

impl Front {
    /// Forwards upstream progress to the agent, if it asked for progress.
    /// The forwarder ends once every sender is dropped (the upstream call is
    /// over); awaiting it before answering keeps progress ahead of the result,
    /// which matters on a stateless HTTP stream that closes with the result.
    fn progress_sink(
        &self,
        context: &RequestContext<RoleServer>,
    ) -> (
        Option<tokio::sync::mpsc::UnboundedSender<Progress>>,
        Option<tokio::task::JoinHandle<()>>,
    ) {
        let Some(token) = context.meta.get_progress_token() else {
            return (None, None);
        };
        let (sink, mut updates) = tokio::sync::mpsc::unbounded_channel::<Progress>();
        let peer = context.peer.clone();
        let forwarder = tokio::spawn(async move {
            while let Some(update) = updates.recv().await {
                let mut params = ProgressNotificationParam::new(token.clone(), update.progress);
                params.total = update.total;
                params.message = update.message;
                if peer.notify_progress(params).await.is_err() {
                    break;
                }
            }
        });
        (Some(sink), Some(forwarder))
    }

    /// A token fired when the agent cancels the request. `explicit_only`:
    /// ignore the agent merely going away (side-effecting calls continue,
    /// owned by leasegate).
    fn cancel_token(
        &self,
        context: &RequestContext<RoleServer>,
        explicit_only: bool,
    ) -> CancellationToken {
        let token = CancellationToken::new();
        let (watched, fire, state, key) = (
            context.ct.clone(),
            token.clone(),
            self.state.clone(),
            request_key(&context.id),
        );
        let done = token.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = watched.cancelled() => {
                    let explicit = state.explicit_cancels.lock().map(|mut set| set.remove(&key)).unwrap_or(false);
                    if explicit || !explicit_only {
                        fire.cancel();
                    }
                }
                _ = done.cancelled() => {}
            }
        });
        token
    }

    async fn read_only(
        &self,
        upstream: String,
        upstream_tool: String,
        request: CallToolRequestParams,
        context: &RequestContext<RoleServer>,
        timeout: std::time::Duration,
    ) -> Result<CallToolResult, McpError> {
        let cancel = self.cancel_token(context, false);
        let (progress, forwarder) = self.progress_sink(context);
        let call = UpstreamCall {
            upstream: upstream.clone(),
            tool: upstream_tool,
            arguments: request.arguments.unwrap_or_default(),
            meta: passthrough_meta(context),
            timeout,
            progress,
            cancel: cancel.clone(),
        };
        let answer = self.state.upstreams.call(call).await;
        cancel.cancel();
        if let Some(forwarder) = forwarder {
            let _ = forwarder.await;
        }
        match answer {
            Ok(answer) => serde_json::from_value(answer.result).map_err(|e| {
                McpError::internal_error(format!("upstream answer unreadable: {e}"), None)
            }),
            Err(UpstreamError::Refused { code, message }) => {
                Err(McpError::new(ErrorCode(code), message, None))
            }
            Err(other) => Err(McpError::internal_error(
                format!("upstream {upstream}: {other}"),
                None,
            )),
        }
    }
}

impl ServerHandler for Front {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("leasegate", env!("CARGO_PKG_VERSION")))
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let start = match request.and_then(|r| r.cursor) {
            None => 0,
            Some(cursor) => cursor
                .parse::<usize>()
                .ok()
                .filter(|n| *n <= self.state.tools.len())
                .ok_or_else(|| invalid_params(format!("invalid cursor {cursor:?}")))?,
        };
        let end = (start + self.state.page_size).min(self.state.tools.len());
        let mut page = ListToolsResult::with_all_items(self.state.tools[start..end].to_vec());
        if end < self.state.tools.len() {
            page.next_cursor = Some(end.to_string());
        }
        Ok(page)
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.state.catalog.get(name).map(|entry| entry.tool.clone())
    }

    async fn on_cancelled(
        &self,
        notification: CancelledNotificationParam,
        _context: NotificationContext<RoleServer>,
    ) {
        if let Some(id) = notification.request_id
            && let Ok(mut set) = self.state.explicit_cancels.lock()
        {
            // Entries leave when their request's watcher sees the cancel; a
            // cancel for a request already answered would stay: bound the set.
            if set.len() >= 10_000 {
                set.clear();
            }
            set.insert(request_key(&id));
        }
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let name = request.name.to_string();
        let resolved = self
            .state
            .directory
            .get(&name)
            .cloned()
            .ok_or_else(|| invalid_params(format!("unknown tool {name:?}: see tools/list")))?;
        let adapter = resolved.adapter;

        if adapter.read_only {
            let result = self
                .read_only(
                    resolved.upstream,
                    resolved.tool,
                    request,
                    &context,
                    adapter.timeout,
                )
                .await?;
            return Ok(CallToolResponse::Complete(result));
        }

        let lease = lease_of(&context).map_err(|e| convert::error_from_call(&e))?;
        let step = step_of(&context).map_err(|e| convert::error_from_call(&e))?;
        let (progress, forwarder) = self.progress_sink(&context);
        let cancel = self.cancel_token(&context, true);
        let call = CallRequest {
            lease,
            step,
            exposed_name: name,
            upstream: resolved.upstream,
            tool: resolved.tool,
            arguments: request.arguments.unwrap_or_default(),
            adapter,
            meta: passthrough_meta(&context),
            progress,
            cancel: cancel.clone(),
        };
        // W3C trace context: the trace id goes into every log line of this call.
        let trace_id = context
            .meta
            .get("traceparent")
            .and_then(Value::as_str)
            .and_then(|tp| tp.split('-').nth(1))
            .unwrap_or("")
            .to_owned();
        let span = tracing::info_span!("tools/call", tool = %call.exposed_name, run_id = %call.lease.run_id,
            owner = %call.lease.owner, epoch = call.lease.epoch, trace_id = %trace_id);
        let outcome = self
            .state
            .dispatcher
            .call(call)
            .instrument(span.clone())
            .await;
        // The call is over: release the cancel watcher.
        cancel.cancel();
        let _entered = span.enter();
        if let Some(forwarder) = forwarder {
            let _ = forwarder.await;
        }
        match outcome {
            Ok(reply) => Ok(CallToolResponse::Complete(convert::result_from_reply(
                reply,
            ))),
            Err(error) => {
                tracing::info!(error = %error, "call refused");
                Err(convert::error_from_call(&error))
            }
        }
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
pub fn lease_meta(lease: &LeaseClaim) -> Value {
    json!({ "run_id": lease.run_id.to_string(), "owner": lease.owner, "epoch": lease.epoch })
}
