//! The web console: server-rendered HTML pages over the ledger, served by
//! the control listener under `/console`, behind the same Host/Origin guard,
//! authentication and tenant scoping as the control API.
//!
//! * `pages`: the HTML (maud templates, every interpolation escaped); the
//!   stylesheet and script are `console.css` and `console.js`, embedded with
//!   `include_str!` — no Node toolchain at build or run time.
//! * Pages: overview (`/console`), runs (`/console/runs`, a run's page),
//!   operations (`/console/operations`, an operation's page with what the
//!   reconciler plans next — read-only, `reconcile::plan` through
//!   [`Sources::planner`]).
//! * Actions (forms, POST): resolve an unknown operation, start a
//!   budget-spent one's same-key retries over, cancel a run.
//!
//! # Invariants
//!
//! 1. Who: every action is written with the actor of the request — the
//!    token's id (`token:<id>`) when authentication is on, `local-operator`
//!    when it is off (shown as "local operator") — and the note the form
//!    requires; the ledger keeps both in `ledger_events` (and the
//!    operator's evidence for a resolution).
//! 2. Optimistic: every action form carries the revision its page was
//!    rendered at. A resolution passes it to `operation_converge` (the
//!    ledger's compare-and-swap: `conflict` when the row moved on); a retry
//!    and a cancel compare it with the row read just before the one ledger
//!    call. Either way a moved-on operation or run is refused (409, a page
//!    that says so) and nothing is written.
//! 3. Tenant: a run or operation of another tenant than the caller's is
//!    "not found", exactly as one that does not exist; lists and counts are
//!    of the caller's tenant only.
//! 4. Bad input (no note, an outcome that is not `succeeded` or
//!    `failed_final`, a missing or wrong form token) is refused with a
//!    precise message before any write.
//! 5. Never the lease secret: pages show owner, epoch and expiry only.
//!    Bodies are shown as the control API shows them (the policy's masking
//!    kept; sealed bodies opened by the ledger).
//!
//! # Browser authentication
//!
//! With tokens required, `/console/login` takes a token and sets it as the
//! `lg_console` cookie (HttpOnly, SameSite=Strict, Path=/console, Secure
//! unless the request's Host is loopback); `control::auth` accepts that
//! cookie on `/console` routes only (the JSON API stays bearer-only) and
//! sends a browser without a valid one to the login page. Logout clears it.
//! CSRF: SameSite=Strict, the Origin check of `control::guard`, and a
//! per-form token (SHA-256 of a per-process random key and the caller's
//! token id) every POST must carry.
//!
//! # Failure handling
//!
//! Each action is one ledger call (one short transaction). If the process
//! dies before it, nothing was written; after it, the ledger has the change
//! and its event, and the page shows it on the next load. A ledger that
//! cannot be reached is a 503 page; nothing is retried here.

mod pages;

use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Form, Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::auth::{Principal, Scope};
use crate::intent::OperationId;
use crate::ledger::{
    Converge, ConvergeEvidence, ConvergeOutcome, Evidence, Ledger, LedgerError, OperationRecord,
    OperationSearch, RetryResetOutcome, RunId, RunSearch, Settlement,
};

/// The cookie that carries a console login's token.
pub const COOKIE: &str = "lg_console";
/// The actor of actions taken without authentication (loopback default).
pub const LOCAL_ACTOR: &str = "local-operator";

const OPERATOR: &[Scope] = &[Scope::Operator];

/// Every console route and the scopes it accepts (`admin` everywhere).
/// They are not part of the JSON API (`openapi.json`, `ROUTES`);
/// `control::auth::route_scopes` reads this table after `ROUTE_SCOPES`.
/// The login page, logout and the assets need no token ([`is_public`]).
/// The console shows request and result bodies, so every page is
/// `operator`: an agent token sees nothing here.
pub const CONSOLE_ROUTES: &[(&str, &str, &[Scope])] = &[
    ("GET", "/console", OPERATOR),
    ("GET", "/console/runs", OPERATOR),
    ("GET", "/console/runs/{run_id}", OPERATOR),
    ("POST", "/console/runs/{run_id}/cancel", OPERATOR),
    ("GET", "/console/operations", OPERATOR),
    ("GET", "/console/operations/{operation_id}", OPERATOR),
    (
        "POST",
        "/console/operations/{operation_id}/resolve",
        OPERATOR,
    ),
    ("POST", "/console/operations/{operation_id}/retry", OPERATOR),
];

/// Console paths served without a token: the login form, logout and the
/// static assets.
pub fn is_public(path: &str) -> bool {
    path == "/console/login" || path == "/console/logout" || path.starts_with("/console/assets/")
}

