//! JSON-RPC's own answers for bodies rmcp's Streamable HTTP service cannot
//! read, on the HTTP front (a body layer in front of rmcp).
//!
//! rmcp answers a POST whose body is not a JSON-RPC message with HTTP 415
//! ("Unsupported Media Type"), as if the content type were wrong. JSON-RPC
//! 2.0 (section 5.1) has codes for both cases, and this layer gives them:
//!
//! * a body that is not JSON at all (declared `application/json`) → HTTP
//!   400 with a `-32700` parse error, `id: null`;
//! * JSON that is not a JSON-RPC message rmcp accepts (rmcp's 415 for a
//!   JSON content type) → HTTP 400 with a `-32600` invalid request;
//! * JSON that serde_json cannot read whole — nested deeper than 128
//!   levels, a number beyond a double's range (`1e400`) — whose `id` a
//!   lenient scan still finds → a request of
//!   [`super::idempotency::UNREADABLE_METHOD`] under that id, which the
//!   front answers `-32700` as it does on stdio (one answer path); the
//!   session, if any, goes on. Without a readable id: `-32700`, `id: null`;
//! * a body over the limit (`max_arguments_bytes` plus room for the
//!   envelope) → HTTP 413 with a `-32600` JSON-RPC error naming the limit
//!   and the setting, under the request's id when the part read shows it.
//!
//! # Invariants
//!
//! 1. A body over the limit is read (and dropped) up to
//!    [`DRAIN_FACTOR`] times the limit before it is answered, so the
//!    client, still writing, reads the answer on a connection that stays
//!    usable; beyond that the answer closes the connection. Only the first
//!    [`ID_PREFIX`] bytes are kept.
//! 2. Only a body that a byte scan finds suspicious (nesting deeper than
//!    the limit, a number token too long or with a three-digit exponent)
//!    is parsed here; every other body is parsed once, by rmcp.
//!
//! A request without a JSON content type keeps rmcp's 415: that one is
//! about the media type. What rmcp refuses before it reads the body (a
//! foreign `Host` or `Origin`: 403; a missing `Accept`: 406) keeps its
//! answer: the layer only rewrites rmcp's 415. Params that do not fit their method (a
//! `tools/call` whose `arguments` is not an object) are answered `-32602`
//! by the front itself (`Front::on_custom_request`), on stdio as well.
//! Nothing reaches the ledger in any of these cases.

use axum::body::Body;
use axum::extract::Request;
use axum::http::{Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde_json::{Value, json};

/// JSON-RPC 2.0: the body is not JSON.
pub const PARSE_ERROR: i32 = -32700;
/// JSON-RPC 2.0: JSON, but not a request object.
pub const INVALID_REQUEST: i32 = -32600;

fn declares_json(request: &Request) -> bool {
    request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| {
            let essence = value.split(';').next().unwrap_or("").trim();
            essence.eq_ignore_ascii_case("application/json")
        })
}

/// How many times the limit an oversized body is read before it is
/// answered (invariant 1).
pub const DRAIN_FACTOR: usize = 4;

/// How much of an oversized body is kept to find its id.
pub const ID_PREFIX: usize = 64 * 1024;

/// serde_json's nesting limit, which rmcp's parse has too.
const MAX_DEPTH: usize = 128;

fn answer(code: i32, message: String) -> Response {
    let body = json!({
        "jsonrpc": "2.0",
        "id": null,
        "error": {"code": code, "message": message},
    });
    (StatusCode::BAD_REQUEST, axum::Json(body)).into_response()
}

/// A body that could not be read whole.
enum Unread {
    /// Over the limit: its first [`ID_PREFIX`] bytes, and whether it ended
    /// within the drain (invariant 1).
    TooLarge {
        prefix: Vec<u8>,
        drained: bool,
    },
    Failed(axum::Error),
}

