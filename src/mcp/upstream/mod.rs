//! MCP clients of the upstream tool servers (stdio children and Streamable
//! HTTP servers), and the tool catalog leasegate exposes.
//!
//! # Sessions
//!
//! Each upstream has **one** client session, shared by every agent and by
//! the background loops (a stdio upstream is one child process). What an
//! upstream sends is routed per request, never broadcast to other agents:
//!
//! - progress, by the upstream request's progress token, to the call that
//!   asked — in order, and before that call's result (see `Routed`);
//! - requests to the client (`sampling/createMessage`, `elicitation/create`,
//!   `roots/list`), to the call they belong to: the one whose HTTP response
//!   stream carried them (Streamable HTTP upstreams), otherwise the only call
//!   the upstream may still be working on (a call it answered, or was sent
//!   `notifications/cancelled` for, no longer counts). When that cannot be
//!   told (several such calls to a stdio upstream), the upstream gets an
//!   error naming the candidates rather than another agent's answer;
//! - `notifications/message` carried on a call's response stream, to that
//!   call; logs and list/resource notifications nobody owns go out as
//!   [`UpstreamEvent`]s, which the front sends only to agent sessions that
//!   asked for them (set a log level, subscribed to the resource) or, for
//!   `list_changed`, to every session after refreshing the catalog.
//!
//! leasegate declares sampling, elicitation (form and URL) and roots to every
//! upstream, because the session is shared; a request for a capability the
//! calling agent did not declare is answered with an error naming it.
//!
//! # Supervision
//!
//! A session can end (a stdio child dies or closes its stdout, an HTTP
//! server drops the session). The routes above belong to the upstream and
//! outlive its sessions; the session's peer is swapped in place.
//!
//! ```text
//!            session ends                       restart attempt fails
//!   ┌────┐  (child killed, reaped)  ┌────────────┐ ──────────────┐
//!   │ up │ ───────────────────────▶ │ restarting │ ◀─────────────┘
//!   └────┘ ◀─────────────────────── └────────────┘   (backoff 100 ms ×2 … 10 s, ±20%)
//!     │      spawn + initialize ok:       │
//!     │      peer swapped, restarts+1,    │
//!     │      catalog refreshed            │
//!     └──────────── shutdown ─────────────┴──────▶ down
//! ```
//!
//! One supervisor task per stdio upstream owns the child and its session.
//! What happens to a call at each point:
//!
//! - **up**: the call goes to the current session.
//! - **the session ends**: requests already handed to it end with "transport
//!   closed", [`UpstreamError::MaybeSent`] (the child may have acted); a
//!   request not yet handed over is [`UpstreamError::NotSent`], as is any
//!   call made before the supervisor noticed (its peer is closed).
//! - **restarting**: there is no peer; a call fails at once with
//!   `NotSent("upstream <name> is restarting (last error: …)")` rather than
//!   waiting (dispatch retries a not-sent call briefly, then records it
//!   unknown with that evidence).
//! - **restarted**: later calls use the new session; calls given up on in the
//!   old one are forgotten (their request ids are reused); the catalog is
//!   refreshed through the `notifications/tools/list_changed` path
//!   ([`UpstreamEvent`]). A child that stayed up [`STABLE_AFTER`] restarts
//!   from the first delay again.
//! - **shutdown**: the peer is cleared (calls fail as not sent), the
//!   session is closed (the child's stdin with it), the child gets
//!   [`EXIT_GRACE`] to exit and is then killed and reaped. Children are
//!   spawned `kill_on_drop`, so a supervisor ended any other way kills its
//!   child too.
//!
//! A Streamable HTTP upstream has no child to restart: its state is what
//! the last exchange with the server proved (an answer: `up`; a transport
//! failure such as a refused connection: `down`; a timeout: unchanged), and
//! a session whose client ended is opened again by the next call (within
//! that call's timeout).
//!
//! ```text
//!          transport failure (refused, reset, DNS, TLS)
//!   ┌────┐ ──────────────────────────────────────────▶ ┌──────┐ ──┐ probe: ping (or initialize)
//!   │ up │                                              │ down │   │ after 100 ms ×2 … 10 s, ±20%;
//!   └────┘ ◀────────────────────────────────────────── └──────┘ ◀─┘ no answer: still down
//!          any answer: a probe's, or a call's
//! ```
//!
//! While it is `down`, calls are still tried (each is its own probe: a
//! refused connection is [`UpstreamError::NotSent`], answered "not sent"),
//! the reconciler defers its queries and same-key retries
//! ([`Upstream::accepting_calls`]), and one probe task per upstream
//! (`supervision::watch_http`) pings it until it answers, so it comes back
//! `up` even when nothing else calls it.
//!
//! [`Upstreams::health`] reports every upstream's state, and the metrics
//! `upstream_up{upstream}` and `upstream_restarts_total{upstream}` follow
//! it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Map, Value};
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use rmcp::model::{
    CallToolRequest, CallToolRequestParams, ClientRequest, RequestMetaObject, ServerPeerInfo,
    ServerResult, Tool,
};
use rmcp::service::{PeerRequestOptions, ServiceError};
use rmcp::transport::DynamicTransportError;
use rmcp::transport::streamable_http_client::StreamableHttpError;

