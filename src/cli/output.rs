//! What the operator commands print: an API answer rendered for people
//! (tables for lists, key/value lines for one object), errors found before
//! any request ([`report`]), and the exit code of an API error code. With
//! `--json` the API's own JSON is printed instead, on stdout, errors too.

use serde_json::{Value, json};

use crate::control::{ErrorCode, exit};

/// Prints an error the CLI found before any request (stderr, or the API's
/// error JSON on stdout with `--json`); returns its exit code.
pub(super) fn report(json: bool, code: ErrorCode, message: &str) -> u8 {
    if json {
        println!("{}", json!({"code": code.as_str(), "message": message}));
    } else {
        eprintln!("leasegate: {message} ({code})");
    }
    code.exit_code()
}

/// The exit code for an API error code string (1 for a code this build
/// does not know).
pub fn exit_code(code: &str) -> u8 {
    ErrorCode::parse(code).map_or(exit::OTHER, ErrorCode::exit_code)
}

pub(super) fn text(value: &Value) -> String {
    match value {
        Value::Null => "-".to_owned(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

pub(super) fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
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
        let listed = table(
            &["OPERATION", "STATUS", "TOOL", "STEP", "V", "REMOTE ID"],
            &rows,
        );
        return match value.get("next_cursor").and_then(Value::as_str) {
            Some(cursor) => format!("{listed}\nmore: the next page with --cursor {cursor}"),
            None => listed,
        };
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
        let claims = value["claims"].as_array().cloned().unwrap_or_default();
        if !claims.is_empty() {
            out.push(String::new());
            out.push("claims:".to_owned());
            let rows: Vec<Vec<String>> = claims
                .iter()
                .map(|c| {
                    vec![
                        text(&c["dispatch_count"]),
                        text(&c["at"]),
                        text(&c["dispatch_owner"]),
                        text(&c["worker"]),
                        text(&c["epoch"]),
                        text(&c["revision"]),
                        if c["ended"].is_null() {
                            "in flight".to_owned()
                        } else {
                            text(&c["ended"])
                        },
                    ]
                })
                .collect();
            out.push(table(
                &[
                    "DISPATCH", "AT", "BY", "WORKER", "EPOCH", "REVISION", "ENDED",
                ],
                &rows,
            ));
        }
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
