//! How every agent `tools/call` is counted (`leasegate_agent_calls_total`):
//! by the front it came over, the path it took, the exposed tool, the lease
//! that carried it, how it ended and, for a refusal, why.
//!
//! # Invariants
//!
//! 1. Every label value but `tool` is one of a small fixed set: a refusal's
//!    `reason` is the JSON-RPC error's `data.reason` only when it is one of
//!    [`REASONS`], else a fixed word for its code.
//! 2. `tool` is an exposed name the catalog resolved (bounded by the
//!    catalog), or empty for a call refused before its name resolved.

use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer};
use serde_json::Value;

use super::super::convert::codes;

/// The refusal reasons a JSON-RPC error's `data.reason` may name and the
/// counter takes as they are (invariant 1).
const REASONS: &[&str] = &[
    "lease_missing",
    "lease_malformed",
    "lease_lost",
    "lease_token_invalid",
    "session_lost",
    "revision_conflict",
    "wrong_status",
    "terminal_run",
    "not_found",
    "intent_conflict",
    "durability",
    "unsafe_integer",
    "inexact_number",
    "no_subject",
    "duplicate_header",
    "unknown_tool",
];

/// Which front an agent call came over: `stdio`, or HTTP with an MCP
/// session (`Mcp-Session-Id`) or without one.
pub(super) fn front_of(context: &RequestContext<RoleServer>) -> &'static str {
    match context.extensions.get::<http::request::Parts>() {
        None => "stdio",
        Some(parts) if parts.headers.contains_key("mcp-session-id") => "http_sessions",
        Some(_) => "http_stateless",
    }
}

/// Whether an answer came from the ledger rather than from a send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Replayed {
    /// Sent now (or refused, or read-only).
    No,
    /// Recorded by an earlier call that had ended.
    Yes,
    /// Recorded by an earlier call still in flight when this one arrived,
    /// which this one waited for.
    Waited,
}

impl Replayed {
    pub(super) fn of(note: &crate::dispatch::OperationNote) -> Self {
        match (note.replayed, note.waited) {
            (false, _) => Self::No,
            (true, false) => Self::Yes,
            (true, true) => Self::Waited,
        }
    }

    pub(super) fn as_str(self) -> &'static str {
        match self {
            Self::No => "false",
            Self::Yes => "true",
            Self::Waited => "waited",
        }
    }
}

/// One call's labels, known before it ends.
#[derive(Debug, Clone)]
pub(super) struct Tally {
    pub front: &'static str,
    /// `gated`, `read_only`, or `unresolved` (refused before its tool
    /// resolved).
    pub path: &'static str,
    pub tool: String,
    /// The lease that carried it: `explicit` (the agent's own), `session`,
    /// `key`, or `none` (read-only, or a gated call that had none).
    pub mode: &'static str,
}

impl Tally {
    pub(super) fn new(
        context: &RequestContext<RoleServer>,
        path: &'static str,
        tool: &str,
    ) -> Self {
        Self {
            front: front_of(context),
            path,
            tool: tool.to_owned(),
            mode: "none",
        }
    }

    /// The call ended with `outcome` (not a refusal).
    pub(super) fn ended(&self, outcome: &'static str, replayed: Replayed) {
        metrics::counter!("leasegate_agent_calls_total", "front" => self.front, "path" => self.path,
            "tool" => self.tool.clone(), "mode" => self.mode, "outcome" => outcome,
            "replayed" => replayed.as_str())
        .increment(1);
    }

    /// The call was refused, nothing sent, for `reason` (one of a fixed set).
    pub(super) fn refused(&self, reason: &'static str) {
        metrics::counter!("leasegate_agent_calls_total", "front" => self.front, "path" => self.path,
            "tool" => self.tool.clone(), "mode" => self.mode, "outcome" => "refused",
            "replayed" => "false", "reason" => reason)
        .increment(1);
    }

    /// The call was refused with `error`; counted, and handed back.
    pub(super) fn refused_with(&self, error: McpError) -> McpError {
        self.refused(reason_of(&error));
        error
    }
}

/// A refusal's reason: its `data.reason` when that is one of [`REASONS`],
/// else a fixed word for its code (invariant 1).
pub(super) fn reason_of(error: &McpError) -> &'static str {
    let named = error
        .data
        .as_ref()
        .and_then(|data| data.get("reason"))
        .and_then(Value::as_str);
    if let Some(known) = named.and_then(|named| REASONS.iter().find(|r| **r == named)) {
        return known;
    }
    match error.code.0 {
        codes::LEASE_REQUIRED => "lease_missing",
        codes::LEASE_LOST => "lease_lost",
        codes::INTENT_CONFLICT => "intent_conflict",
        codes::RUN_TERMINAL => "terminal_run",
        codes::RUN_NOT_FOUND => "run_not_found",
        codes::IN_PROGRESS => "in_progress",
        codes::OPERATION_CANCELLED => "operation_cancelled",
        codes::LEDGER_UNAVAILABLE => "ledger_unavailable",
        codes::TOO_MANY_IN_FLIGHT => "too_many_in_flight",
        codes::INVALID_PARAMS => "invalid_params",
        _ => "other",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::ErrorCode;
    use serde_json::json;

    #[test]
    fn a_refusal_reason_is_a_known_word_whatever_the_data_says() {
        let named = McpError::new(
            ErrorCode(codes::LEASE_LOST),
            "x",
            Some(json!({"reason": "lease_token_invalid"})),
        );
        assert_eq!(reason_of(&named), "lease_token_invalid");
        let unbounded = McpError::new(
            ErrorCode(codes::INVALID_PARAMS),
            "x",
            Some(json!({"reason": "anything an upstream said"})),
        );
        assert_eq!(reason_of(&unbounded), "invalid_params");
        let bare = McpError::new(ErrorCode(codes::IN_PROGRESS), "x", None);
        assert_eq!(reason_of(&bare), "in_progress");
        let foreign = McpError::new(ErrorCode(-32000), "x", None);
        assert_eq!(reason_of(&foreign), "other");
    }
}