/// Whether `path` is the console's (cookie accepted, login redirect).
pub fn is_console(path: &str) -> bool {
    path == "/console" || path.starts_with("/console/")
}

/// The token a console request carries in its cookie, as an
/// `Authorization` value.
pub fn cookie_bearer(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| format!("Bearer {value}"))
        .filter(|v| v.len() > "Bearer ".len())
}

/// How the next step of an operation is described: (step, explanation).
pub type Planner =
    Arc<dyn Fn(&OperationRecord, &[Evidence], &Value) -> (&'static str, String) + Send + Sync>;

/// What the console reads besides the ledger (`leasegate serve` gives all
/// of them; a bare router may give none).
#[derive(Clone)]
pub struct Sources {
    pub ledger: Ledger,
    /// The operator acts' ledger — cancel, resolve, retry run as the
    /// database role `leasegate_operator` (migrations/0007), like the
    /// control API's operator routes; unavailable: the actions are refused
    /// (503) with nothing written.
    pub operator: super::OperatorLedger,
    /// The serving process's tenant (`None`: any).
    pub tenant: Option<String>,
    /// Whether tokens are required (`[auth]`): with them, the login page.
    pub auth_required: bool,
    pub upstreams: Option<super::UpstreamHealthSource>,
    /// The process's Prometheus text.
    pub metrics: Option<Arc<dyn Fn() -> String + Send + Sync>>,
    pub planner: Option<Planner>,
}

pub(crate) struct ConsoleState {
    sources: Sources,
    /// Key of the per-form tokens (random per process: a restart
    /// invalidates open forms, which then say so).
    form_key: [u8; 32],
    /// The last (time, calls dispatched) sample: calls per second between
    /// two overview loads.
    last_calls: Mutex<Option<(Instant, f64)>>,
}

type Shared = State<Arc<ConsoleState>>;

/// Adds the console's routes to the control `router`.
pub fn with_console(router: Router, sources: Sources) -> Router {
    let mut form_key = [0u8; 32];
    // The OS random source; a failure leaves a zero key, which still binds
    // forms to the caller, only not to this process.
    let _ = getrandom::fill(&mut form_key);
    let state = Arc::new(ConsoleState {
        sources,
        form_key,
        last_calls: Mutex::new(None),
    });
    let console = Router::new()
        .route("/console", get(overview))
        .route("/console/runs", get(runs))
        .route("/console/runs/{run_id}", get(run_page))
        .route("/console/runs/{run_id}/cancel", post(cancel_run))
        .route("/console/operations", get(operations))
        .route("/console/operations/{operation_id}", get(operation_page))
        .route(
            "/console/operations/{operation_id}/resolve",
            post(resolve_operation),
        )
        .route(
            "/console/operations/{operation_id}/retry",
            post(retry_operation),
        )
        .route("/console/login", get(login_page).post(login))
        .route("/console/logout", post(logout))
        .route(
            "/console/assets/console.css",
            get(|| asset("text/css; charset=utf-8", include_str!("console.css"))),
        )
        .route(
            "/console/assets/console.js",
            get(|| asset("text/javascript; charset=utf-8", include_str!("console.js"))),
        )
        .layer(DefaultBodyLimit::max(64 * 1024))
        .with_state(state);
    router.merge(console)
}

async fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

/// Who a console request is.
pub(crate) struct Viewer {
    principal: Option<Principal>,
    served: Option<String>,
}

impl Viewer {
    fn of(request_principal: Option<Principal>, state: &ConsoleState) -> Self {
        Viewer {
            principal: request_principal,
            served: state.sources.tenant.clone(),
        }
    }

    /// The tenant whose runs and operations this viewer sees (`None`: any).
    fn tenant(&self) -> Option<&str> {
        match &self.principal {
            Some(principal) => Some(&principal.tenant),
            None => self.served.as_deref(),
        }
    }

    /// The actor written with this viewer's actions (invariant 1).
    fn actor(&self) -> String {
        match &self.principal {
            Some(principal) => format!("token:{}", principal.token_id),
            None => LOCAL_ACTOR.to_owned(),
        }
    }

    /// How the header names this viewer.
    fn display(&self) -> String {
        match &self.principal {
            Some(principal) => format!(
                "token {} ({}, tenant {})",
                principal.token_id, principal.scope, principal.tenant
            ),
            None => "local operator".to_owned(),
        }
    }

    fn form_token(&self, key: &[u8; 32]) -> String {
        let mut hash = Sha256::new();
        hash.update(key);
        hash.update(self.actor().as_bytes());
        hex::encode(hash.finalize())
    }
}

impl axum::extract::FromRequestParts<Arc<ConsoleState>> for Viewer {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &Arc<ConsoleState>,
    ) -> Result<Self, Self::Rejection> {
        Ok(Viewer::of(
            parts.extensions.get::<Principal>().cloned(),
            state,
        ))
    }
}

