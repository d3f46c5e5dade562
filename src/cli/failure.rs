//! How a failed command is told to the operator. A ledger that cannot be
//! opened is told apart ([`ledger_refusal`]): unreachable, login refused,
//! database missing, schema missing, role not granted, an invalid URL,
//! each with the URL tried, where it came from, its fix and its exit code
//! (6, 7, 8, 9, 15 and 2: `control::ErrorCode`). A private PostgreSQL cluster that cannot be
//! provided exits 10 (no binaries) or 11 (not started); any other failure
//! prints its error chain once and exits 1.

use std::process::ExitCode;

use crate::config::DatabaseUrl;
use crate::control::{ErrorCode, exit};
use crate::embedded::EmbeddedError;
use crate::ledger::{ConnectFailure, LedgerError};

/// Prints why `error` ended a command (`database`: the ledger's URL, once
/// the command knew it) and returns the process's exit code.
pub fn failed(error: &anyhow::Error, database: Option<&DatabaseUrl>) -> ExitCode {
    let (message, code) = described(error, database);
    eprintln!("leasegate: {message}");
    code
}

/// What [`failed`] says of `error`, and the exit code.
pub fn described(error: &anyhow::Error, database: Option<&DatabaseUrl>) -> (String, ExitCode) {
    // A ledger that cannot be opened: say which and how to fix it.
    let refusal = database.and_then(|database| {
        error
            .chain()
            .find_map(|cause| cause.downcast_ref::<LedgerError>())
            .filter(|ledger| ledger.connect_failure().is_some())
            .map(|ledger| ledger_refusal(ledger, database))
    });
    let private = error
        .chain()
        .find_map(|cause| cause.downcast_ref::<EmbeddedError>());
    match (refusal, private) {
        (Some((code, message)), _) => (
            format!("{message} ({code})"),
            ExitCode::from(code.exit_code()),
        ),
        (None, Some(private)) => {
            let default = database.map_or_else(String::new, |d| d.url.clone());
            (
                format!(
                    "no database is configured and nothing answers at the default ({default}); \
                     {private}"
                ),
                ExitCode::from(if private.is_no_binaries() {
                    exit::NO_POSTGRES_BINARIES
                } else {
                    exit::PRIVATE_POSTGRES_FAILED
                }),
            )
        }
        (None, None) => (error_chain(error), ExitCode::FAILURE),
    }
}

/// What to tell an operator when the ledger at `database` cannot be
/// opened: the error code (and so the exit code) and a message that says
/// which URL was tried, where it came from, and what fixes it.
pub fn ledger_refusal(error: &LedgerError, database: &DatabaseUrl) -> (ErrorCode, String) {
    let Some(connect) = error.connect_failure() else {
        return (
            ErrorCode::LedgerUnavailable,
            format!("the ledger database is unavailable: {error}"),
        );
    };
    let source = &database.source;
    let target = &connect.target;
    let fix = match connect.failure {
        ConnectFailure::InvalidUrl => format!(
            "the URL came from {source}; write it as postgres://user[:password]@host:port/database"
        ),
        ConnectFailure::Unreachable => {
            // With no URL given, a silent default starts the private cluster
            // itself: the hint is for a URL someone chose.
            let private = if matches!(source, crate::config::DatabaseUrlSource::Default) {
                ""
            } else {
                ", or give no URL at all: with none configured and no server at the default, \
                 leasegate starts a private PostgreSQL of its own (PostgreSQL's programs must be \
                 installed)"
            };
            format!(
                "the URL came from {source}. Start PostgreSQL there (e.g. `sudo systemctl start \
                 postgresql`, or `pg_ctlcluster <version> main start`), or point --database-url \
                 (or LEASEGATE_DATABASE_URL, or database_url in --config) at a server that runs{private}"
            )
        }
        ConnectFailure::AuthenticationFailed => format!(
            "the URL came from {source}. Check the user and password in it, or the server's \
             pg_hba.conf"
        ),
        ConnectFailure::DatabaseMissing => format!(
            "the database does not exist; the URL came from {source}. `leasegate migrate \
             --database-url {target}` creates the database and the ledger in it"
        ),
        ConnectFailure::SchemaMissing => format!(
            "the URL came from {source}. Run `leasegate migrate --database-url {target}` to \
             create the ledger there, or point --database-url at the database that holds it"
        ),
        ConnectFailure::RoleNotGranted => format!(
            "the URL came from {source}. Operator acts (ops resolve, ops retry, ops \
             failover-resolve, runs cancel, tokens, secrets rotate) run as the database role \
             leasegate_operator, every other command as leasegate_app (docs/operating.md)"
        ),
    };
    (
        ErrorCode::from(connect.failure),
        format!("{connect}; {fix}"),
    )
}

