//! Identities shared by every layer (docs/concepts.md).

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

/// Longest owner (and actor) accepted anywhere.
pub const MAX_OWNER_LEN: usize = 200;
/// Longest tenant id.
pub const MAX_TENANT_LEN: usize = 128;
/// Longest task id (also a session task key).
pub const MAX_TASK_LEN: usize = 256;
/// Longest step id a client names.
pub const MAX_STEP_ID_LEN: usize = 512;
/// Longest idempotency key (lease mode `key`; its task id is
/// `idempotency-key:<principal>:<key>`, within [`MAX_TASK_LEN`]).
pub const MAX_IDEMPOTENCY_KEY_LEN: usize = 200;

/// A client-chosen identifier (owner, tenant, task, step, idempotency key,
/// actor) that is empty, too long or holds a character outside the
/// identifier set.
///
/// The set is visible ASCII, `!` to `~`: no spaces, no control characters
/// (which would forge log lines or HTTP headers), nothing beyond ASCII
/// (look-alike characters would make two ids that read the same). The
/// tables hold tenants, task ids and lease owners to it as well
/// (`migrations/0006_identifiers.sql`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidIdentifier {
    #[error("{field} must be 1 to {max} characters, got {len}")]
    Length {
        field: &'static str,
        len: usize,
        max: usize,
    },
    #[error(
        "{field}: character {character:?} at position {position} is not allowed: identifiers \
         are visible ASCII characters ('!' to '~'), without spaces"
    )]
    Character {
        field: &'static str,
        position: usize,
        character: char,
    },
}

impl InvalidIdentifier {
    pub fn code(&self) -> &'static str {
        "invalid_input"
    }

    /// The field it is about.
    pub fn field(&self) -> &'static str {
        match self {
            InvalidIdentifier::Length { field, .. }
            | InvalidIdentifier::Character { field, .. } => field,
        }
    }
}

/// Checks a client-chosen identifier: 1 to `max` characters, each of them
/// visible ASCII (see [`InvalidIdentifier`]).
pub fn check_identifier(
    field: &'static str,
    value: &str,
    max: usize,
) -> Result<(), InvalidIdentifier> {
    let len = value.chars().count();
    if len == 0 || len > max {
        return Err(InvalidIdentifier::Length { field, len, max });
    }
    if let Some((position, character)) = value
        .chars()
        .enumerate()
        .find(|(_, c)| !c.is_ascii_graphic())
    {
        return Err(InvalidIdentifier::Character {
            field,
            position,
            character,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_are_bounded_visible_ascii() {
        assert!(check_identifier("owner", "worker-1:session@host/a+b=c", 200).is_ok());
        assert!(check_identifier("owner", &"x".repeat(200), 200).is_ok());
        assert_eq!(
            check_identifier("owner", &"x".repeat(10_240), 200),
            Err(InvalidIdentifier::Length {
                field: "owner",
                len: 10_240,
                max: 200
            })
        );
        assert!(matches!(
            check_identifier("owner", "", 200),
            Err(InvalidIdentifier::Length { len: 0, .. })
        ));
        for bad in ["a b", "a\nb", "a\u{0}b", "caf\u{e9}", "\u{202e}x", "tab\t"] {
            assert!(
                matches!(
                    check_identifier("task_id", bad, 256),
                    Err(InvalidIdentifier::Character {
                        field: "task_id",
                        ..
                    })
                ),
                "{bad:?}"
            );
        }
        assert_eq!(
            check_identifier("owner", "ab c", 200)
                .unwrap_err()
                .to_string(),
            "owner: character ' ' at position 2 is not allowed: identifiers are visible ASCII \
             characters ('!' to '~'), without spaces"
        );
    }

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