/// A console error page.
pub(crate) struct Problem {
    status: StatusCode,
    message: String,
}

impl Problem {
    fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Problem {
            status,
            message: message.into(),
        }
    }

    fn not_found(what: &str) -> Self {
        Problem::new(StatusCode::NOT_FOUND, format!("no such {what}"))
    }
}

impl From<LedgerError> for Problem {
    fn from(error: LedgerError) -> Self {
        if let LedgerError::InvalidInput(invalid) = &error {
            return Problem::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                format!("refused: {invalid}; nothing was written"),
            );
        }
        // The API's mapping: unreachable → 503, an outcome lost → 503, …;
        // the page says what it means (never SQL).
        let api = super::ApiError::from(error);
        let response = api.into_response();
        Problem::new(
            response.status(),
            "the ledger could not answer (see the server log); nothing was changed",
        )
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        (
            self.status,
            html(pages::problem(self.status, &self.message)),
        )
            .into_response()
    }
}

type PageResult = Result<Response, Problem>;

fn html(markup: maud::Markup) -> Response {
    (
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        markup.into_string(),
    )
        .into_response()
}

fn parse_run(raw: &str) -> Result<RunId, Problem> {
    raw.trim().parse::<RunId>().map_err(|_| {
        Problem::new(
            StatusCode::BAD_REQUEST,
            format!("{raw:?} is not a run id (a UUID)"),
        )
    })
}

fn blank(value: &Option<String>) -> Option<&str> {
    value.as_deref().map(str::trim).filter(|v| !v.is_empty())
}

// Overview.

/// Sums of Prometheus counters by one label, from the text exposition.
fn counter_by(text: &str, name: &str, label: &str) -> Vec<(String, f64)> {
    let mut sums: std::collections::BTreeMap<String, f64> = Default::default();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        let (labels, value) = match rest.strip_prefix('{') {
            Some(rest) => match rest.split_once('}') {
                Some((labels, value)) => (labels, value),
                None => continue,
            },
            None if rest.starts_with(' ') => ("", rest),
            None => continue,
        };
        let Ok(value) = value.trim().parse::<f64>() else {
            continue;
        };
        let key = labels
            .split(',')
            .filter_map(|pair| pair.split_once('='))
            .find(|(k, _)| k.trim() == label)
            .map(|(_, v)| v.trim().trim_matches('"').to_owned())
            .unwrap_or_default();
        *sums.entry(key).or_default() += value;
    }
    sums.into_iter().collect()
}

/// What the overview shows.
pub(crate) struct Overview {
    counts: crate::ledger::ConsoleCounts,
    unknown: crate::ledger::UnknownSummary,
    /// Unknown operations the reconciler cannot settle: (operation, age, why).
    needs_operator: Vec<(OperationRecord, f64, String)>,
    upstreams: Option<Value>,
    calls_per_second: Option<f64>,
    calls_total: Option<f64>,
    takeovers_total: Option<f64>,
    rejections: Vec<(String, f64)>,
    refusals: Vec<(String, f64)>,
}

async fn overview(State(state): Shared, viewer: Viewer) -> PageResult {
    let ledger = &state.sources.ledger;
    let tenant = viewer.tenant();
    let counts = ledger.console_counts(tenant).await?;
    let unknown = ledger.operations_unknown_summary_of(tenant).await?;
    let mut needs_operator = Vec::new();
    if let Some(planner) = &state.sources.planner {
        let unknowns = ledger
            .console_operations(&OperationSearch {
                tenant,
                status: Some("unknown"),
                ..Default::default()
            })
            .await?;
        for row in unknowns.into_iter().take(50) {
            let Some(view) = ledger.operation_get(&row.operation.operation_id).await? else {
                continue;
            };
            let (step, why) = planner(&view.operation, &view.evidence, &view.request_body);
            if step == "needs_operator" {
                needs_operator.push((row.operation, row.age_seconds, why));
            }
        }
    }
    let metrics = state.sources.metrics.as_ref().map(|render| render());
    let (mut calls_per_second, mut calls_total, mut takeovers_total) = (None, None, None);
    let (mut rejections, mut refusals) = (Vec::new(), Vec::new());
    if let Some(text) = &metrics {
        let total = counter_by(text, "dispatch_total", "outcome")
            .iter()
            .fold(0.0, |sum, (_, v)| sum + v);
        calls_total = Some(total);
        let now = Instant::now();
        let mut last = state.last_calls.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((at, before)) = *last {
            let seconds = now.duration_since(at).as_secs_f64();
            if seconds > 0.0 {
                calls_per_second = Some(((total - before) / seconds).max(0.0));
            }
        }
        *last = Some((now, total));
        takeovers_total = counter_by(text, "lease_acquire_total", "outcome")
            .into_iter()
            .find(|(outcome, _)| outcome == "taken_over")
            .map(|(_, v)| v)
            .or(Some(0.0));
        rejections = counter_by(text, "protected_write_rejected_total", "reason");
        refusals = counter_by(text, "http_refused_total", "reason");
    }
    let upstreams = state.sources.upstreams.as_ref().map(|health| health());
    Ok(html(pages::overview(
        &viewer.display(),
        state.sources.auth_required,
        &Overview {
            counts,
            unknown,
            needs_operator,
            upstreams,
            calls_per_second,
            calls_total,
            takeovers_total,
            rejections,
            refusals,
        },
    )))
}

