//! Who is calling: bearer access tokens, their scopes and tenants.
//!
//! A token is `lgt_<id>_<secret>`: `id` is 16 lowercase hex characters (the
//! public half, how the ledger finds the token), `secret` 64 (32 random
//! bytes). The ledger stores the SHA-256 of the secret, never the secret
//! (`ledger::access_token`, `sql/access_token.sql`); `leasegate tokens create` shows the
//! whole token once.
//!
//! # Invariants
//!
//! 1. A secret is never stored, logged or returned after its creation:
//!    [`IssuedToken`] is the only value that holds it, and its `Debug`
//!    redacts it.
//! 2. Every token is bound to one tenant; a caller with a token acts for that
//!    tenant only. Resources of another tenant are "not found" to it (the
//!    control API and the MCP front both check, `control::auth`).
//! 3. A token is checked against the ledger on every request, unless
//!    `[auth] token_cache_ttl` is set (default `"0s"`: off): then a
//!    *positive* verification of that exact token (id and secret hash) is
//!    reused by this process for at most that long (bounded at 60 s) and
//!    never past the token's own expiry. Refusals are never cached. So a
//!    revocation takes effect at the next request with the cache off, and
//!    within `token_cache_ttl` on every process with it on — the revocation
//!    latency is that setting, by construction: an entry is only ever
//!    created from a ledger answer that said valid, and is dropped once it
//!    is older than the setting. A verification cache invalidated by
//!    LISTEN/NOTIFY on revoke was not chosen: it needs a connection per
//!    process held open for notifications, and its latency is unbounded
//!    when that connection stalls without breaking, which a TTL is not.
//! 4. A bearer token that is not `lgt_…` is a JWT only when `[auth.jwt]` is
//!    configured (`jwt`); otherwise it is malformed (401).
//!
//! # Scopes
//!
//! | scope | may |
//! |---|---|
//! | `agent` | tool calls on the MCP front; create and read runs; lease, checkpoint and run transitions (start, complete, fail) on runs of its tenant |
//! | `operator` | read runs, operations (request and result bodies), the unknown summary, upstream health, durability, failovers and metrics; cancel runs; resolve and retry operations |
//! | `admin` | everything `agent` and `operator` may, and resolve failovers (they hold dispatch for every tenant) |
//!
//! "Runs of its tenant" means every run of the token's tenant, not only
//! those the token created: a worker that takes over a lease after a crash
//! must reach its predecessor's run, and the lease (owner, epoch, and its
//! secret token) is what fences one worker from another.

use std::fmt;
use std::sync::Arc;

use sha2::{Digest, Sha256};

use crate::ledger::{Ledger, LedgerError, TokenVerdict};

pub mod jwt;

/// What a token allows (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Scope {
    Agent,
    Operator,
    Admin,
}

impl Scope {
    pub const ALL: [Scope; 3] = [Scope::Agent, Scope::Operator, Scope::Admin];

    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Agent => "agent",
            Scope::Operator => "operator",
            Scope::Admin => "admin",
        }
    }

    pub fn parse(text: &str) -> Option<Scope> {
        Scope::ALL.into_iter().find(|s| s.as_str() == text)
    }

    /// Whether a token of this scope may do what needs one of `needed`.
    pub fn satisfies(self, needed: &[Scope]) -> bool {
        self == Scope::Admin || needed.contains(&self)
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An authenticated caller (put into the HTTP request's extensions by the
/// listeners' authentication layer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// The token's public id (logs use it).
    pub token_id: String,
    pub tenant: String,
    pub scope: Scope,
    /// Whether `token_id` names one caller across requests: always for a
    /// bearer token; for a JWT only when it carries a subject (`sub`).
    /// Lease modes `session` and `key` give each such caller a namespace of
    /// its own, and refuse a caller without one.
    pub identified: bool,
}

impl Principal {
    /// The name of this caller's namespace of lease-mode tasks, when it has
    /// one (see [`Principal::identified`]).
    pub fn lease_namespace(&self) -> Option<&str> {
        self.identified.then_some(self.token_id.as_str())
    }
}

/// The prefix of every leasegate token.
pub const TOKEN_PREFIX: &str = "lgt_";
const ID_BYTES: usize = 8;
const SECRET_BYTES: usize = 32;

/// A newly minted token: the only value that ever holds its secret.
pub struct IssuedToken {
    pub token_id: String,
    secret: String,
}

impl fmt::Debug for IssuedToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IssuedToken")
            .field("token_id", &self.token_id)
            .field("secret", &"<redacted>")
            .finish()
    }
}

impl IssuedToken {
    /// A fresh random id and secret.
    pub fn mint() -> Result<IssuedToken, getrandom::Error> {
        let mut id = [0u8; ID_BYTES];
        let mut secret = [0u8; SECRET_BYTES];
        getrandom::fill(&mut id)?;
        getrandom::fill(&mut secret)?;
        Ok(IssuedToken {
            token_id: hex::encode(id),
            secret: hex::encode(secret),
        })
    }

