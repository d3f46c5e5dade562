//! `POST /v1/leases/renew`: one worker host renews many leases in one call,
//! each lease answered on its own as renewed (its new
//! expiry) or lost (the reason the single renew route would have answered:
//! `lease_lost`, `lease_token_invalid`, `terminal_run`, `not_found`).
//!
//! # Invariants
//!
//! 1. One ledger call (`Ledger::lease_renew_batch`, one transaction): every
//!    lease is fenced exactly as `POST /v1/runs/{id}/lease/renew` fences it
//!    (owner, epoch, unexpired, token, non-terminal run).
//! 2. Tenant scoping: a lease of a run of another tenant than the caller's
//!    is answered `not_found`, exactly as one that does not exist, with
//!    nothing written for it; the rest of the batch is renewed.
//! 3. A batch weighs one request per [`LEASES_PER_REQUEST`] leases against
//!    the caller's rate limit (`limits.rate_limit`): over it, the whole
//!    batch is 429 with nothing fenced.
//! 4. Bad input refuses the whole batch with nothing written: a malformed
//!    run id or owner (422, naming the entry), a run named twice (422), more
//!    than [`MAX_RENEW_BATCH`] leases (413), a bad ttl (422).
//!
//! # Failure handling
//!
//! The answer lost with the connection leaves the batch wholly applied or
//! wholly not (one transaction): the caller treats every lease of it as
//! unconfirmed, as the single heartbeat does.

use axum::Json;
use axum::extract::State;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::caller::Caller;
use super::error::{ApiError, Body, ErrorCode};
use super::state::Shared;
use crate::ids::{MAX_OWNER_LEN, check_identifier};
use crate::ledger::{Fenced, LeaseClaim, LeaseToken, MAX_RENEW_BATCH, RunId};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RenewBatchBody {
    ttl_ms: i64,
    leases: Vec<LeaseEntry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct LeaseEntry {
    run_id: String,
    owner: String,
    epoch: i64,
    /// The lease's secret token, as `lease_token` answered when it was taken.
    lease_token: Option<String>,
}

/// How many leases of a batch weigh one request against the caller's rate
/// limit (the request itself is the first). Weighing each lease as a
/// request would cap a worker host at `rate_limit` leases per second (50
/// by default) and defeat the batch; weighing the batch as one request let
/// one token have the ledger fence millions of leases a minute.
pub const LEASES_PER_REQUEST: usize = 100;

pub(super) async fn renew_batch(
    State(state): Shared,
    caller: Caller,
    charged: Option<axum::Extension<crate::http_server::rate::Charged>>,
    Body(body): Body<RenewBatchBody>,
) -> Result<axum::response::Response, ApiError> {
    use axum::response::IntoResponse;
    if body.leases.len() > MAX_RENEW_BATCH {
        return Err(ApiError::new(
            ErrorCode::BodyTooLarge,
            format!(
                "a batch renewal holds at most {MAX_RENEW_BATCH} leases, got {}; split it. Nothing was written",
                body.leases.len()
            ),
        )
        .with_detail(json!({"max_leases": MAX_RENEW_BATCH, "found": body.leases.len()})));
    }
    // The work asked, against the caller's rate (nothing fenced when over).
    let weight = body.leases.len().div_ceil(LEASES_PER_REQUEST).max(1) - 1;
    if let Some(axum::Extension(charged)) = &charged
        && let Some(limited) = charged.weigh(u32::try_from(weight).unwrap_or(u32::MAX))
    {
        return Ok(limited);
    }
    let mut claims = Vec::with_capacity(body.leases.len());
    let mut seen = std::collections::HashSet::with_capacity(body.leases.len());
    for (index, entry) in body.leases.into_iter().enumerate() {
        let run = entry.run_id.parse::<RunId>().map_err(|error| {
            let error = ApiError::from(error);
            let message = format!("leases[{index}].run_id: {}", error.message);
            ApiError::new(error.code, message).with_detail(json!({"index": index}))
        })?;
        check_identifier("owner", &entry.owner, MAX_OWNER_LEN).map_err(|error| {
            let error = ApiError::from(error);
            let message = format!("leases[{index}].owner: {}", error.message);
            ApiError::new(error.code, message).with_detail(json!({"index": index}))
        })?;
        if !seen.insert(run) {
            return Err(ApiError::new(
                ErrorCode::InvalidInput,
                format!("leases[{index}].run_id: run {run} appears twice in the batch; nothing was written"),
            )
            .with_detail(json!({"index": index, "run_id": run})));
        }
        claims.push(LeaseClaim {
            run_id: run,
            owner: entry.owner,
            epoch: entry.epoch,
            token: entry.lease_token.as_deref().map(LeaseToken::presented),
        });
    }
    let answers = state
        .ledger
        .lease_renew_batch(&claims, body.ttl_ms, caller.tenant())
        .await?;
    let mut renewed = 0usize;
    let leases: Vec<LeaseAnswer> = answers
        .into_iter()
        .zip(&claims)
        .map(|(answer, claim)| match answer.outcome {
            Fenced::Applied(applied) => {
                renewed += 1;
                LeaseAnswer {
                    run_id: answer.run_id,
                    epoch: claim.epoch,
                    outcome: "renewed",
                    expires_at: Some(applied.lease_expires_at),
                    code: None,
                    message: None,
                    detail: None,
                }
            }
            Fenced::Rejected(rejection) => {
                let error = ApiError::from(rejection);
                LeaseAnswer {
                    run_id: answer.run_id,
                    epoch: claim.epoch,
                    outcome: "lost",
                    expires_at: None,
                    code: Some(error.code.as_str()),
                    message: Some(error.message),
                    detail: error.detail,
                }
            }
        })
        .collect();
    let lost = leases.len() - renewed;
    Ok(Json(RenewBatchAnswer {
        renewed,
        lost,
        leases,
    })
    .into_response())
}

/// The answer of `POST /v1/leases/renew`, serialized as it stands (typed,
/// so a batch of 10,000 builds no map per lease).
#[derive(Debug, Serialize)]
pub(super) struct RenewBatchAnswer {
    renewed: usize,
    lost: usize,
    leases: Vec<LeaseAnswer>,
}

/// One lease's answer: `renewed` with its new `expires_at`, or `lost` with
/// the `code`, `message` and `detail` the single renew route would answer.
#[derive(Debug, Serialize)]
struct LeaseAnswer {
    run_id: RunId,
    epoch: i64,
    outcome: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    expires_at: Option<DateTime<Utc>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    code: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    detail: Option<Value>,
}
