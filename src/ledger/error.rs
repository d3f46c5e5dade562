//! Errors of the ledger layer, classified by what the caller may conclude.
//!
//! Expected rejections (lease lost, conflict, busy, terminal, not found) are
//! not errors: they are [`super::Rejection`] / [`super::AcquireOutcome`]
//! values. What is left here is bad input (caught before anything is sent),
//! and failures of the database or the connection, each with a
//! [`Delivery`] that says whether the write may have committed.

/// Input the ledger refuses before sending anything.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidInput {
    #[error("{what} must be > 0 ms, got {ttl_ms} ms")]
    TtlNotPositive { what: &'static str, ttl_ms: i64 },
    #[error("{what} {ttl_ms} ms is above the ceiling of {ceiling_ms} ms")]
    TtlAboveCeiling {
        what: &'static str,
        ttl_ms: i64,
        ceiling_ms: i64,
    },
    /// Any other request the ledger refuses before sending it.
    #[error("{0}")]
    Request(String),
    #[error(transparent)]
    RunId(#[from] crate::ids::InvalidRunId),
    /// Free text (a failover resolution's reason) that is empty or too long.
    #[error("{field} must be 1 to {max} characters, got {len}")]
    TextLength {
        field: &'static str,
        len: usize,
        max: usize,
    },
    /// An owner, tenant, task id or actor that is empty, too long or
    /// holds a character outside the identifier set (`ids::check_identifier`).
    #[error(transparent)]
    Identifier(#[from] crate::ids::InvalidIdentifier),
}

impl InvalidInput {
    /// A stable name for API error codes.
    pub fn code(&self) -> &'static str {
        match self {
            InvalidInput::TtlNotPositive { .. } | InvalidInput::TtlAboveCeiling { .. } => {
                "invalid_ttl"
            }
            InvalidInput::RunId(invalid) => invalid.code(),
            InvalidInput::TextLength { .. }
            | InvalidInput::Identifier(_)
            | InvalidInput::Request(_) => "invalid_input",
        }
    }
}

/// Whether a failed call may have changed the ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// Nothing reached the database (bad input, no connection).
    NotSent,
    /// The database answered with an error: the transaction rolled back.
    NotApplied,
    /// The connection broke after the statement was sent, possibly during
    /// COMMIT. Read the ledger back before the next step.
    Unknown,
}

