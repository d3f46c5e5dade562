//! What rmcp would lose of an agent's message, kept before rmcp parses it,
//! on the HTTP front (a body layer) and on stdio (a line filter):
//!
//! - the draft MCP field `params.idempotencyKey` of `tools/call` (SEP-3182
//!   shape), which rmcp's model does not carry: moved into
//!   `_meta["dev.leasegate/idempotency_key"]`. A key already in `_meta`
//!   wins;
//! - a `tools/list` request: handed over as a request of
//!   [`WHOLE_TOOLS_METHOD`], whose answer carries the upstreams' tool
//!   objects whole (`front::whole_tools`);
//! - numbers in a `tools/call`'s arguments that parsing would change:
//!   refused under `integers = "reject"` (`numbers`).
//!
//! Only messages that contain the names concerned are parsed here;
//! everything else passes untouched.

use axum::body::Body;
use axum::extract::Request;
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

use super::wire::IDEMPOTENCY_KEY_META;
use crate::intent::IntegerPolicy;

const FIELD: &[u8] = b"\"idempotencyKey\"";
const TOOLS_LIST: &[u8] = b"\"tools/list\"";

fn names(bytes: &[u8], name: &[u8]) -> bool {
    bytes.windows(name.len()).any(|window| window == name)
}

/// The message with its draft keys lifted ([`lift`]) and its `tools/list`
/// requests handed over whole ([`list_whole`]); `None` when neither applies
/// (the message passes as it is).
fn rewritten(bytes: &[u8]) -> Option<Vec<u8>> {
    let (keys, lists) = (names(bytes, FIELD), names(bytes, TOOLS_LIST));
    if !keys && !lists {
        return None;
    }
    let mut message = serde_json::from_slice::<Value>(bytes).ok()?;
    let lifted = keys && lift(&mut message);
    let listed = lists && list_whole(&mut message);
    (lifted || listed)
        .then(|| serde_json::to_vec(&message).ok())
        .flatten()
}

/// The method a `tools/list` request is handed to the front as; the front
/// answers it with the upstreams' tool objects whole (`front::whole_tools`).
pub const WHOLE_TOOLS_METHOD: &str = "dev.leasegate/tools_list";

/// Hands each `tools/list` request (alone or in a batch) to the front as a
/// request of [`WHOLE_TOOLS_METHOD`], same id and params, so that its
/// answer carries the upstreams' tool objects whole (`front::whole_tools`).
/// Returns whether any was.
pub fn list_whole(message: &mut Value) -> bool {
    match message {
        Value::Array(batch) => {
            let mut listed = false;
            for message in batch {
                listed |= list_whole(message);
            }
            listed
        }
        Value::Object(object) => {
            let request = object.contains_key("id")
                && object.get("method").and_then(Value::as_str) == Some("tools/list");
            if request {
                object.insert("method".to_owned(), Value::from(WHOLE_TOOLS_METHOD));
            }
            request
        }
        _ => false,
    }
}

/// Moves `params.idempotencyKey` of a `tools/call` request (or of each in
/// a batch) into `params._meta`. Returns whether anything moved.
pub fn lift(message: &mut Value) -> bool {
    match message {
        Value::Array(batch) => {
            // Every message of the batch, not only up to the first.
            let mut moved = false;
            for message in batch {
                moved |= lift(message);
            }
            moved
        }
        Value::Object(object) => {
            if object.get("method").and_then(Value::as_str) != Some("tools/call") {
                return false;
            }
            let Some(Value::Object(params)) = object.get_mut("params") else {
                return false;
            };
            let Some(key) = params.remove("idempotencyKey") else {
                return false;
            };
            let meta = params
                .entry("_meta")
                .or_insert_with(|| Value::Object(Default::default()));
            if let Value::Object(meta) = meta {
                meta.entry(IDEMPOTENCY_KEY_META).or_insert(key);
            }
            true
        }
        _ => false,
    }
}

