//! JWT bearer tokens from an identity provider (`[auth.jwt]`), as a
//! resource server validates them (MCP authorization specification): the
//! signature against a JWKS file, `iss`, `aud`, `exp` (and `nbf` when
//! present), then the claims that name the tenant and the scope.
//!
//! # Invariants
//!
//! 1. A key is chosen by the token's `kid` (or is the set's only key); a key
//!    that names its `alg` accepts only that algorithm, and the library
//!    refuses an algorithm of another family than the key's (no HS256 with
//!    an RSA public key as the secret).
//! 2. A token without the tenant claim or without one of the scopes
//!    `agent`, `operator`, `admin` in the scope claim is refused (401), never
//!    given a default.

use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{DecodingKey, Validation, decode, decode_header};
use serde_json::Value;

use super::{Principal, Refusal, Scope};

/// What `[auth.jwt]` says (the JWKS as read from its file).
#[derive(Debug, Clone)]
pub struct JwtSettings {
    pub issuer: String,
    pub audience: String,
    /// The JWKS document (JSON).
    pub jwks: String,
    /// The claim that holds the tenant (a string).
    pub tenant_claim: String,
    /// The claim that holds the scopes (a space-separated string or an
    /// array of strings); the highest leasegate scope in it counts.
    pub scope_claim: String,
}

/// Validates JWTs against one issuer's keys.
#[derive(Debug)]
pub struct JwtValidator {
    keys: JwkSet,
    settings: JwtSettings,
}

/// Parses a JWKS document, checking that every key can verify.
pub fn parse_jwks(text: &str) -> Result<JwkSet, String> {
    let keys: JwkSet =
        serde_json::from_str(text).map_err(|e| format!("not a JWKS document: {e}"))?;
    if keys.keys.is_empty() {
        return Err("the JWKS has no keys".into());
    }
    for (index, key) in keys.keys.iter().enumerate() {
        DecodingKey::from_jwk(key).map_err(|e| format!("key {index} cannot verify: {e}"))?;
    }
    Ok(keys)
}

impl JwtValidator {
    pub fn new(settings: JwtSettings) -> Result<Self, String> {
        Ok(Self {
            keys: parse_jwks(&settings.jwks)?,
            settings,
        })
    }

    /// The caller a JWT stands for.
    pub fn validate(&self, token: &str) -> Result<Principal, Refusal> {
        let header = decode_header(token).map_err(|_| Refusal::Malformed)?;
        let key = match &header.kid {
            Some(kid) => self.keys.find(kid),
            None if self.keys.keys.len() == 1 => self.keys.keys.first(),
            None => None,
        }
        .ok_or(Refusal::InvalidJwt)?;
        if let Some(algorithm) = &key.common.key_algorithm
            && algorithm.to_string() != format!("{:?}", header.alg)
        {
            return Err(Refusal::InvalidJwt);
        }
        let decoding = DecodingKey::from_jwk(key).map_err(|_| Refusal::InvalidJwt)?;
        let mut validation = Validation::new(header.alg);
        validation.set_issuer(&[&self.settings.issuer]);
        validation.set_audience(&[&self.settings.audience]);
        validation.set_required_spec_claims(&["exp", "iss", "aud"]);
        validation.validate_nbf = true;
        let claims = decode::<Value>(token, &decoding, &validation)
            .map_err(|error| match error.kind() {
                jsonwebtoken::errors::ErrorKind::ExpiredSignature => Refusal::Expired,
                _ => Refusal::InvalidJwt,
            })?
            .claims;
        let tenant = claims
            .get(&self.settings.tenant_claim)
            .and_then(Value::as_str)
            .filter(|t| !t.is_empty() && t.len() <= 128)
            .ok_or(Refusal::InvalidJwt)?;
        let scopes: Vec<&str> = match claims.get(&self.settings.scope_claim) {
            Some(Value::String(text)) => text.split_whitespace().collect(),
            Some(Value::Array(items)) => items.iter().filter_map(Value::as_str).collect(),
            _ => Vec::new(),
        };
        let scope = scopes
            .iter()
            .filter_map(|s| Scope::parse(s))
            .max()
            .ok_or(Refusal::InvalidJwt)?;
        let subject = claims
            .get("sub")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty());
        // A fixed-length, visible-ASCII id: it names the principal's
        // namespace of lease-mode tasks (a bounded identifier) and appears
        // in logs, whatever the identity provider's subjects look like.
        let digest = {
            use sha2::Digest as _;
            sha2::Sha256::digest(
                format!("{}\n{}", self.settings.issuer, subject.unwrap_or("-")).as_bytes(),
            )
        };
        Ok(Principal {
            token_id: format!("jwt-{}", hex::encode(&digest[..8])),
            tenant: tenant.to_owned(),
            scope,
            // Without a subject, the issuer's tokens would all be one caller.
            identified: subject.is_some(),
        })
    }
}
