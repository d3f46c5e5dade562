//! The routes of the control API, its state, and how it is served.

use std::sync::Arc;

use axum::Router;
use axum::extract::{DefaultBodyLimit, State};
use axum::routing::{get, post};

use super::error::{ApiError, ErrorCode};
use super::{durability, leases, operations, runs};
use crate::adapter::SharedDirectory;
use crate::intent::IntegerPolicy;
use crate::ledger::{Fenced, Ledger, RunId};

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
    ("POST", "/v1/leases/renew"),
    ("GET", "/v1/runs/{run_id}/operations"),
    ("GET", "/v1/operations/unknown"),
    ("GET", "/v1/operations/{operation_id}"),
    ("POST", "/v1/operations/{operation_id}/resolve"),
    ("POST", "/v1/operations/{operation_id}/retry"),
    ("GET", "/v1/failovers"),
    ("POST", "/v1/failovers/{failover_id}/resolve"),
    // Added by `with_upstream_health`, `with_durability` and `with_metrics`
    // (as `leasegate serve` does).
    ("GET", "/v1/upstreams"),
    ("GET", "/v1/durability"),
    ("GET", "/metrics"),
];

/// Who runs the operator routes' SQL — resolve, retry, cancel, failover
/// resolve — which only the database role `leasegate_operator` may execute
/// (migrations/0007): a compromised proxy, running as `leasegate_app`,
/// cannot resolve as an operator.
#[derive(Debug, Clone)]
pub enum OperatorLedger {
    /// A ledger whose sessions run as `leasegate_operator`.
    Ready(Ledger),
    /// This process cannot act as `leasegate_operator` (why, and the fix):
    /// the operator routes answer 503 `role_not_granted`, nothing written.
    Unavailable(String),
}

impl OperatorLedger {
    /// The operator ledger, or why there is none and what to do about it
    /// (the control API's 503 and the console's refusal both say this).
    pub(super) fn ready(&self) -> Result<&Ledger, String> {
        match self {
            OperatorLedger::Ready(ledger) => Ok(ledger),
            OperatorLedger::Unavailable(why) => Err(format!(
                "this leasegate cannot act as the database role leasegate_operator, which \
                 operator acts need: {why}. Nothing was written. Use `leasegate ops …` with a \
                 login that is a member of leasegate_operator, or give this process one \
                 (database_operator_url)"
            )),
        }
    }

    /// The operator ledger, or the 503 that says why there is none.
    pub(super) fn get(&self) -> Result<&Ledger, ApiError> {
        self.ready()
            .map_err(|message| ApiError::new(ErrorCode::RoleNotGranted, message))
    }
}

pub(super) struct ControlState {
    pub(super) ledger: Ledger,
    /// The operator routes' ledger (see [`OperatorLedger`]).
    pub(super) operator: OperatorLedger,
    pub(super) integers: IntegerPolicy,
    /// The one tenant this API creates runs for (`tenant` of the serving
    /// process's config): a run of another tenant would be "not found" on
    /// that process's MCP front, so it is refused at creation. `None`: any.
    pub(super) tenant: Option<String>,
    /// The tools this process's upstreams list (the directory its MCP front
    /// and outbox resolve calls by): a planned intent for any other tool is
    /// refused at checkpoint time. `None` (the operator CLI, bare routers):
    /// not judged here.
    pub(super) tools: Option<Arc<SharedDirectory>>,
}

pub(super) type Shared = State<Arc<ControlState>>;

/// The control API as a router (serve it, or drive it with `oneshot` in
/// tests), for runs of any tenant. Without an operator ledger: the
/// operator routes answer 503 `role_not_granted` ([`router_with_operator`]
/// has one).
pub fn router(ledger: Ledger, integers: IntegerPolicy) -> Router {
    router_for_tenant(ledger, integers, None)
}

/// [`router`] whose operator routes run as `operator` (a ledger connected
/// as `leasegate_operator`).
pub fn router_with_operator(ledger: Ledger, operator: Ledger, integers: IntegerPolicy) -> Router {
    router_with_tools(
        ledger,
        OperatorLedger::Ready(operator),
        integers,
        None,
        None,
    )
}

/// The control API of a process that serves one tenant (`Some`): runs of
/// another tenant are refused (`tenant_mismatch`), and a create without
/// `tenant_id` is for that tenant. No operator ledger.
pub fn router_for_tenant(
    ledger: Ledger,
    integers: IntegerPolicy,
    tenant: Option<String>,
) -> Router {
    router_with_tools(
        ledger,
        OperatorLedger::Unavailable("this router was built without an operator ledger".into()),
        integers,
        tenant,
        None,
    )
}

