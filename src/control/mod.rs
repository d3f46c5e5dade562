//! The control HTTP API: runs, leases, checkpoints (with planned intents),
//! run transitions, and the fate of a call. A thin layer over the ledger's
//! functions — no protocol logic of its own. Described by `openapi.json` at
//! the repository root; `tests/control_api.rs` checks the two agree.
//!
//! Errors are JSON `{"code", "message"}` with a stable code: 409 for lease
//! lost, conflicts and busy leases, 404 for unknown ids, 400/413/415/422 for
//! bad input, 503 when the database is unreachable or the outcome of a write
//! is unknown. Messages never carry SQL or stack traces.

pub mod cli;

use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::{DefaultBodyLimit, FromRequest, Path, Query, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::intent::{IntegerPolicy, Intent, OperationId, StepRef};
use crate::ledger::{
    AcquireOutcome, Applied, Delivery, Fenced, InitialLease, LeaseClaim, Ledger, LedgerError,
    OperationStatus, PlannedCheckpoint, Rejection, RunCreateOutcome, RunId, RunSummary,
};

/// Largest accepted request body.
pub const MAX_BODY_BYTES: usize = 1024 * 1024;

/// Every route: (method, path). The router is built from the same handlers;
/// the OpenAPI test checks this list, the document and the router agree.
pub const ROUTES: &[(&str, &str)] = &[
    ("POST", "/v1/runs"),
    ("GET", "/v1/runs/{run_id}"),
    ("POST", "/v1/runs/{run_id}/lease"),
    ("POST", "/v1/runs/{run_id}/lease/renew"),
    ("POST", "/v1/runs/{run_id}/lease/release"),
    ("POST", "/v1/runs/{run_id}/checkpoint"),
    ("POST", "/v1/runs/{run_id}/start"),
    ("POST", "/v1/runs/{run_id}/complete"),
    ("POST", "/v1/runs/{run_id}/fail"),
    ("POST", "/v1/runs/{run_id}/cancel"),
    ("GET", "/v1/runs/{run_id}/operations"),
    ("GET", "/v1/operations/unknown"),
    ("GET", "/v1/operations/{operation_id}"),
    ("POST", "/v1/operations/{operation_id}/resolve"),
    // Added by `with_metrics` (as `leasegate serve` does).
    ("GET", "/metrics"),
];

struct ControlState {
    ledger: Ledger,
    integers: IntegerPolicy,
}

/// The control API as a router (serve it, or drive it with `oneshot` in tests).
pub fn router(ledger: Ledger, integers: IntegerPolicy) -> Router {
    let state = Arc::new(ControlState { ledger, integers });
    Router::new()
        .route("/v1/runs", post(create_run))
        .route("/v1/runs/{run_id}", get(show_run))
        .route("/v1/runs/{run_id}/lease", post(acquire))
        .route("/v1/runs/{run_id}/lease/renew", post(renew))
        .route("/v1/runs/{run_id}/lease/release", post(release))
        .route("/v1/runs/{run_id}/checkpoint", post(checkpoint))
        .route("/v1/runs/{run_id}/start", post(start))
        .route("/v1/runs/{run_id}/complete", post(complete))
        .route("/v1/runs/{run_id}/fail", post(fail))
        .route("/v1/runs/{run_id}/cancel", post(cancel))
        .route("/v1/runs/{run_id}/operations", get(list_operations))
        .route("/v1/operations/unknown", get(unknown_summary))
        .route("/v1/operations/{operation_id}", get(show_operation))
        .route(
            "/v1/operations/{operation_id}/resolve",
            post(resolve_operation),
        )
        .fallback(|| async {
            ApiError::new(
                StatusCode::NOT_FOUND,
                "no_route",
                "no such endpoint; see openapi.json",
            )
        })
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
}

/// Adds `GET /metrics` (Prometheus text) to a control router.
pub fn with_metrics(
    router: Router,
    handle: metrics_exporter_prometheus::PrometheusHandle,
) -> Router {
    router.route("/metrics", get(move || std::future::ready(handle.render())))
}

/// Serves the control API until `shutdown` completes.
pub async fn serve(
    router: Router,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    use axum::serve::ListenerExt;
    let listener = listener.tap_io(|stream| {
        // See `mcp::no_delay`: no 40 ms Nagle stall on kept-alive connections.
        let _ = stream.set_nodelay(true);
    });
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown)
        .await
}

