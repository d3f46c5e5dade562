//! The MCP server agents talk to: the upstreams' whole server surface,
//! namespaced per upstream, with side-effecting `tools/call` through the
//! ledger and everything else straight through.
//!
//! # Names
//!
//! Tools and prompts are exposed as `<upstream><sep><name>` (`sep` is
//! `namespace_separator`, `__` by default), resources and resource templates
//! as `<upstream>+<uri>`; upstreams listed in `unprefixed` keep their own
//! names and URIs. Every other field of a tool, prompt or resource is passed
//! on as the upstream sent it (as far as rmcp's model carries it).
//!
//! # Leases
//!
//! The caller's lease comes per call in `_meta["dev.leasegate/lease"]` =
//! `{run_id, owner, epoch, token}`, or from the HTTP headers
//! `Leasegate-Run-Id`, `Leasegate-Owner`, `Leasegate-Epoch` and
//! `Leasegate-Lease-Token`; `_meta` wins (and its token is the one in
//! `_meta`). Run id, owner and epoch are public; the token (shown once when
//! the lease was taken) is the credential the ledger's fence checks, so a
//! call without it is refused -32002 with `data.reason =
//! "lease_token_invalid"` and nothing is registered or sent. The token is
//! never logged (it is not a span field). The step comes from
//! `_meta["dev.leasegate/step"]` = `{step_id, effect_version}`.
//!
//! Refused with -32602 before anything is recorded or sent: a `Leasegate-*`
//! or `Idempotency-Key` header given twice (which value counts would be a
//! guess); an owner, step id, task key or idempotency key outside the
//! identifier rule (`ids::check_identifier`); `tools/call` params that do
//! not fit their shape (`on_custom_request`, instead of rmcp's -32601).
//!
//! # What the upstream sends during a call
//!
//! Progress, call-scoped notifications and requests to the client
//! (sampling, elicitation, roots) reach the call's handler through its
//! [`ToAgent`] channel and are sent to the agent from the handler's own
//! future, so rmcp ties them to the agent's request (its response stream
//! over HTTP). Everything queued before the upstream's answer is sent before
//! the answer.
//!
//! An agent on stateless MCP (protocol `V_2026_07_28` and later) cannot be sent requests: its `tools/call` runs
//! in a task of its own ([`PendingCall`]); when the upstream asks the agent
//! something, the request ends with an `input_required` result whose
//! `requestState` names the parked call, and the agent's retry (with
//! `inputResponses`) feeds the answers to the waiting upstream request and
//! drives the call on. Parked calls live in this process's memory for
//! `PARK_TTL`.
//!
//! # Cancellation
//!
//! An agent's cancel fires the call's token (`Front::watch_request`): from
//! `notifications/cancelled` (per-session registry), from the stateless
//! front's registry (`super::inflight`), or, under stateless-MCP and for
//! read-only calls, from the request's own token (the agent went away). The
//! agent is answered `-32800` at once and never with a late result; the
//! upstream is told; a gated call's dispatch runs on in its own task and
//! records what happened (`unknown`: the upstream may have acted).
//!
//! # Crash points
//!
//! Nothing in this module is durable: a crash loses parked stateless-MCP calls
//! (their gated operations are in the ledger, and converge like any other),
//! subscriptions and session state; agents reconnect and call again.
//!
//! # Sessions
//!
//! rmcp builds one `Front` per agent session (HTTP sessions, stdio) or per
//! request (stateless HTTP) through [`Front::for_session`]; per-session state
//! (log level, resource subscriptions, the peer) lives in [`Session`].
//! Session-wide notifications (`list_changed`, `resources/updated`, logs no
//! call owns) go only to live sessions that want them, and to stateless-MCP
//! `subscriptions/listen` streams that accepted them.

// Logging (`logging/setLevel`, `notifications/message`) is deprecated by
// SEP-2577 but still part of every handshake-era protocol version leasegate
// serves.
#![allow(deprecated)]

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, RwLock, Weak};

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CancelledNotificationParam,
    ClientRequest, CompleteRequestParams, CompleteResult, CustomRequest, CustomResult, ErrorCode,
    GetPromptRequestParams, GetPromptResponse, GetPromptResult, Implementation, ListPromptsResult,
    ListResourceTemplatesResult, ListResourcesResult, ListToolsResult, LoggingLevel,
    PaginatedRequestParams, ProgressNotificationParam, ProtocolVersion, ReadResourceRequestParams,
    ReadResourceResponse, ReadResourceResult, ResourceUpdatedNotificationParam, ServerCapabilities,
    ServerConfig, ServerNotification, ServerRequest, ServerResult, SetLevelRequestParams,
    SubscribeRequestParams, Tool, UnsubscribeRequestParams,
};
use rmcp::service::{NotificationContext, Peer, RequestContext};
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::convert::{self, codes};
use super::inflight::InFlightRequests;
use super::upstream::{CatalogEntry, REQUEST_TIMEOUT, UpstreamEvent, Upstreams};
use crate::adapter::{PeerError, SharedDirectory, ToAgent, Upstream, UpstreamCall, UpstreamError};
use crate::config::Config;
use crate::dispatch::{CallContext, CallError, CallReply, CallRequest, Dispatcher};
use crate::ids::{MAX_IDEMPOTENCY_KEY_LEN, MAX_TASK_LEN, check_identifier};
use crate::intent::StepRef;
use crate::ledger::LeaseClaim;

mod request;

pub use super::wire::*;
use request::{
    duplicated_header, invalid_params, is_modern, lease_namespace, lease_of, passthrough_meta,
    request_key, session_refusal, step_of, trace_context,
};

/// The exposed tools, replaced whole when an upstream's list changes.
struct Catalog {
    entries: BTreeMap<String, CatalogEntry>,
    /// The entries' tools in name order, for pagination.
    tools: Vec<Tool>,
    built: std::time::Instant,
}

impl Default for Catalog {
    fn default() -> Self {
        Self::new(BTreeMap::new())
    }
}

impl Catalog {
    fn new(entries: BTreeMap<String, CatalogEntry>) -> Self {
        let tools = entries.values().map(|entry| entry.tool.clone()).collect();
        Self {
            entries,
            tools,
            built: std::time::Instant::now(),
        }
    }
}

/// A `tools/list` from an agent re-lists the upstreams when the catalog is
/// older than this. `list_changed` refreshes at once, but an upstream may
/// send it where nobody hears it (a Streamable HTTP server before the
/// client's GET stream is open), so the catalog never stays stale longer.
const CATALOG_MAX_AGE: std::time::Duration = std::time::Duration::from_secs(10);

/// How long a catalog refresh waits for an upstream's `tools/list`.
const REFRESH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

struct State {
    catalog: RwLock<Arc<Catalog>>,
    /// Exposed name → upstream, upstream tool and adapter (shared with the
    /// background loops).
    directory: Arc<SharedDirectory>,
    config: Arc<Config>,
    upstreams: Arc<Upstreams>,
    dispatcher: Dispatcher<Upstreams>,
    /// Requests of stateless HTTP agents, so that their
    /// `notifications/cancelled` can find them.
    in_flight: Arc<InFlightRequests>,
    /// Live agent sessions (HTTP sessions, stdio), for session-wide
    /// notifications.
    sessions: Mutex<Vec<Weak<Session>>>,
    /// Stateless-MCP calls waiting for the agent's input, by handle.
    parked: Mutex<HashMap<String, PendingCall>>,
    /// Lease mode `session` (stdio): the lease calls without one of their
    /// own are sent under.
    session_lease: std::sync::OnceLock<Arc<crate::worker::session::SessionLease>>,
    /// Lease mode `session` over HTTP: this process's memberships, one per
    /// principal and task key, shared by its sessions and requests.
    session_leases: crate::worker::session::SessionLeases,
    /// Lease mode `key`: the key runs' memberships (and tokens) this
    /// process holds.
    key_leases: crate::worker::session::KeyLeases,
    /// Serializes catalog refreshes.
    refreshing: tokio::sync::Mutex<()>,
    /// Session-wide notifications (exposed names and URIs), for stateless-MCP
    /// `subscriptions/listen` streams; each filters what it accepted.
    notices: tokio::sync::broadcast::Sender<ServerNotification>,
    /// `get_info`'s answer and the upstreams' `initialize` answers it was
    /// merged from. rmcp asks for it on every stateless HTTP request; it
    /// is merged again only when an upstream's session (and so its answer)
    /// changed.
    info: Mutex<Option<(Vec<Arc<rmcp::model::ServerPeerInfo>>, ServerConfig)>>,
}

