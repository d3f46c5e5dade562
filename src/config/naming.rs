//! The names this process serves under: its tenant, and how upstream tools
//! are named to agents (`namespace_separator`, the `unprefixed` upstreams,
//! `tools/list` pages). Upstream names themselves are checked against the
//! separator by `upstreams`.

use std::path::Path;

use super::error::ConfigError;
use super::raw::RawConfig;

/// How tools are named and listed to agents, validated.
#[derive(Debug, Clone)]
pub struct NamingConfig {
    /// `namespace_separator`: between an upstream's name and its tool's.
    pub separator: String,
    /// Upstreams whose tools keep their own names (each one an upstream:
    /// checked by `upstreams::from_raw`).
    pub unprefixed: Vec<String>,
    /// Tools per `tools/list` page served to agents.
    pub tools_page_size: usize,
}

/// `tenant` (default "default"), checked as an identifier.
pub(super) fn tenant_from_raw(raw: &RawConfig, file: &Path) -> Result<String, ConfigError> {
    let tenant = raw.tenant.clone().unwrap_or_else(|| "default".to_owned());
    crate::ids::check_identifier("tenant", &tenant, crate::ids::MAX_TENANT_LEN)
        .map_err(|e| ConfigError::new(file, e.to_string()))?;
    Ok(tenant)
}

impl NamingConfig {
    /// The naming keys of `raw`; errors name `file` and the key.
    pub(super) fn from_raw(raw: &RawConfig, file: &Path) -> Result<Self, ConfigError> {
        let err = |message: &str| ConfigError::new(file, message);
        let separator = raw
            .namespace_separator
            .clone()
            .unwrap_or_else(|| "__".to_owned());
        if separator.is_empty() {
            return Err(err("namespace_separator: must not be empty"));
        }
        let tools_page_size = raw.tools_page_size.unwrap_or(50);
        if !(1..=1000).contains(&tools_page_size) {
            return Err(err("tools_page_size: must be 1 to 1000"));
        }
        Ok(Self {
            separator,
            unprefixed: raw.unprefixed.clone(),
            tools_page_size,
        })
    }
}