    /// The whole token, as the caller sends it (`Authorization: Bearer …`).
    pub fn reveal(&self) -> String {
        format!("{TOKEN_PREFIX}{}_{}", self.token_id, self.secret)
    }

    pub fn secret_hash(&self) -> [u8; 32] {
        secret_hash(&self.secret)
    }
}

/// SHA-256 of a token's secret half: what the ledger stores and compares.
/// (The secret is 256 random bits, so a fast hash is enough: there is no
/// dictionary to search.)
pub fn secret_hash(secret: &str) -> [u8; 32] {
    Sha256::digest(secret.as_bytes()).into()
}

/// (id, secret) of a token's text, when it has the shape of one.
pub fn parse_token(text: &str) -> Option<(&str, &str)> {
    let rest = text.strip_prefix(TOKEN_PREFIX)?;
    let (id, secret) = rest.split_once('_')?;
    let hex_of = |s: &str, bytes: usize| {
        s.len() == bytes * 2 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    };
    (hex_of(id, ID_BYTES) && hex_of(secret, SECRET_BYTES)).then_some((id, secret))
}

/// Why a request was not authenticated (the reason label of the refusal
/// metric, and the `error_description` of the 401).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// No `Authorization` header.
    Missing,
    /// Not `Bearer <token>`, or not the shape of a leasegate token.
    Malformed,
    /// No such token, or the secret does not match.
    Unknown,
    Revoked,
    Expired,
    /// The ledger could not be asked (answered 503, not 401).
    Unavailable,
    /// A JWT whose signature, issuer, audience or claims do not hold.
    InvalidJwt,
}

impl Refusal {
    /// The metric label.
    pub fn reason(self) -> &'static str {
        match self {
            Refusal::Missing => "missing_token",
            Refusal::Malformed => "malformed_token",
            Refusal::Unknown => "unknown_token",
            Refusal::Revoked => "revoked_token",
            Refusal::Expired => "expired_token",
            Refusal::Unavailable => "ledger_unavailable",
            Refusal::InvalidJwt => "invalid_jwt",
        }
    }

    /// What the caller is told.
    pub fn description(self) -> &'static str {
        match self {
            Refusal::Missing => "a bearer token is required (Authorization: Bearer lgt_…)",
            Refusal::Malformed => "the Authorization header is not \"Bearer lgt_<id>_<secret>\"",
            Refusal::Unknown => "the token is not valid",
            Refusal::Revoked => "the token was revoked",
            Refusal::Expired => "the token expired",
            Refusal::Unavailable => "the ledger cannot be reached to check the token",
            Refusal::InvalidJwt => {
                "the JWT is not valid here (key, signature, issuer, audience, tenant or scope claim)"
            }
        }
    }
}

/// Checks bearer tokens: leasegate tokens against the ledger, JWTs
/// (when `[auth.jwt]` is configured) against the issuer's keys.
#[derive(Debug, Clone)]
pub struct Authenticator {
    ledger: Ledger,
    jwt: Option<Arc<jwt::JwtValidator>>,
    /// Positive verifications, reused for `cache_ttl` (invariant 3).
    cache: Option<Arc<VerifiedCache>>,
}

/// Most entries of the verification cache; full, it starts over.
const CACHE_ENTRIES: usize = 10_000;

/// One positive verification: the secret's hash, who, valid until.
type Verified = ([u8; 32], Principal, std::time::Instant);

/// Token id → its positive verification (refusals are never cached).
#[derive(Debug)]
struct VerifiedCache {
    ttl: std::time::Duration,
    entries: std::sync::Mutex<std::collections::HashMap<String, Verified>>,
}

impl VerifiedCache {
    fn get(&self, id: &str, hash: &[u8; 32]) -> Option<Principal> {
        let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        match entries.get(id) {
            Some((cached, principal, until))
                if cached == hash && std::time::Instant::now() < *until =>
            {
                Some(principal.clone())
            }
            _ => None,
        }
    }

    fn put(
        &self,
        id: &str,
        hash: [u8; 32],
        principal: &Principal,
        expires_at: Option<chrono::DateTime<chrono::Utc>>,
    ) {
        let mut until = std::time::Instant::now() + self.ttl;
        if let Some(expires_at) = expires_at {
            // Never past the token's own expiry (wall clock to monotonic).
            let left = (expires_at - chrono::Utc::now())
                .to_std()
                .unwrap_or(std::time::Duration::ZERO);
            until = until.min(std::time::Instant::now() + left);
        }
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if entries.len() >= CACHE_ENTRIES {
            entries.clear();
        }
        entries.insert(id.to_owned(), (hash, principal.clone(), until));
    }
}

impl Authenticator {
    pub fn new(ledger: Ledger) -> Self {
        Self {
            ledger,
            jwt: None,
            cache: None,
        }
    }

