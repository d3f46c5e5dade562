//! rmcp ↔ leasegate conversions, in one place so that an rmcp upgrade
//! touches one file. Also the JSON-RPC error codes leasegate answers with.

use rmcp::ErrorData as McpError;
use rmcp::model::{
    CallToolResponse, CallToolResult, ContentBlock, CreateTaskResult, ErrorCode, MetaObject,
    ResultType, ServerResult,
};
use serde_json::{Value, json};

use crate::adapter::ToolAnswer;
use crate::dispatch::{CallError, CallReply};

/// JSON-RPC error codes of leasegate: application codes outside the range
/// JSON-RPC reserves (-32768..-32000), where the MCP specification and its
/// SDKs define theirs (-32000 connection closed and -32001 request timeout
/// in the SDKs, -32002 resource not found, -32020.. in the stateless protocol (`V_2026_07_28`),
/// -32042 URL elicitation) and the agent frameworks' MCP clients raise
/// theirs (fastmcp, pydantic-ai, the Vercel AI SDK), so a client never
/// mistakes a leasegate refusal for its own failure. Stable; `data.reason`
/// carries the meaning too.
pub mod codes {
    /// A side-effecting call came without a lease.
    pub const LEASE_REQUIRED: i32 = -31001;
    /// The lease is not the run's current one (taken over, expired,
    /// released), or (`data.reason = "lease_token_invalid"`) it is, but the
    /// call did not present its secret lease token.
    pub const LEASE_LOST: i32 = -31002;
    /// The same intent identity was sent with a different request.
    pub const INTENT_CONFLICT: i32 = -31003;
    /// The run is succeeded, failed or cancelled (or not in a callable state).
    pub const RUN_TERMINAL: i32 = -31004;
    /// The run does not exist.
    pub const RUN_NOT_FOUND: i32 = -31005;
    /// The same intent is in flight under another claim; ask again later.
    pub const IN_PROGRESS: i32 = -31006;
    /// The operation was cancelled (run cancelled or plan superseded).
    pub const OPERATION_CANCELLED: i32 = -31007;
    /// The ledger could not be reached or its answer was lost (the message
    /// starts "ledger unavailable" or "ledger outcome unknown"); or (with
    /// `data.reason = "durability"`, the message "durability hold") its
    /// durability contract is not met or a lossy failover is unresolved,
    /// and nothing was registered or sent.
    pub const LEDGER_UNAVAILABLE: i32 = -31010;
    /// The upstream could not be reached and provably nothing was sent; the
    /// operation is pending under the same id: call again.
    pub const NOT_SENT: i32 = -31011;
    /// The caller's principal already has `limits.max_in_flight_per_principal`
    /// requests in progress (HTTP 429, `Retry-After`); nothing was sent.
    pub const TOO_MANY_IN_FLIGHT: i32 = -31012;
    /// `leasegate stdio` could not start (the ledger or an upstream cannot
    /// be reached, a config that does not load): its one answer, to the
    /// client's first request, before it exits.
    pub const NOT_STARTED: i32 = -31013;
    /// Every code of leasegate's own above (not the protocol's below).
    pub const OWN: [i32; 11] = [
        LEASE_REQUIRED,
        LEASE_LOST,
        INTENT_CONFLICT,
        RUN_TERMINAL,
        RUN_NOT_FOUND,
        IN_PROGRESS,
        OPERATION_CANCELLED,
        LEDGER_UNAVAILABLE,
        NOT_SENT,
        TOO_MANY_IN_FLIGHT,
        NOT_STARTED,
    ];
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

/// A task an upstream made of a call, from its `CreateTaskResult`.
pub fn task_started(task: &rmcp::model::CreateTaskResult) -> crate::adapter::TaskStarted {
    crate::adapter::TaskStarted {
        task_id: task.task.task_id.clone(),
        handle: serde_json::to_value(task).unwrap_or(Value::Null),
        poll_interval: task
            .task
            .poll_interval_ms
            .map(std::time::Duration::from_millis),
    }
}

/// Where a task stands, from an upstream's answer to `tasks/get` (read as
/// JSON, whatever variant rmcp took it for: the task's fields are at the
/// top level, `result` or `error` beside them once it is terminal).
pub fn task_poll(answer: ServerResult) -> Result<crate::adapter::TaskPoll, String> {
    use crate::adapter::{PeerError, TaskPoll, TaskState};
    let value = serde_json::to_value(&answer).map_err(|e| e.to_string())?;
    let poll_interval = value
        .get("pollIntervalMs")
        .and_then(Value::as_u64)
        .map(std::time::Duration::from_millis);
    let state = match value.get("status").and_then(Value::as_str) {
        Some("working") => TaskState::Working,
        Some("input_required") => TaskState::InputRequired,
        Some("completed") => {
            let result = value
                .get("result")
                .cloned()
                .ok_or("a completed task without its result")?;
            let result: CallToolResult = serde_json::from_value(result)
                .map_err(|e| format!("a completed task's result is not a tool result: {e}"))?;
            TaskState::Completed(answer_from_result(&result))
        }
        Some("failed") => {
            let error = value.get("error").cloned().unwrap_or(Value::Null);
            TaskState::Failed(PeerError {
                code: error
                    .get("code")
                    .and_then(Value::as_i64)
                    .and_then(|c| i32::try_from(c).ok())
                    .unwrap_or(ErrorCode::INTERNAL_ERROR.0),
                message: error
                    .get("message")
                    .and_then(Value::as_str)
                    .unwrap_or("the task failed")
                    .to_owned(),
                data: error.get("data").cloned(),
            })
        }
        Some("cancelled") => TaskState::Cancelled,
        other => return Err(format!("not a task status: {other:?}")),
    };
    Ok(TaskPoll {
        state,
        poll_interval,
    })
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

/// The key of a replayed answer's structured content that says it is a
/// replay ([`OutcomeShown::structured`]).
pub const OUTCOME_KEY: &str = "dev.leasegate/outcome";

/// Where a replayed answer says so besides `_meta`, for clients that hand
/// the model only part of a tool result.
#[derive(Debug, Clone, Copy)]
pub struct OutcomeShown {
    /// A last text block (policy `outcome_in_content`).
    pub content: bool,
    /// The key [`OUTCOME_KEY`] in an object `structuredContent`, for
    /// clients that give the model that alone (pydantic-ai). Only for tools
    /// that declare no `outputSchema`: a key the schema does not name could
    /// fail a strict client's validation of the tool's own answer.
    pub structured: bool,
}

/// The agent's answer to a gated call: a tool result, or the handle of
/// the task the upstream made of it (with the operation in its `_meta`).
pub fn response_from_reply(
    reply: CallReply,
    outcome: OutcomeShown,
) -> Result<CallToolResponse, McpError> {
    match reply {
        CallReply::Task { handle, operation } => {
            let mut task = create_task_result(handle)?;
            task.meta
                .get_or_insert_with(MetaObject::new)
                .insert("dev.leasegate/operation".to_owned(), operation.to_json());
            Ok(CallToolResponse::Task(task))
        }
        other => Ok(CallToolResponse::Complete(result_from_reply(
            other, outcome,
        ))),
    }
}

/// A `CreateTaskResult` from its JSON, as the upstream sent it.
pub fn create_task_result(handle: Value) -> Result<CreateTaskResult, McpError> {
    serde_json::from_value(handle).map_err(|e| {
        McpError::internal_error(format!("upstream task handle unreadable: {e}"), None)
    })
}

fn result_from_reply(reply: CallReply, outcome: OutcomeShown) -> CallToolResult {
    match reply {
        // Where only a tool result can go: the task named, still running.
        CallReply::Task { handle, operation } => {
            let task_id = handle.get("taskId").cloned().unwrap_or(Value::Null);
            let mut tool_result = CallToolResult::structured(json!({"task": handle}));
            tool_result.content = vec![ContentBlock::text(format!(
                "the tool runs this call as task {task_id}; follow it with tasks/get"
            ))];
            tool_result.meta = Some(operation_meta(operation.to_json()));
            tool_result.result_type = Some(ResultType::COMPLETE);
            tool_result
        }
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
            if operation.replayed && outcome.content {
                // For clients that hand the model the content and drop
                // `_meta`: the model must not read a replay as a new effect.
                let said = match &operation.remarks.rephrased {
                    None => format!(
                        "[leasegate] replayed: this is the recorded answer of an earlier identical \
                         call (operation {}, {}); the tool was not called again",
                        operation.operation_id,
                        operation.status.as_str()
                    ),
                    Some(rephrased) => format!(
                        "[leasegate] replayed: {}, so it is the same effect: this is the recorded \
                         answer of that earlier call (operation {}, {}); the tool was not called \
                         again",
                        rephrased.said(),
                        operation.operation_id,
                        operation.status.as_str()
                    ),
                };
                // A client that prefers structured content reads this
                // instead of the text block; the tool's own keys stay as
                // they are.
                if outcome.structured
                    && let Some(Value::Object(fields)) = &mut tool_result.structured_content
                {
                    fields.insert(OUTCOME_KEY.to_owned(), Value::String(said.clone()));
                }
                tool_result.content.push(ContentBlock::text(said));
            }
            tool_result.meta = Some(operation_meta(operation.to_json()));
            tool_result.result_type = Some(ResultType::COMPLETE);
            tool_result
        }
        CallReply::Shown { tool, calls } => shown_result(&tool, &calls),
        CallReply::Unknown {
            operation_id,
            reason,
        } => {
            // In the structured content too, for clients that hand the model
            // that alone.
            let body = json!({
                "operation_id": operation_id.as_str(),
                "status": "unknown",
                "reason": reason,
                "advice": "not reported as failed: it may have happened. Do not retry it under a \
                           new step; the same call again answers its outcome once known",
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

/// The key of a shown answer's structured content that lists the earlier
/// calls whose outcomes their agent never received.
pub const UNDELIVERED_KEY: &str = "dev.leasegate/undelivered";

/// The `_meta` key of a shown answer: `{"sent": false, "operations": [..]}`.
pub const SHOWN_META: &str = "dev.leasegate/shown";

/// A call not sent because earlier calls of its tool have outcomes its
/// agent never received: those calls and outcomes, in words and in
/// structured content, and how to send the call after all.
fn shown_result(tool: &str, calls: &[crate::dispatch::ShownCall]) -> CallToolResult {
    let mut text = format!(
        "[leasegate] nothing was sent. An earlier call to {tool} in this task ended without its \
         answer reaching you:"
    );
    for call in calls {
        text.push_str(&format!(
            "\n- operation {} with arguments {} is {}",
            call.operation_id,
            call.arguments,
            call.status.as_str()
        ));
        let answer = call
            .result
            .as_ref()
            .and_then(|result| result.get("content"))
            .and_then(Value::as_array)
            .map(|blocks| {
                blocks
                    .iter()
                    .filter_map(|block| block.get("text").and_then(Value::as_str))
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .filter(|answer| !answer.is_empty());
        match (call.status, answer) {
            (crate::ledger::OperationStatus::Unknown, _) => text.push_str(
                ": it may have happened; its fate is being reconciled (leasegate ops show)",
            ),
            (crate::ledger::OperationStatus::Dispatching, _) => {
                text.push_str(": still running; its outcome is not known yet")
            }
            (_, Some(answer)) => text.push_str(&format!("; its answer: {answer}")),
            (_, None) => {}
        }
    }
    text.push_str(
        "\nIf that earlier call is what you meant, do not send it again in other words. If this \
         call is a different one, call again with the same arguments to send it.",
    );
    let listed: Vec<Value> = calls.iter().map(|call| call.to_json()).collect();
    let mut tool_result = CallToolResult::error(vec![ContentBlock::text(text)]);
    tool_result.structured_content = Some(json!({
        UNDELIVERED_KEY: listed,
        "sent": false,
        "advice": "call again with the same arguments to send this call",
    }));
    let mut meta = MetaObject::new();
    meta.insert(
        SHOWN_META.to_owned(),
        json!({
            "sent": false,
            "operations": calls.iter().map(|c| c.operation_id.as_str()).collect::<Vec<_>>(),
        }),
    );
    tool_result.meta = Some(meta);
    tool_result.result_type = Some(ResultType::COMPLETE);
    tool_result
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
        CallError::Rephrased {
            operation_id,
            status,
            rephrased,
        } => (
            codes::INTENT_CONFLICT,
            Some(json!({
                "reason": "rephrased",
                "operation_id": operation_id.as_str(),
                "status": status.as_str(),
                "identity": rephrased.identity,
                "differs": rephrased.differs,
            })),
        ),
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

/// What the -31001 answer names: the tool, and what the front knows of
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
    /// The process's lease mode: what the caller is told first.
    pub lease_mode: crate::config::LeaseMode,
}

/// The -31001 refusal: a side-effecting call came without a lease. The
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
        lease_mode,
    } = call;
    let meta = super::wire::LEASE_META;
    let key_meta = super::wire::IDEMPOTENCY_KEY_META;
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
    let keys = if *over_http {
        format!(
            "_meta \"{key_meta}\" (the way for clients whose tool call takes _meta, such as \
             fastmcp, pydantic-ai or the MCP SDKs), the Idempotency-Key header, or \
             params.idempotencyKey"
        )
    } else {
        format!(
            "_meta \"{key_meta}\" (the way for clients whose tool call takes _meta, such as \
             fastmcp, pydantic-ai or the MCP SDKs), or params.idempotencyKey"
        )
    };
    let session = if *over_http {
        format!(
            "Or let leasegate hold the lease: lease_mode = \"session\" with http_sessions = true \
             and a Leasegate-Task header (or [session] task) in leasegate.toml; or, with \
             lease_mode = \"key\", send an idempotency key per call as {keys}"
        )
    } else {
        format!(
            "Or let leasegate hold the lease: start it as `leasegate stdio --task <task>` (or set \
             LEASEGATE_TASK); or, with lease_mode = \"key\", send an idempotency key per call as \
             {keys}"
        )
    };
    let create = "Create a run that holds one (`leasegate runs create --task <task> --owner \
                  <owner> --ttl-ms 60000`, or POST /v1/runs with owner and ttl_ms on the control \
                  API)";
    let message = match lease_mode {
        crate::config::LeaseMode::Key => format!(
            "tool {tool:?} has side effects: this leasegate holds a lease per idempotency key \
             (lease_mode = \"key\"), and the call brought none. Nothing was sent. Send one key \
             per intended call as {keys}: the same key again is answered from the ledger, never \
             sent twice; a different request needs a new key. Or bring a lease of your own: \
             {create}, then {send}. {read_only}."
        ),
        crate::config::LeaseMode::Session if *over_http => format!(
            "tool {tool:?} has side effects: this leasegate holds a lease per task \
             (lease_mode = \"session\"), and the call named no task. Nothing was sent. Send the \
             Leasegate-Task header (any name for the job, the same on every call of it), or set \
             [session] task in leasegate.toml. Or bring a lease of your own: {create}, then \
             {send}. {read_only}."
        ),
        _ => format!(
            "tool {tool:?} has side effects and needs a lease. Nothing was sent. {create}, then \
             {send}. {session}. {read_only}."
        ),
    };
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
        lease["key_mode"] = json!(format!(
            "lease_mode = \"key\", _meta \"{key_meta}\", Idempotency-Key header or params.idempotencyKey"
        ));
    } else {
        lease["session_mode"] = json!("leasegate stdio --task <task> (or LEASEGATE_TASK)");
        lease["key_mode"] = json!(format!(
            "lease_mode = \"key\", _meta \"{key_meta}\" or params.idempotencyKey"
        ));
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

/// -31003 says what the caller must do, and nothing of the request the
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

    fn answer(structured: Value, replayed: bool, shown: OutcomeShown) -> CallToolResult {
        let reply = CallReply::Answer {
            result: json!({"content": [{"type": "text", "text": "charged"}],
                           "structuredContent": structured}),
            is_error: false,
            operation: crate::dispatch::OperationNote {
                operation_id: crate::intent::OperationId::from_string("op-1".into()),
                status: crate::ledger::OperationStatus::Succeeded,
                replayed,
                waited: false,
                remarks: Default::default(),
            },
        };
        result_from_reply(reply, shown)
    }

    #[test]
    fn a_replay_says_so_in_free_form_structured_content_and_nowhere_else() {
        let both = OutcomeShown {
            content: true,
            structured: true,
        };
        let replayed = answer(json!({"charge_id": "ch_1"}), true, both);
        let said = replayed.structured_content.as_ref().unwrap()[OUTCOME_KEY].clone();
        assert!(said.as_str().unwrap().starts_with("[leasegate] replayed: "));
        assert_eq!(
            replayed.structured_content.as_ref().unwrap()["charge_id"],
            "ch_1"
        );
        assert_eq!(replayed.content.len(), 2);
        assert_eq!(
            replayed.content[1].as_text().unwrap().text,
            said.as_str().unwrap()
        );
        // A fresh answer, a tool with an output schema, a structured
        // content that is not an object, the policy off: as the tool wrote it.
        let fresh = answer(json!({"charge_id": "ch_1"}), false, both);
        assert_eq!(fresh.structured_content, Some(json!({"charge_id": "ch_1"})));
        let declared = OutcomeShown {
            content: true,
            structured: false,
        };
        let schema = answer(json!({"charge_id": "ch_1"}), true, declared);
        assert_eq!(
            schema.structured_content,
            Some(json!({"charge_id": "ch_1"}))
        );
        assert_eq!(schema.content.len(), 2, "the text block still says it");
        let list = answer(json!([1, 2]), true, both);
        assert_eq!(list.structured_content, Some(json!([1, 2])));
        let off = OutcomeShown {
            content: false,
            structured: true,
        };
        let quiet = answer(json!({"charge_id": "ch_1"}), true, off);
        assert_eq!(quiet.structured_content, Some(json!({"charge_id": "ch_1"})));
        assert_eq!(quiet.content.len(), 1);
    }

    #[test]
    fn leasegate_codes_lie_outside_the_range_json_rpc_and_mcp_reserve() {
        let own = codes::OWN;
        // What the MCP SDKs, the specification and the agent frameworks'
        // MCP clients raise or compare against, as read in their sources:
        // the official Python SDK (`mcp_types`: -32000 connection closed,
        // -32001 request timeout, -32020..-32022, -32042 URL elicitation,
        // the JSON-RPC five); fastmcp (-32000 permission denied and timeout,
        // -32001 not found, -32002 resource not found, -32021, -32602,
        // -32603); pydantic-ai (-32601, -32602, and whatever its fastmcp
        // client raises); the Vercel AI SDK's `@ai-sdk/mcp` (-32002,
        // -32020..-32022 it retries a protocol version on, -32601..-32603);
        // stateless MCP's -32800 request cancelled.
        let theirs = [
            -32700, -32600, -32601, -32602, -32603, -32000, -32001, -32002, -32020, -32021, -32022,
            -32042, -32800,
        ];
        for code in own {
            assert!(!(-32768..=-32000).contains(&code), "{code} is reserved");
            assert!(
                !theirs.contains(&code),
                "{code} is an SDK's or a framework's"
            );
        }
        let mut unique = own.to_vec();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), own.len(), "each refusal its own code");
    }

    #[test]
    fn lease_required_names_the_tool_the_way_to_a_lease_and_to_read_only() {
        let mut call = LeaseRequired {
            tool: "files__delete",
            upstream: "files",
            upstream_tool: "delete",
            over_http: false,
            read_only_hint: None,
            trust_annotations: false,
            lease_mode: crate::config::LeaseMode::Explicit,
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

        // In key mode the key comes first, in the ways each transport has.
        call.lease_mode = crate::config::LeaseMode::Key;
        for over_http in [false, true] {
            call.over_http = over_http;
            let message = lease_required(&call).message.to_string();
            assert!(
                message.contains("lease per idempotency key")
                    && message.contains("_meta \"dev.leasegate/idempotency_key\"")
                    && message.contains("params.idempotencyKey")
                    && message.contains("Nothing was sent"),
                "{message}"
            );
            assert_eq!(
                message.contains("Idempotency-Key header"),
                over_http,
                "{message}"
            );
        }
        call.lease_mode = crate::config::LeaseMode::Session;
        let message = lease_required(&call).message.to_string();
        assert!(message.contains("Leasegate-Task header"), "{message}");
    }
}
