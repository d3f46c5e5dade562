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
//! `User-Agent`.
//!
//! # Invariants
//!
//! 1. A cancel cancels the request of that identity and id that is in
//!    flight when it arrives, if there is exactly one. A finished request
//!    cannot be cancelled, so it is no rival: SDK clients reuse small ids
//!    across short sessions, and an earlier request's id must not make a
//!    later one uncancellable.
//! 2. Two requests in flight with the same identity and id are ambiguous:
//!    nothing is cancelled (a warning is logged, `mcp_cancel_ambiguous_total`
//!    counts it), because cancelling the wrong agent's call is worse than
//!    letting one run to its end. Agents that share a `User-Agent` and send
//!    no identifying header remain indistinguishable beyond that.
//!
//! Agents on stateless-MCP cancel by closing the response stream and need
//! none of this.
//!
//! The registry also keeps the log level a handshake-era stateless client
//! set with `logging/setLevel`, by the same identity ([`LogLevels`]): such
//! a client has no session to keep it in.

// `logging/setLevel` is what handshake-era clients send, deprecated or not.
#![allow(deprecated)]

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

/// One request in flight.
struct Entry {
    seq: u64,
    token: CancellationToken,
}

/// Requests in flight on the stateless front, by client identity and id.
#[derive(Default)]
pub struct InFlightRequests {
    entries: Mutex<HashMap<ClientRequest, Vec<Entry>>>,
    next: std::sync::atomic::AtomicU64,
    /// The log levels handshake-era stateless clients set.
    pub log_levels: LogLevels,
}

/// Forgets its entry when dropped: a finished request cannot be cancelled
/// (invariant 1).
pub struct Registration {
    registry: Arc<InFlightRequests>,
    key: ClientRequest,
    seq: u64,
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Ok(mut entries) = self.registry.entries.lock()
            && let Some(list) = entries.get_mut(&self.key)
        {
            list.retain(|e| e.seq != self.seq);
            if list.is_empty() {
                entries.remove(&self.key);
            }
        }
    }
}

pub fn client_identity(headers: &HeaderMap) -> String {
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
            entries
                .entry(key.clone())
                .or_default()
                .push(Entry { seq, token });
        }
        Registration {
            registry: self.clone(),
            key,
            seq,
        }
    }

    /// Cancels the one request of this client with this id in flight
    /// (invariants 1 and 2). Returns whether one was cancelled.
    fn cancel(&self, headers: &HeaderMap, id: &Value) -> bool {
        let key = (client_identity(headers), id_key(id));
        let Ok(entries) = self.entries.lock() else {
            return false;
        };
        match entries.get(&key).map(Vec::as_slice) {
            Some([entry]) => {
                entry.token.cancel();
                true
            }
            // Nothing in flight: the cancel came after its answer.
            None | Some([]) => false,
            Some(several) => {
                tracing::warn!(request_id = %crate::logfield::clip_display(&key.1), requests = several.len(),
                    "notifications/cancelled is ambiguous (the same client identity and request id in flight more than once); nothing cancelled");
                metrics::counter!("mcp_cancel_ambiguous_total").increment(1);
                false
            }
        }
    }
}

/// How many client identities' log levels are kept; beyond it the least
/// recently set is forgotten (its client then gets its calls' logs at every
/// level again, as before it set one).
const LOG_LEVELS_KEPT: usize = 4096;

/// The level each handshake-era stateless client identity last set with
/// `logging/setLevel`, the most recent last.
#[derive(Default)]
pub struct LogLevels {
    levels: Mutex<Vec<(String, rmcp::model::LoggingLevel)>>,
}

impl LogLevels {
    pub fn set(&self, headers: &HeaderMap, level: rmcp::model::LoggingLevel) {
        let identity = client_identity(headers);
        let mut levels = self
            .levels
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        levels.retain(|(who, _)| *who != identity);
        if levels.len() >= LOG_LEVELS_KEPT {
            levels.remove(0);
        }
        levels.push((identity, level));
    }

    pub fn get(&self, headers: &HeaderMap) -> Option<rmcp::model::LoggingLevel> {
        let identity = client_identity(headers);
        let levels = self
            .levels
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        levels
            .iter()
            .rev()
            .find(|(who, _)| *who == identity)
            .map(|(_, level)| *level)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Invariants 1 and 2: a finished request of the same identity and id
    /// is no rival; two in flight at once are ambiguous.
    #[test]
    fn a_cancel_finds_the_one_request_in_flight_despite_an_earlier_one_with_its_id() {
        let registry = Arc::new(InFlightRequests::default());
        let mut headers = HeaderMap::new();
        headers.insert("user-agent", "python-httpx/0.28".parse().unwrap());
        let id = RequestId::Number(1);

        let earlier = CancellationToken::new();
        drop(registry.register(&headers, &id, earlier.clone()));
        let later = CancellationToken::new();
        let registration = registry.register(&headers, &id, later.clone());
        assert!(registry.cancel(&headers, &serde_json::json!(1)));
        assert!(later.is_cancelled() && !earlier.is_cancelled());

        // Another identity with the same id is not this one.
        let mut other = headers.clone();
        other.insert("authorization", "Bearer other".parse().unwrap());
        assert!(!registry.cancel(&other, &serde_json::json!(1)));

        // Two in flight with the same identity and id: nothing cancelled.
        let rival = CancellationToken::new();
        let _rival = registry.register(&headers, &RequestId::Number(2), rival.clone());
        let second = CancellationToken::new();
        let _second = registry.register(&headers, &RequestId::Number(2), second.clone());
        assert!(!registry.cancel(&headers, &serde_json::json!(2)));
        assert!(!rival.is_cancelled() && !second.is_cancelled());

        // Finished: nothing left to cancel.
        drop(registration);
        assert!(!registry.cancel(&headers, &serde_json::json!(1)));
    }
}
