//! leasegate as the MCP client of one upstream: what it declares in
//! `initialize`, what it does with the upstream's requests and
//! notifications (routed to the call that owns them, or to the front), and
//! how a failed HTTP exchange with it reads to an agent: what failed and
//! why, in words, the URL without its query or credentials, never a type
//! name or a Debug dump.

use rmcp::model::{
    ClientCapabilities, ClientConfig, ClientResult, CustomResult, Implementation,
    ServerNotification, ServerRequest,
};
use rmcp::service::{NotificationContext, RequestContext};
use rmcp::{RoleClient, Service};

use super::UpstreamEvent;
use super::routes::origin_of;
use super::routes::{CallRoutes, NoOwner};
use crate::adapter::{AgentRequest, ToAgent};
use crate::adapter::{PeerError, RootsOutsideCalls};
use rmcp::ErrorData as McpError;
use serde_json::{Value, json};
use tokio::sync::{broadcast, oneshot};

/// leasegate as the client of one upstream.
#[derive(Clone)]
pub(super) struct UpstreamClient {
    pub(super) name: String,
    pub(super) routes: CallRoutes,
    pub(super) events: broadcast::Sender<UpstreamEvent>,
    /// The upstream's own tool objects, kept from its stdout or its HTTP
    /// `tools/list` answers (`tool_objects`).
    pub(super) tool_objects: super::tool_objects::ToolObjects,
    /// The adapter's answer to a `roots/list` outside any call.
    pub(super) roots_outside_calls: RootsOutsideCalls,
}

pub(super) fn method_and_params<T: serde::Serialize>(message: &T) -> (String, Value) {
    let value = serde_json::to_value(message).unwrap_or(Value::Null);
    let method = value
        .get("method")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let params = value.get("params").cloned().unwrap_or_else(|| json!({}));
    (method, params)
}

pub(super) fn mcp_error(error: PeerError) -> McpError {
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
        let agent = match self.routes.owner_soon(&origin, true).await {
            Ok(agent) => agent,
            // Servers that ask for roots at start (server-filesystem) ask
            // outside any agent's call: there are no roots to give then
            // (`RootsOutsideCalls`).
            Err(NoOwner::NoCall)
                if matches!(request, ServerRequest::ListRootsRequest(_))
                    && self.roots_outside_calls == RootsOutsideCalls::Empty =>
            {
                tracing::debug!(upstream = %self.name, "roots/list outside any call answered with no roots");
                let empty = serde_json::from_value(json!({"roots": []}))
                    .map_err(|e| McpError::internal_error(e.to_string(), None))?;
                return Ok(ClientResult::ListRootsResult(empty));
            }
            Err(why) => {
                tracing::warn!(upstream = %self.name, %method, why = %crate::logfield::clip_display(&why), "upstream request not relayed");
                return Err(McpError::internal_error(
                    format!("leasegate cannot relay {method} to an agent: {why}"),
                    None,
                ));
            }
        };
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
        let capabilities: ClientCapabilities =
            serde_json::from_value(session_capabilities()).unwrap_or_default();
        ClientConfig::new(
            capabilities,
            Implementation::new("leasegate", env!("CARGO_PKG_VERSION")),
        )
    }
}

/// What leasegate declares to every upstream session: what it can relay
/// to the calling agent.
fn session_capabilities() -> Value {
    json!({
        "sampling": {},
        "elicitation": {"form": {}, "url": {}},
        "roots": {"listChanged": true},
    })
}

/// The session's capabilities and the MCP Tasks extension, for the one
/// request of an agent that follows tasks.
pub(super) fn capabilities_with_tasks() -> Value {
    let mut capabilities = session_capabilities();
    capabilities["extensions"] = json!({ (rmcp::model::TASKS_EXTENSION_ID): {} });
    capabilities
}

