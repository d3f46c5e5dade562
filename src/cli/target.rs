//! Where an operator command acts ([`Target`]): the ledger's URL, found as
//! every command finds it, and with `--config` that config's tenant and
//! body rules. Reads the config file only.

use std::collections::BTreeMap;

use super::operator_args::Common;
use super::output::report;
use crate::adapter::Adapter;
use crate::config::{Config, DatabaseUrl};
use crate::control::ErrorCode;
use crate::policy::Bodies;

/// Where an operator command acts: the ledger's URL, the tenant of
/// `--config` (runs of other tenants are refused) and its policy's body
/// rules (sealed bodies are opened for the reader).
pub(super) struct Target {
    pub database: DatabaseUrl,
    pub tenant: Option<String>,
    pub bodies: Bodies,
    /// The adapter files of `--config`, by upstream (empty without one):
    /// what `ops retry` judges a retry by.
    pub adapters: BTreeMap<String, Adapter>,
}

impl Target {
    /// From `--config` (with `--database-url` over its URL) or, without
    /// one, from the environment; a config that does not load is reported
    /// and its exit code returned.
    pub fn of(common: &Common) -> Result<Self, u8> {
        let refused = |error: String| report(common.json, ErrorCode::InvalidInput, &error);
        let mut target = match &common.config {
            Some(path) => {
                let mut config = Config::load(path).map_err(|e| refused(e.to_string()))?;
                config.database.resolve_url(common.database_url.as_deref());
                Self {
                    database: config.database.located(),
                    tenant: Some(config.tenant),
                    // The policy's keys: sealed bodies are opened for the
                    // reader (`control::operations::readable`).
                    bodies: config.policy.bodies(),
                    adapters: config.adapters,
                }
            }
            None => Self {
                database: DatabaseUrl::from_environment(common.database_url.as_deref(), None),
                tenant: None,
                bodies: Default::default(),
                adapters: BTreeMap::new(),
            },
        };
        // "embedded": the private cluster's socket in the state directory.
        target.database =
            crate::app::client_database(target.database).map_err(|e| refused(e.to_string()))?;
        Ok(target)
    }
}
