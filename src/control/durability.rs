//! The durability contract as the control API shows it: this process's
//! gate (`GET /v1/durability`), the recorded failovers, and an operator's
//! resolution of a lossy one (see `crate::durability`).

use axum::Json;
use axum::extract::{Path, Query, State};
use serde::Deserialize;
use serde_json::{Value, json};

use super::error::{ApiError, Body, ErrorCode};
use super::state::Shared;
use crate::ledger::FailoverResolveOutcome;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FailoversQuery {
    /// Only the unresolved ones.
    unresolved: Option<bool>,
}

pub(super) async fn list_failovers(
    State(state): Shared,
    Query(query): Query<FailoversQuery>,
) -> Result<Json<Value>, ApiError> {
    let failovers = state
        .ledger
        .failovers(query.unresolved.unwrap_or(false))
        .await?;
    Ok(Json(json!({ "failovers": failovers })))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ResolveFailoverBody {
    /// Who resolves it.
    by: String,
    /// What was compared and decided: required, kept on the row.
    reason: String,
}

/// Resolves a lossy failover: every process resumes dispatch at its next
/// durability check.
pub(super) async fn resolve_failover(
    State(state): Shared,
    caller: super::caller::Caller,
    Path(raw): Path<String>,
    Body(body): Body<ResolveFailoverBody>,
) -> Result<Json<Value>, ApiError> {
    let id: i64 = raw.parse().map_err(|_| {
        ApiError::new(
            ErrorCode::InvalidInput,
            format!("{raw:?} is not a failover id (a positive integer)"),
        )
    })?;
    if body.by.trim().is_empty() || body.reason.trim().is_empty() {
        return Err(ApiError::new(
            ErrorCode::InvalidBody,
            "a failover resolution needs \"by\" and a \"reason\"",
        ));
    }
    // As leasegate_operator (`OperatorLedger`): the proxy's role cannot.
    match state
        .operator
        .get()?
        .failover_resolve(id, &caller.audited_actor(&body.by), &body.reason)
        .await?
    {
        FailoverResolveOutcome::Resolved => {}
        FailoverResolveOutcome::AlreadyResolved => {
            return Err(ApiError::new(
                ErrorCode::WrongStatus,
                format!("failover {id} is already resolved"),
            ));
        }
        FailoverResolveOutcome::NotFound => return Err(ApiError::not_found("failover")),
    }
    let failover = state
        .ledger
        .failovers(false)
        .await?
        .into_iter()
        .find(|f| f.failover_id == id);
    Ok(Json(json!({ "failover": failover })))
}