    /// Reuses a positive verification of a leasegate token for `ttl`
    /// (`[auth] token_cache_ttl`; zero: off): the revocation latency of
    /// this process (invariant 3).
    pub fn with_cache(mut self, ttl: std::time::Duration) -> Self {
        self.cache = (!ttl.is_zero()).then(|| {
            Arc::new(VerifiedCache {
                ttl,
                entries: Default::default(),
            })
        });
        self
    }

    /// Also accepts JWTs that `validator` validates.
    pub fn with_jwt(mut self, validator: jwt::JwtValidator) -> Self {
        self.jwt = Some(Arc::new(validator));
        self
    }

    /// The caller of a request with this `Authorization` header value.
    pub async fn authenticate(&self, authorization: Option<&str>) -> Result<Principal, Refusal> {
        let Some(value) = authorization else {
            return Err(Refusal::Missing);
        };
        let value = value.trim();
        let token = match value.split_once(' ') {
            Some((scheme, token)) if scheme.eq_ignore_ascii_case("bearer") => token.trim(),
            _ => return Err(Refusal::Malformed),
        };
        if !token.starts_with(TOKEN_PREFIX)
            && let Some(jwt) = &self.jwt
        {
            return jwt.validate(token);
        }
        let (id, secret) = parse_token(token).ok_or(Refusal::Malformed)?;
        let hash = secret_hash(secret);
        if let Some(principal) = self.cache.as_ref().and_then(|c| c.get(id, &hash)) {
            return Ok(principal);
        }
        let verdict =
            self.ledger
                .access_token_verify(id, &hash)
                .await
                .map_err(|error: LedgerError| {
                    tracing::warn!(%error, token_id = id, "could not check a token");
                    Refusal::Unavailable
                })?;
        match verdict {
            TokenVerdict::Valid {
                tenant,
                scope,
                expires_at,
            } => {
                let principal = Principal {
                    token_id: id.to_owned(),
                    tenant,
                    scope: Scope::parse(&scope).ok_or(Refusal::Unknown)?,
                    identified: true,
                };
                if let Some(cache) = &self.cache {
                    cache.put(id, hash, &principal, expires_at);
                }
                Ok(principal)
            }
            TokenVerdict::Unknown => Err(Refusal::Unknown),
            TokenVerdict::Revoked => Err(Refusal::Revoked),
            TokenVerdict::Expired => Err(Refusal::Expired),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minted_tokens_parse_back_and_their_secret_is_not_in_debug() {
        let issued = IssuedToken::mint().unwrap();
        let text = issued.reveal();
        let (id, secret) = parse_token(&text).expect("a minted token parses");
        assert_eq!(id, issued.token_id);
        assert_eq!(secret_hash(secret), issued.secret_hash());
        assert!(!format!("{issued:?}").contains(secret));
        for bad in [
            "",
            "lgt_",
            "lgt_abc_def",
            &text.replace("lgt_", "xyz_"),
            &text.to_uppercase(),
            &format!("{text}0"),
        ] {
            assert_eq!(parse_token(bad), None, "{bad}");
        }
    }

    #[test]
    fn the_verification_cache_answers_only_the_same_secret_and_only_in_time() {
        let cache = VerifiedCache {
            ttl: std::time::Duration::from_secs(30),
            entries: Default::default(),
        };
        let who = Principal {
            token_id: "0123456789abcdef".into(),
            tenant: "t".into(),
            scope: Scope::Agent,
            identified: true,
        };
        let hash = secret_hash("right");
        cache.put(&who.token_id, hash, &who, None);
        assert_eq!(cache.get(&who.token_id, &hash), Some(who.clone()));
        assert_eq!(cache.get(&who.token_id, &secret_hash("wrong")), None);
        assert_eq!(cache.get("fedcba9876543210", &hash), None);
        // A token that expires before the ttl is cached only until then.
        cache.put(
            &who.token_id,
            hash,
            &who,
            Some(chrono::Utc::now() - chrono::Duration::seconds(1)),
        );
        assert_eq!(cache.get(&who.token_id, &hash), None);
        let short = VerifiedCache {
            ttl: std::time::Duration::ZERO,
            entries: Default::default(),
        };
        short.put(&who.token_id, hash, &who, None);
        assert_eq!(short.get(&who.token_id, &hash), None);
    }

    #[test]
    fn admin_satisfies_every_need_and_others_only_their_own() {
        assert!(Scope::Admin.satisfies(&[Scope::Agent]));
        assert!(Scope::Operator.satisfies(&[Scope::Agent, Scope::Operator]));
        assert!(!Scope::Agent.satisfies(&[Scope::Operator]));
        assert!(!Scope::Operator.satisfies(&[Scope::Admin]));
        for scope in Scope::ALL {
            assert_eq!(Scope::parse(scope.as_str()), Some(scope));
        }
    }
}
