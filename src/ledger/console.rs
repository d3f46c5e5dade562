//! Read side for the web console (`control::console`): runs searched by
//! task, run id and status; operations filtered by status, tool, upstream,
//! run and age; the counts of the overview (operations by status, lease
//! takeovers). Each is one read-only statement, no locks, a committed
//! snapshot; every one is scoped to one tenant when given (`Some`), and a
//! run or operation of another tenant is never returned.
//!
//! # Invariants
//!
//! 1. Reads only: nothing here writes, so a crash anywhere loses nothing.
//! 2. Lists are bounded (`LIST_LIMIT` rows, newest first); the page says so
//!    when the bound was reached.
//! 3. Never the lease secret: only owner, epoch and expiry leave here.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::FromRow;
use uuid::Uuid;

use super::operation_rows::TableRow;
use super::{Ledger, LedgerError, OperationRecord, RunId};

/// At most this many rows per list (the literal in the statements).
pub const LIST_LIMIT: i64 = 200;

/// What a run search asks for; `None` fields do not filter.
#[derive(Debug, Clone, Default)]
pub struct RunSearch<'a> {
    pub tenant: Option<&'a str>,
    /// Substring of the task id (case-sensitive).
    pub task: Option<&'a str>,
    pub run_id: Option<RunId>,
    /// A run status (`pending`, `running`, …).
    pub status: Option<&'a str>,
}

/// One row of the runs list.
#[derive(Debug, Clone, Serialize, FromRow)]
pub struct RunRowSummary {
    pub run_id: Uuid,
    pub tenant_id: String,
    pub task_id: String,
    pub attempt: i32,
    pub status: String,
    pub revision: i64,
    pub updated_at: DateTime<Utc>,
    pub lease_owner: Option<String>,
    pub lease_epoch: i64,
    pub lease_expires_at: DateTime<Utc>,
    pub lease_expired: bool,
    /// Its operations: all, and those `unknown`.
    pub operations: i64,
    pub unknown: i64,
}

/// What an operation filter asks for; `None` fields do not filter.
#[derive(Debug, Clone, Default)]
pub struct OperationSearch<'a> {
    pub tenant: Option<&'a str>,
    pub status: Option<&'a str>,
    /// Exposed tool name, exact.
    pub tool: Option<&'a str>,
    /// The upstream the registrar routed it to, exact.
    pub upstream: Option<&'a str>,
    pub run_id: Option<RunId>,
    /// Only operations unchanged for at least this many seconds.
    pub older_than_seconds: Option<i64>,
}

/// One row of the operations list.
#[derive(Debug, Clone)]
pub struct OperationRowSummary {
    pub operation: OperationRecord,
    pub updated_at: DateTime<Utc>,
    /// Seconds since it last changed (database clock).
    pub age_seconds: f64,
}

#[derive(Debug, FromRow)]
struct WithAge {
    #[sqlx(flatten)]
    row: TableRow,
    age_seconds: f64,
}

/// The ledger's part of the overview.
#[derive(Debug, Clone, Serialize)]
pub struct ConsoleCounts {
    /// (status, count) for every status that has operations.
    pub operations_by_status: Vec<(String, i64)>,
    /// (status, count) of runs.
    pub runs_by_status: Vec<(String, i64)>,
    /// Lease takeovers (an expired lease taken by another owner) recorded in
    /// the last hour.
    pub takeovers_last_hour: i64,
}

impl Ledger {
    /// Runs matching `search`, most recently changed first, at most
    /// [`LIST_LIMIT`].
    pub async fn console_runs(
        &self,
        search: &RunSearch<'_>,
    ) -> Result<Vec<RunRowSummary>, LedgerError> {
        const SQL: &str = "SELECT r.run_id, r.tenant_id, r.task_id, r.attempt, r.status, r.revision, r.updated_at,
                    l.owner AS lease_owner, l.epoch AS lease_epoch, l.expires_at AS lease_expires_at,
                    l.expires_at <= clock_timestamp() AS lease_expired,
                    (SELECT count(*) FROM tool_operations o WHERE o.run_id = r.run_id) AS operations,
                    (SELECT count(*) FROM tool_operations o
                      WHERE o.run_id = r.run_id AND o.status = 'unknown') AS unknown
               FROM agent_runs r JOIN worker_leases l ON l.run_id = r.run_id
              WHERE ($1::text IS NULL OR r.tenant_id = $1)
                AND ($2::text IS NULL OR strpos(r.task_id, $2) > 0)
                AND ($3::uuid IS NULL OR r.run_id = $3)
                AND ($4::text IS NULL OR r.status = $4)
              ORDER BY r.updated_at DESC, r.run_id
              LIMIT 200";
        self.invoke_all("console_runs", false, || {
            sqlx::query_as(SQL)
                .bind(search.tenant)
                .bind(search.task)
                .bind(search.run_id.map(|r| r.as_uuid()))
                .bind(search.status)
        })
        .await
    }

