//! One queued `operation_register_claim` and its batch: the caller's
//! arguments owned while they wait, `operation_register_claim_batch`, and
//! each item's verdict in item order (a batch of one is the single
//! statement).

use std::borrow::Cow;

use serde_json::Value;
use sqlx::FromRow;
use sqlx::types::Json;
use uuid::Uuid;

use super::{Call, Flush, ItemAnswer, in_item_order};
use crate::ledger::operation_rows::{ClaimRow, IntentParams};
use crate::ledger::{Ledger, LedgerError};

/// An intent of a queued group-commit item (owned: it outlives the caller's
/// borrow while it waits in the queue).
#[derive(Debug)]
pub(in crate::ledger) struct OwnedIntent {
    operation_id: String,
    step_id: String,
    effect_version: i32,
    tool_name: String,
    request_digest: String,
    request_body: Value,
    upstream: Option<String>,
    upstream_tool: Option<String>,
}

impl OwnedIntent {
    fn of(params: &IntentParams<'_>) -> Self {
        Self {
            operation_id: params.operation_id.to_owned(),
            step_id: params.step_id.to_owned(),
            effect_version: params.effect_version,
            tool_name: params.tool_name.to_owned(),
            request_digest: params.request_digest.to_owned(),
            request_body: params.request_body.0.clone().into_owned(),
            upstream: params.upstream.map(str::to_owned),
            upstream_tool: params.upstream_tool.map(str::to_owned),
        }
    }

    fn params(&self) -> IntentParams<'_> {
        IntentParams {
            operation_id: &self.operation_id,
            step_id: &self.step_id,
            effect_version: self.effect_version,
            tool_name: &self.tool_name,
            request_digest: &self.request_digest,
            request_body: Json(Cow::Borrowed(&self.request_body)),
            upstream: self.upstream.as_deref(),
            upstream_tool: self.upstream_tool.as_deref(),
        }
    }
}

/// The arguments of one `operation_register_claim`, borrowed: sent as a
/// statement of its own ([`RegisterArgs::alone`]: the single path, a batch
/// of one) or queued for a batch ([`RegisterArgs::queued`]).
pub(in crate::ledger) struct RegisterArgs<'a, 'p> {
    pub(in crate::ledger) run_id: Uuid,
    pub(in crate::ledger) owner: &'a str,
    pub(in crate::ledger) epoch: i64,
    pub(in crate::ledger) token_sha256: Option<&'a [u8]>,
    pub(in crate::ledger) intent: &'a IntentParams<'p>,
    pub(in crate::ledger) dispatch_owner: &'a str,
    pub(in crate::ledger) claim_ttl_ms: i64,
    pub(in crate::ledger) tenant: Option<&'a str>,
}

impl Call for RegisterArgs<'_, '_> {
    type Batch = RegisterBatch;

    /// One `operation_register_claim` statement of its own.
    async fn alone(&self, ledger: &Ledger) -> Result<ClaimRow, LedgerError> {
        ledger
            .invoke("operation_register_claim", true, || {
                sqlx::query_as(
                    "SELECT * FROM operation_register_claim($1, $2, $3, $4, $5, $6, $7, $8)",
                )
                .bind(self.run_id)
                .bind(self.owner)
                .bind(self.epoch)
                .bind(self.token_sha256)
                .bind(self.intent)
                .bind(self.dispatch_owner)
                .bind(self.claim_ttl_ms)
                .bind(self.tenant)
            })
            .await
    }

    fn queued(&self) -> RegisterItem {
        RegisterItem {
            run_id: self.run_id,
            owner: self.owner.to_owned(),
            epoch: self.epoch,
            token_sha256: self.token_sha256.map(<[u8]>::to_vec),
            intent: OwnedIntent::of(self.intent),
            dispatch_owner: self.dispatch_owner.to_owned(),
            claim_ttl_ms: self.claim_ttl_ms,
            tenant: self.tenant.map(str::to_owned),
        }
    }
}

