//! What a configuration error says: the file it is about, the message
//! (which names the field), and the kind of problem, which is `leasegate
//! check-config`'s exit code. Every section's validation returns these.

use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
#[error("{}: {message}", file.display())]
pub struct ConfigError {
    pub file: PathBuf,
    pub message: String,
    /// What kind of problem (`leasegate check-config`'s exit code).
    pub problem: Problem,
}

/// What is wrong with a configuration, each with its own `leasegate
/// check-config` exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Problem {
    /// The file cannot be read or parsed, or a field has a bad value (exit 1).
    Invalid,
    /// A stdio upstream's command is not found or not executable (exit 12).
    Command,
    /// `database_url` is not a PostgreSQL URL (exit 13).
    DatabaseUrl,
    /// Timeouts out of order: a claim shorter than the call it covers
    /// (exit 14).
    Timeouts,
}

impl Problem {
    /// `leasegate check-config`'s exit code for it (docs/operating.md).
    pub fn exit_code(self) -> u8 {
        match self {
            Problem::Invalid => 1,
            Problem::Command => 12,
            Problem::DatabaseUrl => 13,
            Problem::Timeouts => 14,
        }
    }
}

impl ConfigError {
    /// A bad value in `file` ([`Problem::Invalid`]).
    pub(super) fn new(file: &Path, message: impl Into<String>) -> Self {
        Self {
            file: file.to_owned(),
            message: message.into(),
            problem: Problem::Invalid,
        }
    }

    /// A problem of its own kind (and exit code) in `file`.
    pub(super) fn of(problem: Problem, file: &Path, message: impl Into<String>) -> Self {
        Self {
            problem,
            ..Self::new(file, message)
        }
    }
}
