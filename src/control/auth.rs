//! Authentication on both listeners (`[auth]`, `crate::auth`): bearer
//! tokens, the scope each route needs, the tenant a request acts for, and
//! the OAuth 2.0 protected-resource metadata (RFC 9728) that the MCP
//! authorization specification asks a resource server to publish.
//!
//! # Invariants
//!
//! 1. With authentication on, no handler runs without a valid token: a
//!    missing, malformed, unknown, revoked or expired token is 401 with
//!    `WWW-Authenticate: Bearer resource_metadata="…"`; a valid token whose
//!    scope does not cover the route is 403 (`insufficient_scope`). Both are
//!    answered before any handler, so nothing is written. The ledger being
//!    unreachable is 503, never a pass.
//! 2. Every refusal is counted: `http_refused_total{listener, reason}`.
//! 3. A request acts for one tenant (`super::caller::Caller`): its
//!    token's, else the serving process's (`tenant`), else any (the
//!    operator CLI without `--config`). A run or operation of another
//!    tenant is 404 `not_found`, exactly as one that does not exist, and
//!    nothing is written.
//! 4. Failovers, upstream health, durability and metrics belong to the
//!    deployment, not to a tenant: they need `operator` (read) or `admin`
//!    (resolving a failover resumes dispatch for every tenant).
//!
//! The metadata documents (`/.well-known/oauth-protected-resource`, and
//! `…/mcp` on the MCP listener) are served without a token: they say where
//! the resource is and which scopes exist, nothing else.

use std::sync::Arc;

use axum::Router;
use axum::extract::{MatchedPath, Request};
use axum::http::{HeaderValue, Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::json;

use super::error::{ApiError, ErrorCode};
use crate::auth::{Authenticator, Principal, Refusal, Scope};

/// The well-known path of the protected-resource metadata (RFC 9728).
pub const METADATA_PATH: &str = "/.well-known/oauth-protected-resource";

const AGENT: &[Scope] = &[Scope::Agent];
const AGENT_OR_OPERATOR: &[Scope] = &[Scope::Agent, Scope::Operator];
const OPERATOR: &[Scope] = &[Scope::Operator];
const ADMIN: &[Scope] = &[Scope::Admin];

/// The scopes each control route accepts (`admin` is accepted everywhere).
/// Every route of [`super::routes::ROUTES`] has a row (a test checks it).
pub const ROUTE_SCOPES: &[(&str, &str, &[Scope])] = &[
    ("POST", "/v1/runs", AGENT),
    ("GET", "/v1/runs/{run_id}", AGENT_OR_OPERATOR),
    ("POST", "/v1/runs/{run_id}/lease", AGENT),
    ("POST", "/v1/runs/{run_id}/lease/renew", AGENT),
    ("POST", "/v1/runs/{run_id}/lease/release", AGENT),
    ("POST", "/v1/runs/{run_id}/checkpoint", AGENT),
    ("POST", "/v1/runs/{run_id}/start", AGENT),
    ("POST", "/v1/runs/{run_id}/complete", AGENT),
    ("POST", "/v1/runs/{run_id}/fail", AGENT),
    ("POST", "/v1/runs/{run_id}/cancel", OPERATOR),
    ("POST", "/v1/leases/renew", AGENT),
    ("GET", "/v1/runs/{run_id}/operations", OPERATOR),
    ("GET", "/v1/operations", OPERATOR),
    ("GET", "/v1/operations/unknown", OPERATOR),
    ("GET", "/v1/operations/{operation_id}", OPERATOR),
    ("POST", "/v1/operations/{operation_id}/resolve", OPERATOR),
    ("POST", "/v1/operations/{operation_id}/retry", OPERATOR),
    ("GET", "/v1/failovers", OPERATOR),
    ("POST", "/v1/failovers/{failover_id}/resolve", ADMIN),
    ("GET", "/v1/upstreams", OPERATOR),
    ("GET", "/v1/durability", OPERATOR),
    ("GET", "/metrics", OPERATOR),
];

/// The scopes a control route accepts; `None` for no route (any valid token
/// then learns only that there is no such route).
/// The web console's routes are in `console::CONSOLE_ROUTES` (not API).
pub fn route_scopes(method: &Method, path: &str) -> Option<&'static [Scope]> {
    ROUTE_SCOPES
        .iter()
        .chain(super::console::CONSOLE_ROUTES)
        .find(|(m, p, _)| *m == method.as_str() && *p == path)
        .map(|(_, _, scopes)| *scopes)
}

/// Which listener a gate guards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listener {
    Control,
    Mcp,
}