/// A message and its causes, each once, without the HTTP client's wrapper
/// layers (`client error (SendRequest)`, `error sending request for url`),
/// which name its internals.
pub(super) fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(inner) = cause {
        let text = inner.to_string();
        let wrapper = text.starts_with("client error (")
            || text.starts_with("error sending request")
            || text.is_empty();
        if !wrapper && !parts.iter().any(|part| part.contains(&text)) {
            parts.push(text);
        }
        cause = inner.source();
    }
    if parts.is_empty() {
        return "no detail".to_owned();
    }
    parts.join(": ")
}

/// The URL as it may be shown: scheme, host, port and path.
fn shown_url(url: &reqwest::Url) -> String {
    let mut shown = format!("{}://{}", url.scheme(), url.host_str().unwrap_or(""));
    if let Some(port) = url.port() {
        shown.push_str(&format!(":{port}"));
    }
    shown.push_str(url.path());
    shown
}

/// A failed HTTP exchange with an upstream, in words.
pub(super) fn http_failure(error: &reqwest::Error) -> String {
    let what = if error.is_connect() {
        "could not connect to"
    } else if error.is_timeout() {
        "no answer in time from"
    } else if never_sent(error) {
        "the connection failed before the request was sent to"
    } else if error.is_request() {
        "the exchange failed with"
    } else if error.is_body() || error.is_decode() {
        "the answer could not be read from"
    } else {
        "HTTP failure with"
    };
    let url = error
        .url()
        .map(shown_url)
        .unwrap_or_else(|| "the upstream".to_owned());
    let mut text = format!("{what} {url}");
    if let Some(cause) = std::error::Error::source(error) {
        text.push_str(": ");
        text.push_str(&error_chain(cause));
    }
    text
}

/// Whether the HTTP client's error proves the request never left: no
/// connection could be made, or the connection failed before the request
/// was started on it (hyper gives such a request back as canceled).
pub(super) fn never_sent(error: &reqwest::Error) -> bool {
    error.is_connect() || crate::http_server::request_never_started(error)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A refused connection reads as what failed and why: the URL without
    /// its query or credentials, no wrapper of the HTTP client, no type
    /// names; it proves nothing was sent.
    #[tokio::test]
    async fn a_refused_connection_reads_in_words_and_is_not_sent() {
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = closed.local_addr().unwrap().port();
        drop(closed);
        let error = reqwest::Client::new()
            .post(format!("http://user:secret@127.0.0.1:{port}/mcp?token=t0p"))
            .body("{}")
            .send()
            .await
            .expect_err("nobody listens");
        let text = http_failure(&error);
        assert!(
            text.starts_with(&format!(
                "could not connect to http://127.0.0.1:{port}/mcp: "
            )),
            "{text}"
        );
        assert!(text.contains("refused"), "{text}");
        for hidden in ["secret", "t0p", "client error", "Connect)", "::", "Some("] {
            assert!(!text.contains(hidden), "{hidden} in {text}");
        }
        assert!(never_sent(&error));
    }

    /// A server that reads the request and closes without answering: the
    /// request may have been received, so it is not "never sent", and the
    /// text says what happened without the HTTP client's internals.
    #[tokio::test]
    async fn a_connection_closed_after_the_request_may_have_been_received() {
        use tokio::io::AsyncReadExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut buffer = vec![0u8; 4096];
            let _ = socket.read(&mut buffer).await;
            drop(socket);
        });
        let error = reqwest::Client::new()
            .post(format!("http://127.0.0.1:{port}/mcp"))
            .body("{}")
            .send()
            .await
            .expect_err("the server closes without answering");
        assert!(!never_sent(&error));
        let text = http_failure(&error);
        assert!(
            text.starts_with(&format!(
                "the exchange failed with http://127.0.0.1:{port}/mcp"
            )),
            "{text}"
        );
        for hidden in ["client error", "SendRequest", "::", "error sending request"] {
            assert!(!text.contains(hidden), "{hidden} in {text}");
        }
    }
}