// Runs.

#[derive(Debug, Deserialize, Default)]
pub(crate) struct RunQuery {
    task: Option<String>,
    run_id: Option<String>,
    status: Option<String>,
}

async fn runs(State(state): Shared, viewer: Viewer, Query(query): Query<RunQuery>) -> PageResult {
    let run_id = blank(&query.run_id).map(parse_run).transpose()?;
    let status = blank(&query.status);
    if let Some(status) = status
        && crate::ledger::RunStatus::parse(status).is_none()
    {
        return Err(Problem::new(
            StatusCode::BAD_REQUEST,
            format!(
                "{status:?} is not a run status (pending, running, succeeded, failed, cancelled)"
            ),
        ));
    }
    let rows = state
        .sources
        .ledger
        .console_runs(&RunSearch {
            tenant: viewer.tenant(),
            task: blank(&query.task),
            run_id,
            status,
        })
        .await?;
    Ok(html(pages::runs(
        &viewer.display(),
        state.sources.auth_required,
        &query,
        &rows,
    )))
}

#[derive(Debug, Deserialize, Default)]
pub(crate) struct Flash {
    done: Option<String>,
}

async fn run_page(
    State(state): Shared,
    viewer: Viewer,
    Path(raw): Path<String>,
    Query(flash): Query<Flash>,
) -> PageResult {
    run_response(&state, &viewer, &raw, flash.done.as_deref(), None).await
}

async fn run_response(
    state: &ConsoleState,
    viewer: &Viewer,
    raw: &str,
    done: Option<&str>,
    refused: Option<(StatusCode, String)>,
) -> PageResult {
    let run = parse_run(raw)?;
    let ledger = &state.sources.ledger;
    let view = ledger
        .run_get(run)
        .await?
        .filter(|view| viewer.tenant().is_none_or(|own| view.tenant_id == own))
        .ok_or_else(|| Problem::not_found("run"))?;
    let events = ledger.run_events(run).await?;
    let operations = ledger.operations_list(run, None).await?;
    let status = refused
        .as_ref()
        .map(|(status, _)| *status)
        .unwrap_or(StatusCode::OK);
    let page = pages::run(
        &viewer.display(),
        state.sources.auth_required,
        &view,
        &events,
        &operations,
        &viewer.form_token(&state.form_key),
        done,
        refused.as_ref().map(|(_, message)| message.as_str()),
    );
    Ok((status, html(page)).into_response())
}

#[derive(Debug, Deserialize)]
pub(crate) struct CancelForm {
    revision: Option<String>,
    note: Option<String>,
    form_token: Option<String>,
}

fn check_form_token(
    state: &ConsoleState,
    viewer: &Viewer,
    token: Option<&str>,
) -> Result<(), String> {
    match token {
        Some(token) if token == viewer.form_token(&state.form_key) => Ok(()),
        Some(_) => Err("refused: the form's token is not this session's (the page is from another login or an earlier leasegate process); reload the page. Nothing was written".to_owned()),
        None => Err("refused: the form carries no form token; reload the page. Nothing was written".to_owned()),
    }
}

/// What every action form is checked for first: its per-form token (403),
/// then the revision it was rendered at (422); the revision, or the refusal.
fn form_revision(
    state: &ConsoleState,
    viewer: &Viewer,
    token: Option<&str>,
    revision: Option<&str>,
) -> Result<i64, (StatusCode, String)> {
    check_form_token(state, viewer, token).map_err(|message| (StatusCode::FORBIDDEN, message))?;
    expected_revision(revision).map_err(|message| (StatusCode::UNPROCESSABLE_ENTITY, message))
}

