//! Runs, leases, checkpoints (with planned intents) and run transitions:
//! one handler per route, each one ledger call.
//!
//! # Lease tokens
//!
//! Taking a lease (`POST /v1/runs` with `owner` and `ttl_ms`, `POST
//! /v1/runs/{id}/lease`) answers `lease_token`: the lease's secret, shown
//! this once (the ledger keeps only its SHA-256). Every lease-fenced route
//! (renew, release, checkpoint, start, complete, fail) takes it back as
//! `lease_token` in the body; without it, or with another, the answer is
//! 403 `lease_token_invalid` and nothing is written. Reads (`GET
//! /v1/runs/{id}`) and errors never carry it. Cancel is an operator route
//! and not lease-fenced.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};

use super::acts;
use super::caller::Caller;
use super::error::{ApiError, Body, ErrorCode, applied, run_id};
use super::state::Shared;
use crate::ids::{MAX_OWNER_LEN, MAX_STEP_ID_LEN, MAX_TASK_LEN, MAX_TENANT_LEN, check_identifier};
use crate::intent::{Intent, StepRef};
use crate::ledger::{
    AcquireOutcome, Applied, InitialLease, LeaseClaim, LeaseToken, PlannedCheckpoint, Rejection,
    RunCreateOutcome, RunId, RunSummary,
};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct CreateRun {
    /// Default: the serving process's tenant, else "default".
    tenant_id: Option<String>,
    task_id: String,
    /// Chosen by the client to make the create retry-safe; generated if absent.
    run_id: Option<String>,
    /// Hold the lease from the start (both or neither).
    owner: Option<String>,
    ttl_ms: Option<i64>,
}

const DEFAULT_TENANT: &str = "default";

/// The run; with `lease_token` when this create took the lease (the one
/// time it is shown).
fn summary_json(summary: &RunSummary) -> Value {
    let mut answer = json!({
        "run_id": summary.run_id,
        "attempt": summary.attempt,
        "status": summary.status,
        "lease": {"owner": summary.lease_owner, "epoch": summary.lease_epoch, "expires_at": summary.lease_expires_at},
    });
    if let Some(token) = &summary.lease_token {
        answer["lease_token"] = json!(token.expose());
    }
    answer
}

pub(super) async fn create_run(
    State(state): Shared,
    caller: Caller,
    Body(body): Body<CreateRun>,
) -> Result<Response, ApiError> {
    // Before any answer quotes them.
    if let Some(tenant) = &body.tenant_id {
        check_identifier("tenant_id", tenant, MAX_TENANT_LEN)?;
    }
    check_identifier("task_id", &body.task_id, MAX_TASK_LEN)?;
    if let Some(owner) = &body.owner {
        check_identifier("owner", owner, MAX_OWNER_LEN)?;
    }
    // A run of another tenant than the caller's would be invisible to it
    // (and to this process's MCP front): refused, nothing written.
    let tenant = caller
        .tenant_for_create(body.tenant_id.as_deref())?
        .unwrap_or_else(|| DEFAULT_TENANT.to_owned());
    let run = match &body.run_id {
        Some(raw) => run_id(raw)?,
        None => RunId::generate(),
    };
    let lease = match (&body.owner, body.ttl_ms) {
        (Some(owner), Some(ttl_ms)) => Some(InitialLease { owner, ttl_ms }),
        (None, None) => None,
        _ => {
            return Err(ApiError::new(
                ErrorCode::InvalidBody,
                "owner and ttl_ms go together",
            ));
        }
    };
    match state
        .ledger
        .run_create(run, &tenant, &body.task_id, lease)
        .await?
    {
        RunCreateOutcome::Created(summary) => {
            Ok((StatusCode::CREATED, Json(summary_json(&summary))).into_response())
        }
        RunCreateOutcome::Exists(summary) => {
            Ok((StatusCode::OK, Json(summary_json(&summary))).into_response())
        }
        RunCreateOutcome::ActiveRunLive(live) => {
            let error = ApiError::new(
                ErrorCode::ActiveRunLive,
                format!(
                    "task {} has a live run {} ({}): take over its lease, or cancel it before retrying",
                    body.task_id, live.run_id, live.status
                ),
            );
            Err(error.with_detail(summary_json(&live)))
        }
        RunCreateOutcome::RunIdTaken => Err(ApiError::new(
            ErrorCode::RunIdTaken,
            format!("run id {run} belongs to another task"),
        )),
    }
}

