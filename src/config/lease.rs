//! How a side-effecting call without a lease of its own gets one
//! (`lease_mode`), and the key mode's `[idempotency]` table. The session
//! mode's `[session]` table is `session`.

use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use super::error::ConfigError;

/// `[idempotency]`: the key lease mode's settings.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawIdempotency {
    /// How long a key stands for its first request (default "24h"); after
    /// that the same key is a new request.
    pub retention: Option<String>,
}

/// How a side-effecting call without a lease of its own gets one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseMode {
    /// The agent sends run, owner and epoch with every call.
    Explicit,
    /// leasegate holds the lease of a task's run for the life of the
    /// session (`agent_leases`).
    Session,
    /// A per-call idempotency key stands for the call
    /// (`agent_leases::key_lease`).
    Key,
}

/// `lease_mode` and `[idempotency]`, validated.
#[derive(Debug, Clone)]
pub struct LeaseConfig {
    pub mode: LeaseMode,
    /// Key mode: how long a key stands for its first request.
    pub key_retention: Duration,
}

impl LeaseConfig {
    /// `lease_mode` (default "explicit") and `[idempotency]` (`None`: not
    /// written; `retention` defaults to "24h", at least 1s) of `file`.
    pub(super) fn from_raw(
        lease_mode: Option<&str>,
        idempotency: Option<&RawIdempotency>,
        file: &Path,
    ) -> Result<Self, ConfigError> {
        let err = |message: String| ConfigError::new(file, message);
        let mode = match lease_mode {
            None | Some("explicit") => LeaseMode::Explicit,
            Some("session") => LeaseMode::Session,
            Some("key") => LeaseMode::Key,
            Some(other) => {
                return Err(err(format!(
                    "lease_mode: {other:?} is not one of \"explicit\", \"session\", \"key\""
                )));
            }
        };
        let key_retention = match idempotency.and_then(|i| i.retention.as_ref()) {
            Some(text) => crate::policy::parse_duration("idempotency.retention", text)
                .map_err(|e| err(e.to_string()))?,
            None => Duration::from_secs(24 * 3600),
        };
        if key_retention < Duration::from_secs(1) {
            return Err(err("idempotency.retention: must be at least 1s".into()));
        }
        Ok(Self {
            mode,
            key_retention,
        })
    }
}
