//! Liveness of leasegate processes (`sql/process.sql`): each process renews
//! a row under its owner name while it runs and marks it stopped at
//! shutdown, so that a claim whose holder is provably gone can be judged
//! before its deadline. A process that dies without retiring keeps its row
//! until the liveness lapses; nothing else is written here.

use chrono::{DateTime, Utc};

use super::{Ledger, LedgerError, MAX_OWNER_LEN, check_text};

impl Ledger {
    /// Records that the process `owner` is alive for `ttl_ms` more.
    pub async fn process_heartbeat(&self, owner: &str, ttl_ms: i64) -> Result<(), LedgerError> {
        const CALL: &str = "process_heartbeat";
        check_text("owner", owner, MAX_OWNER_LEN)?;
        let _: (DateTime<Utc>,) = self
            .invoke(CALL, true, || {
                sqlx::query_as("SELECT process_heartbeat($1, $2)")
                    .bind(owner)
                    .bind(ttl_ms)
            })
            .await?;
        Ok(())
    }

    /// Records that the process `owner` stopped: claims it still holds are
    /// those of a gone holder from now on.
    pub async fn process_retire(&self, owner: &str) -> Result<(), LedgerError> {
        const CALL: &str = "process_retire";
        let _: Option<(i32,)> = self
            .invoke_optional(CALL, true, || {
                sqlx::query_as("SELECT 1 FROM process_retire($1)").bind(owner)
            })
            .await?;
        Ok(())
    }

    /// Whether the claim holder `owner` is provably gone (its liveness
    /// lapsed); false when it is alive or unknown to the ledger.
    pub async fn process_gone(&self, owner: &str) -> Result<bool, LedgerError> {
        const CALL: &str = "process_gone";
        let (gone,): (bool,) = self
            .invoke(CALL, false, || {
                sqlx::query_as(
                    "SELECT EXISTS (SELECT 1 FROM leasegate_processes
                                     WHERE owner = $1 AND alive_until <= clock_timestamp())",
                )
                .bind(owner)
            })
            .await?;
        Ok(gone)
    }
}
