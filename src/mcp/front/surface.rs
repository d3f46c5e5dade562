//! The upstreams' server surface besides tools: reading and subscribing to
//! resources, prompts, completions and log levels, each resolved to the
//! upstream that owns the exposed name or URI and passed on.

// Logging (`logging/setLevel`) and resource subscriptions are deprecated by
// later protocol versions but still served to handshake-era clients.
#![allow(deprecated)]

use rmcp::model::{
    CompleteRequestParams, CompleteResult, ErrorCode, GetPromptRequestParams, GetPromptResponse,
    GetPromptResult, ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult,
    SetLevelRequestParams, SubscribeRequestParams, UnsubscribeRequestParams,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer};
use serde_json::{Value, json};

use super::relay::{self, level_rank};
use super::request::invalid_params;
use super::{Front, typed};

impl Front {
    pub(super) async fn serve_read_resource(
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
    pub(super) async fn serve_subscribe(
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
    pub(super) async fn serve_unsubscribe(
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

    pub(super) async fn serve_get_prompt(
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

    pub(super) async fn serve_complete(
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

    pub(super) async fn serve_set_level(
        &self,
        request: SetLevelRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        self.register_session(context.peer.clone());
        if let Ok(mut level) = self.session.log_level.lock() {
            *level = Some(request.level);
        }
        // A handshake-era stateless client has no session to keep it in:
        // kept by its client identity, for its later calls (`relay`).
        if relay::stateless_level(&context, &self.state.in_flight.log_levels).is_some()
            && let Some(parts) = context.extensions.get::<http::request::Parts>()
        {
            self.state
                .in_flight
                .log_levels
                .set(&parts.headers, request.level);
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
}