/// The HTTP front's layer: POST bodies up to `limit` bytes that name the
/// field are rewritten; larger ones are refused by rmcp's own limit anyway.
/// The answer to a POST body that could not be read whole: 408 when it did
/// not arrive within `limits.body_read_timeout` (the connection is closed),
/// else 413 (over `limit`), counted. Shared by the MCP front's body layers.
pub(super) fn unreadable_body(error: &axum::Error, limit: usize) -> Response {
    if crate::http_server::serve::is_body_timeout(error) {
        return (
            StatusCode::REQUEST_TIMEOUT,
            [(http::header::CONNECTION, "close")],
            error.to_string(),
        )
            .into_response();
    }
    crate::http_server::refused(
        crate::http_server::Listener::Mcp,
        crate::http_server::Refusal::BodyTooLarge,
    );
    (
        StatusCode::PAYLOAD_TOO_LARGE,
        format!("request body over {limit} bytes"),
    )
        .into_response()
}

/// A `tools/call` with a number parsing would change is rewritten into its
/// refusal under `integers` (`numbers`, invariant 1).
pub async fn layer(
    limit: usize,
    integers: IntegerPolicy,
    request: Request,
    next: Next,
) -> Response {
    if request.method() != Method::POST {
        return next.run(request).await;
    }
    let (mut parts, body) = request.into_parts();
    let bytes = match axum::body::to_bytes(body, limit).await {
        Ok(bytes) => bytes,
        Err(error) => return unreadable_body(&error, limit),
    };
    let bytes = match kept(&bytes, integers) {
        Some(rewritten) => {
            method_header_follows(&mut parts.headers, &rewritten);
            rewritten.into()
        }
        None => bytes,
    };
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}

/// The message as the front should read it: a `tools/call` with a number
/// parsing would change replaced by its refusal under `integers`
/// (`numbers`, invariant 1), then [`rewritten`]. `None`: as it is.
fn kept(message: &[u8], integers: IntegerPolicy) -> Option<Vec<u8>> {
    let refused = super::numbers::refuse_altered(message, integers);
    rewritten(refused.as_deref().unwrap_or(message)).or(refused)
}

/// A `V_2026_07_28` client names the method in the `Mcp-Method` header too,
/// and rmcp refuses a header that does not match the body's: the header of
/// a message whose method was rewritten follows it.
fn method_header_follows(headers: &mut http::HeaderMap, rewritten: &[u8]) {
    #[derive(serde::Deserialize)]
    struct Method {
        method: Option<String>,
    }
    if !headers.contains_key(METHOD_HEADER) {
        return;
    }
    if let Ok(Method {
        method: Some(method),
    }) = serde_json::from_slice(rewritten)
        && let Ok(value) = http::HeaderValue::from_str(&method)
    {
        headers.insert(METHOD_HEADER, value);
    }
}

/// The `V_2026_07_28` header that repeats a request's method.
const METHOD_HEADER: &str = "mcp-method";

/// stdin, with `params.idempotencyKey` lifted line by line (stdio MCP is
/// one JSON-RPC message per line), and a `tools/call` with a number parsing
/// would change rewritten into its refusal under `integers` (`numbers`,
/// invariant 1).
pub fn stdin_lifting_keys(integers: IntegerPolicy) -> tokio::io::DuplexStream {
    let (reader, mut writer) = tokio::io::duplex(64 * 1024);
    tokio::spawn(async move {
        let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            let line = if let Some(answerable) = unreadable_request(&line) {
                answerable
            } else if let Some(kept) = kept(line.as_bytes(), integers) {
                String::from_utf8(kept).unwrap_or(line)
            } else {
                line
            };
            if writer.write_all(line.as_bytes()).await.is_err()
                || writer.write_all(b"\n").await.is_err()
            {
                return;
            }
        }
        // EOF (or an unreadable stdin): the reader sees EOF too.
    });
    reader
}

/// The method of the request [`unreadable_request`] makes of a line the
/// JSON-RPC layer could not read; the front answers it with the error
/// (`Front::on_custom_request`).
pub const UNREADABLE_METHOD: &str = "dev.leasegate/unreadable";