pub(super) async fn show_run(
    State(state): Shared,
    caller: Caller,
    Path(raw): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let run = run_id(&raw)?;
    caller.sees_run(&state, run).await?;
    let view = state
        .ledger
        .run_get(run)
        .await?
        .ok_or_else(|| ApiError::not_found("run"))?;
    Ok(Json(serde_json::to_value(view).unwrap_or_default()))
}

// Leases

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct AcquireBody {
    owner: Option<String>,
    ttl_ms: i64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RenewBody {
    owner: String,
    epoch: i64,
    /// The lease's secret token, as `lease_token` answered when it was taken.
    lease_token: Option<String>,
    ttl_ms: i64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ClaimBody {
    owner: String,
    epoch: i64,
    lease_token: Option<String>,
}

pub(super) async fn acquire(
    State(state): Shared,
    caller: Caller,
    Path(raw): Path<String>,
    Body(body): Body<AcquireBody>,
) -> Result<Json<Value>, ApiError> {
    let run = run_id(&raw)?;
    caller.owns_run(&state, run).await?;
    let owner = body
        .owner
        .unwrap_or_else(|| format!("owner-{}", uuid::Uuid::new_v4().simple()));
    match state.ledger.lease_acquire(run, &owner, body.ttl_ms).await? {
        AcquireOutcome::Acquired(grant) => Ok(Json(json!({
            "run_id": run, "owner": grant.claim.owner, "epoch": grant.claim.epoch,
            "lease_token": grant.claim.token.as_ref().map(LeaseToken::expose),
            "expires_at": grant.expires_at, "took_over": grant.took_over,
            "run_status": grant.run_status, "revision": grant.revision,
        }))),
        AcquireOutcome::Busy { owner, expires_at } => {
            let error = ApiError::new(
                ErrorCode::LeaseBusy,
                format!("lease busy: held by {owner} until {expires_at}"),
            );
            Err(error.with_detail(json!({"owner": owner, "expires_at": expires_at})))
        }
        AcquireOutcome::NotFound => Err(ApiError::not_found("run")),
        AcquireOutcome::Terminal { status } => Err(Rejection::Terminal { status }.into()),
    }
}

/// The caller's lease from a body. An owner that no acquire could have
/// handed out (too long, a space or control character) is refused here
/// rather than answered "lease lost"; a missing `lease_token` is sent as
/// none (the fence refuses it).
fn claim(
    run: RunId,
    owner: String,
    epoch: i64,
    token: Option<&str>,
) -> Result<LeaseClaim, ApiError> {
    check_identifier("owner", &owner, MAX_OWNER_LEN)?;
    Ok(LeaseClaim {
        run_id: run,
        owner,
        epoch,
        token: token.map(LeaseToken::presented),
    })
}

fn applied_json(run: RunId, applied: &Applied) -> Json<Value> {
    Json(json!({
        "run_id": run, "run_status": applied.run_status, "revision": applied.revision,
        "lease_expires_at": applied.lease_expires_at,
    }))
}

pub(super) async fn renew(
    State(state): Shared,
    caller: Caller,
    Path(raw): Path<String>,
    Body(body): Body<RenewBody>,
) -> Result<Json<Value>, ApiError> {
    let run = run_id(&raw)?;
    // The tenant check rides in the renew's own statement (one round trip
    // per heartbeat): another tenant's run is "run not found", as from
    // `owns_run`.
    let outcome = state
        .ledger
        .lease_renew_for_tenant(
            &claim(run, body.owner, body.epoch, body.lease_token.as_deref())?,
            body.ttl_ms,
            caller.tenant(),
        )
        .await?;
    let applied = applied(outcome)?;
    Ok(Json(
        json!({"run_id": run, "epoch": body.epoch, "expires_at": applied.lease_expires_at}),
    ))
}

pub(super) async fn release(
    State(state): Shared,
    caller: Caller,
    Path(raw): Path<String>,
    Body(body): Body<ClaimBody>,
) -> Result<Json<Value>, ApiError> {
    let run = run_id(&raw)?;
    caller.owns_run(&state, run).await?;
    applied(
        state
            .ledger
            .lease_release(&claim(
                run,
                body.owner,
                body.epoch,
                body.lease_token.as_deref(),
            )?)
            .await?,
    )?;
    Ok(Json(
        json!({"run_id": run, "released": true, "epoch": body.epoch}),
    ))
}

// Checkpoints and run transitions

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PlannedIntent {
    tool: String,
    #[serde(default)]
    arguments: Value,
    step_id: String,
    #[serde(default = "first_version")]
    effect_version: i32,
}

fn first_version() -> i32 {
    1
}

/// Refuses a plan before anything is read or written: a step id outside
/// the identifier rules, or a tool that no upstream of this process lists
/// (the outbox could only claim it and let it turn `unknown`). The tools
/// are judged against the directory the MCP front and the outbox use: what
/// each upstream listed last, kept while that upstream is down (its
/// planned intents wait in the outbox until it is back).
fn check_planned(
    state: &super::state::ControlState,
    intents: &[PlannedIntent],
) -> Result<(), ApiError> {
    for (index, planned) in intents.iter().enumerate() {
        check_identifier("step_id", &planned.step_id, MAX_STEP_ID_LEN)?;
        // The outbox sends the stored object as the call's arguments.
        if !(planned.arguments.is_object() || planned.arguments.is_null()) {
            let error = ApiError::new(
                ErrorCode::InvalidArguments,
                format!(
                    "intents[{index}].arguments: must be a JSON object (the tool call's \
                     arguments), got {}. Nothing was written",
                    json_type(&planned.arguments)
                ),
            );
            return Err(error.with_detail(json!({"index": index, "step_id": planned.step_id})));
        }
    }
    let Some(tools) = &state.tools else {
        return Ok(());
    };
    let known = tools.snapshot();
    let unknown: Vec<Value> = intents
        .iter()
        .enumerate()
        .filter(|(_, planned)| !known.contains_key(&planned.tool))
        .map(|(index, planned)| {
            // A name is echoed back at most this long.
            let tool: String = planned.tool.chars().take(200).collect();
            json!({"index": index, "step_id": planned.step_id, "tool": tool})
        })
        .collect();
    let Some(first) = unknown.first() else {
        return Ok(());
    };
    let error = ApiError::new(
        ErrorCode::UnknownTool,
        format!(
            "unknown tool {}: no upstream of this leasegate lists it ({} of {} planned intents \
             name such a tool; GET tools/list on the MCP front for the names). Nothing was written",
            first["tool"],
            unknown.len(),
            intents.len()
        ),
    );
    Err(error.with_detail(json!({ "unknown": unknown })))
}

fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct CheckpointBody {
    owner: String,
    epoch: i64,
    lease_token: Option<String>,
    expected_revision: i64,
    checkpoint: Value,
    #[serde(default)]
    intents: Vec<PlannedIntent>,
}

pub(super) async fn checkpoint(
    State(state): Shared,
    caller: Caller,
    Path(raw): Path<String>,
    Body(body): Body<CheckpointBody>,
) -> Result<Json<Value>, ApiError> {
    let run = run_id(&raw)?;
    let tenant = caller.owns_run(&state, run).await?;
    let lease = claim(run, body.owner, body.epoch, body.lease_token.as_deref())?;
    check_planned(&state, &body.intents)?;
    if body.intents.is_empty() {
        let applied = applied(
            state
                .ledger
                .checkpoint_save(&lease, body.expected_revision, &body.checkpoint)
                .await?,
        )?;
        return Ok(Json(
            json!({"run_id": run, "revision": applied.revision, "intents": []}),
        ));
    }
    let intents = body
        .intents
        .iter()
        .map(|planned| {
            let arguments = if planned.arguments.is_null() {
                json!({})
            } else {
                planned.arguments.clone()
            };
            Intent::new(
                &tenant,
                run,
                Some(StepRef {
                    step_id: planned.step_id.clone(),
                    effect_version: planned.effect_version,
                }),
                &planned.tool,
                &arguments,
                state.integers,
            )
            .map_err(ApiError::from)
        })
        .collect::<Result<Vec<_>, _>>()?;
    let plan = PlannedCheckpoint {
        expected_revision: body.expected_revision,
        checkpoint: &body.checkpoint,
    };
    let registered = applied(
        state
            .ledger
            .operation_register(&lease, &intents, Some(plan))
            .await?,
    )?;
    Ok(Json(json!({
        "run_id": run,
        // As the database reports it (every row carries the run's revision).
        "revision": registered.first().map(|r| r.run_revision),
        "intents": registered.iter().map(|r| json!({
            "operation_id": r.operation.operation_id, "step_id": r.operation.step_id,
            "effect_version": r.operation.effect_version, "tool": r.operation.tool_name,
            "status": r.operation.status, "newly_registered": r.newly_registered,
        })).collect::<Vec<_>>(),
    })))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct TransitionBody {
    owner: String,
    epoch: i64,
    lease_token: Option<String>,
    expected_revision: i64,
    /// `complete`: an optional final checkpoint.
    checkpoint: Option<Value>,
    /// `fail`: why (kept in the event history).
    reason: Option<Value>,
}

pub(super) async fn start(
    State(state): Shared,
    caller: Caller,
    Path(raw): Path<String>,
    Body(body): Body<TransitionBody>,
) -> Result<Json<Value>, ApiError> {
    let run = run_id(&raw)?;
    caller.owns_run(&state, run).await?;
    let outcome = state
        .ledger
        .run_start(
            &claim(run, body.owner, body.epoch, body.lease_token.as_deref())?,
            body.expected_revision,
        )
        .await?;
    Ok(applied_json(run, &applied(outcome)?))
}

pub(super) async fn complete(
    State(state): Shared,
    caller: Caller,
    Path(raw): Path<String>,
    Body(body): Body<TransitionBody>,
) -> Result<Json<Value>, ApiError> {
    let run = run_id(&raw)?;
    caller.owns_run(&state, run).await?;
    let outcome = state
        .ledger
        .run_complete(
            &claim(run, body.owner, body.epoch, body.lease_token.as_deref())?,
            body.expected_revision,
            body.checkpoint.as_ref(),
        )
        .await?;
    Ok(applied_json(run, &applied(outcome)?))
}

pub(super) async fn fail(
    State(state): Shared,
    caller: Caller,
    Path(raw): Path<String>,
    Body(body): Body<TransitionBody>,
) -> Result<Json<Value>, ApiError> {
    let run = run_id(&raw)?;
    caller.owns_run(&state, run).await?;
    let reason = body.reason.unwrap_or(Value::Null);
    let outcome = state
        .ledger
        .run_fail(
            &claim(run, body.owner, body.epoch, body.lease_token.as_deref())?,
            body.expected_revision,
            &reason,
        )
        .await?;
    Ok(applied_json(run, &applied(outcome)?))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct CancelBody {
    actor: String,
    reason: Option<String>,
}

pub(super) async fn cancel(
    State(state): Shared,
    caller: Caller,
    Path(raw): Path<String>,
    Body(body): Body<CancelBody>,
) -> Result<Json<Value>, ApiError> {
    let run = run_id(&raw)?;
    caller.sees_run(&state, run).await?;
    let outcome = acts::cancel(
        &state.operator,
        run,
        &caller.audited_actor(&body.actor),
        body.reason.as_deref(),
    )
    .await?;
    Ok(applied_json(run, &applied(outcome)?))
}
