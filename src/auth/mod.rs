//! Who is calling: bearer access tokens, their scopes and tenants.
//!
//! A token is `lgt_<id>_<secret>`: `id` is 16 lowercase hex characters (the
//! public half, how the ledger finds the token), `secret` 64 (32 random
//! bytes). The ledger stores the SHA-256 of the secret, never the secret
//! (`ledger::token`, `sql/token.sql`); `leasegate tokens create` shows the
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
//! 3. A token is checked against the ledger on every request (no cache): a
//!    revocation or expiry takes effect at the next request.
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
    /// The token's public id (logs and key-mode principals use it).
    pub token_id: String,
    pub tenant: String,
    pub scope: Scope,
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
}

impl Authenticator {
    pub fn new(ledger: Ledger) -> Self {
        Self { ledger, jwt: None }
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
        let verdict = self
            .ledger
            .access_token_verify(id, &secret_hash(secret))
            .await
            .map_err(|error: LedgerError| {
                tracing::warn!(%error, token_id = id, "could not check a token");
                Refusal::Unavailable
            })?;
        match verdict {
            TokenVerdict::Valid { tenant, scope, .. } => Ok(Principal {
                token_id: id.to_owned(),
                tenant,
                scope: Scope::parse(&scope).ok_or(Refusal::Unknown)?,
            }),
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
