//! The fate of a call: an operation, a run's operations, the tenant's
//! operations a page at a time (`GET /v1/operations`), the unknown
//! summary, and the JSON face of the operator acts on an unknown operation
//! (resolve, retry: `super::acts`).

use axum::Json;
use axum::extract::{Path, Query, State};
use serde::Deserialize;
use serde_json::{Value, json};

use super::acts;
use super::caller::Caller;
use super::error::{ApiError, Body, ErrorCode, run_id};
use super::state::Shared;
use crate::intent::OperationId;
use crate::ledger::{ConvergeOutcome, OperationStatus};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ListQuery {
    status: Option<String>,
}

pub(super) async fn list_operations(
    State(state): Shared,
    caller: Caller,
    Path(raw): Path<String>,
    Query(query): Query<ListQuery>,
) -> Result<Json<Value>, ApiError> {
    let run = run_id(&raw)?;
    let status = query.status.as_deref().map(parse_status).transpose()?;
    if state.ledger.run_get(run).await?.is_none() {
        return Err(ApiError::not_found("run"));
    }
    caller.sees_run(&state, run).await?;
    let operations = state.ledger.operations_list(run, status).await?;
    Ok(Json(readable(
        json!({"run_id": run, "operations": operations}),
    )))
}

/// The filters of `GET /v1/operations`: those of `leasegate ops list`, and
/// the page.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PageQuery {
    run_id: Option<String>,
    status: Option<String>,
    tool: Option<String>,
    limit: Option<String>,
    /// `next_cursor` of the page before.
    cursor: Option<String>,
}

/// Rows of one page of `GET /v1/operations` unless `limit` says otherwise.
const PAGE_DEFAULT: i64 = 100;
/// The most rows one page holds.
const PAGE_MAX: i64 = 1000;

fn parse_status(text: &str) -> Result<OperationStatus, ApiError> {
    OperationStatus::parse(text).ok_or_else(|| {
        ApiError::new(
            ErrorCode::InvalidStatus,
            format!("{text:?} is not an operation status (prepared, dispatching, unknown, succeeded, failed_final, cancelled)"),
        )
    })
}

/// A page's cursor: the `created_at` (microseconds) and id of its last
/// operation.
fn cursor_of(created_at: chrono::DateTime<chrono::Utc>, operation: &OperationId) -> String {
    format!("{}.{}", created_at.timestamp_micros(), operation.as_str())
}

fn parse_cursor(text: &str) -> Result<(chrono::DateTime<chrono::Utc>, &str), ApiError> {
    text.split_once('.')
        .and_then(|(micros, id)| {
            let at = chrono::DateTime::from_timestamp_micros(micros.parse().ok()?)?;
            (!id.is_empty()).then_some((at, id))
        })
        .ok_or_else(|| {
            ApiError::new(
                ErrorCode::InvalidInput,
                format!("cursor {text:?} is not a next_cursor this API gave"),
            )
        })
}

/// `GET /v1/operations`: the operations of the caller's tenant, newest
/// first, filtered by run, status and tool, a page at a time.
pub(super) async fn page_operations(
    State(state): Shared,
    caller: Caller,
    Query(query): Query<PageQuery>,
) -> Result<Json<Value>, ApiError> {
    let run = query.run_id.as_deref().map(run_id).transpose()?;
    let status = query.status.as_deref().map(parse_status).transpose()?;
    let limit = match query.limit.as_deref() {
        None => PAGE_DEFAULT,
        Some(text) => text
            .parse::<i64>()
            .ok()
            .filter(|n| (1..=PAGE_MAX).contains(n))
            .ok_or_else(|| {
                ApiError::new(
                    ErrorCode::InvalidInput,
                    format!("limit {text:?}: expected 1 to {PAGE_MAX}"),
                )
            })?,
    };
    let after = query.cursor.as_deref().map(parse_cursor).transpose()?;
    if let Some(run) = run {
        caller.sees_run(&state, run).await?;
    }
    let filter = crate::ledger::OperationFilter {
        tenant: caller.tenant(),
        run_id: run,
        status,
        tool: query.tool.as_deref(),
    };
    let (page, more) = state.ledger.operations_page(&filter, after, limit).await?;
    let next_cursor = page
        .last()
        .filter(|_| more)
        .map(|(operation, created_at)| cursor_of(*created_at, &operation.operation_id));
    let operations: Vec<_> = page.into_iter().map(|(operation, _)| operation).collect();
    Ok(Json(readable(
        json!({"operations": operations, "next_cursor": next_cursor}),
    )))
}