/// One agent session's state.
#[derive(Default)]
pub struct Session {
    peer: Mutex<Option<Peer<RoleServer>>>,
    log_level: Mutex<Option<LoggingLevel>>,
    /// Exposed URIs this session subscribed to.
    subscriptions: Mutex<HashSet<String>>,
    /// This session's requests in flight, by request id: the
    /// `notifications/cancelled` of the agent fires the token.
    cancels: Mutex<HashMap<String, (u64, CancellationToken)>>,
    /// Numbers the watches, so a watch only removes its own entry.
    next_watch: std::sync::atomic::AtomicU64,
    /// Lease mode `session` over HTTP: the process's membership this MCP
    /// session (or stateless request) uses, from its first side-effecting
    /// call without a lease of its own; held while the session lives.
    lease: tokio::sync::OnceCell<Arc<crate::worker::session::SessionLease>>,
}

/// The MCP front. Cheap to clone.
#[derive(Clone)]
pub struct Front {
    state: Arc<State>,
    session: Arc<Session>,
}

/// An rmcp request from its JSON-RPC method and params.
fn client_request(method: &str, params: Value) -> Result<ClientRequest, McpError> {
    serde_json::from_value(json!({"method": method, "params": params}))
        .map_err(|e| McpError::internal_error(format!("cannot build {method}: {e}"), None))
}

/// A typed result from the upstream's answer, whatever variant rmcp guessed.
fn typed<T: serde::de::DeserializeOwned>(result: ServerResult, what: &str) -> Result<T, McpError> {
    let value = serde_json::to_value(&result)
        .map_err(|e| McpError::internal_error(format!("{what}: {e}"), None))?;
    serde_json::from_value(value).map_err(|e| {
        McpError::internal_error(format!("upstream answer to {what} unreadable: {e}"), None)
    })
}

/// The agent's error for an upstream failure outside the ledger.
fn upstream_failure(upstream: &str, error: UpstreamError) -> McpError {
    match error {
        UpstreamError::Refused {
            code,
            message,
            data,
        } => McpError::new(ErrorCode(code), message, data),
        other => McpError::internal_error(format!("upstream {upstream}: {other}"), None),
    }
}

fn peer_error(error: McpError) -> PeerError {
    PeerError {
        code: error.code.0,
        message: error.message.to_string(),
        data: error.data,
    }
}

impl Front {
    /// `directory` is the resolution of `catalog` (see
    /// `upstream::directory`), shared with the background loops.
    pub fn new(
        catalog: BTreeMap<String, CatalogEntry>,
        directory: Arc<SharedDirectory>,
        config: Arc<Config>,
        upstreams: Arc<Upstreams>,
        dispatcher: Dispatcher<Upstreams>,
        in_flight: Arc<InFlightRequests>,
    ) -> Self {
        let session_leases = crate::worker::session::SessionLeases::new(
            dispatcher.ledger().clone(),
            &config.tenant,
            dispatcher.owner(),
            crate::worker::session_heartbeat(config.session.ttl),
        );
        let front = Self {
            state: Arc::new(State {
                catalog: RwLock::new(Arc::new(Catalog::new(catalog))),
                directory,
                config,
                upstreams,
                dispatcher,
                in_flight,
                sessions: Mutex::new(Vec::new()),
                parked: Mutex::new(HashMap::new()),
                session_lease: std::sync::OnceLock::new(),
                session_leases,
                key_leases: crate::worker::session::KeyLeases::new(),
                notices: tokio::sync::broadcast::channel(256).0,
                refreshing: tokio::sync::Mutex::new(()),
                info: Mutex::new(None),
            }),
            session: Arc::default(),
        };
        let events = front.state.upstreams.events();
        tokio::spawn(relay_events(Arc::downgrade(&front.state), events));
        front
    }

    /// Lease mode `session`: calls that bring no lease of their own are
    /// sent under `lease` from now on (set once, before serving).
    pub fn set_session_lease(&self, lease: Arc<crate::worker::session::SessionLease>) {
        let _ = self.state.session_lease.set(lease);
    }

    /// Lease mode `session`: this process's memberships (stdio takes its
    /// own there, before serving).
    pub fn session_leases(&self) -> &crate::worker::session::SessionLeases {
        &self.state.session_leases
    }

    /// The requests in flight on the stateless HTTP front.
    pub fn in_flight(&self) -> Arc<InFlightRequests> {
        self.state.in_flight.clone()
    }

    /// The front for a new agent session (or a stateless request).
    pub fn for_session(&self) -> Self {
        Self {
            state: self.state.clone(),
            session: Arc::default(),
        }
    }

    fn catalog(&self) -> Arc<Catalog> {
        self.state
            .catalog
            .read()
            .map(|c| c.clone())
            .unwrap_or_default()
    }

    fn separator(&self) -> &str {
        &self.state.config.naming.separator
    }

    fn unprefixed(&self, upstream: &str) -> bool {
        self.state
            .config
            .naming
            .unprefixed
            .iter()
            .any(|u| u == upstream)
    }

    /// `<upstream><separator><own>`, or `own` for unprefixed upstreams.
    fn expose(&self, upstream: &str, own: &str, separator: &str) -> String {
        if self.unprefixed(upstream) {
            own.to_owned()
        } else {
            format!("{upstream}{separator}{own}")
        }
    }

    /// The upstream and its own name for an exposed one (prefixed by an
    /// upstream and `separator`, else the unprefixed upstream's own).
    fn resolve(&self, exposed: &str, separator: &str) -> Option<(String, String)> {
        for upstream in self.state.upstreams.names() {
            if self.unprefixed(upstream) {
                continue;
            }
            if let Some(rest) = exposed
                .strip_prefix(upstream)
                .and_then(|r| r.strip_prefix(separator))
            {
                return Some((upstream.to_owned(), rest.to_owned()));
            }
        }
        self.state
            .upstreams
            .names()
            .find(|u| self.unprefixed(u))
            .map(|u| (u.to_owned(), exposed.to_owned()))
    }

    /// A tool or prompt name as exposed: `<upstream><sep><name>`.
    fn exposed_name(&self, upstream: &str, name: &str) -> String {
        self.expose(upstream, name, self.separator())
    }

    /// The upstream and its own name of an exposed tool or prompt name.
    fn resolve_name(&self, exposed: &str) -> Option<(String, String)> {
        self.resolve(exposed, self.separator())
    }

    /// A resource URI (or template) as exposed: `<upstream>+<uri>`.
    fn exposed_uri(&self, upstream: &str, uri: &str) -> String {
        self.expose(upstream, uri, URI_SEPARATOR)
    }

    /// The upstream and its own URI of an exposed resource URI.
    fn resolve_uri(&self, exposed: &str) -> Option<(String, String)> {
        self.resolve(exposed, URI_SEPARATOR)
    }

    /// Rewrites the resource URIs of a result from `upstream` to their
    /// exposed form: resource links and embedded resources in `content`
    /// (tool results) and in `messages[].content` (prompts), and
    /// `contents[].uri` (resource reads). Nothing else is touched: a tool's
    /// `structuredContent` and `_meta` are the tool's own data.
    fn expose_uris(&self, upstream: &str, value: &mut Value) {
        let expose = |uri: Option<&mut Value>| {
            if let Some(Value::String(uri)) = uri {
                *uri = self.exposed_uri(upstream, uri);
            }
        };
        let expose_block = |block: &mut Value| match block.get("type").and_then(Value::as_str) {
            Some("resource_link") => expose(block.get_mut("uri")),
            Some("resource") => expose(block.pointer_mut("/resource/uri")),
            _ => {}
        };
        if let Some(Value::Array(blocks)) = value.get_mut("content") {
            blocks.iter_mut().for_each(expose_block);
        }
        if let Some(Value::Array(messages)) = value.get_mut("messages") {
            for message in messages {
                match message.get_mut("content") {
                    Some(Value::Array(blocks)) => blocks.iter_mut().for_each(expose_block),
                    Some(block) => expose_block(block),
                    None => {}
                }
            }
        }
        if let Some(Value::Array(contents)) = value.get_mut("contents") {
            for content in contents {
                expose(content.get_mut("uri"));
            }
        }
    }

    /// Upstreams whose capabilities satisfy `has`.
    fn upstreams_with(&self, has: impl Fn(&ServerCapabilities) -> bool) -> Vec<String> {
        self.state
            .upstreams
            .names()
            .filter(|u| {
                self.state
                    .upstreams
                    .server_info(u)
                    .is_some_and(|info| has(&info.capabilities))
            })
            .map(str::to_owned)
            .collect()
    }

