//! Per-principal rate limits (GCRA, `governor`): each listener keeps its
//! own buckets; a request over its principal's rate gets 429 with
//! `Retry-After` (whole seconds, at least 1) before any handler runs.
//!
//! Two checks:
//!
//! 1. Before anything else (the outermost layer, before Host/Origin and
//!    before the token is looked up): the peer address's allowance,
//!    [`ADDRESS_ALLOWANCE`] times the rate, so a flood of invented tokens
//!    from one address is bounded before it costs ledger lookups.
//! 2. The principal's own bucket, at the rate. Where tokens are required
//!    ([`crate::config::Limits::verified_principals`]) it is taken after
//!    authentication ([`admit`], called by `control::auth`): a verified
//!    token's requests count against its token id, wherever they come from
//!    and however the header is spelled; a request whose token is missing
//!    or not valid counts against its peer address's bucket — every bad
//!    token from one client shares one bucket. Without tokens the bucket is
//!    the peer address's, taken in the outer layer.
//!
//! The peer address is its IP (IPv6: its /64, what one host usually holds).
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

use super::listener::{Listener, Peer};
use super::{Refusal, refused};
use crate::config::RateLimit;

/// How often idle buckets are dropped (invariant 1).
pub const SWEEP_EVERY: Duration = Duration::from_secs(10);

/// Who a request counts against.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum RateKey {
    /// The first 16 bytes of SHA-256 of a verified token's id.
    Token([u8; 16]),
    Ip(IpAddr),
}

impl RateKey {
    /// The principal of a verified token (its public id).
    pub fn token(token_id: &str) -> RateKey {
        let digest = sha2::Sha256::digest(token_id.as_bytes());
        let mut key = [0; 16];
        key.copy_from_slice(&digest[..16]);
        RateKey::Token(key)
    }

    /// The peer address a request came from (IPv6: its /64), if known.
    pub fn address(request: &Request) -> Option<RateKey> {
        let Peer(address) = request.extensions().get::<Peer>()?;
        Some(RateKey::Ip(match address.ip() {
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

/// How many times a principal's rate one peer address may send in all,
/// checked before the credential is verified: it bounds what a client
/// inventing a new `Authorization` value per request costs (a ledger
/// lookup each), and leaves room for several agents behind one address.
pub const ADDRESS_ALLOWANCE: u32 = 10;

/// The listener's limiter, in a request's extensions for [`admit`].
#[derive(Clone)]
pub struct Pending(Arc<Limiter>);

/// Takes a request's principal bucket after authentication (module docs,
/// check 2): `token_id` of the verified token, or `None` when the request
/// was refused (its peer address's bucket). `Some(429)` when over the rate;
/// `None` to go on (also when the listener has no rate limit).
pub fn admit(request: &mut Request, token_id: Option<&str>) -> Option<Response> {
    let Pending(limiter) = request.extensions().get::<Pending>()?.clone();
    let principal = match token_id {
        Some(id) => RateKey::token(id),
        None => RateKey::address(request)?,
    };
    let refused = limiter.take(&principal);
    if refused.is_none() {
        request.extensions_mut().insert(Charged {
            limiter,
            key: principal,
        });
    }
    refused
}

/// The bucket a request was counted against, in its extensions, for a
/// handler whose request asks for more work than one request's
/// ([`Charged::weigh`]).
#[derive(Clone)]
pub struct Charged {
    limiter: Arc<Limiter>,
    key: RateKey,
}

impl Charged {
    /// Takes `more` requests' worth from the same bucket: `Some(429)` when
    /// the bucket does not hold them (or never could, `more` beyond the
    /// burst), with nothing done.
    pub fn weigh(&self, more: u32) -> Option<Response> {
        let more = NonZeroU32::new(more)?;
        match self.limiter.buckets.check_key_n(&self.key, more) {
            Ok(Ok(())) => None,
            Ok(Err(not_until)) => Some(self.limiter.refuse(not_until)),
            // More than the burst: no wait makes room; as a full bucket.
            Err(_) => {
                refused(self.limiter.listener, Refusal::RateLimited);
                Some(too_many(self.limiter.listener, 1))
            }
        }
    }
}

struct Limiter {
    buckets: DefaultKeyedRateLimiter<RateKey>,
    /// Every request's peer address, at [`ADDRESS_ALLOWANCE`] times the rate.
    addresses: DefaultKeyedRateLimiter<RateKey>,
    clock: DefaultClock,
    listener: Listener,
    /// Whether the principal bucket waits for [`admit`] (tokens verified).
    verified: bool,
}

/// `router` behind the rate limit of `listener`.
/// `verified`: tokens are required on this listener, so the principal
/// bucket is taken after authentication ([`admit`]).
pub fn layer(
    router: axum::Router,
    listener: Listener,
    rate: RateLimit,
    verified: bool,
) -> axum::Router {
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
        verified,
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
        move |request: Request, next: Next| limiter.clone().check(request, next),
    ))
}

impl Limiter {
    async fn check(self: Arc<Self>, mut request: Request, next: Next) -> Response {
        let Some(address) = RateKey::address(&request) else {
            return next.run(request).await;
        };
        let verdict = self.addresses.check_key(&address).and_then(|()| {
            if self.verified {
                Ok(())
            } else {
                self.buckets.check_key(&address)
            }
        });
        if let Err(not_until) = verdict {
            return self.refuse(not_until);
        }
        if self.verified {
            request.extensions_mut().insert(Pending(self.clone()));
        } else {
            request.extensions_mut().insert(Charged {
                limiter: self.clone(),
                key: address,
            });
        }
        next.run(request).await
    }

    /// Takes one request from `principal`'s bucket; the 429 when it is
    /// empty.
    fn take(&self, principal: &RateKey) -> Option<Response> {
        self.buckets
            .check_key(principal)
            .err()
            .map(|not_until| self.refuse(not_until))
    }

    fn refuse(&self, not_until: governor::NotUntil<<DefaultClock as Clock>::Instant>) -> Response {
        let wait = not_until.wait_time_from(self.clock.now());
        let seconds = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
        refused(self.listener, Refusal::RateLimited);
        too_many(self.listener, seconds.max(1))
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
