//! The console's routes: every path with the scopes it accepts
//! ([`CONSOLE_ROUTES`], read by `control::auth`), which of them need no
//! token, and the router that mounts the pages, the forms, the login and
//! the embedded assets on the control router.

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};

use super::forms::{cancel_run, resolve_operation, retry_operation};
use super::session::{login, login_page, logout};
use super::state::{ConsoleState, Sources};
use super::views::{operation_page, operations, overview, run_page, runs};
use crate::auth::Scope;

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
        .layer(axum::middleware::map_response(hardened))
        .with_state(state);
    router.merge(console)
}

/// Adds the console's security headers to every console response.
pub(super) async fn hardened(mut response: Response) -> Response {
    super::state::add_security_headers(response.headers_mut());
    response
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
