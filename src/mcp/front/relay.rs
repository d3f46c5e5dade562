//! What flows from the upstreams to agents outside a call's answer:
//! requests to the client (sampling, elicitation, roots) relayed to the
//! agent that can answer them, session-wide notifications (`list_changed`,
//! `resources/updated`, logs no call owns) to the live sessions that want
//! them, and upstream events (a reconnect, a changed list) turned into
//! catalog refreshes. A relay never guesses: a request it cannot attribute
//! to one agent is refused with the reason.

use super::call::{check_capability, refusal};
use super::cancel::cancelled_by_the_agent;
use super::request::{is_modern, passthrough_meta};
use super::{Front, Session, State, client_request, peer_error, upstream_failure};
use crate::adapter::{PeerError, ToAgent};
use crate::mcp::convert::codes;
use crate::mcp::upstream::{REQUEST_TIMEOUT, UpstreamEvent};
use crate::mcp::wire::*;
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use rmcp::model::{
    ErrorCode, LoggingLevel, ProgressNotificationParam, ProtocolVersion,
    ResourceUpdatedNotificationParam, ServerNotification, ServerRequest, ServerResult,
};
use rmcp::service::{Peer, RequestContext};
use rmcp::{ErrorData as McpError, RoleServer};
use serde_json::{Value, json};
use std::sync::{Arc, Weak};
use tokio::sync::mpsc;

impl Front {
    pub(super) fn register_session(&self, peer: Peer<RoleServer>) {
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
    pub(super) async fn forward(
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
    pub(super) async fn with_agent<T>(
        &self,
        context: &RequestContext<RoleServer>,
        mut from_upstream: mpsc::UnboundedReceiver<ToAgent>,
        work: impl Future<Output = T>,
    ) -> T {
        tokio::pin!(work);
        let mut requests = FuturesUnordered::new();
        // A handshake-era stateless client that set a level gets the logs
        // no call owns while its call runs, as a session would.
        let mut unowned_logs = stateless_level(context, &self.state.in_flight.log_levels)
            .flatten()
            .map(|level| (self.state.upstreams.events(), level));
        let outcome = loop {
            tokio::select! {
                biased;
                Some(item) = from_upstream.recv() => {
                    if let Some(request) = self.to_agent(item, context).await {
                        requests.push(request);
                    }
                }
                Some(()) = requests.next(), if !requests.is_empty() => {}
                log = next_log(&mut unowned_logs), if unowned_logs.is_some() => {
                    if let Some(log) = log {
                        let _ = context.peer.send_notification(log).await;
                    }
                }
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
    pub(super) async fn to_agent(
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
                    } else if let Some(level) =
                        stateless_level(context, &self.state.in_flight.log_levels)
                    {
                        // A handshake-era stateless client: the level it set
                        // (by identity), or every level.
                        level
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
    pub(super) fn can_relay(
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
}

/// For a handshake-era client on the stateless front (no session), the
/// level it set with `logging/setLevel`, kept by its client identity
/// (`inflight`), if any; `None` for every other client.
pub(super) fn stateless_level(
    context: &RequestContext<RoleServer>,
    levels: &crate::mcp::inflight::LogLevels,
) -> Option<Option<LoggingLevel>> {
    if is_modern(context) {
        return None;
    }
    let parts = context.extensions.get::<http::request::Parts>()?;
    if parts.headers.contains_key("mcp-session-id") {
        return None;
    }
    Some(levels.get(&parts.headers))
}

/// The next log no call owns at or above the level, as the agent gets it
/// (`logger` prefixed); `None` for an event that is something else.
async fn next_log(
    logs: &mut Option<(
        tokio::sync::broadcast::Receiver<UpstreamEvent>,
        LoggingLevel,
    )>,
) -> Option<ServerNotification> {
    let Some((events, wanted)) = logs.as_mut() else {
        return std::future::pending().await;
    };
    let event = match events.recv().await {
        Ok(event) => event,
        Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => return None,
        Err(tokio::sync::broadcast::error::RecvError::Closed) => {
            *logs = None;
            return None;
        }
    };
    if event.method != "notifications/message" {
        return None;
    }
    let mut params = event.params;
    prefix_logger(&event.upstream, &mut params);
    let message: rmcp::model::LoggingMessageNotificationParam =
        serde_json::from_value(params).ok()?;
    if level_rank(message.level) < level_rank(*wanted) {
        return None;
    }
    Some(ServerNotification::LoggingMessageNotification(
        rmcp::model::LoggingMessageNotification::new(message),
    ))
}

/// `logger` → `<upstream>/<logger>` (or `<upstream>`), so the agent can
/// tell which upstream logged.
pub(super) fn prefix_logger(upstream: &str, params: &mut Value) {
    if let Some(map) = params.as_object_mut() {
        let logger = match map.get("logger").and_then(Value::as_str) {
            Some(logger) => format!("{upstream}/{logger}"),
            None => upstream.to_owned(),
        };
        map.insert("logger".into(), Value::String(logger));
    }
}

pub(super) fn level_rank(level: LoggingLevel) -> u8 {
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
pub(super) async fn relay_events(
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
    pub(super) fn live_sessions(&self) -> Vec<(Arc<Session>, Peer<RoleServer>)> {
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

    pub(super) async fn on_upstream_event(&self, event: UpstreamEvent) {
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
    pub(super) fn notice(&self, notification: ServerNotification) {
        // No listener is not an error.
        let _ = self.state.notices.send(notification);
    }
}
