//! One queued single lease renew and its batch: concurrent
//! `lease_renew` calls (heartbeats through the control API, the CLI, the
//! proxy's own session leases) of different runs share one
//! `lease_renew_batch` statement, judged by the same fence and answered
//! each on its own (a batch of one is the single statement).
//!
//! `lease_renew_batch` takes one ttl and one tenant for the whole batch and
//! each run once: the items with the ttl and tenant most of them share, a
//! run at most once, are the statement; every other item is answered
//! [`ItemAnswer::Alone`] and its caller sends the single statement (also
//! when the statement failed: those items were never sent).
//!
//! One difference from the single renew, by construction: the batch judges
//! every lease on the database clock read once its locks are all held, so a
//! lease that expires while the batch waits for another lease's row lock
//! is answered lease lost, where its own renew, not waiting, would have
//! renewed it. A lease is never renewed after it expired.

use std::collections::HashSet;

use sqlx::FromRow;
use uuid::Uuid;

use super::{Call, Flush, ItemAnswer};
use crate::ledger::verdict::WriteRow;
use crate::ledger::{Ledger, LedgerError};

/// The arguments of one `lease_renew`, borrowed: sent as a statement of
/// its own ([`RenewArgs::alone`]: the single path, a batch of one) or
/// queued for a batch ([`RenewArgs::queued`]).
pub(in crate::ledger) struct RenewArgs<'a> {
    pub(in crate::ledger) run_id: Uuid,
    pub(in crate::ledger) owner: &'a str,
    pub(in crate::ledger) epoch: i64,
    pub(in crate::ledger) token_sha256: Option<&'a [u8]>,
    pub(in crate::ledger) ttl_ms: i64,
    pub(in crate::ledger) tenant: Option<&'a str>,
}

impl Call for RenewArgs<'_> {
    type Batch = RenewBatch;

    /// One `lease_renew` statement of its own.
    async fn alone(&self, ledger: &Ledger) -> Result<WriteRow, LedgerError> {
        ledger
            .invoke("lease_renew", true, || {
                sqlx::query_as("SELECT * FROM lease_renew($1, $2, $3, $4, $5, $6)")
                    .bind(self.run_id)
                    .bind(self.owner)
                    .bind(self.epoch)
                    .bind(self.token_sha256)
                    .bind(self.ttl_ms)
                    .bind(self.tenant)
            })
            .await
    }

    fn queued(&self) -> RenewItem {
        RenewItem {
            run_id: self.run_id,
            owner: self.owner.to_owned(),
            epoch: self.epoch,
            token_sha256: self.token_sha256.map(<[u8]>::to_vec),
            ttl_ms: self.ttl_ms,
            tenant: self.tenant.map(str::to_owned),
        }
    }
}

/// One queued `lease_renew` (the single call's arguments, owned).
#[derive(Debug)]
pub(in crate::ledger) struct RenewItem {
    run_id: Uuid,
    owner: String,
    epoch: i64,
    token_sha256: Option<Vec<u8>>,
    ttl_ms: i64,
    tenant: Option<String>,
}

impl RenewItem {
    fn args(&self) -> RenewArgs<'_> {
        RenewArgs {
            run_id: self.run_id,
            owner: &self.owner,
            epoch: self.epoch,
            token_sha256: self.token_sha256.as_deref(),
            ttl_ms: self.ttl_ms,
            tenant: self.tenant.as_deref(),
        }
    }
}

/// A row of `lease_renew_batch`: the run it answers and the single
/// function's columns.
#[derive(Debug, FromRow)]
struct BatchRenewRow {
    run_id: Uuid,
    #[sqlx(flatten)]
    row: WriteRow,
}

/// `lease_renew_batch` for concurrent single renews (`group/mod.rs`).
#[derive(Debug)]
pub(in crate::ledger) struct RenewBatch;

impl Flush for RenewBatch {
    type Item = RenewItem;
    type Answer = WriteRow;
    const CALL: &'static str = "lease_renew_batch";

    async fn flush(
        ledger: &Ledger,
        items: &[RenewItem],
    ) -> Result<Vec<ItemAnswer<WriteRow>>, LedgerError> {
        let batched = batchable(items);
        let members: Vec<&RenewItem> = items
            .iter()
            .zip(&batched)
            .filter_map(|(item, &batched)| batched.then_some(item))
            .collect();
        let rows = match send(ledger, &members).await {
            Ok(rows) => rows,
            // Nothing left out: the whole batch's failure (`send_batch`).
            Err(error) if members.len() == items.len() => return Err(error),
            Err(error) => {
                tracing::warn!(call = Self::CALL, %error, "group commit batch failed");
                // The items left out were never sent: they go alone.
                return Ok(batched
                    .iter()
                    .map(|&b| {
                        if b {
                            super::failed_item(&error)
                        } else {
                            ItemAnswer::Alone
                        }
                    })
                    .collect());
            }
        };
        let mut rows = rows.into_iter().peekable();
        // One row per member, in their order (`send` checked).
        Ok(batched
            .iter()
            .map(|&b| match rows.next_if(|_| b) {
                Some(row) => ItemAnswer::Verdict(row),
                None => ItemAnswer::Alone,
            })
            .collect())
    }
}

