//! The control API as a router: the handlers of `runs`, `leases`,
//! `operations` and `durability` mounted on the paths of
//! [`super::routes::ROUTES`] over one [`ControlState`], the optional routes
//! a serving process adds (`/metrics`, `/v1/upstreams`, `/v1/durability`),
//! and how it is served. The top of the folder: it depends on the route
//! files, never the reverse.

use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::response::IntoResponse;
use axum::routing::{get, post};

use super::error::{ApiError, ErrorCode};
use super::routes::{MAX_BATCH_BODY_BYTES, MAX_BODY_BYTES};
use super::state::{ControlState, OperatorLedger, UpstreamHealthSource};
use super::{durability, leases, operations, runs};
use crate::adapter::SharedDirectory;
use crate::intent::IntegerPolicy;
use crate::ledger::Ledger;

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
            post(leases::renew_batch).layer(DefaultBodyLimit::max(MAX_BATCH_BODY_BYTES)),
        )
        .route(
            "/v1/runs/{run_id}/operations",
            get(operations::list_operations),
        )
        .route("/v1/operations", get(operations::page_operations))
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

/// The routes that show this process rather than one tenant's data:
/// `/metrics`, `/v1/upstreams`, `/v1/durability`.
const PROCESS_VIEWS: [&str; 3] = ["/metrics", "/v1/upstreams", "/v1/durability"];

/// Keeps this process's own views (its metrics, upstream health and
/// durability) to tokens of the tenant it serves and admin tokens: another
/// tenant's operator gets 403 (without tokens, every caller is local).
pub fn process_views_for(router: Router, tenant: String) -> Router {
    router.layer(axum::middleware::from_fn(
        move |request: axum::extract::Request, next: axum::middleware::Next| {
            let foreign = PROCESS_VIEWS.contains(&request.uri().path())
                && request
                    .extensions()
                    .get::<crate::auth::Principal>()
                    .is_some_and(|principal| {
                        principal.scope != crate::auth::Scope::Admin && principal.tenant != tenant
                    });
            async move {
                if foreign {
                    return ApiError::new(
                        ErrorCode::InsufficientScope,
                        "this view shows the whole process, which serves another tenant: it needs a \
                         token of that tenant or an admin token",
                    )
                    .into_response();
                }
                next.run(request).await
            }
        },
    ))
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