// ---------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------

/// An error answer: HTTP status, stable code, human message.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
    detail: Option<Value>,
}

impl ApiError {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            detail: None,
        }
    }

    fn not_found(what: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("{what} not found"),
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut body = json!({ "code": self.code, "message": self.message });
        if let Some(detail) = self.detail {
            body["detail"] = detail;
        }
        (self.status, Json(body)).into_response()
    }
}

impl From<LedgerError> for ApiError {
    fn from(error: LedgerError) -> Self {
        match &error {
            LedgerError::InvalidInput(invalid) => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                invalid.code(),
                invalid.to_string(),
            ),
            _ => {
                tracing::error!(error = %error, "ledger call failed");
                match error.delivery() {
                    Delivery::Unknown => ApiError::new(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "outcome_unknown",
                        "the ledger's answer was lost: read the run or operation back before retrying",
                    ),
                    _ => ApiError::new(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "ledger_unavailable",
                        "the ledger database is unreachable; nothing was written",
                    ),
                }
            }
        }
    }
}

impl From<Rejection> for ApiError {
    fn from(rejection: Rejection) -> Self {
        let status = match rejection {
            Rejection::NotFound => StatusCode::NOT_FOUND,
            _ => StatusCode::CONFLICT,
        };
        let detail = match &rejection {
            Rejection::LeaseLost { expected, found } => {
                Some(json!({"expected": expected, "found": found}))
            }
            Rejection::Conflict {
                expected_revision,
                found,
            } => Some(json!({"expected_revision": expected_revision, "found_revision": found})),
            Rejection::IntentConflict {
                operation_id,
                expected_digest,
                found_digest,
                ..
            } => Some(json!({
                "operation_id": operation_id, "expected_digest": expected_digest, "found_digest": found_digest})),
            Rejection::Terminal { status } | Rejection::WrongStatus { found: status, .. } => {
                Some(json!({"run_status": status}))
            }
            Rejection::NotFound => None,
        };
        let mut error = ApiError::new(status, rejection.reason(), rejection.to_string());
        error.detail = detail;
        error
    }
}

/// JSON bodies with our error codes for every way a body can be wrong.
pub struct Body<T>(pub T);

impl<S, T> FromRequest<S> for Body<T>
where
    T: serde::de::DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        match Json::<T>::from_request(request, state).await {
            Ok(Json(value)) => Ok(Body(value)),
            Err(rejection) => Err(match rejection {
                JsonRejection::JsonSyntaxError(e) => {
                    ApiError::new(StatusCode::BAD_REQUEST, "malformed_json", e.body_text())
                }
                JsonRejection::JsonDataError(e) => ApiError::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "invalid_body",
                    e.body_text(),
                ),
                JsonRejection::MissingJsonContentType(_) => ApiError::new(
                    StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    "unsupported_media_type",
                    "send Content-Type: application/json",
                ),
                other if other.status() == StatusCode::PAYLOAD_TOO_LARGE => ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "body_too_large",
                    format!("request bodies are limited to {MAX_BODY_BYTES} bytes"),
                ),
                other => ApiError::new(other.status(), "invalid_body", other.body_text()),
            }),
        }
    }
}

fn run_id(raw: &str) -> Result<RunId, ApiError> {
    raw.parse::<RunId>()
        .map_err(|e| ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, e.code(), e.to_string()))
}

fn applied<T>(outcome: Fenced<T>) -> Result<T, ApiError> {
    outcome.into_result().map_err(ApiError::from)
}

type Shared = State<Arc<ControlState>>;

// ---------------------------------------------------------------------------
// Runs
// ---------------------------------------------------------------------------

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateRun {
    #[serde(default = "default_tenant")]
    tenant_id: String,
    task_id: String,
    /// Chosen by the client to make the create retry-safe; generated if absent.
    run_id: Option<String>,
    /// Hold the lease from the start (both or neither).
    owner: Option<String>,
    ttl_ms: Option<i64>,
}

