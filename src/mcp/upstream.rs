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
//!   in flight to that upstream. When that cannot be told (several calls in
//!   flight to a stdio upstream), the upstream gets an error rather than
//!   another agent's answer;
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
//! A Streamable HTTP upstream has no supervisor: its state is what the last
//! request showed (reached: `up`; not reached: `down`), and a session whose
//! client ended is opened again by the next call (within that call's
//! timeout). [`Upstreams::health`] reports every upstream's state, and the
//! metrics `upstream_up{upstream}` and `upstream_restarts_total{upstream}`
//! follow it.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Map, Value, json};
use tokio::sync::{broadcast, oneshot};
use tokio_util::sync::CancellationToken;

use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CancelledNotificationParam, ClientCapabilities,
    ClientConfig, ClientRequest, ClientResult, CustomResult, Implementation, JsonRpcMessage,
    ProgressNotificationParam, ProgressToken, RequestId, RequestMetaObject, ServerNotification,
    ServerPeerInfo, ServerRequest, ServerResult, Tool,
};
use rmcp::service::{
    InboundStreamOrigin, NotificationContext, Peer, PeerRequestOptions, RequestContext,
    RunningService, RxJsonRpcMessage, ServiceError, TxJsonRpcMessage,
};
use rmcp::transport::async_rw::AsyncRwTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, Transport};
use rmcp::{ErrorData as McpError, RoleClient, Service, ServiceExt};

use super::convert;
use crate::adapter::{
    AgentRequest, AgentSink, PeerError, Progress, ToAgent, ToolAnswer, Upstream, UpstreamCall,
    UpstreamError,
};
use crate::config::init::ToolSummary;
use crate::config::{Config, UpstreamTransport};

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

/// Upper bound of a non-tool request (lists, reads, prompts, completions).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

/// The calls in flight on one upstream connection, and where what the
/// upstream sends about them goes.
#[derive(Clone, Default)]
struct CallRoutes {
    state: Arc<Mutex<RoutesState>>,
}

#[derive(Default)]
struct RoutesState {
    progress: HashMap<ProgressToken, AgentSink>,
    early: VecDeque<(Instant, ProgressNotificationParam)>,
    in_flight: HashMap<u64, InFlight>,
    next_call: u64,
}

struct InFlight {
    /// The upstream request id, once the request is handed to the transport.
    request_id: Option<RequestId>,
    agent: Option<AgentSink>,
    /// Set when the caller gave up before the upstream answered (cancel,
    /// timeout): the entry is kept for [`ABANDONED_KEEP`] so that a late
    /// request of the upstream about it is refused, never given to another
    /// call.
    abandoned: Option<Instant>,
}

/// How long a call the caller gave up on still counts as in flight.
const ABANDONED_KEEP: Duration = Duration::from_secs(60);

/// Where something the upstream sent came from.
#[derive(Debug, Clone, PartialEq)]
enum Origin {
    /// The transport does not say (stdio).
    Unknown,
    /// A Streamable HTTP stream not tied to a request (the GET stream).
    Unassociated,
    /// The response stream of this upstream request.
    Request(RequestId),
}

/// Why something from the upstream has no call to go to.
#[derive(Debug, PartialEq)]
enum NoOwner {
    /// The request id is not (yet) known: it may be registered in a moment.
    NotYet,
    Refused(String),
}

/// Ends a call's routes when the request future ends or is dropped.
struct CallGuard<'a> {
    routes: &'a CallRoutes,
    call: u64,
    token: Option<ProgressToken>,
    answered: bool,
}

impl Drop for CallGuard<'_> {
    fn drop(&mut self) {
        self.routes
            .end(self.call, self.token.as_ref(), self.answered);
    }
}

fn progress_of(params: ProgressNotificationParam) -> ToAgent {
    ToAgent::Progress(Progress {
        progress: params.progress,
        total: params.total,
        message: params.message,
    })
}