fn expected_revision(raw: Option<&str>) -> Result<i64, String> {
    raw.map(str::trim)
        .filter(|v| !v.is_empty())
        .ok_or_else(|| {
            "refused: the form carries no revision; reload the page. Nothing was written".to_owned()
        })?
        .parse::<i64>()
        .map_err(|_| {
            "refused: the form's revision is not a number; reload the page. Nothing was written"
                .to_owned()
        })
}

fn required_note(note: Option<&str>, what: &str) -> Result<String, String> {
    match note.map(str::trim).filter(|n| !n.is_empty()) {
        Some(note) => Ok(note.to_owned()),
        None => Err(format!(
            "refused: a {what} needs a note (why); nothing was written"
        )),
    }
}

async fn cancel_run(
    State(state): Shared,
    viewer: Viewer,
    Path(raw): Path<String>,
    Form(form): Form<CancelForm>,
) -> PageResult {
    let run = parse_run(&raw)?;
    let refuse = |status: StatusCode, message: String| {
        let state = state.clone();
        let raw = raw.clone();
        let viewer = &viewer;
        async move { run_response(&state, viewer, &raw, None, Some((status, message))).await }
    };
    // Another tenant's run is not found before anything else is said.
    let view = state
        .sources
        .ledger
        .run_get(run)
        .await?
        .filter(|view| viewer.tenant().is_none_or(|own| view.tenant_id == own))
        .ok_or_else(|| Problem::not_found("run"))?;
    let expected = match form_revision(
        &state,
        &viewer,
        form.form_token.as_deref(),
        form.revision.as_deref(),
    ) {
        Ok(expected) => expected,
        Err((status, message)) => return refuse(status, message).await,
    };
    let note = match required_note(form.note.as_deref(), "cancel") {
        Ok(note) => note,
        Err(message) => return refuse(StatusCode::UNPROCESSABLE_ENTITY, message).await,
    };
    if view.revision != expected {
        return refuse(
            StatusCode::CONFLICT,
            format!(
                "refused: the run moved on since this page was rendered (revision {expected}, now {}, {}); nothing was written. Look again",
                view.revision, view.status
            ),
        )
        .await;
    }
    let operator = match operator_ledger(&state) {
        Ok(operator) => operator,
        Err(message) => return refuse(StatusCode::SERVICE_UNAVAILABLE, message).await,
    };
    // If we crash here nothing was written; after the call the run is
    // cancelled with its event.
    let outcome = operator
        .run_cancel(run, &viewer.actor(), Some(&note))
        .await?;
    match outcome.into_result() {
        Ok(_) => Ok(Redirect::to(&format!("/console/runs/{run}?done=cancelled")).into_response()),
        Err(rejection) => {
            refuse(
                StatusCode::CONFLICT,
                format!("refused: {rejection}; nothing was written"),
            )
            .await
        }
    }
}

// Operations.

#[derive(Debug, Deserialize, Default)]
pub(crate) struct OperationQuery {
    status: Option<String>,
    tool: Option<String>,
    upstream: Option<String>,
    run_id: Option<String>,
    /// Minimum age, e.g. `5m`, `1h`, `30s`.
    older_than: Option<String>,
}

async fn operations(
    State(state): Shared,
    viewer: Viewer,
    Query(query): Query<OperationQuery>,
) -> PageResult {
    let run_id = blank(&query.run_id).map(parse_run).transpose()?;
    let status = blank(&query.status);
    if let Some(status) = status
        && crate::ledger::OperationStatus::parse(status).is_none()
    {
        return Err(Problem::new(
            StatusCode::BAD_REQUEST,
            format!(
                "{status:?} is not an operation status (prepared, dispatching, unknown, succeeded, failed_final, cancelled)"
            ),
        ));
    }
    let older_than_seconds = blank(&query.older_than)
        .map(|text| {
            humantime::parse_duration(text)
                .map(|d| d.as_secs() as i64)
                .map_err(|_| {
                    Problem::new(
                        StatusCode::BAD_REQUEST,
                        format!("{text:?} is not an age (such as 30s, 5m, 2h)"),
                    )
                })
        })
        .transpose()?;
    let rows = state
        .sources
        .ledger
        .console_operations(&OperationSearch {
            tenant: viewer.tenant(),
            status,
            tool: blank(&query.tool),
            upstream: blank(&query.upstream),
            run_id,
            older_than_seconds,
        })
        .await?;
    Ok(html(pages::operations(
        &viewer.display(),
        state.sources.auth_required,
        &query,
        &rows,
    )))
}

fn operation_id(raw: &str) -> Result<OperationId, Problem> {
    if raw.is_empty() || raw.len() > 255 {
        return Err(Problem::new(
            StatusCode::BAD_REQUEST,
            "operation ids are 1 to 255 characters",
        ));
    }
    Ok(OperationId::from_string(raw.to_owned()))
}