#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    #[error(transparent)]
    InvalidInput(#[from] InvalidInput),

    /// No connection could be had; nothing was sent.
    #[error("ledger unavailable for {call}: {source}")]
    Unavailable {
        call: &'static str,
        #[source]
        source: sqlx::Error,
    },

    /// The statement was sent and the connection broke before the answer:
    /// the transaction may or may not have committed.
    #[error("outcome unknown: read back ({call}: {source})")]
    OutcomeUnknown {
        call: &'static str,
        #[source]
        source: sqlx::Error,
    },

    /// Serialization failures or deadlocks kept aborting the transaction.
    #[error("{call} aborted {attempts} times (SQLSTATE {sqlstate}); retry budget spent")]
    RetryBudgetSpent {
        call: &'static str,
        attempts: u32,
        sqlstate: String,
    },

    /// The database refused the statement; nothing was committed.
    #[error("{call} failed: {source}")]
    Database {
        call: &'static str,
        #[source]
        source: sqlx::Error,
    },

    /// The database answered something this build does not understand
    /// (e.g. a migration newer than the binary).
    #[error("{call}: unexpected answer from the database: {detail}")]
    Protocol { call: &'static str, detail: String },

    /// A body could not be sealed before it was sent (nothing was written)
    /// or opened after it was read (`operation_id` names the row): a key
    /// missing, a different key under its id, an altered row. Never
    /// answered with the plaintext or a placeholder instead.
    #[error("stored body of operation {operation_id}: {source}")]
    Sealed {
        operation_id: String,
        #[source]
        source: crate::policy::secrets::SecretsError,
        /// Whether the ledger call had run (an opening failure) or not
        /// (a sealing failure).
        after_call: bool,
    },

    #[error("migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),

    /// The ledger could not be opened; [`ConnectFailure`] says why.
    #[error(transparent)]
    Connect(#[from] ConnectError),
}

/// Why the ledger database could not be opened: each has its own fix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectFailure {
    /// The URL does not parse; nothing was tried.
    InvalidUrl,
    /// No PostgreSQL answered: connection refused, name not resolved,
    /// timed out.
    Unreachable,
    /// The server refused the login (SQLSTATE 28P01, 28000).
    AuthenticationFailed,
    /// The server has no database of that name (SQLSTATE 3D000).
    DatabaseMissing,
    /// The database answered but holds no ledger (tables, functions or the
    /// application role missing): it was never migrated.
    SchemaMissing,
    /// The login may not become the role the sessions need
    /// ([`super::LedgerOptions::session_role`]): it is not a member of
    /// `leasegate_app` (the proxy) or `leasegate_operator` (operator acts).
    RoleNotGranted,
}

impl ConnectFailure {
    /// The failure a driver error of the connect phase means, if it is
    /// one of the kinds told apart (others stay plain database errors).
    pub(crate) fn of(error: &sqlx::Error) -> Option<ConnectFailure> {
        match error {
            sqlx::Error::Configuration(_) => Some(ConnectFailure::InvalidUrl),
            sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut => Some(ConnectFailure::Unreachable),
            sqlx::Error::Database(db) => db.code().as_deref().and_then(Self::of_sqlstate),
            _ => None,
        }
    }

    /// The failure a SQLSTATE of the connect phase means.
    pub fn of_sqlstate(code: &str) -> Option<ConnectFailure> {
        match code {
            "28P01" | "28000" => Some(ConnectFailure::AuthenticationFailed),
            "3D000" => Some(ConnectFailure::DatabaseMissing),
            // Server starting up, shutting down, or out of connection slots.
            "57P03" | "53300" => Some(ConnectFailure::Unreachable),
            _ => None,
        }
    }
}

/// The ledger database could not be opened. `target` is the URL without
/// its password, fit for messages and logs.
#[derive(Debug, thiserror::Error)]
#[error("{}", self.describe())]
pub struct ConnectError {
    pub failure: ConnectFailure,
    pub target: String,
    /// What the driver or the schema check said.
    pub detail: String,
}

impl ConnectError {
    fn describe(&self) -> String {
        let ConnectError {
            failure,
            target,
            detail,
        } = self;
        match failure {
            ConnectFailure::InvalidUrl => format!("the database URL is not valid: {detail}"),
            ConnectFailure::Unreachable => {
                format!("no PostgreSQL server answers at {target}: {detail}")
            }
            ConnectFailure::AuthenticationFailed => {
                format!("PostgreSQL refused the login at {target}: {detail}")
            }
            ConnectFailure::DatabaseMissing => {
                format!("PostgreSQL at {target} answered: {detail}")
            }
            ConnectFailure::SchemaMissing => {
                format!("{target} holds no leasegate ledger: {detail}")
            }
            ConnectFailure::RoleNotGranted => {
                format!("the login at {target} may not act as the role it needs: {detail}")
            }
        }
    }
}

/// `url` without its password (`postgres://user@host/db`), for messages.
pub fn redacted_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let Some((userinfo, host)) = authority.rsplit_once('@') else {
        return url.to_owned();
    };
    match userinfo.split_once(':') {
        Some((user, _password)) => format!("{scheme}://{user}@{host}{tail}"),
        None => url.to_owned(),
    }
}

impl LedgerError {
    pub fn delivery(&self) -> Delivery {
        match self {
            LedgerError::InvalidInput(_)
            | LedgerError::Unavailable { .. }
            | LedgerError::Connect(_) => Delivery::NotSent,
            LedgerError::OutcomeUnknown { .. } => Delivery::Unknown,
            LedgerError::RetryBudgetSpent { .. }
            | LedgerError::Database { .. }
            | LedgerError::Migrate(_) => Delivery::NotApplied,
            // The statement ran; what it did is not known to this build.
            LedgerError::Protocol { .. } => Delivery::Unknown,
            LedgerError::Sealed {
                after_call: false, ..
            } => Delivery::NotSent,
            // The call ran: read the operation back (with the right key).
            LedgerError::Sealed {
                after_call: true, ..
            } => Delivery::Unknown,
        }
    }

