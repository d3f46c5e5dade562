//! The operator CLI (`leasegate runs|lease|ops …`): the control API driven
//! in-process, so the CLI and the API can never disagree. Human-readable
//! output by default, the API's JSON with `--json`; exit codes tell not
//! found, conflict and lease lost apart from other errors.

use axum::body::Body as HttpBody;
use axum::http::{Method, Request, StatusCode};
use serde_json::Value;
use tower::ServiceExt;

use crate::intent::IntegerPolicy;
use crate::ledger::Ledger;

/// Process exit codes of the operator commands.
pub mod exit {
    pub const OK: u8 = 0;
    pub const OTHER: u8 = 1;
    pub const INVALID_INPUT: u8 = 2;
    pub const NOT_FOUND: u8 = 3;
    pub const CONFLICT: u8 = 4;
    pub const LEASE_LOST: u8 = 5;
    pub const UNAVAILABLE: u8 = 6;
}

/// The exit code for an API error code.
pub fn exit_code(code: &str) -> u8 {
    match code {
        "not_found" => exit::NOT_FOUND,
        "lease_lost" => exit::LEASE_LOST,
        "revision_conflict" | "intent_conflict" | "lease_busy" | "terminal_run"
        | "wrong_status" | "active_run_live" | "run_id_taken" | "not_unknown" => exit::CONFLICT,
        "ledger_unavailable" | "outcome_unknown" => exit::UNAVAILABLE,
        "malformed_json"
        | "invalid_body"
        | "invalid_ttl"
        | "invalid_run_id"
        | "invalid_input"
        | "invalid_status"
        | "invalid_operation_id"
        | "unsafe_integer"
        | "invalid_arguments" => exit::INVALID_INPUT,
        _ => exit::OTHER,
    }
}

/// Sends one request to the control API in-process; returns status and JSON.
pub async fn execute(
    ledger: Ledger,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let router = super::router(ledger, IntegerPolicy::Reject);
    let request = Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json")
        .body(match body {
            Some(body) => HttpBody::from(body.to_string()),
            None => HttpBody::empty(),
        })
        .expect("a valid request");
    let response = match router.oneshot(request).await {
        Ok(response) => response,
        Err(never) => match never {},
    };
    let status = response.status();
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap_or_default();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

fn text(value: &Value) -> String {
    match value {
        Value::Null => "-".to_owned(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let widths: Vec<usize> = headers
        .iter()
        .enumerate()
        .map(|(i, h)| {
            rows.iter()
                .map(|r| r[i].chars().count())
                .chain([h.len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |cells: Vec<String>| {
        cells
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c:<width$}", width = widths[i]))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_owned()
    };
    let mut out = vec![line(headers.iter().map(|h| h.to_string()).collect())];
    out.extend(rows.iter().map(|r| line(r.clone())));
    out.join("\n")
}

/// Human-readable rendering of an API answer.
pub fn render(value: &Value) -> String {
    if let Some(operations) = value.get("operations").and_then(Value::as_array) {
        let rows: Vec<Vec<String>> = operations
            .iter()
            .map(|op| {
                [
                    "operation_id",
                    "status",
                    "tool_name",
                    "step_id",
                    "effect_version",
                    "remote_id",
                ]
                .iter()
                .map(|k| text(&op[*k]))
                .collect()
            })
            .collect();
        return table(
            &["OPERATION", "STATUS", "TOOL", "STEP", "V", "REMOTE ID"],
            &rows,
        );
    }
    if let Some(operation) = value.get("operation") {
        let mut out = Vec::new();
        for key in [
            "operation_id",
            "status",
            "tool_name",
            "step_id",
            "effect_version",
            "run_id",
            "request_digest",
            "remote_id",
            "dispatch_owner",
            "dispatch_until",
            "dispatch_count",
        ] {
            out.push(format!("{key:<16} {}", text(&operation[key])));
        }
        out.push(format!("{:<16} {}", "result", text(&operation["result"])));
        out.push(format!(
            "{:<16} {}",
            "request",
            text(&value["request_body"])
        ));
        out.push(String::new());
        out.push("history:".to_owned());
        let rows: Vec<Vec<String>> = value["events"]
            .as_array()
            .map(|events| {
                events
                    .iter()
                    .map(|e| {
                        vec![
                            text(&e["at"]),
                            format!("{} -> {}", text(&e["from_status"]), text(&e["to_status"])),
                            format!("{} {}", text(&e["actor_kind"]), text(&e["actor"])),
                            text(&e["detail"]),
                        ]
                    })
                    .collect()
            })
            .unwrap_or_default();
        out.push(table(&["AT", "CHANGE", "BY", "DETAIL"], &rows));
        let evidence = value["evidence"].as_array().cloned().unwrap_or_default();
        if !evidence.is_empty() {
            out.push(String::new());
            out.push("evidence:".to_owned());
            let rows: Vec<Vec<String>> = evidence
                .iter()
                .map(|e| {
                    vec![
                        text(&e["at"]),
                        text(&e["kind"]),
                        text(&e["source"]),
                        text(&e["outcome"]),
                        text(&e["remote_id"]),
                    ]
                })
                .collect();
            out.push(table(
                &["AT", "KIND", "SOURCE", "OUTCOME", "REMOTE ID"],
                &rows,
            ));
        }
        return out.join("\n");
    }
    match value {
        Value::Object(map) => map
            .iter()
            .map(|(k, v)| format!("{k:<16} {}", text(v)))
            .collect::<Vec<_>>()
            .join("\n"),
        other => text(other),
    }
}