impl CallRoutes {
    fn lock(&self) -> std::sync::MutexGuard<'_, RoutesState> {
        // A poisoned lock only means a panic elsewhere mid-update of plain
        // maps; the maps stay usable.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn deliver_progress(&self, params: ProgressNotificationParam) {
        let mut state = self.lock();
        if let Some(route) = state.progress.get(&params.progress_token) {
            let _ = route.send(progress_of(params));
            return;
        }
        let now = Instant::now();
        state
            .early
            .retain(|(at, _)| now.duration_since(*at) < EARLY_KEEP);
        if state.early.len() >= EARLY_MAX {
            state.early.pop_front();
        }
        state.early.push_back((now, params));
    }

    fn subscribe_progress(&self, token: ProgressToken, sink: AgentSink) {
        let mut state = self.lock();
        let (mine, others): (VecDeque<_>, VecDeque<_>) = std::mem::take(&mut state.early)
            .into_iter()
            .partition(|(_, p)| p.progress_token == token);
        state.early = others;
        for (_, params) in mine {
            let _ = sink.send(progress_of(params));
        }
        state.progress.insert(token, sink);
    }

    fn begin(&self, agent: Option<AgentSink>) -> u64 {
        let mut state = self.lock();
        state
            .in_flight
            .retain(|_, f| f.abandoned.is_none_or(|at| at.elapsed() < ABANDONED_KEEP));
        state.next_call += 1;
        let call = state.next_call;
        state.in_flight.insert(
            call,
            InFlight {
                request_id: None,
                agent,
                abandoned: None,
            },
        );
        call
    }

    fn sent(&self, call: u64, request_id: RequestId, token: ProgressToken) {
        let mut state = self.lock();
        let agent = state.in_flight.get_mut(&call).and_then(|in_flight| {
            in_flight.request_id = Some(request_id);
            in_flight.agent.clone()
        });
        drop(state);
        if let Some(agent) = agent {
            self.subscribe_progress(token, agent);
        }
    }

    fn end(&self, call: u64, token: Option<&ProgressToken>, answered: bool) {
        let mut state = self.lock();
        if answered {
            state.in_flight.remove(&call);
        } else if let Some(in_flight) = state.in_flight.get_mut(&call) {
            in_flight.agent = None;
            in_flight.abandoned = Some(Instant::now());
        }
        if let Some(token) = token {
            state.progress.remove(token);
        }
    }

    /// Forgets the calls given up on: they belonged to a session that is
    /// gone, so nothing about them can arrive any more (and the next
    /// session reuses their request ids).
    fn forget_abandoned(&self) {
        self.lock().in_flight.retain(|_, f| f.abandoned.is_none());
    }

    /// The agent of the call a request or notification from the upstream
    /// belongs to: the call whose response stream carried it (Streamable
    /// HTTP); when the transport cannot say (stdio, or an HTTP server's GET
    /// stream), the only call in flight (`single_fallback`), calls given up
    /// on within [`ABANDONED_KEEP`] included, so that nothing about an
    /// abandoned call reaches another.
    fn owner(&self, origin: &Origin, single_fallback: bool) -> Result<AgentSink, NoOwner> {
        let state = self.lock();
        let refused = |why: &str| Err(NoOwner::Refused(why.to_owned()));
        let agent_of = |in_flight: &InFlight| match (&in_flight.agent, in_flight.abandoned) {
            (_, Some(_)) => refused("the call it belongs to is over (cancelled or timed out)"),
            (None, None) => {
                refused("the call it belongs to has no agent attached (background work)")
            }
            (Some(agent), None) => Ok(agent.clone()),
        };
        match origin {
            Origin::Request(id) => match state
                .in_flight
                .values()
                .find(|f| f.request_id.as_ref() == Some(id))
            {
                Some(in_flight) => agent_of(in_flight),
                None => Err(NoOwner::NotYet),
            },
            // The GET stream (servers send requests there when they do not
            // tie them to a request), or stdio: the transport does not say.
            Origin::Unassociated | Origin::Unknown if !single_fallback => {
                refused("the transport does not say which call it belongs to")
            }
            Origin::Unassociated | Origin::Unknown => match state.in_flight.len() {
                0 => refused("no call is in flight on this upstream"),
                1 => agent_of(state.in_flight.values().next().expect("one entry")),
                n => Err(NoOwner::Refused(format!(
                    "{n} calls are in flight on this upstream and its transport does not say which one this belongs to"
                ))),
            },
        }
    }

    /// [`CallRoutes::owner`], waiting briefly for a request id that is not
    /// registered yet (the upstream may answer on a stream before the
    /// sender has recorded the request it sent).
    async fn owner_soon(
        &self,
        origin: &Origin,
        single_fallback: bool,
    ) -> Result<AgentSink, String> {
        for _ in 0..50 {
            match self.owner(origin, single_fallback) {
                Ok(agent) => return Ok(agent),
                Err(NoOwner::Refused(why)) => return Err(why),
                Err(NoOwner::NotYet) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
        Err("carried on the stream of a request that is not (or no longer) in flight".to_owned())
    }
}

/// The client's transport, with progress routed as it is read: a progress
/// notification reaches its call's channel before the transport yields the
/// next message, so every notification the upstream sent before its result
/// is queued for the agent before the result is (rmcp would otherwise hand
/// notifications to concurrently running handler tasks).
struct Routed<T> {
    inner: T,
    routes: CallRoutes,
}

impl<T: Transport<RoleClient>> Transport<RoleClient> for Routed<T> {
    type Error = T::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleClient>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        self.inner.send(item)
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleClient>> {
        loop {
            let message = self.inner.receive().await?;
            if let JsonRpcMessage::Notification(notification) = &message
                && let ServerNotification::ProgressNotification(progress) =
                    &notification.notification
            {
                self.routes.deliver_progress(progress.params.clone());
                continue;
            }
            return Some(message);
        }
    }

    fn close(&mut self) -> impl Future<Output = Result<(), Self::Error>> + Send {
        self.inner.close()
    }
}

/// leasegate as the client of one upstream.
#[derive(Clone)]
struct UpstreamClient {
    name: String,
    routes: CallRoutes,
    events: broadcast::Sender<UpstreamEvent>,
}

fn origin_of(extensions: &rmcp::model::Extensions) -> Origin {
    match extensions.get::<InboundStreamOrigin>() {
        Some(InboundStreamOrigin::OutboundRequest(id)) => Origin::Request(id.clone()),
        Some(InboundStreamOrigin::Unassociated) => Origin::Unassociated,
        None => Origin::Unknown,
    }
}

fn method_and_params<T: serde::Serialize>(message: &T) -> (String, Value) {
    let value = serde_json::to_value(message).unwrap_or(Value::Null);
    let method = value
        .get("method")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let params = value.get("params").cloned().unwrap_or_else(|| json!({}));
    (method, params)
}

fn mcp_error(error: PeerError) -> McpError {
    McpError::new(
        rmcp::model::ErrorCode(error.code),
        error.message,
        error.data,
    )
}

impl Service<RoleClient> for UpstreamClient {
    async fn handle_request(
        &self,
        request: ServerRequest,
        context: RequestContext<RoleClient>,
    ) -> Result<ClientResult, McpError> {
        if let ServerRequest::PingRequest(_) = request {
            return Ok(ClientResult::empty(()));
        }
        let (method, params) = method_and_params(&request);
        let origin = origin_of(&context.extensions);
        let agent = self.routes.owner_soon(&origin, true).await.map_err(|why| {
            tracing::warn!(upstream = %self.name, %method, why = %crate::logfield::clip_display(&why), "upstream request not relayed");
            McpError::internal_error(
                format!("leasegate cannot relay {method} to an agent: {why}"),
                None,
            )
        })?;
        let (reply, answer) = oneshot::channel();
        agent
            .send(ToAgent::Request(AgentRequest {
                method: method.clone(),
                params,
                reply,
            }))
            .map_err(|_| McpError::internal_error("the agent's call is over", None))?;
        let answer = tokio::select! {
            answer = answer => answer.map_err(|_| McpError::internal_error("the agent's call ended before it answered", None))?,
            _ = context.ct.cancelled() => return Err(McpError::internal_error("cancelled by the upstream", None)),
        };
        let value = answer.map_err(mcp_error)?;
        let invalid = |e: serde_json::Error| {
            McpError::internal_error(format!("agent answer to {method}: {e}"), None)
        };
        Ok(match request {
            ServerRequest::CreateMessageRequest(_) => ClientResult::CreateMessageResult(Box::new(
                serde_json::from_value(value).map_err(invalid)?,
            )),
            ServerRequest::ListRootsRequest(_) => {
                ClientResult::ListRootsResult(serde_json::from_value(value).map_err(invalid)?)
            }
            ServerRequest::ElicitRequest(_) => {
                ClientResult::ElicitResult(serde_json::from_value(value).map_err(invalid)?)
            }
            _ => ClientResult::CustomResult(CustomResult(value)),
        })
    }

    async fn handle_notification(
        &self,
        notification: ServerNotification,
        context: NotificationContext<RoleClient>,
    ) -> Result<(), McpError> {
        match &notification {
            // Routed by the transport already; one that slipped through
            // (none should) is routed here.
            ServerNotification::ProgressNotification(progress) => {
                self.routes.deliver_progress(progress.params.clone());
                return Ok(());
            }
            // rmcp fails the matching outbound request on its own.
            ServerNotification::CancelledNotification(_) => return Ok(()),
            _ => {}
        }
        let (method, params) = method_and_params(&notification);
        let call_scoped = matches!(
            notification,
            ServerNotification::LoggingMessageNotification(_)
                | ServerNotification::CustomNotification(_)
        );
        if call_scoped {
            let origin = origin_of(&context.extensions);
            let single = matches!(notification, ServerNotification::CustomNotification(_));
            if let Ok(agent) = self.routes.owner(&origin, single)
                && agent
                    .send(ToAgent::Notification {
                        upstream: self.name.clone(),
                        method: method.clone(),
                        params: params.clone(),
                    })
                    .is_ok()
            {
                return Ok(());
            }
        }
        let _ = self.events.send(UpstreamEvent {
            upstream: self.name.clone(),
            method,
            params,
        });
        Ok(())
    }

    fn get_info(&self) -> ClientConfig {
        let capabilities: ClientCapabilities = serde_json::from_value(json!({
            "sampling": {},
            "elicitation": {"form": {}, "url": {}},
            "roots": {"listChanged": true},
        }))
        .unwrap_or_default();
        ClientConfig::new(
            capabilities,
            Implementation::new("leasegate", env!("CARGO_PKG_VERSION")),
        )
    }
}

/// One session of an upstream: the MCP client over one stdio child or one
/// Streamable HTTP connection.
type Session = RunningService<RoleClient, UpstreamClient>;

/// Upper bound of the MCP `initialize` handshake of a (re)started session.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a stdio child gets to exit on its own (its stdin closed) before
/// it is killed, at shutdown and after its session ended.
const EXIT_GRACE: Duration = Duration::from_secs(1);

/// A child that stayed up this long starts the next restart from the first
/// delay again.
const STABLE_AFTER: Duration = Duration::from_secs(30);

/// Whether an upstream can be called now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum UpstreamState {
    /// A session is open (stdio), or the last request reached the server
    /// (Streamable HTTP).
    Up,
    /// The stdio child is gone and its supervisor is starting another; calls
    /// fail at once as not sent.
    Restarting,
    /// Not being restarted: stopped with leasegate, or a Streamable HTTP
    /// server the last request (or reconnect) could not reach.
    Down,
}