    fn register_session(&self, peer: Peer<RoleServer>) {
        if let Ok(mut slot) = self.session.peer.lock() {
            if slot.is_some() {
                return;
            }
            *slot = Some(peer);
        }
        if let Ok(mut sessions) = self.state.sessions.lock() {
            sessions.retain(|s| s.strong_count() > 0);
            sessions.push(Arc::downgrade(&self.session));
        }
    }

    /// Sends one upstream request that is not a tool call, relaying what the
    /// upstream sends meanwhile to this agent.
    async fn forward(
        &self,
        upstream: &str,
        method: &str,
        params: Value,
        context: &RequestContext<RoleServer>,
    ) -> Result<ServerResult, McpError> {
        let request = client_request(method, params)?;
        let cancel = self.cancel_token(context, false);
        let (agent, from_upstream) = mpsc::unbounded_channel();
        let request = self.state.upstreams.request(
            upstream,
            request,
            passthrough_meta(context),
            REQUEST_TIMEOUT,
            Some(agent),
            cancel.clone(),
        );
        // The agent's cancel answers at once: no late result.
        let work = async {
            tokio::select! {
                biased;
                answer = request => answer.map_err(|e| upstream_failure(upstream, e)),
                _ = cancel.cancelled() => Err(cancelled_by_the_agent()),
            }
        };
        let answer = self.with_agent(context, from_upstream, work).await;
        cancel.cancel();
        answer
    }

    /// Runs `work` while relaying what the upstream sends to the agent, from
    /// this handler's own future. Whatever was queued before `work` ended is
    /// delivered before this returns.
    async fn with_agent<T>(
        &self,
        context: &RequestContext<RoleServer>,
        mut from_upstream: mpsc::UnboundedReceiver<ToAgent>,
        work: impl Future<Output = T>,
    ) -> T {
        tokio::pin!(work);
        let mut requests = FuturesUnordered::new();
        let outcome = loop {
            tokio::select! {
                biased;
                Some(item) = from_upstream.recv() => {
                    if let Some(request) = self.to_agent(item, context).await {
                        requests.push(request);
                    }
                }
                Some(()) = requests.next(), if !requests.is_empty() => {}
                outcome = &mut work => break outcome,
            }
        };
        while let Ok(item) = from_upstream.try_recv() {
            // Requests still queued: the call is over, nobody waits for them.
            let _ = self.to_agent(item, context).await;
        }
        outcome
    }

    /// Delivers one item; a request comes back as the future that relays it
    /// and its answer.
    async fn to_agent(
        &self,
        item: ToAgent,
        context: &RequestContext<RoleServer>,
    ) -> Option<futures::future::BoxFuture<'static, ()>> {
        match item {
            ToAgent::Progress(update) => {
                if let Some(token) = context.meta.get_progress_token() {
                    let mut params = ProgressNotificationParam::new(token, update.progress);
                    params.total = update.total;
                    params.message = update.message;
                    let _ = context.peer.notify_progress(params).await;
                }
                None
            }
            ToAgent::Notification {
                upstream,
                method,
                mut params,
            } => {
                if method == "notifications/message" {
                    // stateless-MCP: the request's logLevel, and no logs without
                    // one; before: the session's level, if it set one.
                    let wanted: Option<LoggingLevel> = if is_modern(context) {
                        match context
                            .meta
                            .get(LOG_LEVEL_META)
                            .and_then(|v| serde_json::from_value(v.clone()).ok())
                        {
                            Some(level) => Some(level),
                            None => return None,
                        }
                    } else {
                        self.session.log_level.lock().ok().and_then(|l| *l)
                    };
                    let level: Option<LoggingLevel> = params
                        .get("level")
                        .and_then(|v| serde_json::from_value(v.clone()).ok());
                    if let (Some(wanted), Some(level)) = (wanted, level)
                        && level_rank(level) < level_rank(wanted)
                    {
                        return None;
                    }
                    prefix_logger(&upstream, &mut params);
                }
                match serde_json::from_value::<ServerNotification>(
                    json!({"method": method, "params": params}),
                ) {
                    Ok(notification) => {
                        let _ = context.peer.send_notification(notification).await;
                    }
                    Err(error) => {
                        tracing::debug!(method = %crate::logfield::clip(&method), error = %crate::logfield::clip_display(&error), "upstream notification not relayed")
                    }
                }
                None
            }
            ToAgent::Request(request) => {
                if let Err(refusal) = self.can_relay(&request.method, &request.params, context) {
                    let _ = request.reply.send(Err(refusal));
                    return None;
                }
                let peer = context.peer.clone();
                Some(Box::pin(async move {
                    let answer = match serde_json::from_value::<ServerRequest>(
                        json!({"method": request.method, "params": request.params}),
                    ) {
                        Err(error) => Err(PeerError {
                            code: codes::INVALID_PARAMS,
                            message: format!("leasegate cannot relay {}: {error}", request.method),
                            data: None,
                        }),
                        Ok(server_request) => match peer.send_request(server_request).await {
                            Ok(result) => Ok(serde_json::to_value(&result).unwrap_or(Value::Null)),
                            Err(rmcp::service::ServiceError::McpError(error)) => {
                                Err(peer_error(error))
                            }
                            Err(other) => Err(PeerError {
                                code: ErrorCode::INTERNAL_ERROR.0,
                                message: format!("the agent did not answer: {other}"),
                                data: None,
                            }),
                        },
                    };
                    let _ = request.reply.send(answer);
                }))
            }
        }
    }

    /// Whether this agent can be asked `method` now, or why not.
    fn can_relay(
        &self,
        method: &str,
        params: &Value,
        context: &RequestContext<RoleServer>,
    ) -> Result<(), PeerError> {
        if is_modern(context) {
            return Err(refusal(format!(
                "the agent speaks MCP {}, where {method} is only answered within tools/call (input_required); leasegate relays it there only",
                ProtocolVersion::V_2026_07_28.as_str()
            )));
        }
        if let Some(parts) = context.extensions.get::<http::request::Parts>()
            && !parts.headers.contains_key("mcp-session-id")
        {
            return Err(refusal(format!(
                "leasegate's HTTP front runs without sessions (http_sessions = false): the agent cannot answer {method}; enable http_sessions, use leasegate stdio, or a stateless-MCP client"
            )));
        }
        let capabilities = context
            .peer
            .peer_info()
            .map(|info| info.capabilities.clone())
            .unwrap_or_default();
        check_capability(method, params, &capabilities)
    }

    /// A token fired when the agent cancels the request. `explicit_only`:
    /// ignore the agent merely going away (side-effecting calls continue,
    /// owned by leasegate) — except under stateless-MCP, where closing the
    /// response stream is how an agent cancels.
    fn cancel_token(
        &self,
        context: &RequestContext<RoleServer>,
        explicit_only: bool,
    ) -> CancellationToken {
        let token = CancellationToken::new();
        self.watch_request(
            context,
            token.clone(),
            explicit_only,
            CancellationToken::new(),
        );
        token
    }

    /// Fires `token` when the agent cancels this request (see
    /// [`Front::cancel_token`]), until the call ends (`token` fires) or
    /// `detach` fires: a stateless-MCP call that waits for the agent's input
    /// outlives the request that started it and is watched through the
    /// request that resumes it.
    fn watch_request(
        &self,
        context: &RequestContext<RoleServer>,
        token: CancellationToken,
        explicit_only: bool,
        detach: CancellationToken,
    ) {
        let explicit_only = explicit_only && !is_modern(context);
        let key = request_key(&context.id);
        // The agent's notifications/cancelled finds the token here (sessions,
        // stdio) ...
        let watch = self
            .session
            .next_watch
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if let Ok(mut cancels) = self.session.cancels.lock() {
            cancels.insert(key.clone(), (watch, token.clone()));
        }
        // ... or, from a stateless HTTP agent, arrives as its own POST: the
        // in-flight registry finds this request by client and id.
        let registration = context
            .extensions
            .get::<http::request::Parts>()
            .filter(|parts| !parts.headers.contains_key("mcp-session-id"))
            .map(|parts| {
                self.state
                    .in_flight
                    .register(&parts.headers, &context.id, token.clone())
            });
        let (watched, fire, done, session) = (
            context.ct.clone(),
            token.clone(),
            token.clone(),
            self.session.clone(),
        );
        tokio::spawn(async move {
            tokio::select! {
                // A detached watch never fires (the request that ended with
                // input_required closes its stream right after).
                biased;
                _ = detach.cancelled() => {}
                _ = done.cancelled() => {}
                // The request's own token also fires when the agent merely
                // goes away (session closed, connection dropped).
                _ = watched.cancelled() => {
                    if !explicit_only {
                        fire.cancel();
                    }
                    tokio::select! {
                        _ = done.cancelled() => {}
                        _ = detach.cancelled() => {}
                    }
                }
            }
            if let Ok(mut cancels) = session.cancels.lock()
                && cancels.get(&key).is_some_and(|(w, _)| *w == watch)
            {
                cancels.remove(&key);
            }
            drop(registration);
        });
    }

    /// The upstream call of a read-only tool, as a future that owns
    /// everything it needs (an stateless MCP call may outlive the request
    /// that started it; see [`Front::drive_modern`]).
    fn read_only(
        &self,
        resolved: crate::adapter::ResolvedTool,
        request: CallToolRequestParams,
        context: &RequestContext<RoleServer>,
        agent: crate::adapter::AgentSink,
        watch: &CallWatch,
    ) -> ToolCall {
        let upstream = resolved.upstream;
        let cancel = watch.cancel.clone();
        self.watch_request(context, cancel.clone(), false, watch.detach.clone());
        let call = UpstreamCall {
            upstream: upstream.clone(),
            tool: resolved.tool,
            arguments: request.arguments.unwrap_or_default(),
            meta: passthrough_meta(context),
            timeout: resolved.adapter.timeout,
            agent: Some(agent),
            cancel: cancel.clone(),
        };
        let front = self.clone();
        Box::pin(async move {
            // The agent's cancel answers at once (the upstream is told, and
            // its late answer is dropped): no late result.
            let answer = tokio::select! {
                biased;
                answer = front.state.upstreams.call(call) => answer,
                _ = cancel.cancelled() => return Err(cancelled_by_the_agent()),
            };
            cancel.cancel();
            match answer {
                Ok(mut answer) => {
                    front.expose_uris(&upstream, &mut answer.result);
                    convert::tool_result(answer.result)
                }
                Err(error) => Err(upstream_failure(&upstream, error)),
            }
        })
    }
}