async fn operation_page(
    State(state): Shared,
    viewer: Viewer,
    Path(raw): Path<String>,
    Query(flash): Query<Flash>,
) -> PageResult {
    operation_response(&state, &viewer, &raw, flash.done.as_deref(), None, None).await
}

/// What a refused form asked, to fill the form again.
#[derive(Debug, Default)]
pub(crate) struct Asked {
    outcome: Option<String>,
    remote_id: Option<String>,
    note: Option<String>,
}

async fn operation_response(
    state: &ConsoleState,
    viewer: &Viewer,
    raw: &str,
    done: Option<&str>,
    refused: Option<(StatusCode, String)>,
    asked: Option<Asked>,
) -> PageResult {
    let id = operation_id(raw)?;
    let ledger = &state.sources.ledger;
    if let Some(own) = viewer.tenant()
        && ledger.operation_tenant(&id).await?.as_deref() != Some(own)
    {
        return Err(Problem::not_found("operation"));
    }
    let view = ledger
        .operation_get(&id)
        .await?
        .ok_or_else(|| Problem::not_found("operation"))?;
    let attempts = ledger.console_reconcile_attempts(&id).await?;
    let plan = if view.operation.status == crate::ledger::OperationStatus::Unknown {
        state
            .sources
            .planner
            .as_ref()
            .map(|planner| planner(&view.operation, &view.evidence, &view.request_body))
    } else {
        None
    };
    let status = refused
        .as_ref()
        .map(|(status, _)| *status)
        .unwrap_or(StatusCode::OK);
    let page = pages::operation(
        &viewer.display(),
        state.sources.auth_required,
        &pages::OperationPage {
            view: &view,
            reconcile_attempts: attempts,
            plan,
            form_token: viewer.form_token(&state.form_key),
            done,
            refused: refused.as_ref().map(|(_, message)| message.as_str()),
            asked: asked.unwrap_or_default(),
        },
    );
    Ok((status, html(page)).into_response())
}

#[derive(Debug, Deserialize)]
pub(crate) struct ResolveForm {
    revision: Option<String>,
    outcome: Option<String>,
    remote_id: Option<String>,
    note: Option<String>,
    form_token: Option<String>,
}

async fn resolve_operation(
    State(state): Shared,
    viewer: Viewer,
    Path(raw): Path<String>,
    Form(form): Form<ResolveForm>,
) -> PageResult {
    let id = operation_id(&raw)?;
    let asked = || Asked {
        outcome: form.outcome.clone(),
        remote_id: form.remote_id.clone(),
        note: form.note.clone(),
    };
    let refuse = |status: StatusCode, message: String| {
        let asked = asked();
        let state = state.clone();
        let raw = raw.clone();
        let viewer = &viewer;
        async move {
            operation_response(
                &state,
                viewer,
                &raw,
                None,
                Some((status, message)),
                Some(asked),
            )
            .await
        }
    };
    let ledger = &state.sources.ledger;
    if let Some(own) = viewer.tenant()
        && ledger.operation_tenant(&id).await?.as_deref() != Some(own)
    {
        return Err(Problem::not_found("operation"));
    }
    let expected = match form_revision(
        &state,
        &viewer,
        form.form_token.as_deref(),
        form.revision.as_deref(),
    ) {
        Ok(expected) => expected,
        Err((status, message)) => return refuse(status, message).await,
    };
    let settlement = match form.outcome.as_deref() {
        Some("succeeded") => Settlement::Succeeded,
        Some("failed_final") => Settlement::FailedFinal,
        other => {
            return refuse(
                StatusCode::UNPROCESSABLE_ENTITY,
                format!(
                    "refused: outcome {:?} is not \"succeeded\" or \"failed_final\"; nothing was written",
                    other.unwrap_or("")
                ),
            )
            .await;
        }
    };
    let note = match required_note(form.note.as_deref(), "resolution") {
        Ok(note) => note,
        Err(message) => return refuse(StatusCode::UNPROCESSABLE_ENTITY, message).await,
    };
    let remote_id = blank(&form.remote_id);
    let actor = viewer.actor();
    let operator = match operator_ledger(&state) {
        Ok(operator) => operator,
        Err(message) => return refuse(StatusCode::SERVICE_UNAVAILABLE, message).await,
    };
    // One ledger call: the revision the page was rendered at is the
    // compare-and-swap's expected value (invariant 2). If we crash before
    // it nothing was written; after it, the operation is settled with the
    // operator's evidence and event.
    let outcome = operator
        .operation_converge(Converge {
            operation_id: &id,
            expected_revision: expected,
            settlement,
            remote_id,
            result: None,
            kind: ConvergeEvidence::Operator,
            actor: &actor,
            note: Some(&note),
            evidence: &serde_json::json!({"via": "console"}),
        })
        .await;
    let outcome = match outcome {
        Ok(outcome) => outcome,
        Err(LedgerError::InvalidInput(invalid)) => {
            return refuse(
                StatusCode::UNPROCESSABLE_ENTITY,
                format!("refused: {invalid}; nothing was written"),
            )
            .await;
        }
        Err(error) => return Err(error.into()),
    };
    match outcome {
        ConvergeOutcome::Converged { .. } => {
            Ok(Redirect::to(&format!("/console/operations/{}?done=resolved", pages::path_segment(id.as_str()))).into_response())
        }
        ConvergeOutcome::NotUnknown(found) => {
            refuse(
                StatusCode::CONFLICT,
                format!(
                    "refused: the operation is {} (revision {}), no longer unknown; only unknown operations are resolved. Nothing was written",
                    found.status, found.revision
                ),
            )
            .await
        }
        ConvergeOutcome::Conflict { .. } => {
            let now = ledger
                .operation_record(&id)
                .await?
                .map(|found| format!("now {} at revision {}", found.status, found.revision))
                .unwrap_or_default();
            refuse(
                StatusCode::CONFLICT,
                format!(
                    "refused: the operation moved on since this page was rendered (revision {expected}; {now}); nothing was written. Look again before resolving"
                ),
            )
            .await
        }
        ConvergeOutcome::NotFound => Err(Problem::not_found("operation")),
    }
}

