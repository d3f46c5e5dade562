//! Retention: the settled history of terminal runs older
//! than a window leaves the live tables in bounded batches
//! (`sql/retention.sql`, `operations_archive`; tables in migration 0009), so
//! the cost of a gated call and of the background scans does not grow with
//! the ledger's age. Runs as the operator role (`leasegate ops archive`).
//!
//! # Invariants
//!
//! 1. Only terminal runs whose every operation is settled (succeeded,
//!    failed_final, cancelled) and unchanged for the window are touched:
//!    nothing live, prepared, dispatching or unknown ever moves.
//! 2. Archived operations stay answerable: `operation_get` reads the
//!    archive when the live table has no such operation (`archived`).
//!    With `delete` they are gone for good (the fate query answers "not
//!    found").
//!
//! # Failure handling
//!
//! One batch is one transaction: a crash leaves the batch wholly moved or
//! untouched; the next run of the command carries on.

use super::{Ledger, LedgerError};

/// What one archive batch moved (or deleted).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, sqlx::FromRow, serde::Serialize)]
pub struct ArchiveBatch {
    pub runs: i64,
    pub operations: i64,
    pub evidence: i64,
    pub events: i64,
}

/// The most runs one batch takes (the SQL function's bound).
pub const MAX_ARCHIVE_BATCH: i32 = 10_000;

impl Ledger {
    /// One batch of retention: up to `batch` runs (see the module docs)
    /// whose history is older than `older_than_ms`, moved to the archive
    /// tables, or deleted when `delete`. `tenant`: only that tenant's runs
    /// (`None`: any). Zero runs means nothing is left to do.
    pub async fn operations_archive(
        &self,
        older_than_ms: i64,
        batch: i32,
        delete: bool,
        tenant: Option<&str>,
    ) -> Result<ArchiveBatch, LedgerError> {
        const CALL: &str = "operations_archive";
        if older_than_ms <= 0 {
            return Err(super::InvalidInput::Request(format!(
                "the archive window must be > 0 ms, got {older_than_ms} ms"
            ))
            .into());
        }
        if !(1..=MAX_ARCHIVE_BATCH).contains(&batch) {
            return Err(super::InvalidInput::Request(format!(
                "an archive batch is 1 to {MAX_ARCHIVE_BATCH} runs, got {batch}"
            ))
            .into());
        }
        self.invoke(CALL, true, || {
            sqlx::query_as("SELECT * FROM operations_archive($1, $2, $3, $4)")
                .bind(older_than_ms)
                .bind(batch)
                .bind(delete)
                .bind(tenant)
        })
        .await
    }
}
