//! One queued settle and its batch: `CALL
//! operation_settle_acknowledged_batch`, each item's verdict in item order
//! with the WAL position the commit left (a batch of one is the single
//! statement).

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::FromRow;
use sqlx::types::Json;
use uuid::Uuid;

use super::{Call, Flush, ItemAnswer, in_item_order};
use crate::ledger::durability::WalColumns;
use crate::ledger::operation_rows::SettleRow;
use crate::ledger::{Ledger, LedgerError};

/// One queued settle (the single call's arguments, the result as stored).
#[derive(Debug)]
pub(in crate::ledger) struct SettleItem {
    operation_id: String,
    dispatch_owner: String,
    expected_revision: i64,
    request_digest: String,
    status: &'static str,
    remote_id: Option<String>,
    result: Value,
}

impl SettleItem {
    fn args(&self) -> SettleArgs<'_> {
        SettleArgs {
            operation_id: &self.operation_id,
            dispatch_owner: &self.dispatch_owner,
            expected_revision: self.expected_revision,
            request_digest: &self.request_digest,
            status: self.status,
            remote_id: self.remote_id.as_deref(),
            result: &self.result,
        }
    }
}

/// The arguments of one settle (the result as stored), borrowed: sent as
/// a statement of its own ([`SettleArgs::alone`]) or queued for a batch.
pub(in crate::ledger) struct SettleArgs<'a> {
    pub(in crate::ledger) operation_id: &'a str,
    pub(in crate::ledger) dispatch_owner: &'a str,
    pub(in crate::ledger) expected_revision: i64,
    pub(in crate::ledger) request_digest: &'a str,
    pub(in crate::ledger) status: &'static str,
    pub(in crate::ledger) remote_id: Option<&'a str>,
    pub(in crate::ledger) result: &'a Value,
}

impl Call for SettleArgs<'_> {
    type Batch = SettleBatch;

    /// One `CALL operation_settle_acknowledged` of its own.
    async fn alone(&self, ledger: &Ledger) -> Result<SettleRow, LedgerError> {
        ledger
            .invoke("operation_settle", true, || {
                sqlx::query_as("CALL operation_settle_acknowledged($1, $2, $3, $4, $5, $6, $7)")
                    .bind(self.operation_id)
                    .bind(self.dispatch_owner)
                    .bind(self.expected_revision)
                    .bind(self.request_digest)
                    .bind(self.status)
                    .bind(self.remote_id)
                    .bind(Json(self.result))
            })
            .await
    }

    fn queued(&self) -> SettleItem {
        SettleItem {
            operation_id: self.operation_id.to_owned(),
            dispatch_owner: self.dispatch_owner.to_owned(),
            expected_revision: self.expected_revision,
            request_digest: self.request_digest.to_owned(),
            status: self.status,
            remote_id: self.remote_id.map(str::to_owned),
            result: self.result.clone(),
        }
    }
}

/// One element of `operation_settle_acknowledged_batch`'s verdicts.
#[derive(Debug, serde::Deserialize)]
struct SettleVerdict {
    item: i32,
    error_sqlstate: Option<String>,
    outcome: Option<String>,
    db_now: Option<DateTime<Utc>>,
    operation_id: Option<String>,
    run_id: Option<Uuid>,
    step_id: Option<String>,
    effect_version: Option<i32>,
    tool_name: Option<String>,
    request_digest: Option<String>,
    status: Option<String>,
    revision: Option<i64>,
    dispatch_owner: Option<String>,
    dispatch_until: Option<DateTime<Utc>>,
    dispatch_count: Option<i32>,
    remote_id: Option<String>,
    evidence_id: Option<i64>,
    upstream: Option<String>,
    upstream_tool: Option<String>,
}

#[derive(Debug, FromRow)]
struct SettleBatchRow {
    verdicts: Json<Vec<SettleVerdict>>,
    #[sqlx(flatten)]
    wal: WalColumns,
}

/// `CALL operation_settle_acknowledged_batch` (`group/mod.rs`).
#[derive(Debug)]
pub(in crate::ledger) struct SettleBatch;

impl Flush for SettleBatch {
    type Item = SettleItem;
    type Answer = SettleRow;
    const CALL: &'static str = "operation_settle_batch";

    async fn flush(
        ledger: &Ledger,
        items: &[SettleItem],
    ) -> Result<Vec<ItemAnswer<SettleRow>>, LedgerError> {
        if let [item] = items {
            // A batch of one: the single procedure's statement.
            let row = item.args().alone(ledger).await?;
            return Ok(vec![ItemAnswer::Verdict(row)]);
        }
        let ids: Vec<&str> = items.iter().map(|i| i.operation_id.as_str()).collect();
        let owners: Vec<&str> = items.iter().map(|i| i.dispatch_owner.as_str()).collect();
        let revisions: Vec<i64> = items.iter().map(|i| i.expected_revision).collect();
        let digests: Vec<&str> = items.iter().map(|i| i.request_digest.as_str()).collect();
        let statuses: Vec<&str> = items.iter().map(|i| i.status).collect();
        let remote_ids: Vec<Option<&str>> = items.iter().map(|i| i.remote_id.as_deref()).collect();
        let results: Vec<Json<&Value>> = items.iter().map(|i| Json(&i.result)).collect();
        let answer: SettleBatchRow = ledger
            .invoke(Self::CALL, true, || {
                sqlx::query_as(
                    "CALL operation_settle_acknowledged_batch($1, $2, $3, $4, $5, $6, $7)",
                )
                .bind(&ids[..])
                .bind(&owners[..])
                .bind(&revisions[..])
                .bind(&digests[..])
                .bind(&statuses[..])
                .bind(&remote_ids[..])
                .bind(&results[..])
            })
            .await?;
        let wal = answer.wal;
        in_item_order(
            Self::CALL,
            items.len(),
            answer.verdicts.0.into_iter().map(|v| {
                let item = v.item;
                let answer = match (v.error_sqlstate, v.outcome) {
                    (None, Some(outcome)) => ItemAnswer::Verdict(SettleRow {
                        outcome,
                        db_now: v.db_now,
                        operation_id: v.operation_id,
                        run_id: v.run_id,
                        step_id: v.step_id,
                        effect_version: v.effect_version,
                        tool_name: v.tool_name,
                        request_digest: v.request_digest,
                        status: v.status,
                        revision: v.revision,
                        dispatch_owner: v.dispatch_owner,
                        dispatch_until: v.dispatch_until,
                        dispatch_count: v.dispatch_count,
                        remote_id: v.remote_id,
                        evidence_id: v.evidence_id,
                        upstream: v.upstream,
                        upstream_tool: v.upstream_tool,
                        wal: wal.clone(),
                    }),
                    (sqlstate, _) => {
                        tracing::debug!(?sqlstate, "group commit settle item raised; sent alone");
                        ItemAnswer::Alone
                    }
                };
                (item, answer)
            }),
        )
    }
}