    /// What went wrong, in words an agent may read: never the database's
    /// own text (statements, line numbers, settings), which goes to the
    /// log beside it.
    pub fn summary(&self) -> &'static str {
        match self {
            LedgerError::InvalidInput(_) => "the ledger refused the input",
            LedgerError::Unavailable { .. } | LedgerError::Connect(_) => {
                "the ledger could not be reached"
            }
            LedgerError::OutcomeUnknown { .. } => {
                "the connection to the ledger broke before it answered"
            }
            LedgerError::RetryBudgetSpent { .. } => "the ledger was too busy to take the write",
            LedgerError::Database { source, .. } if session_broke(source) => {
                "the connection to the ledger broke"
            }
            LedgerError::Database { source, .. }
                if source
                    .as_database_error()
                    .and_then(|db| db.code())
                    .is_some_and(|code| code == "57014") =>
            {
                "the ledger did not answer in time"
            }
            LedgerError::Database { .. } | LedgerError::Migrate(_) => {
                "the ledger refused the write"
            }
            LedgerError::Protocol { .. } => "the ledger answered unexpectedly",
            LedgerError::Sealed { .. } => "a stored body could not be opened",
        }
    }

    /// Whether calling again may succeed without changing the input.
    pub fn is_retryable(&self) -> bool {
        match self {
            LedgerError::Unavailable { .. } | LedgerError::RetryBudgetSpent { .. } => true,
            LedgerError::Connect(error) => error.failure == ConnectFailure::Unreachable,
            _ => false,
        }
    }

    /// Whether the call failed because a connection broke or could not be
    /// had — the statement itself, the input and the server's set-up are
    /// not at fault, so the same call on a fresh connection may succeed:
    /// no connection ([`LedgerError::Unavailable`]), a session torn down
    /// with the statement in flight ([`LedgerError::OutcomeUnknown`], or a
    /// refusal whose SQLSTATE is 08xxx/57Pxx), aborts that used up their
    /// retries, and no server answering ([`ConnectFailure::Unreachable`]).
    ///
    /// Not once this process closed its own pool: it is stopping, and no
    /// connection will come.
    ///
    /// A write that failed this way may still have committed
    /// ([`LedgerError::delivery`]): only a call that is safe to repeat
    /// (a read, a liveness renewal, the migrations) may simply be sent
    /// again.
    pub fn is_transient(&self) -> bool {
        match self {
            LedgerError::Unavailable { source, .. }
            | LedgerError::OutcomeUnknown { source, .. } => !pool_closed(source),
            LedgerError::RetryBudgetSpent { .. } => true,
            LedgerError::Database { source, .. } => session_broke(source),
            LedgerError::Migrate(
                sqlx::migrate::MigrateError::Execute(source)
                | sqlx::migrate::MigrateError::ExecuteMigration(source, _),
            ) => session_broke(source),
            LedgerError::Connect(error) => error.failure == ConnectFailure::Unreachable,
            _ => false,
        }
    }

    /// Whether the session broke under the call, or none could be opened
    /// (not merely none free in time): the same call on a fresh session
    /// may succeed, and a write's outcome is to be read back
    /// ([`LedgerError::delivery`]).
    pub fn connection_lost(&self) -> bool {
        match self {
            LedgerError::OutcomeUnknown { source, .. } => !pool_closed(source),
            LedgerError::Unavailable { source, .. } => {
                session_broke(source) && !pool_closed(source)
            }
            _ => false,
        }
    }

    /// A call given up after `limit` without an answer (the caller's own
    /// time limit): the statement may have run, as with a lost connection.
    pub fn no_answer_within(call: &'static str, limit: std::time::Duration) -> LedgerError {
        LedgerError::OutcomeUnknown {
            call,
            source: sqlx::Error::Io(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no answer within {limit:?}"),
            )),
        }
    }

    /// Why the ledger could not be opened, when that is what happened.
    pub fn connect_failure(&self) -> Option<&ConnectError> {
        match self {
            LedgerError::Connect(error) => Some(error),
            _ => None,
        }
    }
}

