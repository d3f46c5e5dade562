//! rmcp ↔ leasegate conversions, in one place so that an rmcp upgrade
//! touches one file. Also the JSON-RPC error codes leasegate answers with.

use rmcp::ErrorData as McpError;
use rmcp::model::{CallToolResult, ContentBlock, ErrorCode, MetaObject, ResultType};
use serde_json::{Value, json};

use crate::adapter::ToolAnswer;
use crate::dispatch::{CallError, CallReply};

/// JSON-RPC error codes of leasegate (server-defined range).
pub mod codes {
    /// A side-effecting call came without a lease.
    pub const LEASE_REQUIRED: i32 = -32001;
    /// The lease is not the run's current one (taken over, expired,
    /// released), or (`data.reason = "lease_token_invalid"`) it is, but the
    /// call did not present its secret lease token.
    pub const LEASE_LOST: i32 = -32002;
    /// The same intent identity was sent with a different request.
    pub const INTENT_CONFLICT: i32 = -32003;
    /// The run is succeeded, failed or cancelled (or not in a callable state).
    pub const RUN_TERMINAL: i32 = -32004;
    /// The run does not exist.
    pub const RUN_NOT_FOUND: i32 = -32005;
    /// The same intent is in flight under another claim; ask again later.
    pub const IN_PROGRESS: i32 = -32006;
    /// The operation was cancelled (run cancelled or plan superseded).
    pub const OPERATION_CANCELLED: i32 = -32007;
    /// The ledger could not be reached or its answer was lost (the message
    /// starts "ledger unavailable" or "ledger outcome unknown"); or (with
    /// `data.reason = "durability"`, the message "durability hold") its
    /// durability contract is not met or a lossy failover is unresolved,
    /// and nothing was registered or sent.
    pub const LEDGER_UNAVAILABLE: i32 = -32010;
    /// The upstream could not be reached and provably nothing was sent; the
    /// operation is pending under the same id: call again.
    pub const NOT_SENT: i32 = -32011;
    /// stateless MCP: the request was cancelled by the client.
    pub const REQUEST_CANCELLED: i32 = -32800;
    /// Standard JSON-RPC: invalid params (unknown tool, bad lease fields,
    /// oversized or unsafe arguments, missing step).
    pub const INVALID_PARAMS: i32 = -32602;
}

/// The JSON of a tool result, as stored in the ledger.
pub fn answer_from_result(result: &CallToolResult) -> ToolAnswer {
    let mut value = serde_json::to_value(result).unwrap_or(Value::Null);
    if let Some(map) = value.as_object_mut() {
        // Upstream _meta is transport noise for the ledger; resultType too.
        map.remove("_meta");
        map.remove("resultType");
    }
    ToolAnswer {
        is_error: result.is_error.unwrap_or(false),
        result: value,
    }
}

/// A tool result for the agent from the JSON of an upstream's answer (as
/// passed through or as recorded). `resultType` is set to `complete`; rmcp
/// removes it again for agents on protocol versions before stateless MCP (`V_2026_07_28`).
pub fn tool_result(result: Value) -> Result<CallToolResult, McpError> {
    let mut result: CallToolResult = serde_json::from_value(result)
        .map_err(|e| McpError::internal_error(format!("upstream answer unreadable: {e}"), None))?;
    result.result_type = Some(ResultType::COMPLETE);
    Ok(result)
}

fn operation_meta(note: Value) -> MetaObject {
    let mut meta = MetaObject::new();
    meta.insert("dev.leasegate/operation".to_owned(), note);
    meta
}

/// What the agent receives for a reply.
pub fn result_from_reply(reply: CallReply) -> CallToolResult {
    match reply {
        CallReply::Answer {
            result,
            is_error,
            operation,
        } => {
            let mut tool_result: CallToolResult =
                serde_json::from_value(result).unwrap_or_else(|_| {
                    let mut fallback = CallToolResult::success(vec![ContentBlock::text(
                        "(recorded result could not be read back)",
                    )]);
                    fallback.is_error = Some(is_error);
                    fallback
                });
            tool_result.meta = Some(operation_meta(operation.to_json()));
            tool_result.result_type = Some(ResultType::COMPLETE);
            tool_result
        }
        CallReply::Unknown {
            operation_id,
            reason,
        } => {
            let body = json!({
                "operation_id": operation_id.as_str(),
                "status": "unknown",
                "reason": reason,
            });
            let mut tool_result = CallToolResult::error(vec![ContentBlock::text(format!(
                "outcome unknown for operation {operation_id}: {reason}. It was not reported as failed; \
                 do not retry it under a new step — ask the ledger for its fate."
            ))]);
            tool_result.structured_content = Some(body);
            tool_result.meta = Some(operation_meta(json!({
                "operation_id": operation_id.as_str(),
                "status": "unknown",
                "replayed": false,
            })));
            tool_result.result_type = Some(ResultType::COMPLETE);
            tool_result
        }
    }
}