/// One upstream's health, as the control API shows it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct UpstreamHealth {
    pub name: String,
    /// `stdio` or `streamable_http`, as in the config.
    pub transport: &'static str,
    pub state: UpstreamState,
    /// When `state` last changed.
    pub since: chrono::DateTime<chrono::Utc>,
    /// Sessions opened after the first one (a restarted child, a
    /// reconnected HTTP session).
    pub restarts: u64,
    /// Why the upstream last went away or could not be reached; kept after
    /// it is up again, so an operator sees why it restarted.
    pub last_error: Option<String>,
}

struct Health {
    state: UpstreamState,
    since: chrono::DateTime<chrono::Utc>,
    restarts: u64,
    last_error: Option<String>,
}

/// One upstream: its current session's peer (swapped on restart), the
/// routes of its calls (shared by its sessions), and its health.
struct Connection {
    name: String,
    transport: UpstreamTransport,
    /// The client every session of this upstream serves with.
    handler: UpstreamClient,
    /// The live session's peer. `None` while a stdio child is restarting and
    /// after shutdown, so that a call fails at once, as not sent.
    peer: std::sync::RwLock<Option<Peer<RoleClient>>>,
    health: Mutex<Health>,
    /// A Streamable HTTP upstream's session (a stdio session is owned by its
    /// supervisor); the lock also makes a reconnect happen once.
    http: tokio::sync::Mutex<Option<Session>>,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A poisoned lock only means a panic elsewhere mid-update of plain
    // values; they stay usable.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Connection {
    fn new(
        name: &str,
        transport: UpstreamTransport,
        events: broadcast::Sender<UpstreamEvent>,
    ) -> Self {
        metrics::counter!("upstream_restarts_total", "upstream" => name.to_owned()).increment(0);
        Self {
            name: name.to_owned(),
            transport,
            handler: UpstreamClient {
                name: name.to_owned(),
                routes: CallRoutes::default(),
                events,
            },
            peer: std::sync::RwLock::new(None),
            health: Mutex::new(Health {
                state: UpstreamState::Down,
                since: chrono::Utc::now(),
                restarts: 0,
                last_error: None,
            }),
            http: tokio::sync::Mutex::new(None),
        }
    }