fn default_tenant() -> String {
    "default".to_owned()
}

fn summary_json(summary: &RunSummary) -> Value {
    json!({
        "run_id": summary.run_id,
        "attempt": summary.attempt,
        "status": summary.status,
        "lease": {"owner": summary.lease_owner, "epoch": summary.lease_epoch, "expires_at": summary.lease_expires_at},
    })
}

async fn create_run(
    State(state): Shared,
    Body(body): Body<CreateRun>,
) -> Result<Response, ApiError> {
    let run = match &body.run_id {
        Some(raw) => run_id(raw)?,
        None => RunId::generate(),
    };
    let lease = match (&body.owner, body.ttl_ms) {
        (Some(owner), Some(ttl_ms)) => Some(InitialLease { owner, ttl_ms }),
        (None, None) => None,
        _ => {
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_body",
                "owner and ttl_ms go together",
            ));
        }
    };
    match state
        .ledger
        .run_create(run, &body.tenant_id, &body.task_id, lease)
        .await?
    {
        RunCreateOutcome::Created(summary) => {
            Ok((StatusCode::CREATED, Json(summary_json(&summary))).into_response())
        }
        RunCreateOutcome::Exists(summary) => {
            Ok((StatusCode::OK, Json(summary_json(&summary))).into_response())
        }
        RunCreateOutcome::ActiveRunLive(live) => {
            let mut error = ApiError::new(
                StatusCode::CONFLICT,
                "active_run_live",
                format!(
                    "task {} has a live run {} ({}): take over its lease, or cancel it before retrying",
                    body.task_id, live.run_id, live.status
                ),
            );
            error.detail = Some(summary_json(&live));
            Err(error)
        }
        RunCreateOutcome::RunIdTaken => Err(ApiError::new(
            StatusCode::CONFLICT,
            "run_id_taken",
            format!("run id {run} belongs to another task"),
        )),
    }
}

async fn show_run(State(state): Shared, Path(raw): Path<String>) -> Result<Json<Value>, ApiError> {
    let run = run_id(&raw)?;
    let view = state
        .ledger
        .run_get(run)
        .await?
        .ok_or_else(|| ApiError::not_found("run"))?;
    Ok(Json(serde_json::to_value(view).unwrap_or_default()))
}

