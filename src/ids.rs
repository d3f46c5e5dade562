//! Identities shared by every layer (DESIGN.md, "Identities").

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// One execution instance of a task; new on every retry (invariant 6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct RunId(Uuid);

impl RunId {
    /// A fresh, time-ordered run id (UUID v7).
    pub fn generate() -> Self {
        Self(Uuid::now_v7())
    }

    pub fn from_uuid(uuid: Uuid) -> Self {
        Self(uuid)
    }

    pub fn as_uuid(&self) -> Uuid {
        self.0
    }
}

impl fmt::Display for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl FromStr for RunId {
    type Err = InvalidRunId;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        Uuid::parse_str(value.trim())
            .map(Self)
            .map_err(|_| InvalidRunId {
                value: value.chars().take(80).collect(),
            })
    }
}

/// A run id that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid run id {value:?}: expected a UUID such as 0192e4b0-7c1a-7d2e-9f00-3b5c6d7e8f90")]
pub struct InvalidRunId {
    pub value: String,
}

impl InvalidRunId {
    pub fn code(&self) -> &'static str {
        "invalid_run_id"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_id_parse_errors_name_the_value() {
        let err = "not-a-uuid".parse::<RunId>().unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid run id \"not-a-uuid\": expected a UUID such as 0192e4b0-7c1a-7d2e-9f00-3b5c6d7e8f90"
        );
        let id = RunId::generate();
        assert_eq!(id.to_string().parse::<RunId>().unwrap(), id);
    }
}