    fn routes(&self) -> &CallRoutes {
        &self.handler.routes
    }

    fn transport_name(&self) -> &'static str {
        match self.transport {
            UpstreamTransport::Stdio { .. } => "stdio",
            UpstreamTransport::StreamableHttp { .. } => "streamable_http",
        }
    }

    fn peer(&self) -> Option<Peer<RoleClient>> {
        self.peer
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    fn set_peer(&self, peer: Option<Peer<RoleClient>>) {
        *self
            .peer
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = peer;
    }

    /// Sets the state (and `since` when it changes); an error, when given,
    /// becomes `last_error`.
    fn set_state(&self, state: UpstreamState, error: Option<String>) {
        let mut health = lock(&self.health);
        if health.state != state {
            health.state = state;
            health.since = chrono::Utc::now();
        }
        if error.is_some() {
            health.last_error = error;
        }
        let up = if state == UpstreamState::Up { 1.0 } else { 0.0 };
        metrics::gauge!("upstream_up", "upstream" => self.name.clone()).set(up);
    }

    /// A new session replaced a lost one: later calls use `peer`, and the
    /// catalog is refreshed as on `notifications/tools/list_changed` (the new
    /// session may serve other tools).
    fn replaced(&self, peer: Peer<RoleClient>) {
        // Calls given up on belong to the lost session: nothing about them
        // can arrive any more, and their request ids are reused by the new one.
        self.routes().forget_abandoned();
        self.set_peer(Some(peer));
        lock(&self.health).restarts += 1;
        metrics::counter!("upstream_restarts_total", "upstream" => self.name.clone()).increment(1);
        self.set_state(UpstreamState::Up, None);
        let _ = self.handler.events.send(UpstreamEvent {
            upstream: self.name.clone(),
            method: "notifications/tools/list_changed".into(),
            params: json!({}),
        });
    }

    /// The error of a call made while there is no session: nothing was sent.
    fn unavailable(&self) -> UpstreamError {
        let health = lock(&self.health);
        let why = health
            .last_error
            .as_deref()
            .map(|e| format!(" (last error: {e})"))
            .unwrap_or_default();
        let state = match health.state {
            UpstreamState::Restarting => "is restarting",
            UpstreamState::Down => "is down",
            // Up, but its session just ended: the supervisor is about to
            // notice.
            UpstreamState::Up => "lost its session and is restarting",
        };
        UpstreamError::NotSent(format!("upstream {} {state}{why}", self.name))
    }

    /// What a Streamable HTTP request proved about the server: it answered
    /// (up) or could not be reached (down). Stdio health is the
    /// supervisor's.
    fn observe_http(&self, reached: Result<(), String>) {
        if matches!(self.transport, UpstreamTransport::StreamableHttp { .. }) {
            match reached {
                Ok(()) => self.set_state(UpstreamState::Up, None),
                Err(error) => self.set_state(UpstreamState::Down, Some(error)),
            }
        }
    }

    fn health(&self) -> UpstreamHealth {
        let health = lock(&self.health);
        UpstreamHealth {
            name: self.name.clone(),
            transport: self.transport_name(),
            state: health.state,
            since: health.since,
            restarts: health.restarts,
            last_error: health.last_error.clone(),
        }
    }
}