use super::convert;
use crate::adapter::{AgentSink, TaskPoll, ToolReply, Upstream, UpstreamCall, UpstreamError};
use crate::config::{Config, UpstreamTransport};

mod client;
mod connection;
mod inspect;
mod routes;
mod supervision;
mod tool_objects;

use connection::{Connection, EXIT_GRACE, lock, open_http, open_stdio};
pub use connection::{UpstreamHealth, UpstreamState};
pub use inspect::{Inspected, inspect_upstream};
use routes::CallGuard;
use supervision::{supervise, watch_http};

/// Something an upstream sent that no call owns.
#[derive(Debug, Clone)]
pub struct UpstreamEvent {
    pub upstream: String,
    /// The JSON-RPC method, e.g. `notifications/tools/list_changed`.
    pub method: String,
    pub params: Value,
}

/// How long, and how many, early progress notifications are kept for a
/// call that has not subscribed yet (the subscription can only follow the
/// send, and a fast upstream may report progress first).
const EARLY_KEEP: Duration = Duration::from_secs(10);
const EARLY_MAX: usize = 1024;

/// The `_meta` key of a request's own client capabilities (the stateless protocol, rmcp's `V_2026_07_28`),
/// which an upstream reads before the session's.
const CLIENT_CAPABILITIES_META: &str = "io.modelcontextprotocol/clientCapabilities";

/// Upper bound of a non-tool request (lists, reads, prompts, completions).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

/// One tool as the agent sees it.
#[derive(Debug, Clone)]
pub struct CatalogEntry {
    pub upstream: String,
    /// The tool's name at the upstream.
    pub upstream_tool: String,
    /// The tool as exposed (name namespaced, everything else unchanged).
    pub tool: Tool,
    /// The upstream's own tool object (under its own name), with the fields
    /// rmcp's model drops; `None` where the transport does not let
    /// leasegate keep it (Streamable HTTP upstreams).
    pub object: Option<Arc<Map<String, Value>>>,
}

/// What dispatch and the reconciler need to know of each exposed tool.
pub fn directory(
    catalog: &BTreeMap<String, CatalogEntry>,
    config: &Config,
) -> crate::adapter::ToolDirectory {
    catalog
        .iter()
        .map(|(name, entry)| {
            let hint = entry
                .tool
                .annotations
                .as_ref()
                .and_then(|a| a.read_only_hint);
            let adapter = config
                .adapter(&entry.upstream)
                .tool(&entry.upstream_tool, hint);
            (
                name.clone(),
                crate::adapter::ResolvedTool {
                    upstream: entry.upstream.clone(),
                    tool: entry.upstream_tool.clone(),
                    adapter,
                },
            )
        })
        .collect()
}