/// The JSON-RPC error for a refused call. Internal details never leak.
pub fn error_from_call(error: &CallError) -> McpError {
    let (code, data) = match error {
        CallError::LeaseRequired => (codes::LEASE_REQUIRED, None),
        CallError::BadRequestMeta(_) => (codes::INVALID_PARAMS, None),
        CallError::LeaseLost(rejection) => (codes::LEASE_LOST, Some(reason_data(rejection))),
        CallError::LeaseTokenInvalid(rejection) => {
            let mut data = reason_data(rejection);
            if let crate::ledger::Rejection::LeaseTokenInvalid { fault, .. } = rejection.as_ref() {
                data["fault"] = json!(fault.as_str());
            }
            (codes::LEASE_LOST, Some(data))
        }
        CallError::SessionLost { task, .. } => (
            codes::LEASE_LOST,
            Some(json!({"reason": "session_lost", "task": task})),
        ),
        CallError::RunTerminal(rejection) => (codes::RUN_TERMINAL, Some(reason_data(rejection))),
        CallError::RunNotFound => (codes::RUN_NOT_FOUND, None),
        CallError::IntentConflict(rejection) => {
            (codes::INTENT_CONFLICT, Some(conflict_data(rejection)))
        }
        CallError::InProgress { operation_id } => (
            codes::IN_PROGRESS,
            Some(json!({"operation_id": operation_id.as_str(), "status": "dispatching"})),
        ),
        CallError::Cancelled { operation_id } => (
            codes::OPERATION_CANCELLED,
            Some(json!({"operation_id": operation_id.as_str(), "status": "cancelled"})),
        ),
        CallError::NotSent { operation_id, .. } => (
            codes::NOT_SENT,
            Some(json!({"operation_id": operation_id.as_str(), "status": "prepared"})),
        ),
        // A number RFC 8785 would give a neighbour's digest: where, and
        // what was sent, as the front's `inexact_number` refusals name it.
        CallError::Intent(crate::intent::IntentError::UnsafeInteger { path, value }) => (
            codes::INVALID_PARAMS,
            Some(json!({"reason": "unsafe_integer", "path": path, "value": value})),
        ),
        CallError::StepRequired | CallError::ArgumentsTooLarge { .. } | CallError::Intent(_) => {
            (codes::INVALID_PARAMS, None)
        }
        // Refused before anything was sent (an identifier out of bounds).
        CallError::Ledger(crate::ledger::LedgerError::InvalidInput(_)) => {
            (codes::INVALID_PARAMS, None)
        }
        CallError::Ledger(_) => (codes::LEDGER_UNAVAILABLE, None),
        CallError::Held { reason } => (
            codes::LEDGER_UNAVAILABLE,
            Some(json!({"reason": "durability", "detail": reason})),
        ),
        CallError::LedgerUnreachable { .. } => (codes::LEDGER_UNAVAILABLE, None),
    };
    let message = match error {
        CallError::Ledger(crate::ledger::LedgerError::InvalidInput(invalid)) => invalid.to_string(),
        // A stored body under a key this process lacks: the call is not
        // repeated blindly, the operator fixes encryption_keys.
        CallError::Ledger(inner @ crate::ledger::LedgerError::Sealed { .. }) => {
            tracing::error!(error = %inner, "a stored body cannot be opened");
            format!("{inner}: the operator must configure its key (policy encryption_keys)")
        }
        CallError::Ledger(inner) => {
            tracing::error!(error = %crate::logfield::clip_display(&inner), "ledger call failed");
            match inner.delivery() {
                crate::ledger::Delivery::Unknown => {
                    "ledger outcome unknown: call again with the same step to learn the operation's fate".to_owned()
                }
                _ => "ledger unavailable: nothing was sent upstream; try again".to_owned(),
            }
        }
        // Why is the operator's business (logged, and in GET
        // /v1/durability): driver text is not the agent's.
        CallError::LedgerUnreachable { reason } => {
            tracing::warn!(reason = %crate::logfield::clip(reason), "call refused: ledger unavailable");
            "ledger unavailable: the ledger could not be reached or confirmed, so nothing was \
             registered or sent; call again"
                .to_owned()
        }
        // How to send what is missing, in this transport's words.
        CallError::LeaseRequired => format!(
            "{error}: send _meta \"{}\" {{run_id, owner, epoch}} or the Leasegate-Run-Id, \
             Leasegate-Owner and Leasegate-Epoch headers",
            super::wire::LEASE_META
        ),
        CallError::StepRequired => format!(
            "{error}: send _meta \"{}\" {{step_id, effect_version}}",
            super::wire::STEP_META
        ),
        CallError::IntentConflict(rejection) => conflict_message(rejection),
        other => other.to_string(),
    };
    McpError::new(ErrorCode(code), message, data)
}