/// The answer to a request the agent cancelled.
fn cancelled_by_the_agent() -> McpError {
    McpError::new(
        ErrorCode(codes::REQUEST_CANCELLED),
        "cancelled by the agent",
        None,
    )
}

/// A tool call in progress, ending in the agent's result.
type ToolCall = futures::future::BoxFuture<'static, Result<CallToolResult, McpError>>;

/// How a tool call is cancelled: `cancel` reaches the upstream; `detach`
/// ends the watch of the request currently carrying the call.
#[derive(Clone, Default)]
struct CallWatch {
    cancel: CancellationToken,
    detach: CancellationToken,
}

fn refusal(message: String) -> PeerError {
    PeerError {
        code: ErrorCode::INVALID_REQUEST.0,
        message,
        data: None,
    }
}

/// Refuses a request the agent did not declare it can answer.
fn check_capability(
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

/// How long a stateless-MCP call waits for the agent to answer an
/// `input_required` result before it is given up (the upstream's request
/// then gets an error; a gated call's outcome is recorded all the same).
const PARK_TTL: std::time::Duration = std::time::Duration::from_secs(600);

/// At most this many calls wait for agents' input at once (per process).
const PARK_MAX: usize = 10_000;

/// A tool call of a stateless-MCP agent, running in its own task so that
/// it can outlive the request that started it: when the upstream asks the
/// agent something, the request ends with `input_required` and the call
/// waits, parked under the `requestState` handle, for the agent's retry.
/// The handle is only known to this process (instance affinity).
pub struct PendingCall {
    outcome: tokio::task::JoinHandle<Result<CallToolResult, McpError>>,
    from_upstream: mpsc::UnboundedReceiver<ToAgent>,
    /// Input key → where the agent's answer goes.
    waiting: HashMap<String, tokio::sync::oneshot::Sender<Result<Value, PeerError>>>,
    /// Input key → what was asked (asked again if a retry leaves it out).
    asked: HashMap<String, rmcp::model::InputRequest>,
    next_input: u64,
    parked_at: std::time::Instant,
    watch: CallWatch,
    /// The exposed tool name (a retry must name the same tool).
    tool: String,
}

impl PendingCall {
    fn start(
        tool: String,
        call: ToolCall,
        from_upstream: mpsc::UnboundedReceiver<ToAgent>,
        watch: CallWatch,
    ) -> Self {
        Self {
            tool,
            outcome: tokio::spawn(call),
            from_upstream,
            waiting: HashMap::new(),
            asked: HashMap::new(),
            next_input: 0,
            parked_at: std::time::Instant::now(),
            watch,
        }
    }
}

impl Front {
    /// Turns an upstream request into an input request of this round, or
    /// answers it with an error.
    fn add_input(
        &self,
        pending: &mut PendingCall,
        request: crate::adapter::AgentRequest,
        context: &RequestContext<RoleServer>,
        inputs: &mut rmcp::model::InputRequests,
    ) {
        let capabilities = context.client_capabilities().unwrap_or_default();
        if let Err(refused) = check_capability(&request.method, &request.params, &capabilities) {
            let _ = request.reply.send(Err(refused));
            return;
        }
        match serde_json::from_value::<rmcp::model::InputRequest>(
            json!({"method": request.method, "params": request.params}),
        ) {
            Ok(input) => {
                pending.next_input += 1;
                let key = format!("leasegate-{}", pending.next_input);
                pending.waiting.insert(key.clone(), request.reply);
                pending.asked.insert(key.clone(), input.clone());
                inputs.insert(key, input);
            }
            Err(error) => {
                let _ = request.reply.send(Err(refusal(format!(
                    "{} cannot be asked of an MCP {} agent: {error}",
                    request.method,
                    ProtocolVersion::V_2026_07_28.as_str()
                ))));
            }
        }
    }

    /// Runs a stateless-MCP call until it ends or needs the agent's input.
    async fn drive_modern(
        &self,
        context: &RequestContext<RoleServer>,
        mut pending: PendingCall,
    ) -> Result<CallToolResponse, McpError> {
        loop {
            tokio::select! {
                biased;
                Some(item) = pending.from_upstream.recv() => {
                    let ToAgent::Request(request) = item else {
                        let _ = self.to_agent(item, context).await;
                        continue;
                    };
                    let mut inputs = rmcp::model::InputRequests::new();
                    self.add_input(&mut pending, request, context, &mut inputs);
                    while let Ok(item) = pending.from_upstream.try_recv() {
                        match item {
                            ToAgent::Request(request) => {
                                self.add_input(&mut pending, request, context, &mut inputs)
                            }
                            other => {
                                let _ = self.to_agent(other, context).await;
                            }
                        }
                    }
                    if inputs.is_empty() {
                        continue;
                    }
                    return Ok(self.park(pending, inputs));
                }
                outcome = &mut pending.outcome => {
                    while let Ok(item) = pending.from_upstream.try_recv() {
                        let _ = self.to_agent(item, context).await;
                    }
                    let result = outcome.map_err(|e| {
                        McpError::internal_error(format!("the call's task failed: {e}"), None)
                    })??;
                    return Ok(CallToolResponse::Complete(result));
                }
            }
        }
    }

    /// The agent's retry of a call that needed its input.
    async fn resume_modern(
        &self,
        tool: &str,
        context: &RequestContext<RoleServer>,
        handle: &str,
        responses: rmcp::model::InputResponses,
    ) -> Result<CallToolResponse, McpError> {
        let pending = self.state.parked.lock().ok().and_then(|mut parked| {
            parked.retain(|_, p: &mut PendingCall| {
                let keep = p.parked_at.elapsed() < PARK_TTL;
                if !keep {
                    p.watch.cancel.cancel();
                }
                keep
            });
            // A handle is only good for the tool it was given for.
            match parked.get(handle) {
                Some(p) if p.tool == tool => parked.remove(handle),
                _ => None,
            }
        });
        let Some(mut pending) = pending else {
            return Err(invalid_params(format!(
                "requestState {handle:?} is unknown, expired or not for {tool:?}: leasegate keeps a call that waits for input for {} s, in the memory of the process that started it; call the tool again",
                PARK_TTL.as_secs()
            )));
        };
        self.watch_request(
            context,
            pending.watch.cancel.clone(),
            false,
            pending.watch.detach.clone(),
        );
        for (key, answer) in responses {
            if let Some(reply) = pending.waiting.remove(&key) {
                pending.asked.remove(&key);
                let _ = reply.send(Ok(answer));
            }
        }
        if !pending.waiting.is_empty() {
            // Asked and not answered: ask again, or the upstream waits on.
            let inputs = pending.asked.clone().into_iter().collect();
            return Ok(self.park(pending, inputs));
        }
        self.drive_modern(context, pending).await
    }

    /// Ends this request with `input_required`; the call waits, parked
    /// under a new handle, for the agent's retry. Calls parked longer than
    /// `PARK_TTL`, and the oldest beyond `PARK_MAX`, are given up: their
    /// upstream request is cancelled.
    fn park(
        &self,
        mut pending: PendingCall,
        inputs: rmcp::model::InputRequests,
    ) -> CallToolResponse {
        let handle = uuid::Uuid::new_v4().to_string();
        pending.parked_at = std::time::Instant::now();
        // This request ends here; the call goes on, watched by the request
        // that resumes it.
        pending.watch.detach.cancel();
        pending.watch.detach = CancellationToken::new();
        if let Ok(mut parked) = self.state.parked.lock() {
            parked.retain(|_, p: &mut PendingCall| {
                let keep = p.parked_at.elapsed() < PARK_TTL;
                if !keep {
                    p.watch.cancel.cancel();
                }
                keep
            });
            while parked.len() >= PARK_MAX {
                let oldest = parked
                    .iter()
                    .min_by_key(|(_, p)| p.parked_at)
                    .map(|(h, _)| h.clone());
                match oldest.and_then(|h| parked.remove(&h)) {
                    Some(given_up) => given_up.watch.cancel.cancel(),
                    None => break,
                }
            }
            parked.insert(handle.clone(), pending);
        }
        CallToolResponse::InputRequired(rmcp::model::InputRequiredResult::new(
            Some(inputs),
            Some(handle),
        ))
    }
}

/// The server info leasegate answers `initialize` with: the capabilities
/// any upstream has (list changes always announced: leasegate sends them
/// when its merged lists change), and every upstream's instructions under
/// its name.
fn merged_info(infos: &[(&str, Arc<rmcp::model::ServerPeerInfo>)]) -> ServerConfig {
    let any = |has: &dyn Fn(&ServerCapabilities) -> bool| {
        infos.iter().any(|(_, info)| has(&info.capabilities))
    };
    let mut capabilities = json!({"tools": {"listChanged": true}});
    if any(&|c| c.resources.is_some()) {
        let subscribe = any(&|c| {
            c.resources
                .as_ref()
                .is_some_and(|r| r.subscribe == Some(true))
        });
        capabilities["resources"] = json!({"listChanged": true, "subscribe": subscribe});
    }
    if any(&|c| c.prompts.is_some()) {
        capabilities["prompts"] = json!({"listChanged": true});
    }
    if any(&|c| c.completions.is_some()) {
        capabilities["completions"] = json!({});
    }
    if any(&|c| c.logging.is_some()) {
        capabilities["logging"] = json!({});
    }
    let capabilities: ServerCapabilities = serde_json::from_value(capabilities).unwrap_or_default();
    let mut instructions = String::from(
        "leasegate fronts these MCP servers; tools and prompts are named <server>__<name>, resources <server>+<uri>. Side-effecting tool calls are recorded once per intent and replayed on retry.",
    );
    for (upstream, info) in infos {
        if let Some(text) = &info.instructions {
            instructions.push_str(&format!("\n\n[{upstream}]\n{text}"));
        }
    }
    ServerConfig::new(capabilities)
        .with_server_info(Implementation::new("leasegate", env!("CARGO_PKG_VERSION")))
        .with_instructions(instructions)
}

/// `logger` → `<upstream>/<logger>` (or `<upstream>`), so the agent can
/// tell which upstream logged.
fn prefix_logger(upstream: &str, params: &mut Value) {
    if let Some(map) = params.as_object_mut() {
        let logger = match map.get("logger").and_then(Value::as_str) {
            Some(logger) => format!("{upstream}/{logger}"),
            None => upstream.to_owned(),
        };
        map.insert("logger".into(), Value::String(logger));
    }
}

fn level_rank(level: LoggingLevel) -> u8 {
    match level {
        LoggingLevel::Debug => 0,
        LoggingLevel::Info => 1,
        LoggingLevel::Notice => 2,
        LoggingLevel::Warning => 3,
        LoggingLevel::Error => 4,
        LoggingLevel::Critical => 5,
        LoggingLevel::Alert => 6,
        LoggingLevel::Emergency => 7,
    }
}

/// Handles what upstreams send that no call owns, until the front is gone.
async fn relay_events(
    state: Weak<State>,
    mut events: tokio::sync::broadcast::Receiver<UpstreamEvent>,
) {
    loop {
        let event = match events.recv().await {
            Ok(event) => event,
            Err(tokio::sync::broadcast::error::RecvError::Lagged(missed)) => {
                tracing::warn!(missed, "upstream notifications dropped (too many at once)");
                continue;
            }
            Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
        };
        let Some(state) = state.upgrade() else { return };
        let front = Front {
            state,
            session: Arc::default(),
        };
        front.on_upstream_event(event).await;
    }
}

impl Front {
    fn live_sessions(&self) -> Vec<(Arc<Session>, Peer<RoleServer>)> {
        let Ok(mut sessions) = self.state.sessions.lock() else {
            return Vec::new();
        };
        sessions.retain(|s| s.strong_count() > 0);
        sessions
            .iter()
            .filter_map(Weak::upgrade)
            .filter_map(|s| {
                let peer = s.peer.lock().ok()?.clone()?;
                Some((s, peer))
            })
            .collect()
    }

    async fn on_upstream_event(&self, event: UpstreamEvent) {
        let UpstreamEvent {
            upstream,
            method,
            mut params,
        } = event;
        match method.as_str() {
            "notifications/tools/list_changed" => {
                if let Err(error) = self.refresh_tools(&upstream).await {
                    tracing::warn!(%upstream, error = %crate::logfield::clip_display(&error), "tools/list after list_changed failed; catalog kept");
                    return;
                }
                self.notice(ServerNotification::ToolListChangedNotification(
                    Default::default(),
                ));
                for (_, peer) in self.live_sessions() {
                    let _ = peer.notify_tool_list_changed().await;
                }
            }
            "notifications/prompts/list_changed" => {
                self.notice(ServerNotification::PromptListChangedNotification(
                    Default::default(),
                ));
                for (_, peer) in self.live_sessions() {
                    let _ = peer.notify_prompt_list_changed().await;
                }
            }
            "notifications/resources/list_changed" => {
                self.notice(ServerNotification::ResourceListChangedNotification(
                    Default::default(),
                ));
                for (_, peer) in self.live_sessions() {
                    let _ = peer.notify_resource_list_changed().await;
                }
            }
            "notifications/resources/updated" => {
                let Some(uri) = params.get("uri").and_then(Value::as_str) else {
                    return;
                };
                let exposed = self.exposed_uri(&upstream, uri);
                self.notice(ServerNotification::ResourceUpdatedNotification(
                    rmcp::model::ResourceUpdatedNotification::new(
                        ResourceUpdatedNotificationParam::new(exposed.clone()),
                    ),
                ));
                for (session, peer) in self.live_sessions() {
                    let subscribed = session
                        .subscriptions
                        .lock()
                        .is_ok_and(|s| s.contains(&exposed));
                    if subscribed {
                        let _ = peer
                            .notify_resource_updated(ResourceUpdatedNotificationParam::new(
                                exposed.clone(),
                            ))
                            .await;
                    }
                }
            }
            "notifications/message" => {
                prefix_logger(&upstream, &mut params);
                let Ok(message) =
                    serde_json::from_value::<rmcp::model::LoggingMessageNotificationParam>(params)
                else {
                    return;
                };
                for (session, peer) in self.live_sessions() {
                    let wanted = session
                        .log_level
                        .lock()
                        .ok()
                        .and_then(|l| *l)
                        .is_some_and(|min| level_rank(message.level) >= level_rank(min));
                    if wanted {
                        let _ = peer
                            .send_notification(ServerNotification::LoggingMessageNotification(
                                rmcp::model::LoggingMessageNotification::new(message.clone()),
                            ))
                            .await;
                    }
                }
            }
            other => {
                tracing::debug!(%upstream, method = %crate::logfield::clip(other), "upstream notification not relayed")
            }
        }
    }

    /// Offers a session-wide notification to stateless-MCP listeners.
    fn notice(&self, notification: ServerNotification) {
        // No listener is not an error.
        let _ = self.state.notices.send(notification);
    }

    /// Re-lists `upstream`'s tools and replaces its part of the catalog and
    /// the directory.
    async fn refresh_tools(&self, upstream: &str) -> Result<(), String> {
        // One refresh at a time: each reads the catalog and replaces it.
        let _one_at_a_time = self.state.refreshing.lock().await;
        self.refresh_locked(upstream).await
    }

    /// Re-lists every upstream if the catalog is older than
    /// `CATALOG_MAX_AGE` (checked again under the lock, so concurrent
    /// `tools/list` calls refresh once).
    async fn refresh_if_stale(&self) {
        let _one_at_a_time = self.state.refreshing.lock().await;
        if self.catalog().built.elapsed() <= CATALOG_MAX_AGE {
            return;
        }
        let upstreams: Vec<String> = self.state.upstreams.names().map(str::to_owned).collect();
        for upstream in upstreams {
            if let Err(error) = self.refresh_locked(&upstream).await {
                tracing::warn!(%upstream, error = %crate::logfield::clip_display(&error), "tools/list failed; its tools are served as last listed");
            }
        }
    }

    async fn refresh_locked(&self, upstream: &str) -> Result<(), String> {
        let tools =
            tokio::time::timeout(REFRESH_TIMEOUT, self.state.upstreams.list_tools(upstream))
                .await
                .map_err(|_| format!("tools/list took more than {REFRESH_TIMEOUT:?}"))??;
        let current = self.catalog();
        let mut entries: BTreeMap<String, CatalogEntry> = current
            .entries
            .iter()
            .filter(|(_, e)| e.upstream != upstream)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for tool in tools {
            let exposed = self.exposed_name(upstream, &tool.name);
            if let Some(existing) = entries.get(&exposed) {
                tracing::warn!(name = %crate::logfield::clip(&exposed), first = %existing.upstream, second = %upstream,
                    "tool name collision after list_changed; keeping the first");
                continue;
            }
            let mut exposed_tool = tool.clone();
            exposed_tool.name = exposed.clone().into();
            entries.insert(
                exposed,
                CatalogEntry {
                    upstream: upstream.to_owned(),
                    upstream_tool: tool.name.to_string(),
                    tool: exposed_tool,
                },
            );
        }
        let directory = super::upstream::directory(&entries, &self.state.config);
        self.state.directory.replace(directory);
        if let Ok(mut catalog) = self.state.catalog.write() {
            *catalog = Arc::new(Catalog::new(entries));
        }
        Ok(())
    }

    /// One page of `items` after `cursor` (leasegate's own pagination).
    fn page<T: Clone>(
        &self,
        items: &[T],
        cursor: Option<String>,
    ) -> Result<(Vec<T>, Option<String>), McpError> {
        let start = match cursor {
            None => 0,
            Some(cursor) => cursor
                .parse::<usize>()
                .ok()
                .filter(|n| *n <= items.len())
                .ok_or_else(|| invalid_params(format!("invalid cursor {cursor:?}")))?,
        };
        let end = (start + self.state.config.naming.tools_page_size).min(items.len());
        let next = (end < items.len()).then(|| end.to_string());
        Ok((items[start..end].to_vec(), next))
    }

    /// One page of leasegate's own listing of `method` (resources,
    /// templates or prompts): every page of every upstream that offers it,
    /// each item's `renamed` field (`uri`, `uriTemplate` or `name`) in its
    /// exposed form, everything else as the upstream sent it.
    async fn merged_list<T: serde::de::DeserializeOwned>(
        &self,
        method: &str,
        field: &str,
        renamed: &str,
        cursor: Option<String>,
        context: &RequestContext<RoleServer>,
    ) -> Result<T, McpError> {
        let prompts = field == "prompts";
        let offers = |c: &ServerCapabilities| {
            if prompts {
                c.prompts.is_some()
            } else {
                c.resources.is_some()
            }
        };
        let mut items = Vec::new();
        for upstream in self.upstreams_with(offers) {
            let mut upstream_cursor: Option<String> = None;
            loop {
                let params = match &upstream_cursor {
                    Some(c) => json!({"cursor": c}),
                    None => json!({}),
                };
                let result = self.forward(&upstream, method, params, context).await?;
                let mut value = serde_json::to_value(&result).unwrap_or(Value::Null);
                if let Some(Value::Array(page)) = value.get_mut(field).map(Value::take) {
                    for mut item in page {
                        if let Some(Value::String(text)) = item.get_mut(renamed) {
                            *text = if prompts {
                                self.exposed_name(&upstream, text)
                            } else {
                                self.exposed_uri(&upstream, text)
                            };
                        }
                        items.push(item);
                    }
                }
                upstream_cursor = value
                    .get("nextCursor")
                    .and_then(Value::as_str)
                    .map(str::to_owned);
                if upstream_cursor.is_none() {
                    break;
                }
            }
        }
        let (page, next) = self.page(&items, cursor)?;
        typed_page(json!({field: page, "nextCursor": next}), method)
    }
}

impl ServerHandler for Front {
    fn get_info(&self) -> ServerConfig {
        let infos: Vec<(&str, Arc<rmcp::model::ServerPeerInfo>)> = self
            .state
            .upstreams
            .names()
            .filter_map(|u| self.state.upstreams.server_info(u).map(|i| (u, i)))
            .collect();
        let mut cached = self.state.info.lock().unwrap();
        if let Some((from, config)) = cached.as_ref()
            && from.len() == infos.len()
            && from.iter().zip(&infos).all(|(a, (_, b))| Arc::ptr_eq(a, b))
        {
            return config.clone();
        }
        let config = merged_info(&infos);
        *cached = Some((infos.into_iter().map(|(_, i)| i).collect(), config.clone()));
        config
    }

    /// stateless-MCP subscriptions: list changes of tools, prompts and
    /// resources, and updates of resources leasegate can route.
    fn accepted_subscription_filter(
        &self,
        requested: &rmcp::model::SubscriptionFilter,
    ) -> Option<rmcp::model::SubscriptionFilter> {
        let mut accepted = requested.clone();
        if let Some(uris) = accepted.resource_subscriptions.as_mut() {
            uris.retain(|uri| self.resolve_uri(uri).is_some());
        }
        Some(accepted)
    }

    async fn listen(
        &self,
        subscription: rmcp::service::SubscriptionContext,
    ) -> Result<(), McpError> {
        let mut notices = self.state.notices.subscribe();
        let uris = subscription
            .accepted()
            .resource_subscriptions
            .clone()
            .unwrap_or_default();
        // Ask the owning upstreams for updates of these resources.
        for uri in &uris {
            if let Some((upstream, own)) = self.resolve_uri(uri)
                && let Err(error) = self
                    .forward(
                        &upstream,
                        "resources/subscribe",
                        json!({"uri": own}),
                        subscription.request_context(),
                    )
                    .await
            {
                tracing::debug!(%upstream, uri = %crate::logfield::clip(&own), error = %crate::logfield::clip_display(&error), "upstream resources/subscribe failed");
            }
        }
        loop {
            tokio::select! {
                _ = subscription.cancelled() => break,
                notice = notices.recv() => match notice {
                    Ok(notification) => {
                        // The sink drops what this subscription did not accept.
                        let _ = subscription.sink().send(notification).await;
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
                },
            }
        }
        Ok(())
    }

    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        self.register_session(context.peer);
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let cursor = request.and_then(|r| r.cursor);
        if cursor.is_none() && self.catalog().built.elapsed() > CATALOG_MAX_AGE {
            self.refresh_if_stale().await;
        }
        let catalog = self.catalog();
        let (tools, next) = self.page(&catalog.tools, cursor)?;
        let mut page = ListToolsResult::with_all_items(tools);
        page.next_cursor = next;
        Ok(page)
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.catalog()
            .entries
            .get(name)
            .map(|entry| entry.tool.clone())
    }

    async fn list_resources(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        let cursor = request.and_then(|r| r.cursor);
        self.merged_list("resources/list", "resources", "uri", cursor, &context)
            .await
    }

    async fn list_resource_templates(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, McpError> {
        let cursor = request.and_then(|r| r.cursor);
        self.merged_list(
            "resources/templates/list",
            "resourceTemplates",
            "uriTemplate",
            cursor,
            &context,
        )
        .await
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        let (upstream, uri) = self.resolve_uri(&request.uri).ok_or_else(|| {
            McpError::new(
                ErrorCode::RESOURCE_NOT_FOUND,
                format!("unknown resource {:?}: see resources/list", request.uri),
                None,
            )
        })?;
        let result = self
            .forward(&upstream, "resources/read", json!({"uri": uri}), &context)
            .await?;
        let mut value = serde_json::to_value(&result).unwrap_or(Value::Null);
        self.expose_uris(&upstream, &mut value);
        let mut result: ReadResourceResult = serde_json::from_value(value).map_err(|e| {
            McpError::internal_error(
                format!("upstream answer to resources/read unreadable: {e}"),
                None,
            )
        })?;
        result
            .result_type
            .get_or_insert(rmcp::model::ResultType::COMPLETE);
        Ok(ReadResourceResponse::Complete(result))
    }

    #[allow(deprecated)]
    async fn subscribe(
        &self,
        request: SubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let (upstream, uri) = self
            .resolve_uri(&request.uri)
            .ok_or_else(|| invalid_params(format!("unknown resource {:?}", request.uri)))?;
        self.register_session(context.peer.clone());
        self.forward(
            &upstream,
            "resources/subscribe",
            json!({"uri": uri}),
            &context,
        )
        .await?;
        if let Ok(mut subscriptions) = self.session.subscriptions.lock() {
            subscriptions.insert(request.uri);
        }
        Ok(())
    }

    #[allow(deprecated)]
    async fn unsubscribe(
        &self,
        request: UnsubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let (upstream, uri) = self
            .resolve_uri(&request.uri)
            .ok_or_else(|| invalid_params(format!("unknown resource {:?}", request.uri)))?;
        if let Ok(mut subscriptions) = self.session.subscriptions.lock() {
            subscriptions.remove(&request.uri);
        }
        // Other sessions may still want updates of this resource.
        let still_wanted = self.live_sessions().iter().any(|(s, _)| {
            s.subscriptions
                .lock()
                .is_ok_and(|set| set.contains(&request.uri))
        });
        if !still_wanted {
            self.forward(
                &upstream,
                "resources/unsubscribe",
                json!({"uri": uri}),
                &context,
            )
            .await?;
        }
        Ok(())
    }

    async fn list_prompts(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, McpError> {
        let cursor = request.and_then(|r| r.cursor);
        self.merged_list("prompts/list", "prompts", "name", cursor, &context)
            .await
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, McpError> {
        let (upstream, name) = self.resolve_name(&request.name).ok_or_else(|| {
            invalid_params(format!(
                "unknown prompt {:?}: see prompts/list",
                request.name
            ))
        })?;
        let mut params = json!({"name": name});
        if let Some(arguments) = request.arguments {
            params["arguments"] = Value::Object(arguments);
        }
        let result = self
            .forward(&upstream, "prompts/get", params, &context)
            .await?;
        let mut value = serde_json::to_value(&result).unwrap_or(Value::Null);
        self.expose_uris(&upstream, &mut value);
        let mut result: GetPromptResult = serde_json::from_value(value).map_err(|e| {
            McpError::internal_error(
                format!("upstream answer to prompts/get unreadable: {e}"),
                None,
            )
        })?;
        result
            .result_type
            .get_or_insert(rmcp::model::ResultType::COMPLETE);
        Ok(GetPromptResponse::Complete(result))
    }

    async fn complete(
        &self,
        request: CompleteRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CompleteResult, McpError> {
        let mut params = serde_json::to_value(&request)
            .map_err(|e| McpError::internal_error(e.to_string(), None))?;
        let reference = params.get_mut("ref").and_then(Value::as_object_mut);
        let Some(reference) = reference else {
            return Err(invalid_params("completion/complete needs a ref"));
        };
        let target = match reference.get("type").and_then(Value::as_str) {
            Some("ref/prompt") => reference
                .get("name")
                .and_then(Value::as_str)
                .and_then(|n| self.resolve_name(n))
                .map(|(u, n)| (u, "name", n)),
            Some("ref/resource") => reference
                .get("uri")
                .and_then(Value::as_str)
                .and_then(|uri| self.resolve_uri(uri))
                .map(|(u, uri)| (u, "uri", uri)),
            _ => None,
        };
        let Some((upstream, field, own)) = target else {
            return Err(invalid_params(
                "completion/complete: unknown prompt or resource in ref",
            ));
        };
        reference.insert(field.to_owned(), Value::String(own));
        if let Some(map) = params.as_object_mut() {
            map.remove("_meta");
        }
        let result = self
            .forward(&upstream, "completion/complete", params, &context)
            .await?;
        let mut result: CompleteResult = typed(result, "completion/complete")?;
        result
            .result_type
            .get_or_insert(rmcp::model::ResultType::COMPLETE);
        Ok(result)
    }

    async fn set_level(
        &self,
        request: SetLevelRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        self.register_session(context.peer.clone());
        if let Ok(mut level) = self.session.log_level.lock() {
            *level = Some(request.level);
        }
        // The upstream sessions are shared: ask them for everything at the
        // lowest level any session wants; leasegate filters per session.
        let lowest = self
            .live_sessions()
            .iter()
            .filter_map(|(s, _)| s.log_level.lock().ok().and_then(|l| *l))
            .min_by_key(|l| level_rank(*l))
            .unwrap_or(request.level);
        for upstream in self.upstreams_with(|c| c.logging.is_some()) {
            self.forward(
                &upstream,
                "logging/setLevel",
                json!({"level": lowest}),
                &context,
            )
            .await?;
        }
        Ok(())
    }

    async fn on_cancelled(
        &self,
        notification: CancelledNotificationParam,
        _context: NotificationContext<RoleServer>,
    ) {
        let Some(id) = notification.request_id else {
            return;
        };
        let token = self.session.cancels.lock().ok().and_then(|cancels| {
            cancels
                .get(&request_key(&id))
                .map(|(_, token)| token.clone())
        });
        if let Some(token) = token {
            token.cancel();
        }
    }

    /// rmcp hands a request whose params do not fit its method's shape
    /// over as a custom request (and would answer -32601, "method not
    /// found"). A `tools/call` that arrives here has malformed params
    /// (`arguments` not an object, `name` not a string): -32602, nothing
    /// recorded or sent. Other unknown methods stay -32601.
    async fn on_custom_request(
        &self,
        request: CustomRequest,
        _context: RequestContext<RoleServer>,
    ) -> Result<CustomResult, McpError> {
        if request.method == "tools/call" {
            let why = match request.params_as::<CallToolRequestParams>() {
                // serde quotes the value it did not expect: keep it short.
                Err(error) => error.to_string().chars().take(300).collect(),
                Ok(None) => "params are missing".to_owned(),
                Ok(Some(_)) => "params do not fit".to_owned(),
            };
            return Err(McpError::new(
                ErrorCode(codes::INVALID_PARAMS),
                format!(
                    "invalid params for tools/call: {why}: `name` must be a string and \
                     `arguments` an object. Nothing was recorded or sent"
                ),
                Some(json!({"reason": "invalid_params", "method": "tools/call"})),
            ));
        }
        Err(McpError::new(
            ErrorCode::METHOD_NOT_FOUND,
            request.method.chars().take(200).collect::<String>(),
            None,
        ))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        if let Some((header, count)) = duplicated_header(&context) {
            return Err(McpError::new(
                ErrorCode(codes::INVALID_PARAMS),
                format!(
                    "header {header} is given {count} times: send each Leasegate-* header (and \
                     Idempotency-Key) once. Nothing was recorded or sent"
                ),
                Some(json!({"reason": "duplicate_header", "header": header, "count": count})),
            ));
        }
        let name = request.name.to_string();
        let mut resolved = self.state.directory.get(&name);
        if resolved.is_none()
            && self.catalog().built.elapsed() > std::time::Duration::from_secs(1)
            && let Some((upstream, _)) = self.resolve_name(&name)
        {
            // The upstream may have added it without a list_changed we heard.
            if self.refresh_tools(&upstream).await.is_ok() {
                resolved = self.state.directory.get(&name);
            }
        }
        let resolved = resolved
            .ok_or_else(|| invalid_params(format!("unknown tool {name:?}: see tools/list")))?;
        if let Some(handle) = request.request_state.clone() {
            // stateless MCP: the agent answers what the upstream asked.
            return self
                .resume_modern(
                    &name,
                    &context,
                    &handle,
                    request.input_responses.unwrap_or_default(),
                )
                .await;
        }

        let mut keyed = None;
        if !resolved.adapter.read_only {
            self.begin_session_lease(&context).await?;
            keyed = self.key_lease(&context).await?;
        }
        let (agent, from_upstream) = mpsc::unbounded_channel();
        let watch = CallWatch::default();
        let call = if resolved.adapter.read_only {
            self.read_only(resolved, request, &context, agent, &watch)
        } else {
            self.gated(resolved, request, &context, agent, &watch, keyed)?
        };
        let result = if is_modern(&context) {
            let pending = PendingCall::start(name, call, from_upstream, watch);
            return self.drive_modern(&context, pending).await;
        } else {
            self.with_agent(&context, from_upstream, call).await
        };
        result.map(CallToolResponse::Complete)
    }
}

impl Front {
    /// A side-effecting call through the ledger, as a future that owns
    /// everything it needs.
    fn gated(
        &self,
        resolved: crate::adapter::ResolvedTool,
        request: CallToolRequestParams,
        context: &RequestContext<RoleServer>,
        agent: crate::adapter::AgentSink,
        watch: &CallWatch,
        keyed: Option<LeaseClaim>,
    ) -> Result<ToolCall, McpError> {
        let name = request.name.to_string();
        let upstream = resolved.upstream.clone();
        let session_lease = self
            .session
            .lease
            .get()
            .or_else(|| self.state.session_lease.get());
        let lease =
            match (lease_of(context), session_lease) {
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
                match error {
                    CallError::LeaseRequired => self.lease_required(&name, &resolved, context),
                    other => convert::error_from_call(&other),
                }
            })?;
        let mut step = step_of(context).map_err(|e| convert::error_from_call(&e))?;
        if keyed.is_some() && step.is_none() {
            // The key stands for one request: one step per key's run.
            step = Some(StepRef {
                step_id: KEY_STEP.to_owned(),
                effect_version: 1,
            });
        }
        let cancel = watch.cancel.clone();
        self.watch_request(context, cancel.clone(), true, watch.detach.clone());
        let call = CallRequest {
            lease,
            step,
            exposed_name: name,
            tool: resolved,
            arguments: request.arguments.unwrap_or_default(),
            context: CallContext {
                meta: passthrough_meta(context),
                agent: Some(agent),
                cancel: cancel.clone(),
            },
        };
        // W3C trace context: the trace id goes into every log line of this call.
        let trace_id = context
            .meta
            .get("traceparent")
            .and_then(Value::as_str)
            .and_then(|tp| tp.split('-').nth(1))
            .unwrap_or("")
            .to_owned();
        let span = tracing::info_span!("tools/call", tool = %crate::logfield::clip(&call.exposed_name), run_id = %call.lease.run_id,
            owner = %crate::logfield::clip(&call.lease.owner), epoch = call.lease.epoch, trace_id = %crate::logfield::clip(&trace_id),
            operation_id = tracing::field::Empty, outcome = tracing::field::Empty);
        // The agent's trace is this span's parent (`telemetry`).
        let (traceparent, tracestate) = trace_context(context);
        crate::telemetry::set_parent(&span, traceparent.as_deref(), tracestate.as_deref());
        let front = self.clone();
        Ok(Box::pin(async move {
            // The agent's cancel answers at once; the dispatch runs on in
            // leasegate's own task and records the outcome (unknown, as the
            // upstream may have acted).
            // Spawned, so that a cancel never interrupts a ledger write.
            let state = front.state.clone();
            let dispatch = tokio::spawn(
                async move { state.dispatcher.call(call).await }.instrument(span.clone()),
            );
            let outcome = tokio::select! {
                biased;
                outcome = dispatch => outcome.map_err(|e| {
                    McpError::internal_error(format!("the dispatch task failed: {e}"), None)
                })?,
                _ = cancel.cancelled() => return Err(cancelled_by_the_agent()),
            };
            // The call is over: release the cancel watcher.
            cancel.cancel();
            span.record("outcome", crate::dispatch::trace_outcome(outcome.as_ref()));
            match &outcome {
                Ok(CallReply::Answer { operation, .. }) => {
                    span.record("operation_id", operation.operation_id.as_str());
                }
                Ok(CallReply::Unknown { operation_id, .. }) => {
                    span.record("operation_id", operation_id.as_str());
                }
                Err(_) => {}
            }
            // No guard held in this future: the span is entered for the
            // synchronous rest only.
            span.in_scope(|| match outcome {
                Ok(mut reply) => {
                    // Resource links in the (recorded) result name the
                    // upstream's URIs; the agent reads them under their
                    // exposed names.
                    if let CallReply::Answer { result, .. } = &mut reply {
                        front.expose_uris(&upstream, result);
                    }
                    Ok(convert::result_from_reply(reply))
                }
                Err(error) => {
                    // The agent hears the value; the log names only where
                    // it is (argument values never reach the log).
                    match &error {
                        crate::dispatch::CallError::Intent(
                            crate::intent::IntentError::UnsafeInteger { path, .. },
                        ) => tracing::info!(%path, "call refused: integer beyond ±2^53"),
                        _ => tracing::info!(error = %crate::logfield::clip_display(&error), "call refused"),
                    }
                    Err(convert::error_from_call(&error))
                }
            })
        }))
    }
}

impl Front {
    /// The -32001 answer for `name`: how to get a lease over this
    /// transport, and how to mark the tool read-only.
    /// Lease mode `session`: the lease a side-effecting call that brings
    /// none of its own is sent under, once this process's membership may
    /// register (`SessionLease::ready`). Over stdio the process's own; over
    /// HTTP the membership of the caller's principal for the task key (the
    /// `Leasegate-Task` header, else `[session] task`), kept for this MCP
    /// session. Without a task key the call goes on and is refused as
    /// needing a lease.
    async fn begin_session_lease(
        &self,
        context: &RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let config = &self.state.config;
        if config.lease.mode != crate::config::LeaseMode::Session
            || !matches!(lease_of(context), Err(CallError::LeaseRequired))
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
                let Some(parts) = context.extensions.get::<http::request::Parts>() else {
                    return Ok(());
                };
                let task = parts
                    .headers
                    .get(TASK_HEADER)
                    .and_then(|v| v.to_str().ok())
                    .map(str::trim)
                    .filter(|t| !t.is_empty())
                    .map(str::to_owned)
                    .or_else(|| config.session.task.clone());
                let Some(task) = task else {
                    return Ok(());
                };
                check_identifier("Leasegate-Task", &task, MAX_TASK_LEN)
                    .map_err(|e| invalid_params(e.to_string()))?;
                let namespace = lease_namespace(context, "session")?;
                let arrived = parts
                    .extensions
                    .get::<crate::worker::session::Arrived>()
                    .map_or_else(std::time::Instant::now, |arrived| arrived.0);
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
    async fn key_lease(
        &self,
        context: &RequestContext<RoleServer>,
    ) -> Result<Option<LeaseClaim>, McpError> {
        let config = &self.state.config;
        if config.lease.mode != crate::config::LeaseMode::Key
            || !matches!(lease_of(context), Err(CallError::LeaseRequired))
        {
            return Ok(None);
        }
        let from_meta = match context.meta.get(IDEMPOTENCY_KEY_META) {
            None => None,
            Some(Value::String(key)) => Some(key.clone()),
            Some(_) => {
                return Err(invalid_params(format!(
                    "_meta \"{IDEMPOTENCY_KEY_META}\" must be a string"
                )));
            }
        };
        let key = from_meta.or_else(|| {
            context
                .extensions
                .get::<http::request::Parts>()
                .and_then(|parts| parts.headers.get(IDEMPOTENCY_KEY_HEADER))
                .and_then(|v| v.to_str().ok())
                .map(|v| v.trim().to_owned())
        });
        let Some(key) = key else {
            return Ok(None);
        };
        check_identifier("idempotency key", &key, MAX_IDEMPOTENCY_KEY_LEN)
            .map_err(|e| invalid_params(e.to_string()))?;
        let dispatcher = &self.state.dispatcher;
        crate::worker::session::key_lease(
            dispatcher.ledger(),
            &self.state.key_leases,
            &config.tenant,
            lease_namespace(context, "key")?,
            &key,
            dispatcher.owner(),
            i64::try_from(config.policy.claim_ttl.as_millis()).unwrap_or(i64::MAX),
            config.lease.key_retention,
        )
        .await
        .map(Some)
        .map_err(|error| match error {
            crate::worker::session::SessionError::Ledger(inner) => {
                convert::error_from_call(&CallError::Ledger(inner))
            }
            other => invalid_params(other.to_string()),
        })
    }

    fn lease_required(
        &self,
        name: &str,
        resolved: &crate::adapter::ResolvedTool,
        context: &RequestContext<RoleServer>,
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
            over_http: context.extensions.get::<http::request::Parts>().is_some(),
            read_only_hint,
            trust_annotations: self
                .state
                .config
                .adapter(&resolved.upstream)
                .trust_annotations,
        })
    }
}

fn typed_page<T: serde::de::DeserializeOwned>(mut value: Value, what: &str) -> Result<T, McpError> {
    if value.get("nextCursor").is_some_and(Value::is_null)
        && let Some(map) = value.as_object_mut()
    {
        map.remove("nextCursor");
    }
    value["resultType"] = json!("complete");
    serde_json::from_value(value)
        .map_err(|e| McpError::internal_error(format!("{what}: {e}"), None))
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
