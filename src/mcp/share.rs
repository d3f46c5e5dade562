//! Per-principal shares of the MCP front's requests in flight
//! (`limits.max_in_flight_per_principal`), a layer in front of rmcp.
//!
//! Every call holds a connection (HTTP/1.1) or a stream and a task until
//! its answer is written, so a principal whose calls hang (a slow tool, a
//! flood of calls that never finish) could hold everything the process
//! serves with. The principal is the verified token (a JWT's subject) where
//! tokens are required, else the peer address (IPv6: its /64), as for the
//! rate limit (`http_server::rate::RateKey`).
//!
//! # Invariants
//!
//! 1. A principal has at most its share of JSON-RPC requests in progress:
//!    a POST counts from its arrival here until its response's last byte
//!    is written or the response is dropped (an SSE answer counts until its
//!    stream ends).
//! 2. A request beyond the share is answered at once, before rmcp reads it:
//!    HTTP 429 with `Retry-After: 1` and the JSON-RPC error
//!    [`codes::TOO_MANY_IN_FLIGHT`] under the request's id; nothing is
//!    registered, sent or made (no session). Counted as
//!    `http_refused_total{listener="mcp", reason="max_in_flight_per_principal"}`.
//! 3. What the agent sends that is not a request — a notification (its
//!    cancels), or its answer to what a call asked it (sampling,
//!    elicitation, roots) — is never refused: a principal at its share
//!    must still be able to cancel its calls and let them finish.
//! 4. Memory is bounded by the principals with a request in progress: a
//!    principal's count is forgotten when it falls to zero.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::convert::codes;
use crate::http_server::rate::RateKey;
use crate::http_server::{HeldBody, Listener, Refusal, refused};

/// The counts of requests in progress, by principal.
pub struct Shares {
    share: usize,
    counts: Mutex<HashMap<RateKey, usize>>,
}

/// One request's place in its principal's share, until dropped.
struct Held {
    shares: Arc<Shares>,
    key: RateKey,
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut counts = self.shares.lock();
        if let Some(count) = counts.get_mut(&self.key) {
            *count -= 1;
            if *count == 0 {
                // Invariant 4.
                counts.remove(&self.key);
            }
        }
    }
}

impl Shares {
    pub fn new(share: usize) -> Arc<Shares> {
        Arc::new(Shares {
            share,
            counts: Mutex::new(HashMap::new()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<RateKey, usize>> {
        self.counts
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A place for `key`'s request, or `None` when its share is taken.
    fn enter(self: &Arc<Self>, key: RateKey) -> Option<Held> {
        let mut counts = self.lock();
        let count = counts.entry(key.clone()).or_insert(0);
        if *count >= self.share {
            return None;
        }
        *count += 1;
        Some(Held {
            shares: self.clone(),
            key,
        })
    }
}

/// Who a request counts against: its verified principal, else its peer
/// address; `None` (not limited) without either, as for the operator CLI's
/// in-process router.
fn principal(request: &Request) -> Option<RateKey> {
    match request.extensions().get::<crate::auth::Principal>() {
        Some(principal) => Some(RateKey::token(&principal.token_id)),
        None => RateKey::address(request),
    }
}

/// The layer (module docs).
pub async fn layer(shares: Arc<Shares>, request: Request, next: Next) -> Response {
    if request.method() != http::Method::POST {
        return next.run(request).await;
    }
    let Some(key) = principal(&request) else {
        return next.run(request).await;
    };
    if let Some(held) = shares.enter(key) {
        return next
            .run(request)
            .await
            .map(|body| HeldBody::wrap(body, held));
    }
    // At the share: only now is the body looked at (invariant 3). The body
    // layers before this one have read it whole, within the body limit.
    let (parts, body) = request.into_parts();
    let bytes = axum::body::to_bytes(body, usize::MAX)
        .await
        .unwrap_or_default();
    let message: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    let id = message.get("id").filter(|id| !id.is_null());
    if !bytes.is_empty() && (message.get("method").is_none() || id.is_none()) {
        return next
            .run(Request::from_parts(parts, axum::body::Body::from(bytes)))
            .await;
    }
    refused(Listener::Mcp, Refusal::MaxInFlightPerPrincipal);
    too_many(id.cloned().unwrap_or(Value::Null), shares.share)
}

/// The answer beyond the share (invariant 2).
fn too_many(id: Value, share: usize) -> Response {
    let body = json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": {
            "code": codes::TOO_MANY_IN_FLIGHT,
            "message": format!(
                "too many requests in flight: this principal already has {share} in progress \
                 (limits.max_in_flight_per_principal); nothing was sent, retry after one finishes"
            ),
            "data": {"reason": "max_in_flight_per_principal", "limit": share},
        },
    });
    (
        http::StatusCode::TOO_MANY_REQUESTS,
        [(http::header::RETRY_AFTER, "1")],
        axum::Json(body),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_share_is_per_principal_and_freed_with_its_requests() {
        let shares = Shares::new(2);
        let (a, b) = (RateKey::token("a"), RateKey::token("b"));
        let first = shares.enter(a.clone()).expect("first of a");
        let second = shares.enter(a.clone()).expect("second of a");
        assert!(shares.enter(a.clone()).is_none(), "a's share is taken");
        let other = shares.enter(b.clone()).expect("b has a share of its own");
        drop(first);
        let third = shares.enter(a.clone()).expect("a place came free");
        drop((second, third, other));
        assert!(shares.lock().is_empty(), "idle principals are forgotten");
    }
}