#[derive(Debug, Deserialize)]
pub(crate) struct RetryForm {
    revision: Option<String>,
    note: Option<String>,
    form_token: Option<String>,
}

async fn retry_operation(
    State(state): Shared,
    viewer: Viewer,
    Path(raw): Path<String>,
    Form(form): Form<RetryForm>,
) -> PageResult {
    let id = operation_id(&raw)?;
    let refuse = |status: StatusCode, message: String| {
        let state = state.clone();
        let raw = raw.clone();
        let viewer = &viewer;
        async move {
            operation_response(&state, viewer, &raw, None, Some((status, message)), None).await
        }
    };
    let ledger = &state.sources.ledger;
    if let Some(own) = viewer.tenant()
        && ledger.operation_tenant(&id).await?.as_deref() != Some(own)
    {
        return Err(Problem::not_found("operation"));
    }
    let expected = match form_revision(
        &state,
        &viewer,
        form.form_token.as_deref(),
        form.revision.as_deref(),
    ) {
        Ok(expected) => expected,
        Err((status, message)) => return refuse(status, message).await,
    };
    let note = match required_note(form.note.as_deref(), "retry") {
        Ok(note) => note,
        Err(message) => return refuse(StatusCode::UNPROCESSABLE_ENTITY, message).await,
    };
    let found = ledger
        .operation_record(&id)
        .await?
        .ok_or_else(|| Problem::not_found("operation"))?;
    if found.revision != expected {
        return refuse(
            StatusCode::CONFLICT,
            format!(
                "refused: the operation moved on since this page was rendered (revision {expected}; now {} at revision {}); nothing was written. Look again",
                found.status, found.revision
            ),
        )
        .await;
    }
    let operator = match operator_ledger(&state) {
        Ok(operator) => operator,
        Err(message) => return refuse(StatusCode::SERVICE_UNAVAILABLE, message).await,
    };
    // If we crash here nothing was written; after the call the budget is
    // reset with its event.
    match operator
        .operation_reconcile_reset(&id, &viewer.actor(), &note)
        .await?
    {
        RetryResetOutcome::Reset(_) => Ok(Redirect::to(&format!(
            "/console/operations/{}?done=retry_reset",
            pages::path_segment(id.as_str())
        ))
        .into_response()),
        RetryResetOutcome::NotUnknown(found) => {
            refuse(
                StatusCode::CONFLICT,
                format!(
                    "refused: the operation is {}, no longer unknown; only unknown operations are retried. Nothing was written",
                    found.status
                ),
            )
            .await
        }
        RetryResetOutcome::NotFound => Err(Problem::not_found("operation")),
    }
}

/// The ledger the operator acts run on, or why this process has none.
fn operator_ledger(state: &ConsoleState) -> Result<&Ledger, String> {
    state
        .sources
        .operator
        .ready()
        .map_err(|why| format!("refused: {why}"))
}

// Login.

#[derive(Debug, Deserialize, Default)]
pub(crate) struct LoginQuery {
    failed: Option<String>,
}

