//! What the tests read back from the ledger's tables as the superuser
//! (bypassing the roles and fencing the application goes through): counts,
//! an operation's status by tool, a lease's expiry. Reads only; a test
//! arranges states through the ledger or its own SQL.

use leasegate::ledger::RunId;

use super::TestDb;

impl TestDb {
    /// How many rows `table` holds.
    pub async fn row_count(&self, table: &str) -> i64 {
        sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT count(*) FROM {table}")))
            .fetch_one(&self.admin)
            .await
            .unwrap_or_else(|e| panic!("count the rows of {table}: {e}"))
    }

    /// The status of the (first) operation that called `tool`, if there is one.
    pub async fn status_of_tool(&self, tool: &str) -> Option<String> {
        sqlx::query_scalar("SELECT status FROM tool_operations WHERE tool_name = $1")
            .bind(tool)
            .fetch_optional(&self.admin)
            .await
            .expect("read the operation's status")
    }

    /// Waits until the operation that called `tool` exists and has `status`.
    pub async fn wait_tool_status(&self, what: &str, tool: &str, status: &str) {
        super::wait_until(what, || async {
            (self.status_of_tool(tool).await.as_deref() == Some(status)).then_some(())
        })
        .await
    }

    /// When the run's lease expires, as the lease row says.
    pub async fn lease_expiry(&self, run_id: RunId) -> chrono::DateTime<chrono::Utc> {
        sqlx::query_scalar("SELECT expires_at FROM worker_leases WHERE run_id = $1")
            .bind(run_id.as_uuid())
            .fetch_one(&self.admin)
            .await
            .expect("read the lease's expiry")
    }
}
