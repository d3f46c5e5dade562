//! leasegate as the MCP client of one upstream: what it declares in
//! `initialize`, and what it does with the upstream's requests and
//! notifications (routed to the call that owns them, or to the front).

use rmcp::model::{
    ClientCapabilities, ClientConfig, ClientResult, CustomResult, Implementation,
    ServerNotification, ServerRequest,
};
use rmcp::service::{NotificationContext, RequestContext};
use rmcp::{RoleClient, Service};

use super::UpstreamEvent;
use super::routes::CallRoutes;
use super::routes::origin_of;
use crate::adapter::PeerError;
use crate::adapter::{AgentRequest, ToAgent};
use rmcp::ErrorData as McpError;
use serde_json::{Value, json};
use tokio::sync::{broadcast, oneshot};

/// leasegate as the client of one upstream.
#[derive(Clone)]
pub(super) struct UpstreamClient {
    pub(super) name: String,
    pub(super) routes: CallRoutes,
    pub(super) events: broadcast::Sender<UpstreamEvent>,
    /// The upstream's own tool objects, kept from its stdout (`tool_objects`).
    pub(super) tool_objects: super::tool_objects::ToolObjects,
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