/// One queued `operation_register_claim` (the single call's arguments).
#[derive(Debug)]
pub(in crate::ledger) struct RegisterItem {
    run_id: Uuid,
    owner: String,
    epoch: i64,
    token_sha256: Option<Vec<u8>>,
    intent: OwnedIntent,
    dispatch_owner: String,
    claim_ttl_ms: i64,
    tenant: Option<String>,
}

impl RegisterItem {
    fn args<'a, 'p>(&'a self, intent: &'a IntentParams<'p>) -> RegisterArgs<'a, 'p> {
        RegisterArgs {
            run_id: self.run_id,
            owner: &self.owner,
            epoch: self.epoch,
            token_sha256: self.token_sha256.as_deref(),
            intent,
            dispatch_owner: &self.dispatch_owner,
            claim_ttl_ms: self.claim_ttl_ms,
            tenant: self.tenant.as_deref(),
        }
    }
}

/// A row of `operation_register_claim_batch`: the item it answers, and its
/// error (the item was rolled back) or the single function's columns.
#[derive(Debug, FromRow)]
struct BatchClaimRow {
    item: i32,
    error_sqlstate: Option<String>,
    #[sqlx(flatten)]
    claim: ClaimRow,
}

/// `operation_register_claim_batch` (`group/mod.rs`).
#[derive(Debug)]
pub(in crate::ledger) struct RegisterBatch;

impl Flush for RegisterBatch {
    type Item = RegisterItem;
    type Answer = ClaimRow;
    const CALL: &'static str = "operation_register_claim_batch";

    async fn flush(
        ledger: &Ledger,
        items: &[RegisterItem],
    ) -> Result<Vec<ItemAnswer<ClaimRow>>, LedgerError> {
        if let [item] = items {
            // A batch of one is the single function's statement: the same
            // verdict, without the batch function's layers.
            let params = item.intent.params();
            let row = item.args(&params).alone(ledger).await?;
            return Ok(vec![ItemAnswer::Verdict(row)]);
        }
        let run_ids: Vec<Uuid> = items.iter().map(|i| i.run_id).collect();
        let owners: Vec<&str> = items.iter().map(|i| i.owner.as_str()).collect();
        let epochs: Vec<i64> = items.iter().map(|i| i.epoch).collect();
        let tokens: Vec<Option<&[u8]>> = items.iter().map(|i| i.token_sha256.as_deref()).collect();
        let intents: Vec<IntentParams<'_>> = items.iter().map(|i| i.intent.params()).collect();
        let dispatch_owners: Vec<&str> = items.iter().map(|i| i.dispatch_owner.as_str()).collect();
        let ttls: Vec<i64> = items.iter().map(|i| i.claim_ttl_ms).collect();
        let tenants: Vec<Option<&str>> = items.iter().map(|i| i.tenant.as_deref()).collect();
        let rows: Vec<BatchClaimRow> = ledger
            .invoke_all(Self::CALL, true, || {
                sqlx::query_as(
                    "SELECT * FROM operation_register_claim_batch($1, $2, $3, $4, $5, $6, $7, $8)",
                )
                .bind(&run_ids[..])
                .bind(&owners[..])
                .bind(&epochs[..])
                .bind(&tokens[..])
                .bind(&intents[..])
                .bind(&dispatch_owners[..])
                .bind(&ttls[..])
                .bind(&tenants[..])
            })
            .await?;
        in_item_order(
            Self::CALL,
            items.len(),
            rows.into_iter().map(|row| {
                let answer = match row.error_sqlstate {
                    Some(sqlstate) => {
                        tracing::debug!(sqlstate, "group commit item raised; sent alone");
                        ItemAnswer::Alone
                    }
                    None => ItemAnswer::Verdict(row.claim),
                };
                (row.item, answer)
            }),
        )
    }
}