impl Listener {
    fn label(self) -> &'static str {
        match self {
            Listener::Control => "control",
            Listener::Mcp => "mcp",
        }
    }
}

/// One listener's authentication.
#[derive(Debug, Clone)]
pub struct AuthGate {
    pub authenticator: Authenticator,
    pub listener: Listener,
    /// `[auth] resource_url` (the MCP front's public URL).
    pub resource_url: Option<String>,
    /// The issuers whose JWTs are accepted (`[auth.jwt] issuer`), as the
    /// metadata's `authorization_servers`.
    pub issuers: Vec<String>,
    /// On the MCP front: the tenant this process serves. Every upstream
    /// behind it (tools, resources, prompts, sessions) is that tenant's, so
    /// a token of another tenant is refused before any method runs or any
    /// session is made (422 `tenant_mismatch`, counted `other_tenant`).
    pub served_tenant: Option<String>,
}

impl AuthGate {
    /// The resource this listener is, as the metadata and the challenge name
    /// it, for a request that came with `host`.
    fn resource(&self, host: &str) -> String {
        match (self.listener, &self.resource_url) {
            (Listener::Mcp, Some(url)) => url.trim_end_matches('/').to_owned(),
            (Listener::Mcp, None) => format!("http://{host}/mcp"),
            (Listener::Control, _) => format!("http://{host}"),
        }
    }

    /// Where this listener's metadata is, for a request with `host`.
    fn metadata_url(&self, host: &str) -> String {
        metadata_url_of(&self.resource(host))
    }

    fn metadata(&self, host: &str) -> serde_json::Value {
        json!({
            "resource": self.resource(host),
            // leasegate's own tokens come from `leasegate tokens create`;
            // JWTs from the `[auth.jwt]` issuer.
            "authorization_servers": self.issuers,
            "bearer_methods_supported": ["header"],
            "scopes_supported": Scope::ALL.map(Scope::as_str),
            "resource_name": match self.listener {
                Listener::Mcp => "leasegate MCP front",
                Listener::Control => "leasegate control API",
            },
        })
    }

    fn refuse(&self, reason: &'static str) {
        metrics::counter!("http_refused_total", "listener" => self.listener.label(), "reason" => reason)
            .increment(1);
    }

    /// The 401 (or 503) for a request that was not authenticated.
    fn unauthenticated(&self, host: &str, refusal: Refusal) -> Response {
        self.refuse(refusal.reason());
        if refusal == Refusal::Unavailable {
            return ApiError::new(ErrorCode::LedgerUnavailable, refusal.description())
                .into_response();
        }
        let challenge = match refusal {
            // RFC 6750 section 3.1: no error code when no token was sent.
            Refusal::Missing => format!("Bearer resource_metadata=\"{}\"", self.metadata_url(host)),
            _ => format!(
                "Bearer error=\"invalid_token\", error_description=\"{}\", resource_metadata=\"{}\"",
                refusal.description(),
                self.metadata_url(host)
            ),
        };
        let mut response = ApiError::new(ErrorCode::Unauthorized, refusal.description())
            .with_detail(json!({ "reason": refusal.reason() }))
            .into_response();
        if let Ok(value) = HeaderValue::from_str(&challenge) {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, value);
        }
        response
    }

    /// The 403 for a valid token whose scope does not cover the request.
    fn insufficient(&self, host: &str, principal: &Principal, needed: &[Scope]) -> Response {
        self.refuse("insufficient_scope");
        let needed: Vec<&str> = needed.iter().map(|s| s.as_str()).collect();
        let challenge = format!(
            "Bearer error=\"insufficient_scope\", scope=\"{}\", resource_metadata=\"{}\"",
            needed.join(" "),
            self.metadata_url(host)
        );
        let mut response = ApiError::new(
            ErrorCode::InsufficientScope,
            format!(
                "insufficient scope: expected {} (or admin), found {}",
                needed.join(" or "),
                principal.scope
            ),
        )
        .with_detail(json!({ "expected": needed, "found": principal.scope.as_str() }))
        .into_response();
        if let Ok(value) = HeaderValue::from_str(&challenge) {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, value);
        }
        response
    }
}

/// Where the metadata of `resource` is (RFC 9728 section 3.1: the
/// well-known segment goes between the authority and the path).
fn metadata_url_of(resource: &str) -> String {
    let (scheme, rest) = resource.split_once("://").unwrap_or(("http", resource));
    let (authority, path) = match rest.find('/') {
        Some(at) => rest.split_at(at),
        None => (rest, ""),
    };
    format!("{scheme}://{authority}{METADATA_PATH}{path}")
}

fn host_of(request: &Request) -> String {
    request
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("localhost")
        .to_owned()
}