    /// Operations matching `search`, most recently changed first, at most
    /// [`LIST_LIMIT`].
    pub async fn console_operations(
        &self,
        search: &OperationSearch<'_>,
    ) -> Result<Vec<OperationRowSummary>, LedgerError> {
        const CALL: &str = "console_operations";
        const SQL: &str = "SELECT o.*, extract(epoch FROM clock_timestamp() - o.updated_at)::float8 AS age_seconds
               FROM tool_operations o JOIN agent_runs r ON r.run_id = o.run_id
              WHERE ($1::text IS NULL OR r.tenant_id = $1)
                AND ($2::text IS NULL OR o.status = $2)
                AND ($3::text IS NULL OR o.tool_name = $3)
                AND ($4::text IS NULL OR o.upstream = $4)
                AND ($5::uuid IS NULL OR o.run_id = $5)
                AND ($6::bigint IS NULL
                     OR o.updated_at <= clock_timestamp() - $6 * interval '1 second')
              ORDER BY o.updated_at DESC, o.operation_id
              LIMIT 200";
        let rows: Vec<WithAge> = self
            .invoke_all(CALL, false, || {
                sqlx::query_as(SQL)
                    .bind(search.tenant)
                    .bind(search.status)
                    .bind(search.tool)
                    .bind(search.upstream)
                    .bind(search.run_id.map(|r| r.as_uuid()))
                    .bind(search.older_than_seconds)
            })
            .await?;
        rows.into_iter()
            .map(|with| {
                Ok(OperationRowSummary {
                    operation: with.row.record(CALL, &self.options.bodies)?,
                    updated_at: with.row.updated_at,
                    age_seconds: with.age_seconds,
                })
            })
            .collect()
    }

    /// The overview's counts from the ledger.
    pub async fn console_counts(&self, tenant: Option<&str>) -> Result<ConsoleCounts, LedgerError> {
        let operations_by_status: Vec<(String, i64)> = self
            .invoke_all("console_operation_counts", false, || {
                sqlx::query_as(
                    "SELECT o.status, count(*) FROM tool_operations o
                       JOIN agent_runs r ON r.run_id = o.run_id
                      WHERE ($1::text IS NULL OR r.tenant_id = $1)
                      GROUP BY o.status ORDER BY o.status",
                )
                .bind(tenant)
            })
            .await?;
        let runs_by_status: Vec<(String, i64)> = self
            .invoke_all("console_run_counts", false, || {
                sqlx::query_as(
                    "SELECT r.status, count(*) FROM agent_runs r
                      WHERE ($1::text IS NULL OR r.tenant_id = $1)
                      GROUP BY r.status ORDER BY r.status",
                )
                .bind(tenant)
            })
            .await?;
        let (takeovers_last_hour,): (i64,) = self
            .invoke("console_takeovers", false, || {
                sqlx::query_as(
                    "SELECT count(*) FROM ledger_events e JOIN agent_runs r ON r.run_id = e.run_id
                      WHERE ($1::text IS NULL OR r.tenant_id = $1)
                        AND e.subject = 'lease' AND e.from_status = 'expired'
                        AND e.to_status = 'held'
                        AND e.at > clock_timestamp() - interval '1 hour'",
                )
                .bind(tenant)
            })
            .await?;
        Ok(ConsoleCounts {
            operations_by_status,
            runs_by_status,
            takeovers_last_hour,
        })
    }
}

impl Ledger {
    /// How many of an operation's same-key retry budget the reconciler has
    /// spent (`None`: no such operation).
    pub async fn console_reconcile_attempts(
        &self,
        operation_id: &crate::intent::OperationId,
    ) -> Result<Option<i32>, LedgerError> {
        let row: Option<(i32,)> = self
            .invoke_optional("console_reconcile_attempts", false, || {
                sqlx::query_as(
                    "SELECT reconcile_attempts FROM tool_operations WHERE operation_id = $1",
                )
                .bind(operation_id.as_str())
            })
            .await?;
        Ok(row.map(|(attempts,)| attempts))
    }
}