/// One statement for `members` (1 or more, sharing a ttl and a tenant, each
/// run once): their answers in their order.
async fn send(ledger: &Ledger, members: &[&RenewItem]) -> Result<Vec<WriteRow>, LedgerError> {
    const CALL: &str = RenewBatch::CALL;
    if let [item] = members {
        // A batch of one is the single function's statement.
        return Ok(vec![item.args().alone(ledger).await?]);
    }
    let first = members[0];
    let run_ids: Vec<Uuid> = members.iter().map(|i| i.run_id).collect();
    let owners: Vec<&str> = members.iter().map(|i| i.owner.as_str()).collect();
    let epochs: Vec<i64> = members.iter().map(|i| i.epoch).collect();
    let tokens: Vec<Option<&[u8]>> = members.iter().map(|i| i.token_sha256.as_deref()).collect();
    let rows: Vec<BatchRenewRow> = ledger
        .invoke_all(CALL, true, || {
            sqlx::query_as("SELECT * FROM lease_renew_batch($1, $2, $3, $4, $5, $6)")
                .bind(&run_ids[..])
                .bind(&owners[..])
                .bind(&epochs[..])
                .bind(&tokens[..])
                .bind(first.ttl_ms)
                .bind(first.tenant.as_deref())
        })
        .await?;
    if rows.len() != members.len() {
        return Err(super::protocol(
            CALL,
            format!("{} answers for {} leases", rows.len(), members.len()),
        ));
    }
    // The function answers in the order asked.
    rows.into_iter()
        .zip(members)
        .map(|(answer, item)| {
            if answer.run_id == item.run_id {
                Ok(answer.row)
            } else {
                Err(super::protocol(
                    CALL,
                    format!(
                        "answer for run {} where run {} was asked",
                        answer.run_id, item.run_id
                    ),
                ))
            }
        })
        .collect()
}

/// Which items go in the statement: those with the ttl and tenant most
/// items share (on a tie, the earliest item's), each run once (the first
/// of its run).
fn batchable(items: &[RenewItem]) -> Vec<bool> {
    fn key(item: &RenewItem) -> (i64, Option<&str>) {
        (item.ttl_ms, item.tenant.as_deref())
    }
    // Keys in order of first appearance, with how many items have each.
    let mut keys: Vec<((i64, Option<&str>), usize)> = Vec::new();
    for item in items {
        match keys.iter_mut().find(|(k, _)| *k == key(item)) {
            Some((_, count)) => *count += 1,
            None => keys.push((key(item), 1)),
        }
    }
    // `max_by_key` keeps the last of equals: reversed, the earliest.
    let Some(&(chosen, _)) = keys.iter().rev().max_by_key(|(_, count)| *count) else {
        return Vec::new();
    };
    let mut runs = HashSet::with_capacity(items.len());
    items
        .iter()
        .map(|item| key(item) == chosen && runs.insert(item.run_id))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(run: u128, ttl_ms: i64, tenant: Option<&str>) -> RenewItem {
        RenewItem {
            run_id: Uuid::from_u128(run),
            owner: "agent".to_owned(),
            epoch: 1,
            token_sha256: None,
            ttl_ms,
            tenant: tenant.map(str::to_owned),
        }
    }

    #[test]
    fn a_batch_holds_the_first_items_ttl_and_tenant_and_each_run_once() {
        let items = [
            item(1, 30_000, Some("a")),
            item(2, 30_000, Some("a")),
            item(3, 60_000, Some("a")),
            item(4, 30_000, None),
            item(1, 30_000, Some("a")),
            item(5, 30_000, Some("b")),
            item(6, 30_000, Some("a")),
        ];
        assert_eq!(
            batchable(&items),
            [true, true, false, false, false, false, true]
        );
        assert!(batchable(&[]).is_empty());
        // The ttl and tenant most items share, not the first item's.
        let items = [
            item(1, 60_000, Some("a")),
            item(2, 30_000, None),
            item(3, 30_000, None),
            item(2, 30_000, None),
        ];
        assert_eq!(batchable(&items), [false, true, true, false]);
        // On a tie, the earliest item's.
        let items = [item(1, 60_000, None), item(2, 30_000, None)];
        assert_eq!(batchable(&items), [true, false]);
    }
}