/// The middleware: authenticate, check the scope, hand the [`Principal`]
/// to the handler in the request's extensions.
async fn check(gate: Arc<AuthGate>, mut request: Request, next: Next) -> Response {
    let path = request.uri().path();
    if path.starts_with(METADATA_PATH) || super::console::is_public(path) {
        return next.run(request).await;
    }
    // The web console (control listener only) also takes its login cookie;
    // a browser without a valid one is sent to the login page.
    let console = gate.listener == Listener::Control && super::console::is_console(path);
    let host = host_of(&request);
    let authorization = request
        .headers()
        .get(header::AUTHORIZATION)
        .map(|v| v.to_str().unwrap_or("\u{fffd}").to_owned())
        .or_else(|| {
            console
                .then(|| super::console::cookie_bearer(request.headers()))
                .flatten()
        });
    let principal = match gate
        .authenticator
        .authenticate(authorization.as_deref())
        .await
    {
        Ok(principal) => principal,
        Err(refusal) if console && refusal != Refusal::Unavailable => {
            // Every refused credential of one address shares its bucket.
            if let Some(limited) = crate::http_server::rate::admit(&mut request, None) {
                return limited;
            }
            gate.refuse(refusal.reason());
            return super::console::login_redirect(refusal.reason(), request.headers());
        }
        Err(refusal) => {
            // Every refused credential of one address shares its bucket.
            if let Some(limited) = crate::http_server::rate::admit(&mut request, None) {
                return limited;
            }
            return gate.unauthenticated(&host, refusal);
        }
    };
    // The rate bucket of the verified token (`http_server::rate`, check 2).
    if let Some(limited) = crate::http_server::rate::admit(&mut request, Some(&principal.token_id))
    {
        return limited;
    }
    let needed = match gate.listener {
        Listener::Mcp => Some(AGENT),
        Listener::Control => request
            .extensions()
            .get::<MatchedPath>()
            .and_then(|path| route_scopes(request.method(), path.as_str())),
    };
    if let Some(needed) = needed
        && !principal.scope.satisfies(needed)
    {
        if console {
            gate.refuse("insufficient_scope");
            return super::console::insufficient_scope(principal.scope);
        }
        return gate.insufficient(&host, &principal, needed);
    }
    if let Some(served) = &gate.served_tenant
        && gate.listener == Listener::Mcp
        && &principal.tenant != served
    {
        gate.refuse("other_tenant");
        return ApiError::new(
            ErrorCode::TenantMismatch,
            format!(
                "tenant mismatch: expected tenant {served:?} (the tenant this leasegate serves), \
                 found {:?} (the token's); nothing was called",
                principal.tenant
            ),
        )
        .with_detail(json!({"expected": served, "found": principal.tenant}))
        .into_response();
    }
    request.extensions_mut().insert(principal);
    next.run(request).await
}

/// `router` behind `gate`: the metadata documents, then every route (and
/// the fallback) authenticated.
pub fn authenticated(router: Router, gate: AuthGate) -> Router {
    let gate = Arc::new(gate);
    let document = {
        let gate = gate.clone();
        move |request: Request| {
            let gate = gate.clone();
            async move { axum::Json(gate.metadata(&host_of(&request))) }
        }
    };
    let mut router = router.route(METADATA_PATH, get(document.clone()));
    if gate.listener == Listener::Mcp {
        router = router.route(&format!("{METADATA_PATH}/mcp"), get(document));
    }
    router.layer(axum::middleware::from_fn(
        move |request: Request, next: Next| check(gate.clone(), request, next),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_route_has_its_scopes_and_no_other_row_exists() {
        for (method, path) in super::super::routes::ROUTES {
            let method: Method = method.parse().unwrap();
            assert!(route_scopes(&method, path).is_some(), "{method} {path}");
        }
        assert_eq!(ROUTE_SCOPES.len(), super::super::routes::ROUTES.len());
        // The console's pages are not API routes: none shares a path with
        // one, and each has its row.
        for (method, path, _) in super::super::console::CONSOLE_ROUTES {
            assert!(path.starts_with("/console"), "{method} {path}");
            assert!(!super::super::routes::ROUTES.iter().any(|(_, p)| p == path));
        }
    }

    #[test]
    fn the_metadata_url_puts_the_well_known_segment_before_the_path() {
        assert_eq!(
            metadata_url_of("https://gw.example.com/tools/mcp"),
            "https://gw.example.com/.well-known/oauth-protected-resource/tools/mcp"
        );
        assert_eq!(
            metadata_url_of("http://127.0.0.1:8641"),
            "http://127.0.0.1:8641/.well-known/oauth-protected-resource"
        );
    }
}