/// A line that is not a JSON value serde_json reads whole (nested deeper
/// than its 128 levels, a number beyond a double's range such as `1e400`)
/// would be dropped unanswered by the stdio transport, and the client would
/// wait for its timeout. When its `id` can still be read (a shallow scan
/// that skips the rest), it becomes a request of [`UNREADABLE_METHOD`]
/// under that id, carrying why; the front answers it with JSON-RPC's error.
/// `None`: the line reads, or no id can be found (logged, then dropped).
fn unreadable_request(line: &str) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Envelope {
        id: Option<Value>,
    }
    let error = serde_json::from_str::<Value>(line).err()?;
    if line.trim().is_empty() {
        return None;
    }
    let id = serde_json::from_str::<Envelope>(line)
        .ok()
        .and_then(|envelope| envelope.id)
        .filter(|id| id.is_string() || id.is_number());
    let Some(id) = id else {
        tracing::warn!(error = %error, "a stdin line is not a JSON-RPC message and names no id: dropped");
        return None;
    };
    let request = serde_json::json!({
        "jsonrpc": "2.0",
        "id": id,
        "method": UNREADABLE_METHOD,
        "params": {"reason": error.to_string()},
    });
    Some(request.to_string())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_line_too_deep_or_with_a_number_out_of_range_keeps_its_id() {
        let deep = format!(
            r#"{{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{{"name":"t","arguments":{{"a":{}1{}}}}}}}"#,
            "[".repeat(200),
            "]".repeat(200)
        );
        let huge = r#"{"jsonrpc":"2.0","id":"x-1","method":"tools/call","params":{"name":"t","arguments":{"n":1e400}}}"#;
        for (line, id) in [(deep.as_str(), json!(7)), (huge, json!("x-1"))] {
            let rewritten: Value =
                serde_json::from_str(&unreadable_request(line).expect("answerable")).unwrap();
            assert_eq!(rewritten["id"], id);
            assert_eq!(rewritten["method"], UNREADABLE_METHOD);
            assert!(rewritten["params"]["reason"].is_string(), "{rewritten}");
        }
        assert_eq!(
            unreadable_request(r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#),
            None
        );
        assert_eq!(unreadable_request("not json"), None);
        assert_eq!(unreadable_request(""), None);
    }

    #[test]
    fn tools_list_requests_are_handed_over_whole_and_nothing_else_is() {
        let mut list = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/list",
            "params": {"cursor": "1"}});
        assert!(list_whole(&mut list));
        assert_eq!(
            list,
            json!({"jsonrpc": "2.0", "id": 3, "method": WHOLE_TOOLS_METHOD,
                "params": {"cursor": "1"}})
        );
        let mut notification = json!({"jsonrpc": "2.0", "method": "tools/list"});
        assert!(!list_whole(&mut notification));
        let batch = br#"[{"jsonrpc":"2.0","id":1,"method":"ping"},{"jsonrpc":"2.0","id":2,"method":"tools/list"}]"#;
        let batch: Value = serde_json::from_slice(&rewritten(batch).expect("rewritten")).unwrap();
        assert_eq!(
            (&batch[0]["method"], &batch[1]["method"]),
            (&json!("ping"), &json!(WHOLE_TOOLS_METHOD))
        );
        assert_eq!(
            rewritten(br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#),
            None
        );
    }

    #[test]
    fn the_draft_field_moves_into_meta_and_a_meta_key_wins() {
        let mut call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "pay", "arguments": {}, "idempotencyKey": "k-1"}});
        assert!(lift(&mut call));
        assert_eq!(call["params"]["_meta"][IDEMPOTENCY_KEY_META], "k-1");
        assert!(call["params"].get("idempotencyKey").is_none());

        let mut both = json!({"method": "tools/call", "params": {"name": "pay",
            "idempotencyKey": "k-2", "_meta": {IDEMPOTENCY_KEY_META: "k-meta"}}});
        assert!(lift(&mut both));
        assert_eq!(both["params"]["_meta"][IDEMPOTENCY_KEY_META], "k-meta");

        let mut other = json!({"method": "resources/read", "params": {"idempotencyKey": "k"}});
        assert!(!lift(&mut other));
        assert_eq!(other["params"]["idempotencyKey"], "k");

        let mut batch = json!([{"method": "tools/call", "params": {"name": "a", "idempotencyKey": "x"}},
                               {"method": "ping"}]);
        assert!(lift(&mut batch));
        assert_eq!(batch[0]["params"]["_meta"][IDEMPOTENCY_KEY_META], "x");
    }
}