/// How a driver error is handled by the retry loop.
pub(crate) enum ErrorClass {
    /// 40001 / 40P01: the short transaction was rolled back; run it again.
    RetryTransaction(String),
    /// The server refused the statement: rolled back, definite.
    Refused,
    /// The connection failed with the statement in flight.
    InFlight,
    /// A complete answer came back but does not decode: the statement ran.
    Undecodable,
}

pub(crate) fn classify(error: &sqlx::Error) -> ErrorClass {
    match error {
        sqlx::Error::Database(db) => match db.code().as_deref() {
            Some(code @ ("40001" | "40P01")) => ErrorClass::RetryTransaction(code.to_owned()),
            // The session is being torn down (administrator command, crash,
            // shutdown, connection failure): treat it like a lost connection.
            Some(code) if code.starts_with("08") || code.starts_with("57P") => ErrorClass::InFlight,
            _ => ErrorClass::Refused,
        },
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::PoolClosed => ErrorClass::InFlight,
        sqlx::Error::RowNotFound
        | sqlx::Error::ColumnNotFound(_)
        | sqlx::Error::ColumnDecode { .. }
        | sqlx::Error::Decode(_)
        | sqlx::Error::TypeNotFound { .. } => ErrorClass::Undecodable,
        _ => ErrorClass::Refused,
    }
}

/// Whether `error` says the session broke (the connection, or the server
/// tearing the session down) rather than that the statement was refused.
pub(crate) fn session_broke(error: &sqlx::Error) -> bool {
    matches!(classify(error), ErrorClass::InFlight)
}

/// The pool was closed by this process (it is shutting down).
fn pool_closed(error: &sqlx::Error) -> bool {
    matches!(error, sqlx::Error::PoolClosed)
}

/// The database answered something this build cannot read.
pub(super) fn protocol(call: &'static str, detail: impl Into<String>) -> LedgerError {
    LedgerError::Protocol {
        call,
        detail: detail.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn io() -> sqlx::Error {
        sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::ConnectionReset))
    }

    fn connect(failure: ConnectFailure) -> LedgerError {
        LedgerError::Connect(ConnectError {
            failure,
            target: "postgres://leasegate@127.0.0.1/leasegate".into(),
            detail: String::new(),
        })
    }

    #[test]
    fn only_what_a_fresh_connection_may_cure_is_transient() {
        let cured = [
            LedgerError::Unavailable {
                call: "c",
                source: sqlx::Error::PoolTimedOut,
            },
            LedgerError::OutcomeUnknown {
                call: "c",
                source: io(),
            },
            LedgerError::Database {
                call: "c",
                source: io(),
            },
            LedgerError::Migrate(sqlx::migrate::MigrateError::Execute(io())),
            connect(ConnectFailure::Unreachable),
        ];
        for error in &cured {
            assert!(error.is_transient(), "{error}");
        }
        let not_cured = [
            LedgerError::Unavailable {
                call: "c",
                source: sqlx::Error::PoolClosed,
            },
            LedgerError::Migrate(sqlx::migrate::MigrateError::VersionMismatch(1)),
            LedgerError::Protocol {
                call: "c",
                detail: "a migration newer than this build".into(),
            },
            connect(ConnectFailure::AuthenticationFailed),
            connect(ConnectFailure::DatabaseMissing),
            connect(ConnectFailure::SchemaMissing),
        ];
        for error in &not_cured {
            assert!(!error.is_transient(), "{error}");
        }
        // A pool with no free session in time is not a broken one.
        assert!(
            !LedgerError::Unavailable {
                call: "c",
                source: sqlx::Error::PoolTimedOut,
            }
            .connection_lost()
        );
        assert!(
            LedgerError::OutcomeUnknown {
                call: "c",
                source: io(),
            }
            .connection_lost()
        );
    }
}