/// A response cache would let a proxy answer from a stale page.
async fn no_cache(session: &Session) {
    session
        .peer()
        .set_response_cache_config(rmcp::ClientCacheConfig::disabled())
        .await;
}

/// A stdio upstream's child: stdin and stdout piped for MCP, `stderr` as
/// asked, killed when its handle is dropped.
fn spawn_stdio(
    command: &std::path::Path,
    args: &[String],
    env: &BTreeMap<String, String>,
    stderr: std::process::Stdio,
) -> Result<tokio::process::Child, String> {
    tokio::process::Command::new(command)
        .args(args)
        .envs(env)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(stderr)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("{}: {e}", command.display()))
}

/// Spawns a stdio upstream's command and does the MCP handshake over its
/// stdin/stdout. The child is killed when its handle is dropped (a failed
/// handshake, a supervisor ended by the runtime).
async fn open_stdio(
    handler: &UpstreamClient,
    command: &std::path::Path,
    args: &[String],
    env: &BTreeMap<String, String>,
) -> Result<(Session, tokio::process::Child), String> {
    let mut child = spawn_stdio(command, args, env, std::process::Stdio::inherit())?;
    let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
        return Err("the child's stdin or stdout is not piped".into());
    };
    let session = handshake(handler, AsyncRwTransport::new_client(stdout, stdin)).await?;
    Ok((session, child))
}

/// The MCP `initialize` handshake over `inner`, with per-request routing of
/// what the upstream sends, within [`HANDSHAKE_TIMEOUT`].
async fn handshake<X>(handler: &UpstreamClient, inner: X) -> Result<Session, String>
where
    Routed<X>: Transport<RoleClient> + Send + 'static,
{
    let transport = Routed {
        inner,
        routes: handler.routes.clone(),
    };
    let session =
        match tokio::time::timeout(HANDSHAKE_TIMEOUT, handler.clone().serve(transport)).await {
            Ok(Ok(session)) => session,
            Ok(Err(error)) => return Err(error.to_string()),
            Err(_) => {
                return Err(format!(
                    "no answer to initialize within {HANDSHAKE_TIMEOUT:?}"
                ));
            }
        };
    no_cache(&session).await;
    Ok(session)
}

/// Opens a Streamable HTTP session (the `initialize` request).
async fn open_http(handler: &UpstreamClient, url: &str) -> Result<Session, String> {
    handshake(
        handler,
        StreamableHttpClientTransport::with_client(
            super::http_headers::PerCallHeaders::default(),
            StreamableHttpClientTransportConfig::with_uri(url),
        ),
    )
    .await
}

/// Waits up to `grace` for the child to exit, then kills it; reaps it
/// either way. Says how it ended.
async fn end_child(child: &mut tokio::process::Child, grace: Duration) -> String {
    match tokio::time::timeout(grace, child.wait()).await {
        Ok(Ok(status)) => status.to_string(),
        Ok(Err(error)) => format!("cannot wait for it: {error}"),
        Err(_) => match child.kill().await {
            Ok(()) => format!("killed by leasegate after {grace:?}"),
            Err(error) => format!("cannot kill it: {error}"),
        },
    }
}

/// Restart delays: exponential from [`Backoff::FIRST`] to [`Backoff::CAP`],
/// each with ±20% jitter so that upstreams that died together do not
/// restart in lockstep.
struct Backoff {
    next: Duration,
}

