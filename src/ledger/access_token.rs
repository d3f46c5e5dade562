//! Access tokens: verifying a presented token (the application role's one
//! token call) and minting, listing and revoking them (the operator role's,
//! `leasegate tokens …`). SQL in `sql/access_token.sql`; the token format and
//! scopes are `crate::auth`'s — this module stores and compares hashes
//! only, and never sees a secret.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::FromRow;

use super::error::protocol;
use super::{InvalidInput, Ledger, LedgerError, MAX_OWNER_LEN, MAX_TENANT_LEN, check_text};

/// What the ledger says about a presented (token id, secret hash).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenVerdict {
    Valid {
        tenant: String,
        /// `agent`, `operator` or `admin`.
        scope: String,
        expires_at: Option<DateTime<Utc>>,
    },
    /// No such id, or the secret does not match (not told apart).
    Unknown,
    Revoked,
    Expired,
}

/// A token as `leasegate tokens list` shows it: never its secret or hash.
#[derive(Debug, Clone, Serialize, FromRow)]
pub struct TokenRecord {
    pub token_id: String,
    pub tenant_id: String,
    pub scope: String,
    pub name: Option<String>,
    pub created_at: DateTime<Utc>,
    pub created_by: String,
    pub expires_at: Option<DateTime<Utc>>,
    pub revoked_at: Option<DateTime<Utc>>,
    pub revoked_by: Option<String>,
}

/// A token to record: the caller generated the id and the secret, and
/// sends only the secret's SHA-256.
#[derive(Debug, Clone)]
pub struct NewToken<'a> {
    pub token_id: &'a str,
    pub secret_hash: &'a [u8; 32],
    pub tenant: &'a str,
    pub scope: &'a str,
    pub name: Option<&'a str>,
    pub created_by: &'a str,
    /// `None`: never expires.
    pub expires_in_ms: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenCreateOutcome {
    Created {
        created_at: DateTime<Utc>,
        expires_at: Option<DateTime<Utc>>,
    },
    /// The (random) id exists already: generate another.
    IdTaken,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenRevokeOutcome {
    Revoked,
    AlreadyRevoked,
    NotFound,
}

#[derive(Debug, FromRow)]
struct VerifyRow {
    outcome: String,
    tenant_id: Option<String>,
    scope: Option<String>,
    expires_at: Option<DateTime<Utc>>,
}

impl Ledger {
    /// Whether `token_id` with a secret hashing to `secret_hash` is a live
    /// token, and for which tenant and scope. Reads only.
    pub async fn access_token_verify(
        &self,
        token_id: &str,
        secret_hash: &[u8; 32],
    ) -> Result<TokenVerdict, LedgerError> {
        const CALL: &str = "access_token_verify";
        let row: VerifyRow = self
            .invoke(CALL, false, || {
                sqlx::query_as("SELECT * FROM access_token_verify($1, $2)")
                    .bind(token_id)
                    .bind(&secret_hash[..])
            })
            .await?;
        match (row.outcome.as_str(), row.tenant_id, row.scope) {
            ("valid", Some(tenant), Some(scope)) => Ok(TokenVerdict::Valid {
                tenant,
                scope,
                expires_at: row.expires_at,
            }),
            ("unknown", _, _) => Ok(TokenVerdict::Unknown),
            ("revoked", _, _) => Ok(TokenVerdict::Revoked),
            ("expired", _, _) => Ok(TokenVerdict::Expired),
            (other, _, _) => Err(protocol(CALL, format!("unexpected outcome {other:?}"))),
        }
    }

    /// Records a new token (operator role).
    pub async fn access_token_create(
        &self,
        token: NewToken<'_>,
    ) -> Result<TokenCreateOutcome, LedgerError> {
        const CALL: &str = "access_token_create";
        check_text("tenant", token.tenant, MAX_TENANT_LEN)?;
        check_text("created_by", token.created_by, MAX_OWNER_LEN)?;
        if let Some(name) = token.name {
            check_text("name", name, MAX_OWNER_LEN)?;
        }
        if token.expires_in_ms.is_some_and(|ms| ms <= 0) {
            return Err(
                InvalidInput::Request("a token's expiry must be in the future".into()).into(),
            );
        }
        let (outcome, created_at, expires_at): (String, DateTime<Utc>, Option<DateTime<Utc>>) =
            self.invoke(CALL, true, || {
                sqlx::query_as(
                    "SELECT outcome, created_at, expires_at \
                       FROM access_token_create($1, $2, $3, $4, $5, $6, $7)",
                )
                .bind(token.token_id)
                .bind(&token.secret_hash[..])
                .bind(token.tenant)
                .bind(token.scope)
                .bind(token.name)
                .bind(token.created_by)
                .bind(token.expires_in_ms)
            })
            .await?;
        match outcome.as_str() {
            "created" => Ok(TokenCreateOutcome::Created {
                created_at,
                expires_at,
            }),
            "id_taken" => Ok(TokenCreateOutcome::IdTaken),
            other => Err(protocol(CALL, format!("unexpected outcome {other:?}"))),
        }
    }

    /// Every token, oldest first, optionally of one tenant (operator role).
    pub async fn access_tokens_list(
        &self,
        tenant: Option<&str>,
    ) -> Result<Vec<TokenRecord>, LedgerError> {
        self.invoke_all("access_tokens_list", false, || {
            sqlx::query_as(
                "SELECT token_id, tenant_id, scope, name, created_at, created_by, expires_at,
                        revoked_at, revoked_by
                   FROM access_tokens WHERE $1::text IS NULL OR tenant_id = $1
                  ORDER BY created_at, token_id",
            )
            .bind(tenant)
        })
        .await
    }

    /// Revokes a token for good (operator role).
    pub async fn access_token_revoke(
        &self,
        token_id: &str,
        by: &str,
    ) -> Result<TokenRevokeOutcome, LedgerError> {
        const CALL: &str = "access_token_revoke";
        check_text("by", by, MAX_OWNER_LEN)?;
        let (outcome,): (String,) = self
            .invoke(CALL, true, || {
                sqlx::query_as("SELECT outcome FROM access_token_revoke($1, $2)")
                    .bind(token_id)
                    .bind(by)
            })
            .await?;
        match outcome.as_str() {
            "revoked" => Ok(TokenRevokeOutcome::Revoked),
            "already_revoked" => Ok(TokenRevokeOutcome::AlreadyRevoked),
            "not_found" => Ok(TokenRevokeOutcome::NotFound),
            other => Err(protocol(CALL, format!("unexpected outcome {other:?}"))),
        }
    }
}