pub(super) async fn show_operation(
    State(state): Shared,
    caller: Caller,
    Path(raw): Path<String>,
) -> Result<Json<Value>, ApiError> {
    if raw.is_empty() || raw.len() > 255 {
        return Err(ApiError::new(
            ErrorCode::InvalidOperationId,
            "operation ids are 1 to 255 characters",
        ));
    }
    let id = OperationId::from_string(raw);
    caller.owns_operation(&state, &id).await?;
    let view = state
        .ledger
        .operation_get(&id)
        .await?
        .ok_or_else(|| ApiError::not_found("operation"))?;
    Ok(Json(readable(
        serde_json::to_value(view).unwrap_or_default(),
    )))
}

/// The one place stored bodies (request arguments, results, evidence)
/// reach an API or CLI reader: what the policy masked stays masked (the
/// ledger never had it); what it sealed arrives opened (the ledger opened
/// it with the policy's keys). Who may read bodies at all is decided here.
fn readable(answer: Value) -> Value {
    answer
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ResolveBody {
    /// "succeeded" or "failed_final".
    outcome: String,
    /// Who resolves it.
    actor: String,
    /// Why: required, kept in the history.
    note: String,
    remote_id: Option<String>,
    result: Option<Value>,
}

pub(super) async fn resolve_operation(
    State(state): Shared,
    caller: Caller,
    Path(raw): Path<String>,
    Body(body): Body<ResolveBody>,
) -> Result<Json<Value>, ApiError> {
    let Some(settlement) = acts::settlement(&body.outcome) else {
        return Err(ApiError::new(
            ErrorCode::InvalidBody,
            format!(
                "outcome {:?} is not \"succeeded\" or \"failed_final\"",
                body.outcome
            ),
        ));
    };
    if acts::note(&body.note).is_none() {
        return Err(ApiError::new(
            ErrorCode::InvalidBody,
            "a resolution needs a note",
        ));
    }
    let id = OperationId::from_string(raw);
    caller.owns_operation(&state, &id).await?;
    let found = state
        .ledger
        .operation_record(&id)
        .await?
        .ok_or_else(|| ApiError::not_found("operation"))?;
    let outcome = acts::resolve(
        &state.operator,
        acts::Resolution {
            operation_id: &id,
            expected_revision: found.revision,
            settlement,
            remote_id: body.remote_id.as_deref(),
            result: body.result.as_ref(),
            actor: &caller.audited_actor(&body.actor),
            note: &body.note,
            evidence: &json!({}),
        },
    )
    .await?;
    match outcome {
        ConvergeOutcome::Converged {
            operation,
            evidence_id,
        } => Ok(Json(
            json!({"operation": operation, "evidence_id": evidence_id}),
        )),
        ConvergeOutcome::NotUnknown(found) => Err(ApiError::new(
            ErrorCode::NotUnknown,
            format!(
                "operation is {}: only unknown operations are resolved",
                found.status
            ),
        )),
        // Only the application role's converge answers `NotClaimed`.
        ConvergeOutcome::Conflict { .. } | ConvergeOutcome::NotClaimed(_) => Err(ApiError::new(
            ErrorCode::RevisionConflict,
            "the operation changed while resolving it; look again",
        )),
        ConvergeOutcome::NotFound => Err(ApiError::not_found("operation")),
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RetryBody {
    /// Who asks.
    actor: String,
    /// Why: required, kept in the history.
    note: String,
}

/// Starts an unknown operation's same-key retry budget over.
pub(super) async fn retry_operation(
    State(state): Shared,
    caller: Caller,
    Path(raw): Path<String>,
    Body(body): Body<RetryBody>,
) -> Result<Json<Value>, ApiError> {
    if acts::note(&body.note).is_none() {
        return Err(ApiError::new(
            ErrorCode::InvalidBody,
            "a retry needs a note",
        ));
    }
    let id = OperationId::from_string(raw);
    caller.owns_operation(&state, &id).await?;
    match acts::retry(
        &state.operator,
        state.tools.as_deref(),
        &id,
        &caller.audited_actor(&body.actor),
        &body.note,
    )
    .await?
    {
        crate::ledger::RetryResetOutcome::Reset(operation) => Ok(Json(
            json!({"operation": operation, "retry_budget_reset": true}),
        )),
        crate::ledger::RetryResetOutcome::NotUnknown(found) => Err(ApiError::new(
            ErrorCode::NotUnknown,
            format!(
                "operation is {}: only unknown operations are retried",
                found.status
            ),
        )),
        crate::ledger::RetryResetOutcome::NotFound => Err(ApiError::not_found("operation")),
    }
}

pub(super) async fn unknown_summary(
    State(state): Shared,
    caller: Caller,
) -> Result<Json<Value>, ApiError> {
    let summary = state
        .ledger
        .operations_unknown_summary_of(caller.tenant())
        .await?;
    Ok(Json(serde_json::to_value(summary).unwrap_or_default()))
}
