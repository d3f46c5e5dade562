//! `[session]`: the session lease mode's settings — the task key a session
//! takes the lease of when no flag or environment variable names one, and
//! the lease's ttl, which must fit under the policy's `lease_ttl_ceiling`.

use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use super::error::ConfigError;
use crate::policy::Policy;

/// `[session]`: the session lease mode's settings.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSession {
    /// The task key when neither `leasegate stdio --task` nor
    /// `LEASEGATE_TASK` gives one.
    pub task: Option<String>,
    /// The session lease's ttl (default "30s"), renewed every third of it.
    pub ttl: Option<String>,
}

/// `[session]`, validated.
#[derive(Debug, Clone)]
pub struct SessionConfig {
    /// The configured task key (the CLI flag and the environment override
    /// it).
    pub task: Option<String>,
    /// The lease ttl, renewed every third of it.
    pub ttl: Duration,
}

impl SessionConfig {
    /// `[session]` of `file` (`None`: not written), its ttl checked against
    /// `policy`'s `lease_ttl_ceiling`.
    pub(super) fn from_raw(
        raw: Option<&RawSession>,
        file: &Path,
        policy: &Policy,
    ) -> Result<Self, ConfigError> {
        let err = |message: String| ConfigError::new(file, message);
        let session = raw.cloned().unwrap_or_default();
        let ttl = match &session.ttl {
            Some(text) => crate::policy::parse_duration("session.ttl", text)
                .map_err(|e| err(e.to_string()))?,
            None => Duration::from_secs(30),
        };
        if ttl < Duration::from_secs(3) || ttl > policy.lease_ttl_ceiling {
            return Err(err(format!(
                "session.ttl: must be 3s to the policy's lease_ttl_ceiling ({:?})",
                policy.lease_ttl_ceiling
            )));
        }
        if let Some(task) = &session.task {
            crate::ids::check_identifier("session.task", task, crate::ids::MAX_TASK_LEN)
                .map_err(|e| err(e.to_string()))?;
        }
        Ok(Self {
            task: session.task,
            ttl,
        })
    }
}