// ---------------------------------------------------------------------------
// Leases
// ---------------------------------------------------------------------------

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AcquireBody {
    owner: Option<String>,
    ttl_ms: i64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RenewBody {
    owner: String,
    epoch: i64,
    ttl_ms: i64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ClaimBody {
    owner: String,
    epoch: i64,
}

async fn acquire(
    State(state): Shared,
    Path(raw): Path<String>,
    Body(body): Body<AcquireBody>,
) -> Result<Json<Value>, ApiError> {
    let run = run_id(&raw)?;
    let owner = body
        .owner
        .unwrap_or_else(|| format!("owner-{}", uuid::Uuid::new_v4().simple()));
    match state.ledger.lease_acquire(run, &owner, body.ttl_ms).await? {
        AcquireOutcome::Acquired(grant) => Ok(Json(json!({
            "run_id": run, "owner": grant.claim.owner, "epoch": grant.claim.epoch,
            "expires_at": grant.expires_at, "took_over": grant.took_over,
            "run_status": grant.run_status, "revision": grant.revision,
        }))),
        AcquireOutcome::Busy { owner, expires_at } => {
            let mut error = ApiError::new(
                StatusCode::CONFLICT,
                "lease_busy",
                format!("lease busy: held by {owner} until {expires_at}"),
            );
            error.detail = Some(json!({"owner": owner, "expires_at": expires_at}));
            Err(error)
        }
        AcquireOutcome::NotFound => Err(ApiError::not_found("run")),
        AcquireOutcome::Terminal { status } => Err(Rejection::Terminal { status }.into()),
    }
}

fn claim(run: RunId, owner: String, epoch: i64) -> LeaseClaim {
    LeaseClaim {
        run_id: run,
        owner,
        epoch,
    }
}

fn applied_json(run: RunId, applied: &Applied) -> Json<Value> {
    Json(json!({
        "run_id": run, "run_status": applied.run_status, "revision": applied.revision,
        "lease_expires_at": applied.lease_expires_at,
    }))
}

async fn renew(
    State(state): Shared,
    Path(raw): Path<String>,
    Body(body): Body<RenewBody>,
) -> Result<Json<Value>, ApiError> {
    let run = run_id(&raw)?;
    let outcome = state
        .ledger
        .lease_renew(&claim(run, body.owner, body.epoch), body.ttl_ms)
        .await?;
    let applied = applied(outcome)?;
    Ok(Json(
        json!({"run_id": run, "epoch": body.epoch, "expires_at": applied.lease_expires_at}),
    ))
}

async fn release(
    State(state): Shared,
    Path(raw): Path<String>,
    Body(body): Body<ClaimBody>,
) -> Result<Json<Value>, ApiError> {
    let run = run_id(&raw)?;
    applied(
        state
            .ledger
            .lease_release(&claim(run, body.owner, body.epoch))
            .await?,
    )?;
    Ok(Json(
        json!({"run_id": run, "released": true, "epoch": body.epoch}),
    ))
}

// ---------------------------------------------------------------------------
// Checkpoints and run transitions
// ---------------------------------------------------------------------------

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PlannedIntent {
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

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CheckpointBody {
    owner: String,
    epoch: i64,
    expected_revision: i64,
    checkpoint: Value,
    #[serde(default)]
    intents: Vec<PlannedIntent>,
}

async fn checkpoint(
    State(state): Shared,
    Path(raw): Path<String>,
    Body(body): Body<CheckpointBody>,
) -> Result<Json<Value>, ApiError> {
    let run = run_id(&raw)?;
    let lease = claim(run, body.owner, body.epoch);
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
    let tenant = state
        .ledger
        .run_tenant(run)
        .await?
        .ok_or_else(|| ApiError::not_found("run"))?;
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
            .map_err(|e| ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, e.code(), e.to_string()))
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
        "revision": body.expected_revision + 1,
        "intents": registered.iter().map(|r| json!({
            "operation_id": r.operation.operation_id, "step_id": r.operation.step_id,
            "effect_version": r.operation.effect_version, "tool": r.operation.tool_name,
            "status": r.operation.status, "newly_registered": r.newly_registered,
        })).collect::<Vec<_>>(),
    })))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TransitionBody {
    owner: String,
    epoch: i64,
    expected_revision: i64,
    /// `complete`: an optional final checkpoint.
    checkpoint: Option<Value>,
    /// `fail`: why (kept in the event history).
    reason: Option<Value>,
}

async fn start(
    State(state): Shared,
    Path(raw): Path<String>,
    Body(body): Body<TransitionBody>,
) -> Result<Json<Value>, ApiError> {
    let run = run_id(&raw)?;
    let outcome = state
        .ledger
        .run_start(&claim(run, body.owner, body.epoch), body.expected_revision)
        .await?;
    Ok(applied_json(run, &applied(outcome)?))
}

async fn complete(
    State(state): Shared,
    Path(raw): Path<String>,
    Body(body): Body<TransitionBody>,
) -> Result<Json<Value>, ApiError> {
    let run = run_id(&raw)?;
    let outcome = state
        .ledger
        .run_complete(
            &claim(run, body.owner, body.epoch),
            body.expected_revision,
            body.checkpoint.as_ref(),
        )
        .await?;
    Ok(applied_json(run, &applied(outcome)?))
}

async fn fail(
    State(state): Shared,
    Path(raw): Path<String>,
    Body(body): Body<TransitionBody>,
) -> Result<Json<Value>, ApiError> {
    let run = run_id(&raw)?;
    let reason = body.reason.unwrap_or(Value::Null);
    let outcome = state
        .ledger
        .run_fail(
            &claim(run, body.owner, body.epoch),
            body.expected_revision,
            &reason,
        )
        .await?;
    Ok(applied_json(run, &applied(outcome)?))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CancelBody {
    actor: String,
    reason: Option<String>,
}

async fn cancel(
    State(state): Shared,
    Path(raw): Path<String>,
    Body(body): Body<CancelBody>,
) -> Result<Json<Value>, ApiError> {
    let run = run_id(&raw)?;
    let outcome = state
        .ledger
        .run_cancel(run, &body.actor, body.reason.as_deref())
        .await?;
    Ok(applied_json(run, &applied(outcome)?))
}

// ---------------------------------------------------------------------------
// Operations
// ---------------------------------------------------------------------------

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    status: Option<String>,
}

