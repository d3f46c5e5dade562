//! MCP clients of the upstream tool servers (stdio children and Streamable
//! HTTP servers), and the tool catalog leasegate exposes.

use std::collections::BTreeMap;

use futures::StreamExt;
use rmcp::handler::client::progress::ProgressDispatcher;
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CancelledNotificationParam, ClientCapabilities,
    ClientConfig, ClientRequest, Implementation, ProgressNotificationParam, RequestMetaObject,
    ServerResult, Tool,
};
use rmcp::service::{NotificationContext, Peer, PeerRequestOptions, RunningService, ServiceError};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{ClientHandler, RoleClient, ServiceExt};

use super::convert;
use crate::adapter::{Progress, ToolAnswer, Upstream, UpstreamCall, UpstreamError};
use crate::config::{Config, UpstreamTransport};

/// Receives what upstreams send leasegate unasked: progress.
#[derive(Clone, Default)]
struct UpstreamClient {
    progress: ProgressDispatcher,
}

impl ClientHandler for UpstreamClient {
    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.progress.handle_notification(params).await;
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
    progress: ProgressDispatcher,
    /// Keeps the client (and, for stdio, the child process) alive.
    _service: RunningService<RoleClient, UpstreamClient>,
}

/// One tool as the agent sees it.
#[derive(Debug, Clone)]
pub struct CatalogEntry {
    pub upstream: String,
    pub tool: Tool,
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
                    _service: service,
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
                let exposed = format!("{name}{separator}{}", tool.name);
                if let Some(existing) = catalog.get(&exposed) {
                    return Err(StartError::Collision {
                        name: exposed,
                        first: format!("{}/{}", existing.upstream, existing.tool.name),
                        second: format!("{name}/{}", tool.name),
                    });
                }
                let mut exposed_tool = tool.clone();
                exposed_tool.name = exposed.clone().into();
                catalog.insert(
                    exposed,
                    CatalogEntry {
                        upstream: name.clone(),
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
            let _ = connection._service.cancel().await;
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
        let mut subscriber = connection
            .progress
            .subscribe(handle.progress_token.clone())
            .await;
        let forward = call.progress.map(|sink| {
            tokio::spawn(async move {
                while let Some(update) = subscriber.next().await {
                    let _ = sink.send(Progress {
                        progress: update.progress,
                        total: update.total,
                        message: update.message,
                    });
                }
            })
        });
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
        let response = handle.await_response().await;
        cancel_watch.abort();
        if let Some(forward) = forward {
            forward.abort();
        }
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
