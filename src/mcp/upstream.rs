//! MCP clients of the upstream tool servers (stdio children and Streamable
//! HTTP servers), and the tool catalog leasegate exposes.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CancelledNotificationParam, ClientCapabilities,
    ClientConfig, ClientRequest, Implementation, ProgressNotificationParam, ProgressToken,
    RequestMetaObject, ServerResult, Tool,
};
use rmcp::service::{NotificationContext, Peer, PeerRequestOptions, RunningService, ServiceError};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{ClientHandler, RoleClient, ServiceExt};

use super::convert;
use crate::adapter::{Progress, ToolAnswer, Upstream, UpstreamCall, UpstreamError};
use crate::config::{Config, UpstreamTransport};

/// Routes upstream progress to the call that asked for it. rmcp's own
/// dispatcher drops a notification that arrives before the subscription
/// (the subscription can only follow the send); this router keeps such early
/// notifications briefly and hands them over when the call subscribes.
#[derive(Clone, Default)]
struct ProgressRouter {
    state: Arc<Mutex<RouterState>>,
}

#[derive(Default)]
struct RouterState {
    routes: HashMap<ProgressToken, mpsc::UnboundedSender<Progress>>,
    early: VecDeque<(Instant, ProgressNotificationParam)>,
}

/// How long, and how many, early notifications are kept for a subscriber.
const EARLY_KEEP: Duration = Duration::from_secs(10);
const EARLY_MAX: usize = 1024;

fn progress_of(params: ProgressNotificationParam) -> Progress {
    Progress {
        progress: params.progress,
        total: params.total,
        message: params.message,
    }
}

impl ProgressRouter {
    fn deliver(&self, params: ProgressNotificationParam) {
        let Ok(mut state) = self.state.lock() else {
            return;
        };
        if let Some(route) = state.routes.get(&params.progress_token) {
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

    fn subscribe(&self, token: ProgressToken, sink: mpsc::UnboundedSender<Progress>) {
        let Ok(mut state) = self.state.lock() else {
            return;
        };
        let (mine, others): (VecDeque<_>, VecDeque<_>) = std::mem::take(&mut state.early)
            .into_iter()
            .partition(|(_, p)| p.progress_token == token);
        state.early = others;
        for (_, params) in mine {
            let _ = sink.send(progress_of(params));
        }
        state.routes.insert(token, sink);
    }

    fn unsubscribe(&self, token: &ProgressToken) {
        if let Ok(mut state) = self.state.lock() {
            state.routes.remove(token);
        }
    }
}

/// Receives what upstreams send leasegate unasked: progress.
#[derive(Clone, Default)]
struct UpstreamClient {
    progress: ProgressRouter,
}

impl ClientHandler for UpstreamClient {
    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.progress.deliver(params);
    }

    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("leasegate", env!("CARGO_PKG_VERSION")),
        )
    }
}

struct Connection {
    peer: Peer<RoleClient>,
    progress: ProgressRouter,
    /// Keeps the client (and, for stdio, the child process) alive.
    service: RunningService<RoleClient, UpstreamClient>,
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
    connections: BTreeMap<String, Connection>,
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
    /// Connects every configured upstream.
    pub async fn connect(config: &Config) -> Result<Self, StartError> {
        let mut connections = BTreeMap::new();
        for (name, transport) in &config.upstreams {
            let handler = UpstreamClient::default();
            let progress = handler.progress.clone();
            let connect_error = |message: String| StartError::Connect {
                upstream: name.clone(),
                message,
            };
            let service = match transport {
                UpstreamTransport::Stdio { command, args, env } => {
                    let mut cmd = tokio::process::Command::new(command);
                    cmd.args(args).envs(env);
                    let child = TokioChildProcess::new(cmd)
                        .map_err(|e| connect_error(format!("{}: {e}", command.display())))?;
                    handler
                        .serve(child)
                        .await
                        .map_err(|e| connect_error(e.to_string()))?
                }
                UpstreamTransport::StreamableHttp { url } => {
                    let transport = StreamableHttpClientTransport::from_config(
                        StreamableHttpClientTransportConfig::with_uri(url.as_str()),
                    );
                    handler
                        .serve(transport)
                        .await
                        .map_err(|e| connect_error(e.to_string()))?
                }
            };
            // A proxy must never answer from a stale tools/list page.
            service
                .peer()
                .set_response_cache_config(rmcp::ClientCacheConfig::disabled())
                .await;
            connections.insert(
                name.clone(),
                Connection {
                    peer: service.peer().clone(),
                    progress,
                    service,
                },
            );
        }
        Ok(Self { connections })
    }