/// The error and its causes on one line, without repeating a cause that the
/// message before it already quotes.
fn error_chain(error: &anyhow::Error) -> String {
    let mut line = error.to_string();
    for cause in error.chain().skip(1) {
        let cause = cause.to_string();
        if !line.contains(&cause) {
            line.push_str(": ");
            line.push_str(&cause);
        }
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::exit;

    /// A refused login cannot be provoked against the test server (its
    /// pg_hba.conf trusts 127.0.0.1), so its SQLSTATEs are checked here.
    #[test]
    fn each_connect_failure_has_its_code_exit_code_and_fix() {
        use crate::config::DatabaseUrlSource;
        use crate::ledger::ConnectError;
        let database = DatabaseUrl {
            url: "postgres://app:secret@db:5432/leasegate".into(),
            source: DatabaseUrlSource::Env,
        };
        let refusal = |failure| {
            ledger_refusal(
                &LedgerError::Connect(ConnectError {
                    failure,
                    target: crate::ledger::redacted_url(&database.url),
                    detail: "detail".into(),
                }),
                &database,
            )
        };
        for (sqlstate, failure, code, exit, needles) in [
            (
                "28P01",
                ConnectFailure::AuthenticationFailed,
                "database_auth_failed",
                7,
                &[
                    "PostgreSQL refused the login at postgres://app@db:5432/leasegate: detail",
                    "Check the user and password",
                ][..],
            ),
            (
                "28000",
                ConnectFailure::AuthenticationFailed,
                "database_auth_failed",
                7,
                &["refused the login"][..],
            ),
            (
                "3D000",
                ConnectFailure::DatabaseMissing,
                "database_missing",
                8,
                &[
                    "does not exist",
                    "`leasegate migrate --database-url postgres://app@db:5432/leasegate` creates",
                    "the database does not exist",
                ][..],
            ),
            (
                "57P03",
                ConnectFailure::Unreachable,
                "ledger_unavailable",
                6,
                &["no PostgreSQL server answers", "Start PostgreSQL"][..],
            ),
        ] {
            assert_eq!(
                ConnectFailure::of_sqlstate(sqlstate),
                Some(failure),
                "{sqlstate}"
            );
            let (error_code, message) = refusal(failure);
            assert_eq!((error_code.as_str(), error_code.exit_code()), (code, exit));
            assert!(
                message.contains("the URL came from LEASEGATE_DATABASE_URL"),
                "{message}"
            );
            assert!(!message.contains("secret"), "{message}");
            for needle in needles {
                assert!(
                    message.contains(needle),
                    "{needle:?} missing from {message}"
                );
            }
        }
        assert_eq!(ConnectFailure::of_sqlstate("42P01"), None);
        let (code, message) = refusal(ConnectFailure::SchemaMissing);
        assert_eq!((code.as_str(), code.exit_code()), ("schema_missing", 9));
        assert!(message.contains("holds no leasegate ledger"), "{message}");
        let (code, _) = refusal(ConnectFailure::InvalidUrl);
        assert_eq!(code.exit_code(), exit::INVALID_INPUT);
    }

    #[test]
    fn passwords_are_redacted_from_urls() {
        use crate::ledger::redacted_url;
        assert_eq!(
            redacted_url("postgres://u:p@ss@h:1/d?sslmode=require"),
            "postgres://u@h:1/d?sslmode=require"
        );
        assert_eq!(redacted_url("postgres://u@h/d"), "postgres://u@h/d");
        assert_eq!(redacted_url("garbage"), "garbage");
    }
}
