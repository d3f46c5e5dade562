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
//! on as the upstream sent it: as far as rmcp's model carries it, and for
//! tools whole, unknown fields included (`whole_tools`).
//!
//! # Leases
//!
//! The caller's lease comes per call in `_meta["dev.leasegate/lease"]` =
//! `{run_id, owner, epoch, token}`, or from the HTTP headers
//! `Leasegate-Run-Id`, `Leasegate-Owner`, `Leasegate-Epoch` and
//! `Leasegate-Lease-Token`; `_meta` wins (and its token is the one in
//! `_meta`). Run id, owner and epoch are public; the token (shown once when
//! the lease was taken) is the credential the ledger's fence checks, so a
//! call without it is refused -31002 with `data.reason =
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
//! front's registry (`super::inflight`), or from the request's own token
//! when the agent goes away — for read-only calls always, for gated calls
//! only under stateless-MCP and when the tool's `on_disconnect` is
//! `cancel` (by default a gated call whose agent went away finishes and is
//! recorded, so the agent's re-issued call replays it). The agent is
//! answered `-32800` at once and never with a late result; the upstream is
//! told; a gated call's dispatch runs on in its own task and records what
//! happened (`unknown`: the upstream may have acted).
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
//!
//! # Files
//!
//! `mod.rs` holds the shared state ([`Front`], [`Session`]) and the
//! `ServerHandler` that routes each MCP method; `request.rs` reads a
//! request's credentials and context; `call.rs` is one `tools/call`
//! (read-only or gated, in each lease mode); `catalog.rs` the exposed
//! names, the merged lists and `initialize` answer; `relay.rs` what the
//! upstreams send outside a call's answer; `cancel.rs` an agent's cancel;
//! `parked.rs` stateless-MCP calls waiting for the agent's input;
//! `tally.rs` how every call is counted.

// Logging (`logging/setLevel`, `notifications/message`) is deprecated by
// SEP-2577 but still part of every handshake-era protocol version leasegate
// serves.
#![allow(deprecated)]

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, RwLock, Weak};

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CancelledNotificationParam, ClientRequest,
    CompleteRequestParams, CompleteResult, CustomRequest, CustomResult, ErrorCode,
    GetPromptRequestParams, GetPromptResponse, ListPromptsResult, ListResourceTemplatesResult,
    ListResourcesResult, ListToolsResult, LoggingLevel, PaginatedRequestParams,
    ReadResourceRequestParams, ReadResourceResponse, ServerConfig, ServerNotification,
    ServerResult, SetLevelRequestParams, SubscribeRequestParams, Tool, UnsubscribeRequestParams,
};
use rmcp::service::{NotificationContext, Peer, RequestContext};
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::convert::codes;
use super::inflight::InFlightRequests;
use super::upstream::{CatalogEntry, Upstreams};
use crate::adapter::{PeerError, SharedDirectory, UpstreamError};
use crate::config::Config;
use crate::dispatch::Dispatcher;

mod call;
mod cancel;
mod catalog;
mod parked;
mod relay;
mod request;
mod surface;
mod tally;
mod tasks;
mod whole_tools;
pub use call::{lease_meta, operation_of};
use cancel::CallWatch;
use catalog::{CATALOG_MAX_AGE, Catalog, merged_info};
use parked::PendingCall;
use relay::relay_events;

pub use super::wire::*;
use request::{CallCredentials, duplicated_header, invalid_params, is_modern, request_key};

struct State {
    catalog: RwLock<Arc<Catalog>>,
    /// Exposed name → upstream, upstream tool and adapter (shared with the
    /// background loops).
    directory: Arc<SharedDirectory>,
    config: Arc<Config>,
    upstreams: Arc<Upstreams>,
    dispatcher: Arc<Dispatcher<Upstreams>>,
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
    session_lease: std::sync::OnceLock<Arc<crate::agent_leases::SessionLease>>,
    /// Lease mode `session` over HTTP: this process's memberships, one per
    /// principal and task key, shared by its sessions and requests.
    session_leases: crate::agent_leases::SessionLeases,
    /// Lease mode `key`: the key runs' memberships (and tokens) this
    /// process holds.
    key_leases: crate::agent_leases::KeyLeases,
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
    /// Task handles given to agents: which upstream made each (`tasks`).
    task_routes: tasks::TaskRoutes,
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
    lease: tokio::sync::OnceCell<Arc<crate::agent_leases::SessionLease>>,
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
        let session_leases = crate::agent_leases::SessionLeases::new(
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
                dispatcher: Arc::new(dispatcher),
                in_flight,
                sessions: Mutex::new(Vec::new()),
                parked: Mutex::new(HashMap::new()),
                session_lease: std::sync::OnceLock::new(),
                session_leases,
                key_leases: crate::agent_leases::KeyLeases::new(),
                notices: tokio::sync::broadcast::channel(256).0,
                refreshing: tokio::sync::Mutex::new(()),
                info: Mutex::new(None),
                task_routes: Default::default(),
            }),
            session: Arc::default(),
        };
        let events = front.state.upstreams.events();
        tokio::spawn(relay_events(Arc::downgrade(&front.state), events));
        front
    }

    /// Lease mode `session`: calls that bring no lease of their own are
    /// sent under `lease` from now on (set once, before serving).
    pub fn set_session_lease(&self, lease: Arc<crate::agent_leases::SessionLease>) {
        let _ = self.state.session_lease.set(lease);
    }

    /// Lease mode `session`: this process's memberships (stdio takes its
    /// own there, before serving).
    pub fn session_leases(&self) -> &crate::agent_leases::SessionLeases {
        &self.state.session_leases
    }

    /// The policy's `integers`: what the raw-number check of the line hook
    /// and the body layer refuses (`mcp::numbers`).
    pub fn integers(&self) -> crate::intent::IntegerPolicy {
        self.state.config.policy.integers
    }

    /// Waits, at most `grace`, for the side-effecting calls whose dispatch
    /// runs now to record their outcomes; how many still run then.
    pub async fn calls_settled(&self, grace: std::time::Duration) -> usize {
        self.state.dispatcher.settled(grace).await
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
}