    /// Every upstream tool under its exposed name (`<upstream><sep><tool>`),
    /// schemas and annotations unchanged. A collision is an error.
    pub async fn catalog(
        &self,
        separator: &str,
        unprefixed: &[String],
    ) -> Result<BTreeMap<String, CatalogEntry>, StartError> {
        let mut catalog: BTreeMap<String, CatalogEntry> = BTreeMap::new();
        for (name, connection) in &self.connections {
            let tools = connection
                .peer
                .list_all_tools()
                .await
                .map_err(|e| StartError::List {
                    upstream: name.clone(),
                    message: e.to_string(),
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

    /// Stops the clients (and their child processes).
    pub async fn shutdown(self) {
        for (_, connection) in self.connections {
            let _ = connection.service.cancel().await;
        }
    }
}

impl Upstream for Upstreams {
    async fn call(&self, call: UpstreamCall) -> Result<ToolAnswer, UpstreamError> {
        let connection = self.connections.get(&call.upstream).ok_or_else(|| {
            UpstreamError::NotSent(format!("no upstream named {:?}", call.upstream))
        })?;
        let mut meta = RequestMetaObject::new();
        for (key, value) in call.meta {
            meta.insert(key, value);
        }
        let params = CallToolRequestParams::new(call.tool.clone()).with_arguments(call.arguments);
        let handle = connection
            .peer
            .send_request_with_option(
                ClientRequest::CallToolRequest(CallToolRequest::new(params)),
                PeerRequestOptions::with_timeout(call.timeout).with_meta(meta),
            )
            .await
            // The request never reached the client's transport task.
            .map_err(|e| UpstreamError::NotSent(e.to_string()))?;

        // rmcp gives the upstream request its own progress token: re-key.
        let token = handle.progress_token.clone();
        if let Some(sink) = call.progress {
            connection.progress.subscribe(token.clone(), sink);
        }
        let (request_id, peer, cancel) =
            (handle.id.clone(), handle.peer.clone(), call.cancel.clone());
        let cancel_watch = tokio::spawn(async move {
            cancel.cancelled().await;
            let _ = peer
                .notify_cancelled(CancelledNotificationParam::new(
                    Some(request_id),
                    Some("cancelled by the agent".into()),
                ))
                .await;
        });
        let started = Instant::now();
        let response = handle.await_response().await;
        let outcome = match &response {
            Ok(_) => "answered",
            Err(ServiceError::Timeout { .. }) => "timeout",
            Err(ServiceError::McpError(_)) => "refused",
            Err(_) => "transport_error",
        };
        metrics::histogram!("upstream_call_duration_seconds", "upstream" => call.upstream.clone(),
            "tool" => call.tool.clone(), "outcome" => outcome)
        .record(started.elapsed().as_secs_f64());
        cancel_watch.abort();
        connection.progress.unsubscribe(&token);
        match response {
            Ok(ServerResult::CallToolResult(result)) => Ok(convert::answer_from_result(&result)),
            Ok(other) => Err(UpstreamError::MaybeSent(format!(
                "unsupported answer to tools/call (input-required and task results are not proxied yet): {}",
                serde_json::to_string(&other)
                    .unwrap_or_default()
                    .chars()
                    .take(200)
                    .collect::<String>()
            ))),
            Err(ServiceError::McpError(error)) => {
                let (code, message) = convert::refused(&error);
                Err(UpstreamError::Refused { code, message })
            }
            Err(ServiceError::Timeout { timeout }) => Err(UpstreamError::TimedOut(timeout)),
            Err(other) => Err(UpstreamError::MaybeSent(other.to_string())),
        }
    }
}
