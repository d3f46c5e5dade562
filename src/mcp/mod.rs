//! MCP: the front agents talk to and the clients of upstream tool servers.
//! The only module of the library that imports rmcp.

pub mod convert;
pub mod front;
pub mod http_headers;
pub mod idempotency;
pub mod inflight;
pub mod malformed;
pub mod upstream;

pub use front::Front;
pub use upstream::{
    Inspected, StartError, UpstreamHealth, UpstreamState, Upstreams, inspect_upstream,
};

use std::future::Future;

use axum::serve::ListenerExt;

use rmcp::ServiceExt;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use tokio_util::sync::CancellationToken;

/// Serves the front over Streamable HTTP at `/mcp` until `shutdown`
/// completes. Without `sessions` every request stands alone (no sticky
/// sessions needed behind a load balancer). `wrap` adds what the caller
/// puts in front of every request (authentication, `control::auth`); what
/// it inserts into a request's extensions reaches the front's handlers in
/// the request's `http::request::Parts`.
pub async fn serve_http(
    front: Front,
    listener: tokio::net::TcpListener,
    sessions: bool,
    body_limit: usize,
    (allowed_hosts, allowed_origins): (Vec<String>, Vec<String>),
    wrap: impl FnOnce(axum::Router) -> axum::Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
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
    let router = if sessions {
        let service = StreamableHttpService::new(
            move || Ok(front.for_session()),
            LocalSessionManager::default().into(),
            config,
        );
        axum::Router::new().nest_service("/mcp", service)
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
    // Outermost: the token gate (`wrap`); then malformed bodies get
    // JSON-RPC's codes, not rmcp's 415.
    let router = wrap(
        router
            .layer(axum::middleware::from_fn(move |request, next| {
                idempotency::layer(body_limit, request, next)
            }))
            .layer(axum::middleware::from_fn(move |request, next| {
                malformed::layer(body_limit, request, next)
            })),
    );
    axum::serve(listener.tap_io(no_delay), router)
        .with_graceful_shutdown(async move {
            shutdown.await;
            stop.cancel();
        })
        .await
}

/// `TCP_NODELAY` on an accepted socket: a Streamable HTTP answer is a small
/// chunked write followed by the terminating chunk; with Nagle on, the second
/// write waits for the client's delayed ACK (~40 ms) on a kept-alive
/// connection.
pub fn no_delay(stream: &mut tokio::net::TcpStream) {
    if let Err(error) = stream.set_nodelay(true) {
        tracing::debug!(%error, "cannot set TCP_NODELAY");
    }
}

/// Serves the front on stdin/stdout until the client closes stdin. Logs
/// must go to stderr.
pub async fn serve_stdio(front: Front) -> anyhow::Result<()> {
    front
        .serve((idempotency::stdin_lifting_keys(), tokio::io::stdout()))
        .await?
        .waiting()
        .await?;
    Ok(())
}