impl Backoff {
    const FIRST: Duration = Duration::from_millis(100);
    const CAP: Duration = Duration::from_secs(10);

    fn new() -> Self {
        Self { next: Self::FIRST }
    }

    fn reset(&mut self) {
        self.next = Self::FIRST;
    }

    fn next_delay(&mut self) -> Duration {
        let base = self.next;
        self.next = (base * 2).min(Self::CAP);
        // A randomly keyed hasher is random enough for jitter.
        let random = std::hash::BuildHasher::hash_one(
            &std::collections::hash_map::RandomState::new(),
            Instant::now(),
        );
        let unit = (random >> 11) as f64 / (1u64 << 53) as f64;
        base.mul_f64(0.8 + 0.4 * unit)
    }
}

/// Keeps one stdio upstream running until `stop` (see "Supervision" in the
/// module docs).
async fn supervise(
    connection: Arc<Connection>,
    mut session: Session,
    mut child: tokio::process::Child,
    stop: CancellationToken,
) {
    let UpstreamTransport::Stdio { command, args, env } = connection.transport.clone() else {
        return;
    };
    let mut backoff = Backoff::new();
    loop {
        let started = Instant::now();
        let close = session.cancellation_token();
        let ended = session.waiting();
        tokio::pin!(ended);
        let quit = tokio::select! {
            quit = &mut ended => quit,
            () = stop.cancelled() => {
                connection.set_peer(None);
                // Closing the session closes the child's stdin: an MCP
                // server exits on EOF. One that does not is killed.
                close.cancel();
                let _ = tokio::time::timeout(EXIT_GRACE, &mut ended).await;
                end_child(&mut child, EXIT_GRACE).await;
                connection.set_state(UpstreamState::Down, None);
                return;
            }
        };
        // Calls from here on fail as not sent; calls already handed to the
        // lost session end with "transport closed" (maybe sent).
        connection.set_peer(None);
        // Its stdout closed; it may still run (or be a zombie): end it.
        let exit = end_child(&mut child, EXIT_GRACE).await;
        let why = match quit {
            Ok(quit) => format!("session ended ({quit:?}), child: {exit}"),
            Err(error) => format!("session task failed ({error}), child: {exit}"),
        };
        tracing::warn!(upstream = %connection.name, why = %crate::logfield::clip_display(&why), "stdio upstream lost; restarting it");
        connection.set_state(UpstreamState::Restarting, Some(why));
        if started.elapsed() >= STABLE_AFTER {
            backoff.reset();
        }
        (session, child) = loop {
            let delay = backoff.next_delay();
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                () = stop.cancelled() => {
                    connection.set_state(UpstreamState::Down, None);
                    return;
                }
            }
            // A child spawned by an attempt that `stop` interrupts is killed
            // when the attempt is dropped.
            let opened = tokio::select! {
                opened = open_stdio(&connection.handler, &command, &args, &env) => opened,
                () = stop.cancelled() => {
                    connection.set_state(UpstreamState::Down, None);
                    return;
                }
            };
            match opened {
                Ok(opened) => break opened,
                Err(error) => {
                    tracing::warn!(upstream = %connection.name, %error, "restart failed; retrying");
                    connection.set_state(
                        UpstreamState::Restarting,
                        Some(format!("restart failed: {error}")),
                    );
                }
            }
        };
        tracing::info!(upstream = %connection.name, "stdio upstream restarted");
        connection.replaced(session.peer().clone());
    }
}

/// One tool as the agent sees it.
#[derive(Debug, Clone)]
pub struct CatalogEntry {
    pub upstream: String,
    /// The tool's name at the upstream.
    pub upstream_tool: String,
    /// The tool as exposed (name namespaced, everything else unchanged).
    pub tool: Tool,
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
    /// stdio upstream.
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
            let connection = Arc::new(Connection::new(name, transport.clone(), events.clone()));
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
        let supervisors = stdio
            .into_iter()
            .map(|(connection, session, child)| {
                tokio::spawn(supervise(connection, session, child, stop.clone()))
            })
            .collect();
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

