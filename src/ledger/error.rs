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
    #[error("{field} must be 1 to {max} characters, got {len}")]
    TextLength {
        field: &'static str,
        len: usize,
        max: usize,
    },
}

impl InvalidInput {
    /// A stable name for API error codes.
    pub fn code(&self) -> &'static str {
        match self {
            InvalidInput::TtlNotPositive { .. } | InvalidInput::TtlAboveCeiling { .. } => {
                "invalid_ttl"
            }
            InvalidInput::RunId(invalid) => invalid.code(),
            InvalidInput::TextLength { .. } | InvalidInput::Request(_) => "invalid_input",
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
    /// COMMIT. Read the ledger back before the next step (seed section 7).
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

    #[error("migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
}

impl LedgerError {
    pub fn delivery(&self) -> Delivery {
        match self {
            LedgerError::InvalidInput(_) | LedgerError::Unavailable { .. } => Delivery::NotSent,
            LedgerError::OutcomeUnknown { .. } => Delivery::Unknown,
            LedgerError::RetryBudgetSpent { .. }
            | LedgerError::Database { .. }
            | LedgerError::Migrate(_) => Delivery::NotApplied,
            // The statement ran; what it did is not known to this build.
            LedgerError::Protocol { .. } => Delivery::Unknown,
        }
    }

    /// Whether calling again may succeed without changing the input.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            LedgerError::Unavailable { .. } | LedgerError::RetryBudgetSpent { .. }
        )
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
