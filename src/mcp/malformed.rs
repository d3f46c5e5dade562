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
//!   JSON content type) → HTTP 400 with a `-32600` invalid request.
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
use serde_json::json;

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

fn answer(code: i32, message: String) -> Response {
    let body = json!({
        "jsonrpc": "2.0",
        "id": null,
        "error": {"code": code, "message": message},
    });
    (StatusCode::BAD_REQUEST, axum::Json(body)).into_response()
}

/// The layer: POST bodies up to `limit` bytes declared as JSON are kept
/// (a reference-counted copy) while rmcp reads them; rmcp's 415 for such a
/// body becomes a JSON-RPC parse error (not JSON) or invalid request (JSON,
/// not JSON-RPC). Everything rmcp checks first — `Host`, `Origin`,
/// `Accept` — keeps its own answer. Larger bodies are refused with 413, as
/// rmcp's own limit would; a body that does not arrive in time with 408.
pub async fn layer(limit: usize, request: Request, next: Next) -> Response {
    if request.method() != Method::POST || !declares_json(&request) {
        return next.run(request).await;
    }
    let (parts, body) = request.into_parts();
    let bytes = match axum::body::to_bytes(body, limit).await {
        Ok(bytes) => bytes,
        Err(error) => return super::idempotency::unreadable_body(&error, limit),
    };
    let response = next
        .run(Request::from_parts(parts, Body::from(bytes.clone())))
        .await;
    if response.status() != StatusCode::UNSUPPORTED_MEDIA_TYPE {
        return response;
    }
    match serde_json::from_slice::<serde::de::IgnoredAny>(&bytes) {
        Err(error) => answer(
            PARSE_ERROR,
            format!("parse error: the body is not JSON ({error})"),
        ),
        Ok(_) => answer(
            INVALID_REQUEST,
            "invalid request: the body is JSON but not a JSON-RPC 2.0 message (an object with \
             \"jsonrpc\": \"2.0\", \"method\" and, for a request, \"id\")"
                .to_owned(),
        ),
    }
}