async fn login_page(State(state): Shared, Query(query): Query<LoginQuery>) -> Response {
    html(pages::login(
        state.sources.auth_required,
        query.failed.as_deref(),
    ))
}

#[derive(Debug, Deserialize)]
pub(crate) struct LoginForm {
    token: Option<String>,
}

fn loopback(host: &str) -> bool {
    let host = host.rsplit_once(':').map_or(host, |(h, port)| {
        if port.chars().all(|c| c.is_ascii_digit()) {
            h
        } else {
            host
        }
    });
    let host = host.trim_matches(['[', ']']);
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

fn cookie(value: &str, host: &str, max_age: Option<u64>) -> HeaderValue {
    let secure = if loopback(host) { "" } else { "; Secure" };
    let age = max_age.map_or(String::new(), |age| format!("; Max-Age={age}"));
    HeaderValue::from_str(&format!(
        "{COOKIE}={value}; HttpOnly; SameSite=Strict; Path=/console{secure}{age}"
    ))
    .unwrap_or_else(|_| HeaderValue::from_static("lg_console=; Max-Age=0; Path=/console"))
}

fn host(request_headers: &HeaderMap) -> String {
    request_headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned()
}

async fn login(headers: HeaderMap, Form(form): Form<LoginForm>) -> Response {
    let token = form.token.unwrap_or_default();
    let token = token.trim();
    // A cookie value holds no separators; anything else is not a token.
    if token.is_empty()
        || !token
            .chars()
            .all(|c| c.is_ascii_graphic() && c != ';' && c != ',' && c != '"' && c != '\\')
    {
        return Redirect::to("/console/login?failed=malformed").into_response();
    }
    // Validated by `control::auth` on the next request, as every request is:
    // an unknown or revoked token comes back here with `failed`.
    let mut response = Redirect::to("/console").into_response();
    response
        .headers_mut()
        .insert(header::SET_COOKIE, cookie(token, &host(&headers), None));
    response
}

async fn logout(request: Request) -> Response {
    let mut response = Redirect::to("/console/login").into_response();
    response.headers_mut().insert(
        header::SET_COOKIE,
        cookie("", &host(request.headers()), Some(0)),
    );
    response
}

/// The answer to a console request whose token's scope is not `operator`
/// or `admin` (403; the refusal is counted by `control::auth`).
pub fn insufficient_scope(found: Scope) -> Response {
    Problem::new(
        StatusCode::FORBIDDEN,
        format!(
            "insufficient scope: the console needs an operator or admin token, found {found}; \
             log out and log in with another"
        ),
    )
    .into_response()
}

/// The answer to a console request that was not authenticated: back to the
/// login page (saying why), the stale cookie cleared.
pub fn login_redirect(reason: &str, headers: &HeaderMap) -> Response {
    let mut response = Redirect::to(&format!(
        "/console/login?failed={}",
        pages::path_segment(reason)
    ))
    .into_response();
    if cookie_bearer(headers).is_some() {
        response
            .headers_mut()
            .insert(header::SET_COOKIE, cookie("", &host(headers), Some(0)));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_summed_by_label() {
        let text = "# TYPE x counter\nprotected_write_rejected_total{reason=\"lease_lost\",call=\"a\"} 2\nprotected_write_rejected_total{call=\"b\",reason=\"lease_lost\"} 3\nprotected_write_rejected_total{reason=\"stale_epoch\"} 1\nprotected_write_rejected_totalx 9\n";
        assert_eq!(
            counter_by(text, "protected_write_rejected_total", "reason"),
            vec![("lease_lost".into(), 5.0), ("stale_epoch".into(), 1.0)]
        );
    }

    #[test]
    fn the_cookie_is_secure_unless_the_host_is_loopback() {
        for host in ["127.0.0.1:8641", "localhost", "[::1]:80", "localhost:1"] {
            assert!(
                !cookie("t", host, None).to_str().unwrap().contains("Secure"),
                "{host}"
            );
        }
        for host in ["gw.example.com", "10.0.0.1:8641", "example.com:443"] {
            let value = cookie("t", host, None);
            let value = value.to_str().unwrap();
            assert!(value.contains("; Secure"), "{host}");
            assert!(value.contains("HttpOnly") && value.contains("SameSite=Strict"));
        }
    }

    #[test]
    fn only_the_console_cookie_is_taken_as_a_token() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::COOKIE,
            HeaderValue::from_static("a=b; lg_console=lgt_x_y; c=d"),
        );
        assert_eq!(cookie_bearer(&headers).as_deref(), Some("Bearer lgt_x_y"));
        headers.insert(header::COOKIE, HeaderValue::from_static("lg_console="));
        assert_eq!(cookie_bearer(&headers), None);
    }
}
