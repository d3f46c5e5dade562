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
        match &common.config {
            Some(path) => match Config::load(path) {
                Ok(mut config) => {
                    config.database.resolve_url(common.database_url.as_deref());
                    // The policy's keys: sealed bodies are opened for the
                    // reader (`control::operations::readable`).
                    let bodies = config.policy.bodies();
                    let database = crate::app::client_database(config.database.located()).map_err(
                        |error| report(common.json, ErrorCode::InvalidInput, &error.to_string()),
                    )?;
                    Ok(Self {
                        database,
                        tenant: Some(config.tenant),
                        bodies,
                        adapters: config.adapters,
                    })
                }
                Err(error) => Err(report(
                    common.json,
                    ErrorCode::InvalidInput,
                    &error.to_string(),
                )),
            },
            None => Ok(Self {
                database: crate::app::client_database(DatabaseUrl::from_environment(
                    common.database_url.as_deref(),
                    None,
                ))
                .map_err(|error| {
                    report(common.json, ErrorCode::InvalidInput, &error.to_string())
                })?,
                tenant: None,
                bodies: Default::default(),
                adapters: BTreeMap::new(),
            }),
        }
    }
}
