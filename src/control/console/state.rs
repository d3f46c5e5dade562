//! What every console handler shares: the console's state (the sources it
//! reads, the per-process form key), who a request is ([`Viewer`]: its
//! tenant, the actor its actions are written with, its form token), the
//! error page ([`Problem`]) and the parsing of ids from paths. Holds no
//! ledger state of its own; a restart draws a new form key, which
//! invalidates the forms open in browsers (they say so).

use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::auth::Principal;
use crate::intent::OperationId;
use crate::ledger::{Evidence, Ledger, LedgerError, OperationRecord, RunId};

/// The cookie that carries a console login's token.
pub const COOKIE: &str = "lg_console";
/// The actor of actions taken without authentication (loopback default).
pub const LOCAL_ACTOR: &str = "local-operator";

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
    pub operator: crate::control::OperatorLedger,
    /// The serving process's tenant (`None`: any).
    pub tenant: Option<String>,
    /// Whether tokens are required (`[auth]`): with them, the login page.
    pub auth_required: bool,
    pub upstreams: Option<crate::control::UpstreamHealthSource>,
    /// The process's Prometheus text.
    pub metrics: Option<Arc<dyn Fn() -> String + Send + Sync>>,
    pub planner: Option<Planner>,
    /// The serving process's tool directory: a retry its tool cannot
    /// follow is refused (`None`: not judged).
    pub tools: Option<Arc<crate::adapter::SharedDirectory>>,
}

pub(crate) struct ConsoleState {
    pub(super) sources: Sources,
    /// Key of the per-form tokens (random per process: a restart
    /// invalidates open forms, which then say so).
    pub(super) form_key: [u8; 32],
    /// The last (time, calls dispatched) sample: calls per second between
    /// two overview loads.
    pub(super) last_calls: Mutex<Option<(Instant, f64)>>,
}

pub(super) type Shared = State<Arc<ConsoleState>>;

/// Who a console request is.
pub(crate) struct Viewer {
    principal: Option<Principal>,
    served: Option<String>,
    /// The console session the request came with (its logout form).
    session: Option<String>,
}

impl Viewer {
    pub(super) fn of(request_principal: Option<Principal>, state: &ConsoleState) -> Self {
        Viewer {
            principal: request_principal,
            served: state.sources.tenant.clone(),
            session: None,
        }
    }

    /// The tenant whose runs and operations this viewer sees (`None`: any).
    pub(super) fn tenant(&self) -> Option<&str> {
        match &self.principal {
            Some(principal) => Some(&principal.tenant),
            None => self.served.as_deref(),
        }
    }

    /// Whether this viewer may see the process's own state (upstream
    /// health, metrics): a token of the tenant it serves, an admin token,
    /// or no tokens at all.
    pub(super) fn sees_process(&self) -> bool {
        match (&self.principal, &self.served) {
            (Some(principal), Some(served)) => {
                principal.scope == crate::auth::Scope::Admin || &principal.tenant == served
            }
            _ => true,
        }
    }

    /// The actor written with this viewer's actions (invariant 1).
    pub(super) fn actor(&self) -> String {
        match &self.principal {
            Some(principal) => format!("token:{}", principal.token_id),
            None => LOCAL_ACTOR.to_owned(),
        }
    }

    /// How the header names this viewer.
    pub(super) fn display(&self) -> String {
        match &self.principal {
            Some(principal) => format!(
                "token {} ({}, tenant {})",
                principal.token_id, principal.scope, principal.tenant
            ),
            None => "local operator".to_owned(),
        }
    }

    /// The page header for this viewer.
    pub(super) fn banner(&self, state: &ConsoleState) -> super::pages::Banner {
        super::pages::Banner {
            viewer: self.display(),
            auth_required: state.sources.auth_required,
            form_token: self
                .session
                .as_deref()
                .map(|id| bound_form_token(&state.form_key, "logout", id))
                .unwrap_or_default(),
        }
    }

    pub(super) fn form_token(&self, key: &[u8; 32]) -> String {
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
        let mut viewer = Viewer::of(parts.extensions.get::<Principal>().cloned(), state);
        viewer.session = session_id(&parts.headers).map(str::to_owned);
        Ok(viewer)
    }
}

/// A console error page.
pub(crate) struct Problem {
    status: StatusCode,
    message: String,
}

impl Problem {
    pub(super) fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Problem {
            status,
            message: message.into(),
        }
    }

    pub(super) fn not_found(what: &str) -> Self {
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
        let api = crate::control::ApiError::from(error);
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
            html(super::pages::problem(self.status, &self.message)),
        )
            .into_response()
    }
}

pub(super) type PageResult = Result<Response, Problem>;

pub(super) fn html(markup: maud::Markup) -> Response {
    (
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        markup.into_string(),
    )
        .into_response()
}

pub(super) fn parse_run(raw: &str) -> Result<RunId, Problem> {
    raw.trim().parse::<RunId>().map_err(|_| {
        Problem::new(
            StatusCode::BAD_REQUEST,
            format!("{raw:?} is not a run id (a UUID)"),
        )
    })
}

pub(super) fn blank(value: &Option<String>) -> Option<&str> {
    value.as_deref().map(str::trim).filter(|v| !v.is_empty())
}

pub(super) fn operation_id(raw: &str) -> Result<OperationId, Problem> {
    if raw.is_empty() || raw.len() > 255 {
        return Err(Problem::new(
            StatusCode::BAD_REQUEST,
            "operation ids are 1 to 255 characters",
        ));
    }
    Ok(OperationId::from_string(raw.to_owned()))
}

/// The Content-Security-Policy of every console response: the console's
/// own stylesheet and script only, no framing, forms to itself.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; style-src 'self'; script-src 'self'; \
     img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// The console's security headers: never framed (its forms carry live
/// tokens), no content sniffing, no referrer to other origins (a same-origin one
/// keeps the `Origin` of form posts, which the guard checks), and pages (which show
/// request and result bodies) never stored by a cache.
pub(super) fn add_security_headers(headers: &mut axum::http::HeaderMap) {
    for (name, value) in [
        (axum::http::header::X_FRAME_OPTIONS, "DENY"),
        (
            axum::http::header::CONTENT_SECURITY_POLICY,
            CONTENT_SECURITY_POLICY,
        ),
        (axum::http::header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (axum::http::header::REFERRER_POLICY, "same-origin"),
    ] {
        headers.insert(name, axum::http::header::HeaderValue::from_static(value));
    }
    // The assets say their own (revalidated, nothing secret in them).
    if !headers.contains_key(axum::http::header::CACHE_CONTROL) {
        headers.insert(
            axum::http::header::CACHE_CONTROL,
            axum::http::header::HeaderValue::from_static("no-store"),
        );
    }
}

pub(super) fn cookie_value<'h>(headers: &'h axum::http::HeaderMap, name: &str) -> Option<&'h str> {
    headers
        .get_all(axum::http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(found, _)| *found == name)
        .map(|(_, value)| value)
        .filter(|value| !value.is_empty())
}

/// The console session id a request carries, if any.
pub(super) fn session_id(headers: &axum::http::HeaderMap) -> Option<&str> {
    cookie_value(headers, COOKIE)
}

/// The token of a form bound to `purpose` and `value` (a login nonce, a
/// session id) under the per-process form key.
pub(super) fn bound_form_token(key: &[u8; 32], purpose: &str, value: &str) -> String {
    let mut hash = sha2::Sha256::new();
    hash.update(key);
    hash.update(purpose.as_bytes());
    hash.update([0]);
    hash.update(value.as_bytes());
    hex::encode(hash.finalize())
}