/// What the -32001 answer names: the tool, and what the front knows of
/// how the agent could call it.
#[derive(Debug, Clone)]
pub struct LeaseRequired<'a> {
    /// The tool as the agent called it.
    pub tool: &'a str,
    pub upstream: &'a str,
    /// The tool's name at the upstream (its `[tools.<name>]` in the adapter).
    pub upstream_tool: &'a str,
    /// The call came over HTTP, where the lease may come as headers too.
    pub over_http: bool,
    /// The upstream's `readOnlyHint` for the tool.
    pub read_only_hint: Option<bool>,
    /// Whether the upstream's adapter honours that hint.
    pub trust_annotations: bool,
}

/// The -32001 refusal: a side-effecting call came without a lease. The
/// message says, in a few sentences, how to get a lease for the transport
/// in use and how to mark the tool read-only; `data` carries the same as
/// structured hints.
pub fn lease_required(call: &LeaseRequired<'_>) -> McpError {
    let LeaseRequired {
        tool,
        upstream,
        upstream_tool,
        over_http,
        read_only_hint,
        trust_annotations,
    } = call;
    let meta = super::wire::LEASE_META;
    let send = if *over_http {
        format!(
            "send its run_id, owner, epoch and secret lease token (shown once when the lease is \
             taken) as the Leasegate-Run-Id, Leasegate-Owner, Leasegate-Epoch and \
             Leasegate-Lease-Token headers or as _meta \"{meta}\" {{run_id, owner, epoch, token}}"
        )
    } else {
        format!(
            "send its run_id, owner, epoch and secret lease token (shown once when the lease is \
             taken) as _meta \"{meta}\" {{run_id, owner, epoch, token}}"
        )
    };
    let read_only = if *read_only_hint == Some(true) && !trust_annotations {
        format!(
            "If {tool:?} has no side effects, set read_only = true under [tools.{upstream_tool}] in \
             the adapter file of upstream {upstream:?}, or trust_annotations = true there to honour \
             the readOnlyHint it declares"
        )
    } else {
        format!(
            "If {tool:?} has no side effects, set read_only = true under [tools.{upstream_tool}] in \
             the adapter file of upstream {upstream:?} (or trust_annotations = true to honour a \
             server's readOnlyHint)"
        )
    };
    let session = if *over_http {
        "Or let leasegate hold the lease: lease_mode = \"session\" with http_sessions = true and a \
         Leasegate-Task header (or [session] task) in leasegate.toml; or, with lease_mode = \"key\", \
         send an Idempotency-Key header or params.idempotencyKey"
    } else {
        "Or let leasegate hold the lease: start it as `leasegate stdio --task <task>` (or set \
         LEASEGATE_TASK); or, with lease_mode = \"key\", send params.idempotencyKey"
    };
    let message = format!(
        "tool {tool:?} has side effects and needs a lease. Create a run that holds one \
         (`leasegate runs create --task <task> --owner <owner> --ttl-ms 60000`, or POST /v1/runs \
         with owner and ttl_ms on the control API), then {send}. {session}. {read_only}."
    );
    let mut lease = json!({
        "meta": {"key": meta, "fields": ["run_id", "owner", "epoch", "token"]},
        "create_run": {
            "cli": "leasegate runs create --task <task> --owner <owner> --ttl-ms <ms>",
            "api": "POST /v1/runs {\"task_id\", \"owner\", \"ttl_ms\"}",
        },
    });
    if *over_http {
        lease["headers"] = json!([
            "Leasegate-Run-Id",
            "Leasegate-Owner",
            "Leasegate-Epoch",
            "Leasegate-Lease-Token"
        ]);
        lease["session_mode"] =
            json!("lease_mode = \"session\", http_sessions = true, Leasegate-Task header");
        lease["key_mode"] =
            json!("lease_mode = \"key\", Idempotency-Key header or params.idempotencyKey");
    } else {
        lease["session_mode"] = json!("leasegate stdio --task <task> (or LEASEGATE_TASK)");
        lease["key_mode"] = json!("lease_mode = \"key\", params.idempotencyKey");
    }
    let data = json!({
        "tool": tool,
        "upstream": upstream,
        "upstream_tool": upstream_tool,
        "how": {
            "lease": lease,
            "read_only": {
                "adapter_upstream": upstream,
                "set": format!("[tools.{upstream_tool}] read_only = true"),
                "or": "trust_annotations = true",
                "read_only_hint": read_only_hint,
                "trust_annotations": trust_annotations,
            },
        },
    });
    McpError::new(ErrorCode(codes::LEASE_REQUIRED), message, Some(data))
}