/// Removes from each tool's input schema the argument its adapter fills
/// with the operation id (`operation_id_argument`): the agent's model must
/// not see a key it could re-mint on a retry. The upstream's own schema is
/// untouched (it is only the agent's view that changes); a value an agent
/// sends there anyway is dropped before the intent is identified and
/// replaced when sent (`dispatch`).
pub fn hide_filled_arguments(
    catalog: &mut BTreeMap<String, CatalogEntry>,
    directory: &crate::adapter::ToolDirectory,
) {
    for (name, entry) in catalog.iter_mut() {
        let Some(argument) = directory
            .get(name)
            .and_then(|resolved| resolved.adapter.filled_argument())
        else {
            continue;
        };
        without_property(
            std::sync::Arc::make_mut(&mut entry.tool.input_schema),
            argument,
        );
        if let Some(object) = entry.object.as_mut()
            && let Some(Value::Object(schema)) = Arc::make_mut(object).get_mut("inputSchema")
        {
            without_property(schema, argument);
        }
    }
}

/// `schema` without `property` in `properties` and `required`.
fn without_property(schema: &mut Map<String, Value>, property: &str) {
    if let Some(Value::Object(properties)) = schema.get_mut("properties") {
        properties.remove(property);
    }
    if let Some(Value::Array(required)) = schema.get_mut("required") {
        required.retain(|name| name.as_str() != Some(property));
    }
}

/// All upstream connections, by name.
pub struct Upstreams {
    connections: BTreeMap<String, Arc<Connection>>,
    events: broadcast::Sender<UpstreamEvent>,
    /// Stops the supervisors (and with them the children); cancelled by
    /// [`Upstreams::shutdown`], or when `Upstreams` is dropped.
    stop: CancellationToken,
    supervisors: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("upstream {upstream}: cannot start: {message}")]
    Connect { upstream: String, message: String },
    #[error("upstream {upstream}: tools/list failed: {message}")]
    List { upstream: String, message: String },
    #[error(
        "tool name collision: {name:?} is exposed by both {first} and {second}; change namespace_separator or rename an upstream"
    )]
    Collision {
        name: String,
        first: String,
        second: String,
    },
}

impl Upstreams {
    /// Connects every configured upstream, and starts a supervisor per
    /// stdio upstream and a probe per Streamable HTTP upstream.
    pub async fn connect(config: &Config) -> Result<Self, StartError> {
        let (events, _) = broadcast::channel(1024);
        let mut connections = BTreeMap::new();
        // Children started so far are killed when this is dropped (a later
        // upstream failed to start).
        let mut stdio = Vec::new();
        for (name, transport) in &config.upstreams {
            let connect_error = |message: String| StartError::Connect {
                upstream: name.clone(),
                message,
            };
            let roots = config.adapter(name).roots_outside_calls;
            let connection = Arc::new(Connection::new(
                name,
                transport.clone(),
                events.clone(),
                roots,
            ));
            match transport {
                UpstreamTransport::Stdio { command, args, env } => {
                    let (session, child) = open_stdio(&connection.handler, command, args, env)
                        .await
                        .map_err(connect_error)?;
                    connection.set_peer(Some(session.peer().clone()));
                    stdio.push((connection.clone(), session, child));
                }
                UpstreamTransport::StreamableHttp { url } => {
                    let session = open_http(&connection.handler, url)
                        .await
                        .map_err(connect_error)?;
                    connection.set_peer(Some(session.peer().clone()));
                    *connection.http.lock().await = Some(session);
                }
            }
            connection.set_state(UpstreamState::Up, None);
            connections.insert(name.clone(), connection);
        }
        let stop = CancellationToken::new();
        let mut supervisors: Vec<_> = stdio
            .into_iter()
            .map(|(connection, session, child)| {
                tokio::spawn(supervise(connection, session, child, stop.clone()))
            })
            .collect();
        supervisors.extend(
            connections
                .values()
                .filter(|c| matches!(c.transport, UpstreamTransport::StreamableHttp { .. }))
                .map(|connection| tokio::spawn(watch_http(connection.clone(), stop.clone()))),
        );
        Ok(Self {
            connections,
            events,
            stop,
            supervisors: Mutex::new(supervisors),
        })
    }

    /// What upstreams send that no call owns.
    pub fn events(&self) -> broadcast::Receiver<UpstreamEvent> {
        self.events.subscribe()
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.connections.keys().map(String::as_str)
    }

    /// Every upstream's health, by name.
    pub fn health(&self) -> Vec<UpstreamHealth> {
        self.connections.values().map(|c| c.health()).collect()
    }