async fn list_operations(
    State(state): Shared,
    Path(raw): Path<String>,
    Query(query): Query<ListQuery>,
) -> Result<Json<Value>, ApiError> {
    let run = run_id(&raw)?;
    let status = match query.status.as_deref() {
        None => None,
        Some(text) => Some(OperationStatus::parse(text).ok_or_else(|| {
            ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_status",
                format!("{text:?} is not an operation status (prepared, dispatching, unknown, succeeded, failed_final, cancelled)"),
            )
        })?),
    };
    if state.ledger.run_get(run).await?.is_none() {
        return Err(ApiError::not_found("run"));
    }
    let operations = state.ledger.operations_list(run, status).await?;
    Ok(Json(json!({"run_id": run, "operations": operations})))
}

async fn show_operation(
    State(state): Shared,
    Path(raw): Path<String>,
) -> Result<Json<Value>, ApiError> {
    if raw.is_empty() || raw.len() > 255 {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_operation_id",
            "operation ids are 1 to 255 characters",
        ));
    }
    let view = state
        .ledger
        .operation_get(&OperationId::from_string(raw))
        .await?
        .ok_or_else(|| ApiError::not_found("operation"))?;
    Ok(Json(serde_json::to_value(view).unwrap_or_default()))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ResolveBody {
    /// "succeeded" or "failed_final".
    outcome: String,
    /// Who resolves it.
    actor: String,
    /// Why: required, kept in the history.
    note: String,
    remote_id: Option<String>,
    result: Option<Value>,
}

async fn resolve_operation(
    State(state): Shared,
    Path(raw): Path<String>,
    Body(body): Body<ResolveBody>,
) -> Result<Json<Value>, ApiError> {
    let settlement = match body.outcome.as_str() {
        "succeeded" => crate::ledger::Settlement::Succeeded,
        "failed_final" => crate::ledger::Settlement::FailedFinal,
        other => {
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_body",
                format!("outcome {other:?} is not \"succeeded\" or \"failed_final\""),
            ));
        }
    };
    if body.note.trim().is_empty() {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_body",
            "a resolution needs a note",
        ));
    }
    let id = OperationId::from_string(raw);
    let view = state
        .ledger
        .operation_get(&id)
        .await?
        .ok_or_else(|| ApiError::not_found("operation"))?;
    let outcome = state
        .ledger
        .operation_converge(crate::ledger::Converge {
            operation_id: &id,
            expected_revision: view.operation.revision,
            settlement,
            remote_id: body.remote_id.as_deref(),
            result: body.result.as_ref(),
            kind: crate::ledger::ConvergeEvidence::Operator,
            actor: &body.actor,
            note: Some(&body.note),
            evidence: &json!({}),
        })
        .await?;
    match outcome {
        crate::ledger::ConvergeOutcome::Converged {
            operation,
            evidence_id,
        } => Ok(Json(
            json!({"operation": operation, "evidence_id": evidence_id}),
        )),
        crate::ledger::ConvergeOutcome::NotUnknown(found) => Err(ApiError::new(
            StatusCode::CONFLICT,
            "not_unknown",
            format!(
                "operation is {}: only unknown operations are resolved",
                found.status
            ),
        )),
        crate::ledger::ConvergeOutcome::Conflict { .. } => Err(ApiError::new(
            StatusCode::CONFLICT,
            "revision_conflict",
            "the operation changed while resolving it; look again",
        )),
        crate::ledger::ConvergeOutcome::NotFound => Err(ApiError::not_found("operation")),
    }
}

async fn unknown_summary(State(state): Shared) -> Result<Json<Value>, ApiError> {
    Ok(Json(
        serde_json::to_value(state.ledger.operations_unknown_summary().await?).unwrap_or_default(),
    ))
}
