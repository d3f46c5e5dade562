//! The control API driven in-process: one request through the same router
//! `leasegate serve` serves, without a listener. The operator CLI
//! (`crate::cli`) sends each of its commands this way, so the CLI and the
//! API cannot disagree. Nothing is kept between requests: a router is built
//! for the one request and dropped with it.

use axum::body::Body as HttpBody;
use axum::http::{Method, Request, StatusCode};
use serde_json::Value;
use tower::ServiceExt;

use crate::intent::IntegerPolicy;
use crate::ledger::Ledger;

/// Sends one request to the control API in-process (for runs of `tenant`
/// only, when given); returns status and JSON.
pub async fn execute(
    ledger: Ledger,
    operator: super::state::OperatorLedger,
    tenant: Option<String>,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let router =
        super::router::router_with_tools(ledger, operator, IntegerPolicy::Reject, tenant, None);
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