/// A tool call in progress, ending in the agent's result.
type ToolCall = futures::future::BoxFuture<'static, Result<CallToolResponse, McpError>>;

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
        self.serve_read_resource(request, context).await
    }

    #[allow(deprecated)]
    async fn subscribe(
        &self,
        request: SubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        self.serve_subscribe(request, context).await
    }

    #[allow(deprecated)]
    async fn unsubscribe(
        &self,
        request: UnsubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        self.serve_unsubscribe(request, context).await
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
        self.serve_get_prompt(request, context).await
    }

    async fn complete(
        &self,
        request: CompleteRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CompleteResult, McpError> {
        self.serve_complete(request, context).await
    }

    async fn set_level(
        &self,
        request: SetLevelRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        self.serve_set_level(request, context).await
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
        context: RequestContext<RoleServer>,
    ) -> Result<CustomResult, McpError> {
        if request.method == super::idempotency::UNREADABLE_METHOD {
            let reason = request
                .params
                .as_ref()
                .and_then(|params| params.get("reason"))
                .and_then(serde_json::Value::as_str)
                .unwrap_or("unreadable")
                .chars()
                .take(300)
                .collect::<String>();
            return Err(McpError::new(
                ErrorCode(super::malformed::PARSE_ERROR),
                format!(
                    "parse error: the message cannot be read ({reason}); JSON nested deeper \
                     than 128 levels and numbers beyond a double's range are not accepted. \
                     Nothing was recorded or sent"
                ),
                Some(json!({"reason": "unreadable"})),
            ));
        }
        if request.method == super::numbers::INEXACT_METHOD {
            return Err(super::numbers::refusal(request.params.as_ref()));
        }
        if request.method == super::idempotency::WHOLE_TOOLS_METHOD {
            return self.whole_tools_list(request, context).await;
        }
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
        let unresolved = tally::Tally::new(&context, "unresolved", "");
        if let Some((header, count)) = duplicated_header(&context) {
            return Err(unresolved.refused_with(McpError::new(
                ErrorCode(codes::INVALID_PARAMS),
                format!(
                    "header {header} is given {count} times: send each Leasegate-* header (and \
                     Idempotency-Key) once. Nothing was recorded or sent"
                ),
                Some(json!({"reason": "duplicate_header", "header": header, "count": count})),
            )));
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
        let Some(resolved) = resolved else {
            unresolved.refused("unknown_tool");
            return Err(invalid_params(format!(
                "unknown tool {name:?}: see tools/list"
            )));
        };
        let upstream = resolved.upstream.clone();
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

        let mut credentials = CallCredentials::read(&context);
        if !resolved.adapter.read_only {
            let tally = tally::Tally::new(&context, "gated", &name);
            // Refused before a lease carried it: which mode was to lend one.
            let lending = match self.state.config.lease.mode {
                crate::config::LeaseMode::Session => "session",
                crate::config::LeaseMode::Key => "key",
                crate::config::LeaseMode::Explicit => "none",
            };
            let lend = |error| {
                let mode = if credentials.brings_no_lease() {
                    lending
                } else {
                    "explicit"
                };
                tally::Tally {
                    mode,
                    ..tally.clone()
                }
                .refused_with(error)
            };
            self.begin_session_lease(&credentials).await.map_err(lend)?;
            credentials.keyed = self
                .key_lease(&credentials, resolved.adapter.identity.is_some())
                .await
                .map_err(lend)?;
        }
        let (agent, from_upstream) = mpsc::unbounded_channel();
        let watch = if resolved.adapter.read_only {
            CallWatch::default()
        } else {
            CallWatch::side_effecting(&context, resolved.adapter.on_disconnect)
        };
        let call = if resolved.adapter.read_only {
            self.read_only(resolved, request, &context, credentials, agent, &watch)
        } else {
            self.gated(resolved, request, &context, credentials, agent, &watch)?
        };
        let response = if is_modern(&context) {
            let pending = PendingCall::start(name, call, from_upstream, watch);
            self.drive_modern(&context, pending).await
        } else {
            self.with_agent(&context, from_upstream, call).await
        };
        match response? {
            CallToolResponse::Task(task) => Ok(CallToolResponse::Task(
                self.route_task(&upstream, task, &context),
            )),
            other => Ok(other),
        }
    }

    async fn get_task(
        &self,
        request: rmcp::model::GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::GetTaskResult, McpError> {
        self.get_task_state(request, context).await
    }

    async fn update_task(
        &self,
        request: rmcp::model::UpdateTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        self.update_task_input(request, context).await
    }

    async fn cancel_task(
        &self,
        request: rmcp::model::CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        self.cancel_task_run(request, context).await
    }
}
