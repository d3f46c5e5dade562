//! Per-principal rate limits (GCRA, `governor`): each listener keeps its
//! own buckets; a request over its principal's rate gets 429 with
//! `Retry-After` (whole seconds, at least 1) before any handler runs.
//!
//! The principal is a digest of the `Authorization` header when there is
//! one (a token's requests share a bucket wherever they come from), else
//! the peer's IP address (IPv6: its /64, what one host usually holds).
//! Requests without a peer (the operator CLI's in-process router) are not
//! limited.
//!
//! # Invariants
//!
//! 1. Memory is bounded by the principals active in the last burst window:
//!    buckets indistinguishable from fresh ones are dropped every
//!    [`SWEEP_EVERY`].

use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota};
use http::StatusCode;
use sha2::Digest;

use super::serve::{Listener, Peer};
use super::{Refusal, refused};
use crate::config::RateLimit;

/// How often idle buckets are dropped (invariant 1).
pub const SWEEP_EVERY: Duration = Duration::from_secs(10);

/// Who a request counts against.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Principal {
    /// The first 16 bytes of SHA-256 of the `Authorization` header.
    Token([u8; 16]),
    Ip(IpAddr),
}

impl Principal {
    /// The principal of a request, if it has a peer.
    pub fn of(request: &Request) -> Option<Principal> {
        if let Some(value) = request.headers().get(http::header::AUTHORIZATION) {
            let digest = sha2::Sha256::digest(value.as_bytes());
            let mut key = [0; 16];
            key.copy_from_slice(&digest[..16]);
            return Some(Principal::Token(key));
        }
        let Peer(address) = request.extensions().get::<Peer>()?;
        Some(Principal::Ip(match address.ip() {
            IpAddr::V6(v6) if v6.to_ipv4_mapped().is_none() => {
                let mut bits = u128::from(v6);
                bits &= !0u128 << 64;
                IpAddr::V6(bits.into())
            }
            IpAddr::V6(v6) => IpAddr::V4(v6.to_ipv4_mapped().expect("checked")),
            v4 => v4,
        }))
    }
}

struct Limiter {
    buckets: DefaultKeyedRateLimiter<Principal>,
    clock: DefaultClock,
    listener: Listener,
}

/// `router` behind the rate limit of `listener`.
pub fn layer(router: axum::Router, listener: Listener, rate: RateLimit) -> axum::Router {
    let quota = Quota::per_second(NonZeroU32::new(rate.per_second).unwrap_or(NonZeroU32::MIN))
        .allow_burst(NonZeroU32::new(rate.burst).unwrap_or(NonZeroU32::MIN));
    let limiter = Arc::new(Limiter {
        buckets: DefaultKeyedRateLimiter::keyed(quota),
        clock: DefaultClock::default(),
        listener,
    });
    {
        // Invariant 1; ends with the router (the last strong reference).
        let limiter = Arc::downgrade(&limiter);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(SWEEP_EVERY);
            loop {
                tick.tick().await;
                let Some(limiter) = limiter.upgrade() else {
                    return;
                };
                limiter.buckets.retain_recent();
                limiter.buckets.shrink_to_fit();
            }
        });
    }
    router.layer(axum::middleware::from_fn(
        move |request: Request, next: Next| {
            let limiter = limiter.clone();
            async move { limiter.check(request, next).await }
        },
    ))
}

impl Limiter {
    async fn check(&self, request: Request, next: Next) -> Response {
        let Some(principal) = Principal::of(&request) else {
            return next.run(request).await;
        };
        match self.buckets.check_key(&principal) {
            Ok(()) => next.run(request).await,
            Err(not_until) => {
                let wait = not_until.wait_time_from(self.clock.now());
                let seconds = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
                refused(self.listener, Refusal::RateLimited);
                too_many(self.listener, seconds.max(1))
            }
        }
    }
}

/// The 429 answer: the control API's error shape, or a JSON-RPC error on
/// the MCP front.
fn too_many(listener: Listener, retry_after: u64) -> Response {
    let message = format!("rate limit exceeded (limits.rate_limit); retry after {retry_after} s");
    let body = match listener {
        Listener::Control => serde_json::json!({ "code": "rate_limited", "message": message }),
        Listener::Mcp => serde_json::json!({
            "jsonrpc": "2.0",
            "id": null,
            "error": { "code": -32000, "message": message },
        }),
    };
    (
        StatusCode::TOO_MANY_REQUESTS,
        [(http::header::RETRY_AFTER, retry_after.to_string())],
        axum::Json(body),
    )
        .into_response()
}