/// The body, if it is at most `limit` bytes; else its prefix, read on up
/// to [`DRAIN_FACTOR`] × `limit` bytes.
async fn read_body(body: Body, limit: usize) -> Result<bytes::Bytes, Unread> {
    let mut stream = body.into_data_stream();
    let mut kept: Vec<u8> = Vec::new();
    let mut total = 0usize;
    let cap = limit.saturating_mul(DRAIN_FACTOR);
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(Unread::Failed)?;
        total = total.saturating_add(chunk.len());
        if total <= limit {
            kept.extend_from_slice(&chunk);
            continue;
        }
        kept.truncate(ID_PREFIX);
        if kept.len() < ID_PREFIX {
            let room = ID_PREFIX - kept.len();
            kept.extend_from_slice(&chunk[..chunk.len().min(room)]);
        }
        if total > cap {
            return Err(Unread::TooLarge {
                prefix: kept,
                drained: false,
            });
        }
    }
    if total > limit {
        return Err(Unread::TooLarge {
            prefix: kept,
            drained: true,
        });
    }
    Ok(kept.into())
}

/// The answer to a body over `limit`: HTTP 413 with a JSON-RPC error the
/// client can read (the official SDKs surface a JSON-RPC error body at any
/// status), under the id its first bytes show; the connection closed only
/// when the body was not drained (invariant 1).
fn too_large(limit: usize, prefix: &[u8], drained: bool) -> Response {
    crate::http_server::refused(
        crate::http_server::Listener::Mcp,
        crate::http_server::Refusal::BodyTooLarge,
    );
    let id = top_level_id(prefix).unwrap_or(Value::Null);
    let body = json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": {
            "code": INVALID_REQUEST,
            "message": format!(
                "request too large: the body is over the {limit}-byte limit (the largest \
                 `arguments`, policy setting max_arguments_bytes, plus 64 KiB for the \
                 envelope); send smaller arguments or raise max_arguments_bytes. Nothing \
                 was recorded or sent"
            ),
            "data": {"reason": "body_too_large", "limit_bytes": limit},
        },
    });
    let mut response = (StatusCode::PAYLOAD_TOO_LARGE, axum::Json(body)).into_response();
    if !drained {
        response.headers_mut().insert(
            header::CONNECTION,
            header::HeaderValue::from_static("close"),
        );
    }
    response
}