    /// The current session's peer: none while a stdio child restarts (the
    /// call fails as not sent); a lost Streamable HTTP session is opened
    /// again here, within `timeout`.
    async fn session(
        &self,
        connection: &Connection,
        timeout: Duration,
    ) -> Result<Peer<RoleClient>, UpstreamError> {
        if let Some(peer) = connection.peer()
            && !peer.is_transport_closed()
        {
            return Ok(peer);
        }
        let UpstreamTransport::StreamableHttp { url } = &connection.transport else {
            return Err(connection.unavailable());
        };
        let mut session = connection.http.lock().await;
        // Another call may have reconnected meanwhile.
        if let Some(peer) = connection.peer()
            && !peer.is_transport_closed()
        {
            return Ok(peer);
        }
        if self.stop.is_cancelled() {
            return Err(connection.unavailable());
        }
        let opened = tokio::time::timeout(timeout, open_http(&connection.handler, url))
            .await
            .unwrap_or_else(|_| Err(format!("no answer to initialize within {timeout:?}")));
        match opened {
            Ok(opened) => {
                let peer = opened.peer().clone();
                // The old session's loop is over; dropping it frees it.
                *session = Some(opened);
                tracing::info!(upstream = %connection.name, "Streamable HTTP session reopened");
                connection.replaced(peer.clone());
                Ok(peer)
            }
            Err(error) => {
                let error = format!("reconnecting failed: {error}");
                connection.set_state(UpstreamState::Down, Some(error.clone()));
                Err(UpstreamError::NotSent(format!(
                    "upstream {} is down: {error}",
                    connection.name
                )))
            }
        }
    }

    /// The upstream's tools, every page.
    pub async fn list_tools(&self, upstream: &str) -> Result<Vec<Tool>, String> {
        let connection = self
            .connections
            .get(upstream)
            .ok_or_else(|| format!("no upstream named {upstream:?}"))?;
        let peer = self
            .session(connection, REQUEST_TIMEOUT)
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
        let peer = self.session(connection, timeout).await?;
        let mut guard = CallGuard {
            routes: connection.routes(),
            call: connection.routes().begin(agent),
            token: None,
            answered: true,
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
                let error = UpstreamError::NotSent(format!("upstream {upstream}: {error}"));
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
        let (request_id, peer) = (handle.id.clone(), handle.peer.clone());
        let cancel_watch = tokio::spawn(async move {
            cancel.cancelled().await;
            let _ = peer
                .notify_cancelled(CancelledNotificationParam::new(
                    Some(request_id),
                    Some("cancelled by the agent".into()),
                ))
                .await;
        });
        let response = handle.await_response().await;
        cancel_watch.abort();
        guard.answered = !matches!(response, Err(ServiceError::Timeout { .. }));
        drop(guard);
        connection.observe_http(match &response {
            Ok(_) | Err(ServiceError::McpError(_) | ServiceError::Timeout { .. }) => Ok(()),
            Err(error) => Err(error.to_string()),
        });
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
            Err(other) => Err(UpstreamError::MaybeSent(other.to_string())),
        }
    }

    /// Stops the supervisors and the clients, and ends the stdio children:
    /// each gets [`EXIT_GRACE`] to exit on its closed stdin, then is killed
    /// and reaped. Later calls fail as not sent.
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
    async fn call(&self, call: UpstreamCall) -> Result<ToolAnswer, UpstreamError> {
        let params = CallToolRequestParams::new(call.tool.clone()).with_arguments(call.arguments);
        let started = Instant::now();
        let response = self
            .request(
                &call.upstream,
                ClientRequest::CallToolRequest(CallToolRequest::new(params)),
                call.meta,
                call.timeout,
                call.agent,
                call.cancel,
            )
            .await;
        let outcome = match &response {
            Ok(_) => "answered",
            Err(UpstreamError::TimedOut(_)) => "timeout",
            Err(UpstreamError::Refused { .. }) => "refused",
            Err(_) => "transport_error",
        };
        metrics::histogram!("upstream_call_duration_seconds", "upstream" => call.upstream.clone(),
            "tool" => call.tool.clone(), "outcome" => outcome)
        .record(started.elapsed().as_secs_f64());
        match response? {
            ServerResult::CallToolResult(result) => Ok(convert::answer_from_result(&result)),
            other => Err(UpstreamError::MaybeSent(format!(
                "unsupported answer to tools/call (input-required and task results are not proxied yet): {}",
                serde_json::to_string(&other)
                    .unwrap_or_default()
                    .chars()
                    .take(200)
                    .collect::<String>()
            ))),
        }
    }

    fn accepting_calls(&self, upstream: &str) -> bool {
        self.connections
            .get(upstream)
            .is_none_or(|c| c.health().state != UpstreamState::Restarting)
    }
}

/// What `leasegate init` learns of one upstream.
#[derive(Debug, Clone)]
pub struct Inspected {
    /// The server's `name version` from `initialize`, if it said.
    pub server: Option<String>,
    /// Every tool, every page, in the order listed.
    pub tools: Vec<ToolSummary>,
}

