//! `tools/list` answered with the upstreams' own tool objects.
//!
//! rmcp's `ServerHandler::list_tools` answers with its typed `Tool`, which
//! drops every field its model does not know (the `V_2025_11_25` `execution`,
//! vendor fields), and rmcp's HTTP service only serves a `ServerHandler`.
//! So the raw layers (`idempotency`: the stdio line hook, the HTTP body
//! layer) hand a `tools/list` request over as a request of
//! `idempotency::WHOLE_TOOLS_METHOD` (same id and params), which rmcp passes to
//! `on_custom_request`, and its answer is a custom result: the front's own
//! `list_tools` page (paging, re-listing a stale catalog), shaped for the
//! negotiated protocol version as rmcp shapes a `tools/list` answer, then
//! each tool replaced by the object its upstream sent
//! (`upstream::tool_objects`) under the exposed name.
//!
//! # Invariants
//!
//! 1. A listed tool is the upstream's object with `name` as exposed; of
//!    the fields rmcp's model knows, one the shaped answer lacks (rmcp drops
//!    a non-object `outputSchema` for older protocol versions) is left out.
//!    The one other change: the argument the tool's adapter fills with the
//!    operation id is not in its `inputSchema` (`upstream::hide_filled_arguments`).
//!    Nothing else is changed or added.
//! 2. A tool whose object was not kept is listed as rmcp's model carries
//!    it.
//! 3. Pages, cursors and `list_changed` are the front's own: only the tool
//!    objects of a page differ from what `list_tools` answers.

use rmcp::model::{
    CustomRequest, CustomResult, PaginatedRequestParams, ProtocolVersion, ServerResult,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde_json::{Map, Value};

use super::Front;
use super::request::invalid_params;

/// The fields of a tool that rmcp's model carries (invariant 1).
const MODELLED: [&str; 7] = [
    "title",
    "description",
    "inputSchema",
    "outputSchema",
    "annotations",
    "icons",
    "_meta",
];

impl Front {
    /// The answer to a request of `idempotency::WHOLE_TOOLS_METHOD`.
    pub(super) async fn whole_tools_list(
        &self,
        request: CustomRequest,
        context: RequestContext<RoleServer>,
    ) -> Result<CustomResult, McpError> {
        let params = request
            .params_as::<PaginatedRequestParams>()
            .map_err(|error| invalid_params(format!("invalid params for tools/list: {error}")))?;
        let modern = context
            .protocol_version()
            .is_some_and(|v| v.as_str() >= ProtocolVersion::V_2026_07_28.as_str());
        let page = self.list_tools(params, context).await?;
        // As rmcp shapes a `tools/list` answer for the negotiated version.
        let mut shaped = ServerResult::ListToolsResult(page);
        if modern {
            shaped.fill_missing_cache_hints();
        } else {
            shaped.strip_result_type_for_legacy_peer();
            shaped.strip_non_object_output_for_legacy_peer();
        }
        let mut answer = serde_json::to_value(&shaped)
            .map_err(|e| McpError::internal_error(format!("tools/list: {e}"), None))?;
        let catalog = self.catalog();
        if let Some(Value::Array(tools)) = answer.get_mut("tools") {
            for tool in tools.iter_mut() {
                let object = tool
                    .get("name")
                    .and_then(Value::as_str)
                    .and_then(|name| catalog.entries.get(name))
                    .and_then(|entry| entry.object.clone());
                if let (Some(object), Value::Object(shaped)) = (object, &*tool) {
                    let whole = whole(&object, shaped);
                    *tool = Value::Object(whole);
                }
            }
        }
        Ok(CustomResult(answer))
    }
}

/// The upstream's `object` under the name of `shaped` (rmcp's answer for
/// it), without the modelled fields `shaped` lacks.
fn whole(object: &Map<String, Value>, shaped: &Map<String, Value>) -> Map<String, Value> {
    let mut whole = object.clone();
    if let Some(name) = shaped.get("name") {
        whole.insert("name".to_owned(), name.clone());
    }
    for field in MODELLED {
        if !shaped.contains_key(field) {
            whole.remove(field);
        }
    }
    whole
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_upstreams_object_keeps_every_field_but_the_name() {
        let object = json!({"name": "record", "inputSchema": {"type": "object"},
            "outputSchema": {"type": "array"}, "execution": {"taskSupport": "optional"},
            "x-vendor": {"tier": "gold"}, "annotations": {"readOnlyHint": false, "x-hint": 1}});
        let shaped = json!({"name": "raw__record", "inputSchema": {"type": "object"},
            "annotations": {"readOnlyHint": false}});
        let whole = whole(object.as_object().unwrap(), shaped.as_object().unwrap());
        assert_eq!(
            Value::Object(whole),
            json!({"name": "raw__record", "inputSchema": {"type": "object"},
                "execution": {"taskSupport": "optional"}, "x-vendor": {"tier": "gold"},
                "annotations": {"readOnlyHint": false, "x-hint": 1}})
        );
    }
}