/// Whether a byte scan finds what serde_json may refuse to read whole:
/// nesting deeper than [`MAX_DEPTH`], or a number token that is very long
/// or has a three-digit exponent (invariant 2).
fn suspicious(bytes: &[u8]) -> bool {
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    let mut i = 0;
    while i < bytes.len() {
        let byte = bytes[i];
        if in_string {
            if escaped {
                escaped = false;
            } else if byte == b'\\' {
                escaped = true;
            } else if byte == b'"' {
                in_string = false;
            }
            i += 1;
            continue;
        }
        match byte {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > MAX_DEPTH {
                    return true;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            b'-' | b'0'..=b'9' => {
                let start = i;
                let mut exponent_digits = None;
                while i < bytes.len()
                    && matches!(bytes[i], b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E')
                {
                    match (bytes[i], exponent_digits.as_mut()) {
                        (b'e' | b'E', _) => exponent_digits = Some(0usize),
                        (b'0'..=b'9', Some(digits)) => *digits += 1,
                        _ => {}
                    }
                    i += 1;
                }
                if i - start > 300 || exponent_digits.is_some_and(|d| d >= 3) {
                    return true;
                }
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    false
}

fn skip_ws(bytes: &[u8], mut i: usize) -> usize {
    while bytes.get(i).is_some_and(u8::is_ascii_whitespace) {
        i += 1;
    }
    i
}

/// The index after the string that starts at `i` (its opening quote).
fn string_end(bytes: &[u8], i: usize) -> Option<usize> {
    let mut j = i + 1;
    while j < bytes.len() {
        match bytes[j] {
            b'\\' => j += 2,
            b'"' => return Some(j + 1),
            _ => j += 1,
        }
    }
    None
}

/// The index after the value that starts at `i`, without parsing it (any
/// depth, any number).
fn value_end(bytes: &[u8], i: usize) -> Option<usize> {
    match bytes.get(i)? {
        b'"' => string_end(bytes, i),
        b'[' | b'{' => {
            let mut depth = 0usize;
            let mut j = i;
            while j < bytes.len() {
                match bytes[j] {
                    b'"' => {
                        j = string_end(bytes, j)?;
                        continue;
                    }
                    b'[' | b'{' => depth += 1,
                    b']' | b'}' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(j + 1);
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
            None
        }
        _ => {
            let mut j = i;
            while j < bytes.len() && !matches!(bytes[j], b',' | b'}' | b']') {
                j += 1;
            }
            (j < bytes.len()).then_some(j)
        }
    }
}

/// The `id` (a string or a number) of the JSON-RPC object `bytes` starts
/// with, read by a shallow scan that skips every other member unparsed:
/// found in a body too deep or with numbers out of range, and in the first
/// part of one cut short, when it comes before what cannot be read.
pub(super) fn top_level_id(bytes: &[u8]) -> Option<Value> {
    let mut i = skip_ws(bytes, 0);
    if bytes.get(i) != Some(&b'{') {
        return None;
    }
    i += 1;
    loop {
        i = skip_ws(bytes, i);
        if bytes.get(i) != Some(&b'"') {
            return None;
        }
        let end = string_end(bytes, i)?;
        let key: String = serde_json::from_slice(&bytes[i..end]).ok()?;
        i = skip_ws(bytes, end);
        if bytes.get(i) != Some(&b':') {
            return None;
        }
        i = skip_ws(bytes, i + 1);
        if key == "id" {
            let end = value_end(bytes, i)?;
            let id: Value = serde_json::from_slice(&bytes[i..end]).ok()?;
            return (id.is_string() || id.is_number()).then_some(id);
        }
        i = skip_ws(bytes, value_end(bytes, i)?);
        if bytes.get(i) != Some(&b',') {
            return None;
        }
        i += 1;
    }
}

/// A body serde_json cannot read whole whose id can be read, as the
/// request the front answers with a parse error under that id.
fn unreadable_request(bytes: &[u8]) -> Option<Vec<u8>> {
    if !suspicious(bytes) {
        return None;
    }
    let error = serde_json::from_slice::<Value>(bytes).err()?;
    let id = top_level_id(bytes)?;
    let request = json!({
        "jsonrpc": "2.0",
        "id": id,
        "method": super::idempotency::UNREADABLE_METHOD,
        "params": {"reason": error.to_string()},
    });
    serde_json::to_vec(&request).ok()
}

/// The layer: POST bodies up to `limit` bytes declared as JSON are kept
/// (a reference-counted copy) while rmcp reads them; one serde_json cannot
/// read whole goes to the front as [`super::idempotency::UNREADABLE_METHOD`]
/// under its id; rmcp's 415 for such a body becomes a JSON-RPC parse error
/// (not JSON) or invalid request (JSON, not JSON-RPC). Everything rmcp
/// checks first — `Host`, `Origin`, `Accept` — keeps its own answer. Larger
/// bodies are answered 413 with a JSON-RPC error (invariant 1); a body that
/// does not arrive in time with 408.
/// A POST whose `Accept` takes anything (`*/*`, or `application/*` and
/// `text/*`) accepts both answers Streamable HTTP may give, so it is read
/// as naming them (rmcp would answer 406 to the wildcard).
fn accept_anything_as_both(request: &mut Request) {
    if request.method() != Method::POST {
        return;
    }
    let accepts = |wanted: &[&str]| {
        request
            .headers()
            .get_all(header::ACCEPT)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(|item| {
                item.split(';')
                    .next()
                    .unwrap_or("")
                    .trim()
                    .to_ascii_lowercase()
            })
            .any(|item| wanted.contains(&item.as_str()))
    };
    let json = accepts(&["application/json", "application/*", "*/*"]);
    let stream = accepts(&["text/event-stream", "text/*", "*/*"]);
    let named = accepts(&["application/json"]) && accepts(&["text/event-stream"]);
    if json && stream && !named {
        request.headers_mut().insert(
            header::ACCEPT,
            axum::http::HeaderValue::from_static("application/json, text/event-stream"),
        );
    }
}

pub async fn layer(limit: usize, mut request: Request, next: Next) -> Response {
    accept_anything_as_both(&mut request);
    if request.method() != Method::POST || !declares_json(&request) {
        return next.run(request).await;
    }
    let (parts, body) = request.into_parts();
    let bytes = match read_body(body, limit).await {
        Ok(bytes) => bytes,
        Err(Unread::TooLarge { prefix, drained }) => return too_large(limit, &prefix, drained),
        Err(Unread::Failed(error)) if crate::http_server::serve::is_body_timeout(&error) => {
            return super::idempotency::unreadable_body(&error, limit);
        }
        // The body broke off (the client went away): nobody reads this.
        Err(Unread::Failed(error)) => {
            return answer(
                PARSE_ERROR,
                format!("parse error: the body could not be read whole ({error})"),
            );
        }
    };
    let bytes = match unreadable_request(&bytes) {
        Some(rewritten) => bytes::Bytes::from(rewritten),
        None => bytes,
    };
    let response = next
        .run(Request::from_parts(parts, Body::from(bytes.clone())))
        .await;
    if response.status() != StatusCode::UNSUPPORTED_MEDIA_TYPE {
        return response;
    }
    match serde_json::from_slice::<Value>(&bytes) {
        Err(error) if error.is_syntax() || error.is_eof() => answer(
            PARSE_ERROR,
            format!("parse error: the body is not JSON ({error})"),
        ),
        Err(error) => answer(
            PARSE_ERROR,
            format!(
                "parse error: the body cannot be read ({error}); JSON nested deeper than 128 \
                 levels and numbers beyond a double's range are not accepted"
            ),
        ),
        Ok(_) => answer(
            INVALID_REQUEST,
            "invalid request: the body is JSON but not a JSON-RPC 2.0 message (an object with \
             \"jsonrpc\": \"2.0\", \"method\" and, for a request, \"id\")"
                .to_owned(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deep(id: &str, levels: usize) -> String {
        format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"t","arguments":{{"a":{}1{}}}}}}}"#,
            "[".repeat(levels),
            "]".repeat(levels)
        )
    }

    #[test]
    fn a_body_too_deep_or_with_a_number_out_of_range_keeps_its_id() {
        let huge = r#"{"jsonrpc":"2.0","id":"x-1","method":"tools/call","params":{"name":"t","arguments":{"n":1e400}}}"#;
        let late_id =
            r#"{"jsonrpc":"2.0","method":"tools/call","params":{"n":[1e400,"}\"]"]},"id":9}"#;
        let too_deep = deep("7", 200);
        for (body, id) in [
            (too_deep.as_str(), json!(7)),
            (huge, json!("x-1")),
            (late_id, json!(9)),
        ] {
            let rewritten: Value =
                serde_json::from_slice(&unreadable_request(body.as_bytes()).expect("answerable"))
                    .unwrap();
            assert_eq!(rewritten["id"], id, "{body}");
            assert_eq!(
                rewritten["method"],
                super::super::idempotency::UNREADABLE_METHOD
            );
            assert!(rewritten["params"]["reason"].is_string(), "{rewritten}");
        }
        // Readable bodies are left to rmcp, suspicious or not.
        for readable in [
            deep("7", 100),
            r#"{"jsonrpc":"2.0","id":1,"method":"t","params":{"n":1e300,"s":"1e400 [[[["}}"#
                .to_owned(),
        ] {
            assert_eq!(unreadable_request(readable.as_bytes()), None, "{readable}");
        }
        // No id to answer under: rmcp's 415 path answers -32700 with null.
        assert_eq!(unreadable_request(deep("null", 200).as_bytes()), None);
    }

    #[test]
    fn the_id_of_a_body_cut_short_is_read_when_it_comes_first() {
        let body =
            br#"{"jsonrpc":"2.0","id":42,"method":"tools/call","params":{"arguments":{"a":"xxxx"#;
        assert_eq!(top_level_id(body), Some(json!(42)));
        let after = br#"{"jsonrpc":"2.0","method":"tools/call","params":{"arguments":{"a":"xx"#;
        assert_eq!(top_level_id(after), None);
        assert_eq!(top_level_id(br#"[{"id":1}]"#), None);
        assert_eq!(top_level_id(br#"{"id":{"a":1}}"#), None);
    }
}
