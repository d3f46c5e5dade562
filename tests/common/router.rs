//! The control API driven without a socket: a request sent through
//! `tower::ServiceExt::oneshot` to a router built as `leasegate serve` builds
//! it, the answer read back as status and JSON.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use serde_json::Value;
use tower::ServiceExt;

/// Sends `request` to `router`; returns the status and the body as JSON
/// (`Value::Null` when the body is not JSON).
pub async fn answer(router: axum::Router, request: Request<Body>) -> (StatusCode, Value) {
    let (status, bytes) = answer_bytes(router, request).await;
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

/// Sends `request` to `router`; returns the status and the raw body.
pub async fn answer_bytes(
    router: axum::Router,
    request: Request<Body>,
) -> (StatusCode, axum::body::Bytes) {
    let response = router.oneshot(request).await.unwrap();
    let status = response.status();
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    (status, bytes)
}