    /// What the upstream said about itself at `initialize` (of its current
    /// session): the same `Arc` until a new session answers another
    /// `initialize`, so callers may key a cache on its address.
    pub fn server_info(&self, upstream: &str) -> Option<Arc<ServerPeerInfo>> {
        self.connections
            .get(upstream)
            .and_then(|c| c.peer())
            .and_then(|peer| peer.peer_info())
    }

    /// The tool object `upstream` last listed for its tool `name`, whole
    /// (`tool_objects`, invariant 3: ask only for a tool the typed list
    /// just returned).
    pub fn tool_object(&self, upstream: &str, name: &str) -> Option<Arc<Map<String, Value>>> {
        self.connections
            .get(upstream)?
            .handler
            .tool_objects
            .get(name)
    }

    /// The upstream's tools, every page.
    pub async fn list_tools(&self, upstream: &str) -> Result<Vec<Tool>, String> {
        let connection = self
            .connections
            .get(upstream)
            .ok_or_else(|| format!("no upstream named {upstream:?}"))?;
        let peer = connection
            .session(REQUEST_TIMEOUT, &self.stop)
            .await
            .map_err(|e| e.to_string())?;
        let listed = peer.list_all_tools().await;
        connection.observe_http(match &listed {
            Ok(_) | Err(ServiceError::McpError(_)) => Ok(()),
            Err(error) => Err(error.to_string()),
        });
        listed.map_err(|e| e.to_string())
    }

    /// Every upstream tool under its exposed name (`<upstream><sep><tool>`),
    /// everything else unchanged. A collision is an error.
    pub async fn catalog(
        &self,
        separator: &str,
        unprefixed: &[String],
    ) -> Result<BTreeMap<String, CatalogEntry>, StartError> {
        let mut catalog: BTreeMap<String, CatalogEntry> = BTreeMap::new();
        for name in self.connections.keys() {
            let tools = self
                .list_tools(name)
                .await
                .map_err(|message| StartError::List {
                    upstream: name.clone(),
                    message,
                })?;
            for tool in tools {
                let exposed = if unprefixed.contains(name) {
                    tool.name.to_string()
                } else {
                    format!("{name}{separator}{}", tool.name)
                };
                if let Some(existing) = catalog.get(&exposed) {
                    return Err(StartError::Collision {
                        name: exposed,
                        first: format!("{}/{}", existing.upstream, existing.upstream_tool),
                        second: format!("{name}/{}", tool.name),
                    });
                }
                let mut exposed_tool = tool.clone();
                exposed_tool.name = exposed.clone().into();
                catalog.insert(
                    exposed,
                    CatalogEntry {
                        upstream: name.clone(),
                        upstream_tool: tool.name.to_string(),
                        object: self.tool_object(name, &tool.name),
                        tool: exposed_tool,
                    },
                );
            }
        }
        Ok(catalog)
    }