/// Connects to one upstream the way [`Upstreams::connect`] does (spawn and
/// `initialize` over stdio, or a Streamable HTTP session), lists its tools
/// (every page), and closes the session again (a stdio child gets its
/// closed stdin, then is killed). For `leasegate init`.
pub async fn inspect_upstream(
    name: &str,
    transport: &UpstreamTransport,
) -> Result<Inspected, StartError> {
    let (events, _) = broadcast::channel(16);
    let handler = UpstreamClient {
        name: name.to_owned(),
        routes: CallRoutes::default(),
        events,
    };
    // rmcp's transport errors start with the transport's type name.
    let connect_error = |message: String| StartError::Connect {
        upstream: name.to_owned(),
        message: match message.split_once("] error: ") {
            Some((_, rest)) if message.starts_with("Send message error Transport [") => {
                rest.to_owned()
            }
            _ => message,
        },
    };
    let (mut session, child) = match transport {
        UpstreamTransport::Stdio { command, args, env } => {
            let (session, child) = inspect_stdio(&handler, command, args, env)
                .await
                .map_err(connect_error)?;
            (session, Some(child))
        }
        UpstreamTransport::StreamableHttp { url } => {
            (open_http(&handler, url).await.map_err(connect_error)?, None)
        }
    };
    let server = session
        .peer()
        .peer_info()
        .and_then(|info| info.server_info.clone())
        .map(|server| format!("{} {}", server.name, server.version));
    let listed = tokio::time::timeout(HANDSHAKE_TIMEOUT, session.peer().list_all_tools())
        .await
        .map_err(|_| format!("no answer to tools/list within {HANDSHAKE_TIMEOUT:?}"))
        .and_then(|listed| listed.map_err(|e| e.to_string()));
    let _ = session.close_with_timeout(EXIT_GRACE).await;
    if let Some(mut child) = child {
        end_child(&mut child, EXIT_GRACE).await;
    }
    let tools = listed.map_err(|message| StartError::List {
        upstream: name.to_owned(),
        message,
    })?;
    Ok(Inspected {
        server,
        tools: tools.iter().map(tool_summary).collect(),
    })
}

/// [`open_stdio`] with the child's stderr kept rather than shown: a server
/// that fails to start gets its last words quoted in the error, one that
/// works (and complains when its stdout is closed under it) stays quiet.
async fn inspect_stdio(
    handler: &UpstreamClient,
    command: &std::path::Path,
    args: &[String],
    env: &BTreeMap<String, String>,
) -> Result<(Session, tokio::process::Child), String> {
    use tokio::io::AsyncReadExt;
    let mut child = spawn_stdio(command, args, env, std::process::Stdio::piped())?;
    let (Some(stdin), Some(stdout), Some(mut stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        return Err("the child's stdin, stdout or stderr is not piped".into());
    };
    // The last 2 KB the child wrote to stderr.
    let said = tokio::spawn(async move {
        const KEEP: usize = 2048;
        let mut kept = Vec::new();
        let mut buffer = [0u8; 1024];
        while let Ok(read) = stderr.read(&mut buffer).await {
            if read == 0 {
                break;
            }
            kept.extend_from_slice(&buffer[..read]);
            if kept.len() > KEEP {
                kept.drain(..kept.len() - KEEP);
            }
        }
        String::from_utf8_lossy(&kept).into_owned()
    });
    match handshake(handler, AsyncRwTransport::new_client(stdout, stdin)).await {
        Ok(session) => Ok((session, child)),
        Err(error) => {
            let exit = end_child(&mut child, EXIT_GRACE).await;
            let said = tokio::time::timeout(EXIT_GRACE, said)
                .await
                .ok()
                .and_then(Result::ok)
                .unwrap_or_default();
            let said = said.split_whitespace().collect::<Vec<_>>().join(" ");
            if said.is_empty() {
                Err(format!("{error} (the command {exit})"))
            } else {
                Err(format!("{error} (the command {exit}; its stderr: {said})"))
            }
        }
    }
}

/// What `init` needs of a listed tool.
fn tool_summary(tool: &Tool) -> ToolSummary {
    let annotations = tool.annotations.as_ref();
    ToolSummary {
        name: tool.name.to_string(),
        title: tool
            .title
            .clone()
            .or_else(|| annotations.and_then(|a| a.title.clone())),
        description: tool.description.as_ref().map(|d| d.to_string()),
        read_only_hint: annotations.and_then(|a| a.read_only_hint),
        destructive_hint: annotations.and_then(|a| a.destructive_hint),
        idempotent_hint: annotations.and_then(|a| a.idempotent_hint),
        input_schema: Value::Object((*tool.input_schema).clone()),
    }
}

#[cfg(test)]
mod supervision_tests {
    use super::*;

    #[test]
    fn restart_delays_double_to_the_cap_with_jitter_and_reset() {
        let mut backoff = Backoff::new();
        let within = |delay: Duration, base: Duration| {
            delay >= base.mul_f64(0.8) && delay <= base.mul_f64(1.2)
        };
        let mut base = Backoff::FIRST;
        for _ in 0..12 {
            let delay = backoff.next_delay();
            assert!(within(delay, base), "{delay:?} is not {base:?} ± 20%");
            base = (base * 2).min(Backoff::CAP);
        }
        assert_eq!(base, Backoff::CAP, "the cap was reached");
        backoff.reset();
        let delay = backoff.next_delay();
        assert!(within(delay, Backoff::FIRST), "{delay:?} after a reset");
    }
}
