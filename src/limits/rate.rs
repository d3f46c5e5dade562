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
    /// The principal of a request: its bearer credential when it has an
    /// `Authorization` header (scheme case and surrounding blanks do not
    /// make another principal), else its peer address.
    pub fn of(request: &Request) -> Option<Principal> {
        if let Some(value) = request.headers().get(http::header::AUTHORIZATION) {
            let text = String::from_utf8_lossy(value.as_bytes());
            let text = text.trim();
            let normalized = match text.split_once(char::is_whitespace) {
                Some((scheme, credential)) => {
                    format!("{} {}", scheme.to_ascii_lowercase(), credential.trim())
                }
                None => text.to_owned(),
            };
            let digest = sha2::Sha256::digest(normalized.as_bytes());
            let mut key = [0; 16];
            key.copy_from_slice(&digest[..16]);
            return Some(Principal::Token(key));
        }
        Principal::address(request)
    }

    /// The peer address a request came from (IPv6: its /64), if known.
    pub fn address(request: &Request) -> Option<Principal> {
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

/// How many times a principal's rate one peer address may send in all:
/// the credential is not verified yet when the limit is checked, so a
/// client inventing a new `Authorization` value per request would get a
/// fresh bucket each time (and cost a ledger lookup each); the address
/// bound caps that, and leaves room for several agents behind one address.
pub const ADDRESS_ALLOWANCE: u32 = 10;

struct Limiter {
    buckets: DefaultKeyedRateLimiter<Principal>,
    /// Every request's peer address, at [`ADDRESS_ALLOWANCE`] times the rate.
    addresses: DefaultKeyedRateLimiter<Principal>,
    clock: DefaultClock,
    listener: Listener,
}

/// `router` behind the rate limit of `listener`.
pub fn layer(router: axum::Router, listener: Listener, rate: RateLimit) -> axum::Router {
    let quota = Quota::per_second(NonZeroU32::new(rate.per_second).unwrap_or(NonZeroU32::MIN))
        .allow_burst(NonZeroU32::new(rate.burst).unwrap_or(NonZeroU32::MIN));
    let scaled =
        |n: u32| NonZeroU32::new(n.saturating_mul(ADDRESS_ALLOWANCE)).unwrap_or(NonZeroU32::MIN);
    let address_quota = Quota::per_second(scaled(rate.per_second)).allow_burst(scaled(rate.burst));
    let limiter = Arc::new(Limiter {
        buckets: DefaultKeyedRateLimiter::keyed(quota),
        addresses: DefaultKeyedRateLimiter::keyed(address_quota),
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
                limiter.addresses.retain_recent();
                limiter.addresses.shrink_to_fit();
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
        let verdict = Principal::address(&request)
            .map_or(Ok(()), |address| self.addresses.check_key(&address))
            .and_then(|()| {
                Principal::of(&request)
                    .map_or(Ok(()), |principal| self.buckets.check_key(&principal))
            });
        match verdict {
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