/// The control API with every part given: the operator routes' ledger,
/// the tenant, and the tools planned intents are judged against (`None`:
/// not judged; `Some`: others are refused, `unknown_tool`, as the router
/// `leasegate serve` serves does).
pub fn router_with_tools(
    ledger: Ledger,
    operator: OperatorLedger,
    integers: IntegerPolicy,
    tenant: Option<String>,
    tools: Option<Arc<SharedDirectory>>,
) -> Router {
    let state = Arc::new(ControlState {
        ledger,
        operator,
        integers,
        tenant,
        tools,
    });
    Router::new()
        .route("/v1/runs", post(runs::create_run))
        .route("/v1/runs/{run_id}", get(runs::show_run))
        .route("/v1/runs/{run_id}/lease", post(runs::acquire))
        .route("/v1/runs/{run_id}/lease/renew", post(runs::renew))
        .route("/v1/runs/{run_id}/lease/release", post(runs::release))
        .route("/v1/runs/{run_id}/checkpoint", post(runs::checkpoint))
        .route("/v1/runs/{run_id}/start", post(runs::start))
        .route("/v1/runs/{run_id}/complete", post(runs::complete))
        .route("/v1/runs/{run_id}/fail", post(runs::fail))
        .route("/v1/runs/{run_id}/cancel", post(runs::cancel))
        .route(
            "/v1/leases/renew",
            post(leases::renew_batch).layer(DefaultBodyLimit::max(leases::MAX_BATCH_BODY_BYTES)),
        )
        .route(
            "/v1/runs/{run_id}/operations",
            get(operations::list_operations),
        )
        .route("/v1/operations/unknown", get(operations::unknown_summary))
        .route(
            "/v1/operations/{operation_id}",
            get(operations::show_operation),
        )
        .route(
            "/v1/operations/{operation_id}/resolve",
            post(operations::resolve_operation),
        )
        .route(
            "/v1/operations/{operation_id}/retry",
            post(operations::retry_operation),
        )
        .route("/v1/failovers", get(durability::list_failovers))
        .route(
            "/v1/failovers/{failover_id}/resolve",
            post(durability::resolve_failover),
        )
        .fallback(|| async {
            ApiError::new(ErrorCode::NoRoute, "no such endpoint; see openapi.json")
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

/// What the upstreams' health looks like as JSON (the MCP layer provides
/// it; this module does not depend on it).
pub type UpstreamHealthSource = Arc<dyn Fn() -> serde_json::Value + Send + Sync>;

/// Adds `GET /v1/upstreams`: each upstream's state (`up`, `restarting`,
/// `down`), since when, restarts and last error.
pub fn with_upstream_health(router: Router, health: UpstreamHealthSource) -> Router {
    router.route(
        "/v1/upstreams",
        get(move || {
            let upstreams = health();
            std::future::ready(axum::Json(serde_json::json!({ "upstreams": upstreams })))
        }),
    )
}

/// Adds `GET /v1/durability`: this process's durability contract, whether
/// it is met, why not, the facts it was judged by, the acknowledged WAL
/// high-water and the unresolved failovers (`crate::durability::Report`).
pub fn with_durability(router: Router, gate: Arc<crate::durability::DurabilityGate>) -> Router {
    router.route(
        "/v1/durability",
        get(move || std::future::ready(axum::Json(gate.report()))),
    )
}

/// The router `leasegate serve` serves: the API for its tenant, judging
/// planned intents against its upstreams' `tools`, and `/metrics`.
pub fn router_with_metrics(
    ledger: Ledger,
    operator: OperatorLedger,
    integers: IntegerPolicy,
    tenant: String,
    tools: Arc<SharedDirectory>,
    handle: metrics_exporter_prometheus::PrometheusHandle,
) -> Router {
    with_metrics(
        router_with_tools(ledger, operator, integers, Some(tenant), Some(tools)),
        handle,
    )
}

/// Refuses foreign `Host` and `Origin` headers (`guard`) before any route.
pub fn guarded(router: Router, allowed: Arc<super::guard::Allowed>) -> Router {
    router.layer(axum::middleware::from_fn(
        move |request: axum::extract::Request, next: axum::middleware::Next| {
            super::guard::check(allowed.clone(), request, next)
        },
    ))
}

/// Serves the control API until `shutdown` completes, bounded by `limits`
/// (`crate::http_server`: timeouts, at most `max_connections` connections, the
/// rate limit).
pub async fn serve(
    router: Router,
    listener: tokio::net::TcpListener,
    limits: &crate::config::Limits,
    max_connections: usize,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    crate::http_server::serve(
        listener,
        router,
        crate::http_server::Listener::Control,
        limits,
        max_connections,
        shutdown,
    )
    .await
}

pub(super) fn run_id(raw: &str) -> Result<RunId, ApiError> {
    raw.parse::<RunId>().map_err(ApiError::from)
}

pub(super) fn applied<T>(outcome: Fenced<T>) -> Result<T, ApiError> {
    outcome.into_result().map_err(ApiError::from)
}
