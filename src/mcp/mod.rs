//! MCP: the front agents talk to and the clients of upstream tool servers.
//! The only module of the library that imports rmcp.

pub mod convert;
pub mod front;
pub mod http_headers;
pub mod idempotency;
pub mod inflight;
pub mod malformed;
pub mod numbers;
pub mod sessions;
pub mod share;
pub mod startup;
pub mod upstream;
pub mod wire;

pub use front::Front;
pub use upstream::{
    Inspected, StartError, UpstreamHealth, UpstreamState, Upstreams, inspect_upstream,
};

use std::future::Future;

use std::sync::Arc;

use rmcp::ServiceExt;
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use tokio_util::sync::CancellationToken;

/// How the front is served over HTTP.
pub struct HttpServing {
    /// MCP sessions (`http_sessions`). Without them every request stands
    /// alone (no sticky sessions needed behind a load balancer).
    pub sessions: bool,
    /// Largest POST body.
    pub body_limit: usize,
    pub allowed_hosts: Vec<String>,
    pub allowed_origins: Vec<String>,
    pub limits: crate::config::Limits,
    /// `limits.max_connections`, or less when the open-file limit is lower.
    pub max_connections: usize,
}

/// Serves the front over Streamable HTTP at `/mcp` until `shutdown`
/// completes, bounded by `serving.limits` (`crate::http_server`; sessions:
/// `sessions`). `wrap` adds what the caller puts in front of every request
/// (authentication, `control::auth`); what it inserts into a request's
/// extensions reaches the front's handlers in the request's
/// `http::request::Parts`.
pub async fn serve_http(
    front: Front,
    listener: tokio::net::TcpListener,
    serving: HttpServing,
    wrap: impl FnOnce(axum::Router) -> axum::Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let HttpServing {
        sessions,
        body_limit,
        allowed_hosts,
        allowed_origins,
        limits,
        max_connections,
    } = serving;
    let stop = CancellationToken::new();
    // json_response: a request whose handler sends nothing before its answer
    // is answered as plain JSON (one write, no SSE framing); one that streams
    // progress or asks the agent something falls back to SSE.
    // Host and Origin checks against DNS rebinding, as `control::guard`
    // does for the control listener (the same lists and rules).
    let config = StreamableHttpServerConfig::default()
        .with_allowed_hosts(allowed_hosts)
        .with_allowed_origins(allowed_origins)
        .enforce_origin_validation()
        .with_legacy_session_mode(sessions)
        .with_json_response(true)
        .with_cancellation_token(stop.child_token());
    let in_flight = front.in_flight();
    let integers = front.integers();
    let router = if sessions {
        let manager = Arc::new(sessions::BoundedSessions::new(
            limits.max_sessions,
            limits.max_sessions_per_principal,
            limits.session_idle_timeout,
        ));
        let service =
            StreamableHttpService::new(move || Ok(front.for_session()), manager.clone(), config);
        axum::Router::new()
            .nest_service("/mcp", service)
            .layer(axum::middleware::from_fn(session_deleted))
            .layer(axum::middleware::from_fn(move |request, next| {
                session_cap(manager.clone(), request, next)
            }))
    } else {
        let service = StreamableHttpService::new(
            move || Ok(front.for_session()),
            NeverSessionManager::default().into(),
            config,
        );
        axum::Router::new()
            .nest_service("/mcp", service)
            .layer(axum::middleware::from_fn(move |request, next| {
                inflight::cancel_layer(in_flight.clone(), request, next)
            }))
    };
    // Each principal's share of the requests in flight, taken after the
    // token is verified and the body read, before rmcp or a session.
    let router = match limits.max_in_flight_per_principal {
        Some(share) => {
            let shares = share::Shares::new(share);
            router.layer(axum::middleware::from_fn(move |request, next| {
                share::layer(shares.clone(), request, next)
            }))
        }
        None => router,
    };
    // Outermost: the token gate (`wrap`); then malformed bodies get
    // JSON-RPC's codes, not rmcp's 415.
    let router = wrap(
        router
            .layer(axum::middleware::from_fn(move |request, next| {
                idempotency::layer(body_limit, integers, request, next)
            }))
            .layer(axum::middleware::from_fn(move |request, next| {
                malformed::layer(body_limit, request, next)
            })),
    );
    crate::http_server::serve(
        listener,
        router,
        crate::http_server::Listener::Mcp,
        &limits,
        max_connections,
        async move {
            shutdown.await;
            stop.cancel();
        },
    )
    .await
}

/// Invariant 2 of `sessions`: an `initialize` (a POST without
/// `Mcp-Session-Id`) while every session is busy gets 503 and
/// `Retry-After` before rmcp makes a session.
async fn session_cap(
    manager: Arc<sessions::BoundedSessions>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    // Invariant 4 of `sessions`: a session answers only its creator.
    let principal = request
        .extensions()
        .get::<crate::auth::Principal>()
        .map(|principal| format!("token:{}", principal.token_id));
    if let Some(id) = request
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        && !manager.may_use(id, principal.as_deref())
    {
        // Word for word what rmcp answers for a session it does not know.
        return (http::StatusCode::NOT_FOUND, "Not Found: Session not found").into_response();
    }
    if request.method() == http::Method::POST
        && !request.headers().contains_key("mcp-session-id")
        && manager.full()
    {
        crate::http_server::refused(
            crate::http_server::Listener::Mcp,
            crate::http_server::Refusal::MaxSessions,
        );
        return (
            http::StatusCode::SERVICE_UNAVAILABLE,
            [(http::header::RETRY_AFTER, "5")],
            axum::Json(serde_json::json!({
                "jsonrpc": "2.0",
                "id": null,
                "error": {
                    "code": -32000,
                    "message": "every MCP session is busy (limits.max_sessions); retry later",
                },
            })),
        )
            .into_response();
    }
    if request.method() == http::Method::POST && !request.headers().contains_key("mcp-session-id") {
        // A session rmcp makes for this request belongs to its principal.
        return sessions::creating(principal, next.run(request)).await;
    }
    next.run(request).await
}

/// A `DELETE /mcp` that ended its session is answered 204 No Content:
/// rmcp answers 202, which the spec's clients do not expect of a DELETE
/// (the official Python SDK logs "Session termination failed: 202").
async fn session_deleted(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let deleting = request.method() == http::Method::DELETE;
    let mut response = next.run(request).await;
    if deleting && response.status() == http::StatusCode::ACCEPTED {
        *response.status_mut() = http::StatusCode::NO_CONTENT;
        *response.body_mut() = axum::body::Body::empty();
        response.headers_mut().remove(http::header::CONTENT_LENGTH);
        response.headers_mut().remove(http::header::CONTENT_TYPE);
    }
    response
}

/// `TCP_NODELAY` on an accepted socket (`http_server::serve` sets it on both
/// listeners; the example tool server uses this one).
pub fn no_delay(stream: &mut tokio::net::TcpStream) {
    if let Err(error) = stream.set_nodelay(true) {
        tracing::debug!(%error, "cannot set TCP_NODELAY");
    }
}

/// Serves the front on stdin/stdout until the client closes stdin. Logs
/// must go to stderr.
pub async fn serve_stdio(front: Front) -> anyhow::Result<()> {
    let integers = front.integers();
    front
        .serve((
            idempotency::stdin_lifting_keys(integers),
            tokio::io::stdout(),
        ))
        .await?
        .waiting()
        .await?;
    Ok(())
}