/// -32003 says what the caller must do, and nothing of the request the
/// step or key was first used with (its digest would let a caller test
/// guesses of another request's arguments offline).
fn conflict_message(rejection: &crate::ledger::Rejection) -> String {
    let operation = match rejection {
        crate::ledger::Rejection::IntentConflict { operation_id, .. } => operation_id.as_str(),
        _ => "",
    };
    format!(
        "intent conflict on operation {operation}: this step (or idempotency key) was already \
         used with a different request. Nothing was sent. Send the same request again to get its \
         recorded answer; for a different request use a new idempotency key, or a new step (or \
         effect_version + 1 when the plan changed)"
    )
}

fn conflict_data(rejection: &crate::ledger::Rejection) -> Value {
    match rejection {
        crate::ledger::Rejection::IntentConflict { operation_id, .. } => {
            json!({"reason": rejection.reason(), "operation_id": operation_id.as_str()})
        }
        other => json!({"reason": other.reason()}),
    }
}

fn reason_data(rejection: &crate::ledger::Rejection) -> Value {
    json!({ "reason": rejection.reason(), "detail": rejection.to_string() })
}

/// The upstream's JSON-RPC error, as a code and a message.
pub fn refused(error: &McpError) -> (i32, String) {
    (error.code.0, error.message.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_required_names_the_tool_the_way_to_a_lease_and_to_read_only() {
        let mut call = LeaseRequired {
            tool: "files__delete",
            upstream: "files",
            upstream_tool: "delete",
            over_http: false,
            read_only_hint: None,
            trust_annotations: false,
        };
        let stdio = lease_required(&call);
        assert_eq!(stdio.code.0, codes::LEASE_REQUIRED);
        let message = stdio.message.to_string();
        for needle in [
            "tool \"files__delete\" has side effects and needs a lease",
            "leasegate runs create --task <task> --owner <owner>",
            "POST /v1/runs",
            "_meta \"dev.leasegate/lease\" {run_id, owner, epoch, token}",
            "set read_only = true under [tools.delete] in the adapter file of upstream \"files\"",
            "trust_annotations = true",
        ] {
            assert!(
                message.contains(needle),
                "{needle:?} missing from {message}"
            );
        }
        assert!(
            !message.contains("Leasegate-Run-Id"),
            "stdio has no headers: {message}"
        );
        let data = stdio.data.expect("structured hints");
        assert_eq!(data["tool"], "files__delete");
        assert_eq!(data["how"]["lease"]["meta"]["key"], "dev.leasegate/lease");
        assert!(data["how"]["lease"].get("headers").is_none());
        assert_eq!(
            data["how"]["read_only"]["set"],
            "[tools.delete] read_only = true"
        );

        call.over_http = true;
        call.read_only_hint = Some(true);
        let http = lease_required(&call);
        let message = http.message.to_string();
        assert!(
            message.contains(
                "Leasegate-Run-Id, Leasegate-Owner, Leasegate-Epoch and Leasegate-Lease-Token headers"
            ),
            "{message}"
        );
        assert!(
            message.contains("honour the readOnlyHint it declares"),
            "{message}"
        );
        let data = http.data.expect("structured hints");
        assert_eq!(
            data["how"]["lease"]["headers"],
            json!([
                "Leasegate-Run-Id",
                "Leasegate-Owner",
                "Leasegate-Epoch",
                "Leasegate-Lease-Token"
            ])
        );
        assert_eq!(data["how"]["read_only"]["read_only_hint"], true);
    }
}
