//! `[auth]`: bearer tokens on both listeners (`crate::auth`) — when they
//! are required, the resource URL agents are told, how long a verified
//! token may be reused, and JWTs from an identity provider (`[auth.jwt]`,
//! its key set read and checked here, at load).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::error::ConfigError;

/// `[auth]`: bearer tokens on both listeners (`crate::auth`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAuth {
    /// "auto" (default: required as soon as a listener is not loopback),
    /// "required" or "off" (refused with a listener that is not loopback).
    pub mode: Option<String>,
    /// The URL agents reach the MCP front at, as the protected-resource
    /// metadata names it (default: `http://<Host of the request>/mcp`);
    /// set it behind a TLS-terminating proxy.
    pub resource_url: Option<String>,
    /// JWTs from an identity provider, besides leasegate's own tokens.
    pub jwt: Option<RawJwt>,
    /// How long a positive verification of a leasegate token may be reused
    /// without asking the ledger ("0s", the default: never; every request
    /// reads the ledger). Also the longest a revocation may take to reach
    /// this process.
    pub token_cache_ttl: Option<String>,
}

/// `[auth.jwt]`: JWT validation (issuer, audience, keys from a JWKS file).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawJwt {
    /// The `iss` a token must carry.
    pub issuer: String,
    /// The `aud` a token must carry (this leasegate's resource identifier).
    pub audience: String,
    /// The issuer's public keys (JWKS JSON), relative to this file.
    pub jwks_file: String,
    /// The claim naming the tenant (default "tenant").
    pub tenant_claim: Option<String>,
    /// The claim holding the scopes (default "scope": space-separated, or an
    /// array); the highest of agent, operator, admin counts.
    pub scope_claim: Option<String>,
}

/// `[auth.jwt]`, validated, with its key set read.
#[derive(Debug, Clone)]
pub struct JwtConfig {
    pub issuer: String,
    pub audience: String,
    pub jwks_file: PathBuf,
    /// The JWKS document as read at load.
    pub jwks: String,
    pub tenant_claim: String,
    pub scope_claim: String,
}

/// `[auth] mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthMode {
    /// Required whenever a listener is not loopback-only.
    Auto,
    Required,
    Off,
}

/// `[auth]`, validated.
#[derive(Debug, Clone)]
pub struct AuthConfig {
    /// `Config::auth_required` resolves `auto`.
    pub mode: AuthMode,
    pub resource_url: Option<String>,
    /// Zero turns the verification cache off.
    pub token_cache_ttl: Duration,
    pub jwt: Option<JwtConfig>,
}

impl AuthConfig {
    /// `[auth]` of `file` (`None`: not written); the JWKS file is read
    /// relative to `base`, the configuration's directory.
    pub(super) fn from_raw(
        raw: Option<&RawAuth>,
        file: &Path,
        base: &Path,
    ) -> Result<Self, ConfigError> {
        let err = |message: String| ConfigError::new(file, message);
        let raw = raw.cloned().unwrap_or_default();
        let mode = match raw.mode.as_deref() {
            None | Some("auto") => AuthMode::Auto,
            Some("required") => AuthMode::Required,
            Some("off") => AuthMode::Off,
            Some(other) => {
                return Err(err(format!(
                    "auth.mode: {other:?} is not one of \"auto\", \"required\", \"off\""
                )));
            }
        };
        if let Some(url) = &raw.resource_url
            && !(url.starts_with("http://") || url.starts_with("https://"))
        {
            return Err(err(format!(
                "auth.resource_url: {url:?} is not an http(s) URL"
            )));
        }
        let token_cache_ttl = match &raw.token_cache_ttl {
            None => Duration::ZERO,
            Some(text) if matches!(text.trim(), "0" | "0s") => Duration::ZERO,
            Some(text) => crate::policy::parse_duration("auth.token_cache_ttl", text)
                .map_err(|e| err(e.to_string()))?,
        };
        if token_cache_ttl > Duration::from_secs(60) {
            return Err(err(format!(
                "auth.token_cache_ttl: {} s is above the 60 s bound (it is how long a revoked \
                 token may still be accepted)",
                token_cache_ttl.as_secs()
            )));
        }
        let jwt = match &raw.jwt {
            None => None,
            Some(jwt) => Some(JwtConfig::from_raw(jwt, file, base)?),
        };
        Ok(Self {
            mode,
            resource_url: raw.resource_url,
            token_cache_ttl,
            jwt,
        })
    }
}

impl JwtConfig {
    /// `[auth.jwt]` with its key set read from `base`/`jwks_file`.
    fn from_raw(jwt: &RawJwt, file: &Path, base: &Path) -> Result<Self, ConfigError> {
        let err = |message: String| ConfigError::new(file, message);
        if jwt.issuer.trim().is_empty() || jwt.audience.trim().is_empty() {
            return Err(err("auth.jwt: issuer and audience must not be empty".into()));
        }
        let jwks_file = base.join(&jwt.jwks_file);
        let jwks = std::fs::read_to_string(&jwks_file).map_err(|e| {
            err(format!(
                "auth.jwt.jwks_file: cannot read {}: {e}",
                jwks_file.display()
            ))
        })?;
        check_jwks(&jwks)
            .map_err(|e| err(format!("auth.jwt.jwks_file: {}: {e}", jwks_file.display())))?;
        Ok(JwtConfig {
            issuer: jwt.issuer.clone(),
            audience: jwt.audience.clone(),
            jwks_file,
            jwks,
            tenant_claim: jwt.tenant_claim.clone().unwrap_or_else(|| "tenant".into()),
            scope_claim: jwt.scope_claim.clone().unwrap_or_else(|| "scope".into()),
        })
    }
}

/// Whether `text` is a JWKS whose every key can verify (what
/// `auth::jwt::JwtValidator` will load).
fn check_jwks(text: &str) -> Result<(), String> {
    let keys: jsonwebtoken::jwk::JwkSet =
        serde_json::from_str(text).map_err(|e| format!("not a JWKS document: {e}"))?;
    if keys.keys.is_empty() {
        return Err("the JWKS has no keys".into());
    }
    for (index, key) in keys.keys.iter().enumerate() {
        jsonwebtoken::DecodingKey::from_jwk(key)
            .map_err(|e| format!("key {index} cannot verify: {e}"))?;
    }
    Ok(())
}