    /// Sends `request` to `upstream` and waits for its answer, routing what
    /// the upstream sends meanwhile to `agent`; `cancel` sends
    /// `notifications/cancelled` upstream.
    pub async fn request(
        &self,
        upstream: &str,
        request: ClientRequest,
        meta: Map<String, Value>,
        timeout: Duration,
        agent: Option<AgentSink>,
        cancel: CancellationToken,
    ) -> Result<ServerResult, UpstreamError> {
        let connection = self
            .connections
            .get(upstream)
            .ok_or_else(|| UpstreamError::NotSent(format!("no upstream named {upstream:?}")))?;
        let mut request_meta = RequestMetaObject::new();
        for (key, value) in meta {
            request_meta.insert(key, value);
        }
        // No session (a stdio child restarting): fails at once, not sent.
        let peer = connection.session(timeout, &self.stop).await?;
        let (ended, on_end) = tokio::sync::oneshot::channel::<()>();
        let mut guard = CallGuard {
            routes: connection.routes(),
            call: connection.routes().begin(agent, routes::describe(&request)),
            token: None,
            answered: true,
            _ended: Some(ended),
        };
        let handle = match peer
            .send_request_with_option(
                request,
                PeerRequestOptions::with_timeout(timeout).with_meta(request_meta),
            )
            .await
        {
            Ok(handle) => handle,
            // The request never reached the client's transport task (its
            // session ended since `session` looked).
            Err(error) => {
                let error = UpstreamError::NotSent(format!(
                    "upstream {upstream}: {}",
                    transport_failure(&error)
                ));
                connection.observe_http(Err(error.to_string()));
                return Err(error);
            }
        };
        // rmcp gives the upstream request its own progress token: re-key.
        let token = handle.progress_token.clone();
        connection
            .routes()
            .sent(guard.call, handle.id.clone(), token.clone());
        // From here on, a caller that stops waiting abandons the call.
        guard.token = Some(token);
        guard.answered = false;
        // The upstream is told of a call the agent cancelled, and of one
        // whose caller stopped waiting (routes invariant 3): once either
        // happens, the call no longer holds up another call's relay.
        let (routes, call, peer) = (connection.routes().clone(), guard.call, handle.peer.clone());
        tokio::spawn(async move {
            let reason = tokio::select! {
                _ = cancel.cancelled() => "cancelled by the agent",
                _ = on_end => "leasegate stopped waiting for it",
            };
            // A call that ended (answered, timed out) is no candidate any
            // more: nothing is sent for it.
            routes.cancel_upstream(&peer, call, reason).await;
        });
        let response = handle.await_response().await;
        // Answered, or failed in transport (its session is gone), or timed
        // out (rmcp sent `notifications/cancelled` itself): the upstream is
        // not working on it for leasegate any more.
        guard.answered = true;
        drop(guard);
        match &response {
            Ok(_) | Err(ServiceError::McpError(_)) => connection.observe_http(Ok(())),
            // Proves neither (connection invariant 2).
            Err(ServiceError::Timeout { .. }) => {}
            Err(error) => connection.observe_http(Err(transport_failure(error))),
        }
        match response {
            Ok(result) => Ok(result),
            Err(ServiceError::McpError(error)) => {
                let (code, message) = convert::refused(&error);
                Err(UpstreamError::Refused {
                    code,
                    message,
                    data: error.data,
                })
            }
            Err(ServiceError::Timeout { timeout }) => Err(UpstreamError::TimedOut(timeout)),
            Err(other) if never_left(&other) => Err(UpstreamError::NotSent(format!(
                "upstream {upstream} could not be reached: {}",
                transport_failure(&other)
            ))),
            Err(other) => Err(UpstreamError::MaybeSent(transport_failure(&other))),
        }
    }

    /// Sends a request of the MCP Tasks extension (`tasks/get`,
    /// `tasks/update`, `tasks/cancel`) to `upstream`, declaring the
    /// extension for this request (the shared session declares none).
    pub async fn task_request(
        &self,
        upstream: &str,
        request: ClientRequest,
        timeout: Duration,
    ) -> Result<ServerResult, UpstreamError> {
        let mut meta = Map::new();
        meta.insert(
            CLIENT_CAPABILITIES_META.to_owned(),
            client::capabilities_with_tasks(),
        );
        self.request(
            upstream,
            request,
            meta,
            timeout,
            None,
            CancellationToken::new(),
        )
        .await
    }

    /// Stops the supervisors, the probes and the clients, and ends the
    /// stdio children: each gets [`EXIT_GRACE`] to exit on its closed stdin,
    /// then is killed and reaped. Later calls fail as not sent.
    pub async fn shutdown(&self) {
        self.stop.cancel();
        let supervisors = std::mem::take(&mut *lock(&self.supervisors));
        // Every child gets its grace at the same time.
        for ended in futures::future::join_all(supervisors).await {
            if let Err(error) = ended {
                tracing::error!(%error, "an upstream supervisor ended abnormally");
            }
        }
        for connection in self.connections.values() {
            connection.set_peer(None);
            if let Some(mut session) = connection.http.lock().await.take() {
                let _ = session.close_with_timeout(EXIT_GRACE).await;
            }
            connection.set_state(UpstreamState::Down, None);
        }
    }
}

