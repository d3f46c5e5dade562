//! Cancellation for agents on the stateless HTTP front.
//!
//! Without sessions rmcp answers every client notification with 202 and
//! drops it, so a handshake-era agent's `notifications/cancelled` (a POST of
//! its own, on another connection) would never reach the call it cancels.
//! [`cancel_layer`] looks at small POSTs before rmcp does; a
//! `notifications/cancelled` is matched against the requests in flight by
//! the cancelled request id **and** the client's identity, and fires that
//! request's cancellation.
//!
//! A stateless client has no session id, so its identity is what it sends
//! on every request: `Authorization`, the `Leasegate-*` lease headers and
//! `User-Agent`. Two agents with identical headers whose request ids
//! collide — both in flight, or one finished within the last 2 s (its
//! cancel may have raced its answer) — are ambiguous: then nothing is
//! cancelled (a warning is logged, `mcp_cancel_ambiguous_total` counts it),
//! because cancelling the wrong agent's call is worse than letting one run
//! to its end. Agents that share a `User-Agent` and send no identifying
//! header remain indistinguishable beyond that. Agents on stateless-MCP cancel by closing the response
//! stream and need none of this.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rmcp::model::RequestId;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

const CANCELLED: &str = "notifications/cancelled";

/// Bodies above this size are never a cancellation; passed on unread.
const SMALL_BODY: u64 = 16 * 1024;

/// (client identity, JSON of the request id).
type ClientRequest = (String, String);

/// A finished request still counts for this long: a cancel that raced its
/// own request's answer must not find another agent's request with the same
/// identity and id (it is ambiguous instead). Short, because agents of one
/// SDK reuse small request ids: a longer window would make their cancels
/// ambiguous for no reason.
const FINISHED_KEEP: std::time::Duration = std::time::Duration::from_secs(2);

/// One request: its token while in flight, when it finished afterwards.
struct Entry {
    seq: u64,
    token: Option<CancellationToken>,
    finished: Option<std::time::Instant>,
}

/// Requests in flight (and lately finished) on the stateless front, by
/// client identity and id.
#[derive(Default)]
pub struct InFlightRequests {
    entries: Mutex<HashMap<ClientRequest, Vec<Entry>>>,
    next: std::sync::atomic::AtomicU64,
}

/// Marks its entry finished when dropped.
pub struct Registration {
    registry: Arc<InFlightRequests>,
    key: ClientRequest,
    seq: u64,
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Ok(mut entries) = self.registry.entries.lock()
            && let Some(entry) = entries
                .get_mut(&self.key)
                .and_then(|list| list.iter_mut().find(|e| e.seq == self.seq))
        {
            entry.token = None;
            entry.finished = Some(std::time::Instant::now());
        }
    }
}

fn expired(entry: &Entry) -> bool {
    entry
        .finished
        .is_some_and(|at| at.elapsed() >= FINISHED_KEEP)
}

fn client_identity(headers: &HeaderMap) -> String {
    [
        "authorization",
        "leasegate-run-id",
        "leasegate-owner",
        "leasegate-epoch",
        "leasegate-lease-token",
        "user-agent",
    ]
    .iter()
    .map(|name| {
        headers
            .get(*name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    })
    .collect::<Vec<_>>()
    .join("\u{1f}")
}

fn id_key(id: &Value) -> String {
    id.to_string()
}

impl InFlightRequests {
    pub fn register(
        self: &Arc<Self>,
        headers: &HeaderMap,
        id: &RequestId,
        token: CancellationToken,
    ) -> Registration {
        let key = (
            client_identity(headers),
            id_key(&serde_json::to_value(id).unwrap_or(Value::Null)),
        );
        let seq = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if let Ok(mut entries) = self.entries.lock() {
            // Sweep finished entries now and then (bounded work per request).
            if seq.is_multiple_of(256) {
                entries.retain(|_, list| {
                    list.retain(|e| !expired(e));
                    !list.is_empty()
                });
            }
            let list = entries.entry(key.clone()).or_default();
            list.retain(|e| !expired(e));
            list.push(Entry {
                seq,
                token: Some(token),
                finished: None,
            });
        }
        Registration {
            registry: self.clone(),
            key,
            seq,
        }
    }

    /// Cancels the one request of this client with this id. Returns whether
    /// one was cancelled.
    fn cancel(&self, headers: &HeaderMap, id: &Value) -> bool {
        let key = (client_identity(headers), id_key(id));
        let Ok(mut entries) = self.entries.lock() else {
            return false;
        };
        let Some(list) = entries.get_mut(&key) else {
            return false;
        };
        list.retain(|e| !expired(e));
        match list.as_slice() {
            [
                Entry {
                    token: Some(token), ..
                },
            ] => {
                token.cancel();
                true
            }
            // Only a finished request: the cancel came after its answer.
            [_] | [] => false,
            several => {
                tracing::warn!(request_id = %crate::logfield::clip_display(&key.1), requests = several.len(),
                    "notifications/cancelled is ambiguous (the same client identity and request id in flight or lately finished more than once); nothing cancelled");
                metrics::counter!("mcp_cancel_ambiguous_total").increment(1);
                false
            }
        }
    }
}

/// Axum middleware: intercepts `notifications/cancelled` POSTs of
/// stateless agents (see the module docs).
pub async fn cancel_layer(
    registry: Arc<InFlightRequests>,
    request: Request,
    next: Next,
) -> Response {
    let small = request
        .headers()
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .is_some_and(|n| n <= SMALL_BODY);
    if request.method() != Method::POST
        || !small
        || request.headers().contains_key("mcp-session-id")
    {
        return next.run(request).await;
    }
    let (parts, body) = request.into_parts();
    let bytes = match axum::body::to_bytes(body, SMALL_BODY as usize).await {
        Ok(bytes) => bytes,
        Err(_) => return (StatusCode::BAD_REQUEST, "request body unreadable").into_response(),
    };
    // Only a body that names the method is parsed here; every other request
    // is parsed once, by rmcp.
    let names_cancel = bytes
        .windows(CANCELLED.len())
        .any(|window| window == CANCELLED.as_bytes());
    if names_cancel
        && let Ok(message) = serde_json::from_slice::<Value>(&bytes)
        && message.get("method").and_then(Value::as_str) == Some(CANCELLED)
        && message.get("id").is_none()
    {
        if let Some(id) = message.pointer("/params/requestId") {
            let cancelled = registry.cancel(&parts.headers, id);
            tracing::debug!(request_id = %crate::logfield::clip_display(&id), cancelled, "notifications/cancelled on the stateless front");
        }
        return StatusCode::ACCEPTED.into_response();
    }
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}