impl Drop for Upstreams {
    /// Never leave a supervisor restarting children nobody can call.
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Upstream for Upstreams {
    async fn call(&self, call: UpstreamCall) -> Result<ToolReply, UpstreamError> {
        let params = CallToolRequestParams::new(call.tool.clone()).with_arguments(call.arguments);
        let mut meta = call.meta;
        if call.tasks {
            // Declared for this request alone: a task handle goes only to an
            // agent that can follow it (the shared session declares none).
            meta.insert(
                CLIENT_CAPABILITIES_META.to_owned(),
                client::capabilities_with_tasks(),
            );
        }
        let started = Instant::now();
        let response = self
            .request(
                &call.upstream,
                ClientRequest::CallToolRequest(CallToolRequest::new(params)),
                meta,
                call.timeout,
                call.agent,
                call.cancel,
            )
            .await;
        let outcome = match &response {
            Ok(ServerResult::CreateTaskResult(_)) => "task",
            Ok(_) => "answered",
            Err(UpstreamError::TimedOut(_)) => "timeout",
            Err(UpstreamError::Refused { .. }) => "refused",
            Err(_) => "transport_error",
        };
        metrics::histogram!("upstream_call_duration_seconds", "upstream" => call.upstream.clone(),
            "tool" => call.tool.clone(), "outcome" => outcome)
        .record(started.elapsed().as_secs_f64());
        match response? {
            ServerResult::CallToolResult(result) => {
                Ok(ToolReply::Answer(convert::answer_from_result(&result)))
            }
            ServerResult::CreateTaskResult(task) if call.tasks => {
                Ok(ToolReply::Task(convert::task_started(&task)))
            }
            other => Err(UpstreamError::MaybeSent(format!(
                "unsupported answer to tools/call: {}",
                serde_json::to_string(&other)
                    .unwrap_or_default()
                    .chars()
                    .take(200)
                    .collect::<String>()
            ))),
        }
    }

    async fn task_state(
        &self,
        upstream: &str,
        task_id: &str,
        timeout: Duration,
    ) -> Result<TaskPoll, UpstreamError> {
        let request = ClientRequest::GetTaskRequest(rmcp::model::GetTaskRequest::new(
            rmcp::model::GetTaskParams::new(task_id),
        ));
        let answer = self.task_request(upstream, request, timeout).await?;
        convert::task_poll(answer).map_err(UpstreamError::MaybeSent)
    }

    fn accepting_calls(&self, upstream: &str) -> bool {
        self.connections
            .get(upstream)
            .is_none_or(|c| c.accepting_calls())
    }

    fn unavailable(&self) -> Vec<String> {
        self.connections
            .iter()
            .filter(|(_, c)| !c.accepting_calls())
            .map(|(name, _)| name.clone())
            .collect()
    }
}

/// A Streamable HTTP request that failed before any of its bytes left: no
/// connection could be made (refused, DNS, TLS, connect timeout), or the
/// connection failed before the request was started on it
/// ([`client::never_sent`]). Anything later — a reset after the request was
/// written, a broken response — may have reached the server. (A pooled
/// connection the server closed before the request was written is retried
/// on a fresh one by the HTTP client itself.)
fn never_left(error: &ServiceError) -> bool {
    let ServiceError::TransportSend(error) = error else {
        return false;
    };
    match error
        .error
        .downcast_ref::<StreamableHttpError<reqwest::Error>>()
    {
        Some(StreamableHttpError::Client(error)) => client::never_sent(error),
        _ => false,
    }
}

/// What an agent and an operator read of a transport failure: what failed
/// and why, in words — no wrapper of rmcp's (which names leasegate's
/// transport types) and no Debug dumps.
pub(super) fn transport_failure(error: &ServiceError) -> String {
    match error {
        ServiceError::TransportSend(error) => dynamic_transport_failure(error),
        ServiceError::TransportClosed => "the connection to the upstream closed".to_owned(),
        other => other.to_string(),
    }
}

/// [`transport_failure`] of rmcp's transport error as it also comes from a
/// failed `initialize`.
pub(super) fn dynamic_transport_failure(error: &DynamicTransportError) -> String {
    match error
        .error
        .downcast_ref::<StreamableHttpError<reqwest::Error>>()
    {
        Some(StreamableHttpError::Client(client)) => client::http_failure(client),
        Some(StreamableHttpError::UnexpectedContentType(found)) => format!(
            "the upstream answered with content type {}, not JSON or an event stream",
            found.as_deref().unwrap_or("(none)")
        ),
        Some(other) => format!("transport error: {}", client::error_chain(other)),
        None => format!("transport error: {}", client::error_chain(&*error.error)),
    }
}
