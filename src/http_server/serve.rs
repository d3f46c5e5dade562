//! The accept loop and the connections of one listener (module docs,
//! invariants 1–3).
//!
//! # State model (one connection)
//!
//! ```text
//!   accepted ──first byte──▶ head started ──head complete──▶ in progress
//!      │ idle_timeout            │ header_read_timeout        │ (response written
//!      ▼                         ▼                            ▼  or dropped)
//!   closed (graceful)        closed (counted)              idle ──▶ …
//! ```
//!
//! HTTP/2: bytes on an idle connection after its first request (pings,
//! window updates) do not start the head timer; the idle timer applies.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::{Pin, pin};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use super::listener::{Listener, Peer};
use super::{ACCEPT_ERROR_LOG_INTERVAL, Refusal, refused};
use crate::config::Limits;

/// Connections and sessions that ended, process-wide: the memory upkeep
/// hands freed heap back when this moved (`super::spawn_memory_upkeep`).
pub static ENDED: AtomicU64 = AtomicU64::new(0);

/// The answer to a connection beyond `max_connections`, written if the
/// socket takes it at once.
const OVER_CAPACITY: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\nconnection: close\r\n\
retry-after: 1\r\ncontent-type: text/plain\r\ncontent-length: 28\r\n\r\ntoo many connections; retry\n";

/// Serves `router` on `listener` within `limits` until `shutdown`
/// completes; then stops accepting, closes idle connections, lets requests
/// in progress finish and returns once every connection is closed.
pub async fn serve(
    listener: TcpListener,
    router: axum::Router,
    name: Listener,
    limits: &Limits,
    max_connections: usize,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let router = match limits.rate_limit {
        Some(rate) => super::rate::layer(router, name, rate, limits.verified_principals),
        None => router,
    };
    let stop = CancellationToken::new();
    let open = Arc::new(AtomicUsize::new(0));
    // Open connections per peer address, when peers have a share.
    let per_peer = Arc::new(std::sync::Mutex::new(std::collections::HashMap::<
        std::net::IpAddr,
        usize,
    >::new()));
    let gauge = metrics::gauge!("http_connections_open", "listener" => name.as_str());
    let (closed_tx, closed_rx) = tokio::sync::watch::channel(());
    let mut shutdown = pin!(shutdown);
    let mut errors = AcceptErrors::default();
    loop {
        let (stream, peer) = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => {
                    errors.ok();
                    accepted
                }
                Err(error) => {
                    if let Some(pause) = errors.failed(name, &error) {
                        tokio::select! {
                            () = &mut shutdown => break,
                            () = tokio::time::sleep(pause) => {}
                        }
                    }
                    continue;
                }
            },
        };
        // Invariant 3: over the cap, answered if it fits and closed now.
        if open.load(Ordering::Relaxed) >= max_connections {
            refused(name, Refusal::MaxConnections);
            let _ = stream.try_write(OVER_CAPACITY);
            drop(stream);
            continue;
        }
        // Invariant 3: a peer over its share, closed now (the others keep
        // their room under the cap).
        let peer_key = peer_address(&peer);
        if let Some(share) = limits.max_connections_per_peer {
            let mut held = per_peer.lock().unwrap_or_else(|e| e.into_inner());
            let count = held.entry(peer_key).or_default();
            if *count >= share {
                drop(held);
                refused(name, Refusal::MaxConnectionsPerPeer);
                let _ = stream.try_write(OVER_CAPACITY);
                drop(stream);
                continue;
            }
            *count += 1;
        }
        open.fetch_add(1, Ordering::Relaxed);
        gauge.increment(1.0);
        // `TCP_NODELAY`: a Streamable HTTP answer is a small chunked write
        // followed by the terminating chunk; with Nagle on, the second write
        // waits for the client's delayed ACK (~40 ms) on a kept-alive
        // connection.
        let _ = stream.set_nodelay(true);
        let connection = Connection {
            name,
            peer,
            limits: limits.clone(),
            router: router.clone(),
            stop: stop.clone(),
        };
        let (open, gauge, closed) = (open.clone(), gauge.clone(), closed_rx.clone());
        let shared = limits.max_connections_per_peer.map(|_| per_peer.clone());
        tokio::spawn(async move {
            connection.run(stream).await;
            if let Some(per_peer) = shared {
                let mut held = per_peer.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(count) = held.get_mut(&peer_key) {
                    *count -= 1;
                    if *count == 0 {
                        held.remove(&peer_key);
                    }
                }
            }
            open.fetch_sub(1, Ordering::Relaxed);
            gauge.decrement(1.0);
            ENDED.fetch_add(1, Ordering::Relaxed);
            drop(closed);
        });
    }
    drop(listener);
    stop.cancel();
    drop(closed_rx);
    closed_tx.closed().await;
    Ok(())
}

/// The address a peer's connections count against: its IP (IPv6: its
/// /64, what one host usually holds).
fn peer_address(peer: &SocketAddr) -> std::net::IpAddr {
    match peer.ip() {
        std::net::IpAddr::V6(v6) if v6.to_ipv4_mapped().is_none() => {
            std::net::IpAddr::V6((u128::from(v6) & (!0u128 << 64)).into())
        }
        std::net::IpAddr::V6(v6) => std::net::IpAddr::V4(v6.to_ipv4_mapped().expect("checked")),
        v4 => v4,
    }
}

/// Accept errors: backed off, and logged at most once per interval with
/// the number of errors since the last line (invariant 3).
#[derive(Default)]
struct AcceptErrors {
    last_logged: Option<Instant>,
    since_logged: u64,
    pause: Duration,
}

impl AcceptErrors {
    fn ok(&mut self) {
        self.pause = Duration::ZERO;
    }

    /// How long to pause before accepting again (`None`: at once — the
    /// error was one connection's, such as a reset before accept).
    fn failed(&mut self, name: Listener, error: &std::io::Error) -> Option<Duration> {
        use std::io::ErrorKind::*;
        if matches!(
            error.kind(),
            ConnectionAborted | ConnectionReset | ConnectionRefused | Interrupted
        ) {
            return None;
        }
        self.since_logged += 1;
        let now = Instant::now();
        if self
            .last_logged
            .is_none_or(|at| now.duration_since(at) >= ACCEPT_ERROR_LOG_INTERVAL)
        {
            tracing::error!(listener = name.as_str(), %error, errors = self.since_logged,
                "accept failed; pausing accepts (logged at most every {ACCEPT_ERROR_LOG_INTERVAL:?})");
            self.last_logged = Some(now);
            self.since_logged = 0;
        }
        metrics::counter!("http_accept_errors_total", "listener" => name.as_str()).increment(1);
        self.pause = (self.pause * 2).clamp(Duration::from_millis(10), Duration::from_secs(1));
        Some(self.pause)
    }
}

/// One accepted connection and what it needs.
struct Connection {
    name: Listener,
    peer: SocketAddr,
    limits: Limits,
    router: axum::Router,
    stop: CancellationToken,
}

/// Why the watchdog closes a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expiry {
    Idle,
    Head,
}

impl Connection {
    async fn run(self, stream: TcpStream) {
        let state = Arc::new(State::new());
        let io = TokioIo::new(Watched {
            inner: stream,
            state: state.clone(),
        });
        let service = {
            let (state, router, peer, name) =
                (state.clone(), self.router.clone(), self.peer, self.name);
            let body_timeout = self.limits.body_read_timeout;
            hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
                let in_flight = InFlight::begin(state.clone());
                let router = router.clone();
                async move {
                    let (mut parts, body) = request.into_parts();
                    parts.extensions.insert(Peer(peer));
                    parts
                        .extensions
                        .insert(super::listener::Arrived(std::time::Instant::now()));
                    let body = Body::new(DeadlineBody::new(body, body_timeout, name));
                    let response = router
                        .oneshot(axum::extract::Request::from_parts(parts, body))
                        .await
                        .unwrap_or_else(|never| match never {});
                    Ok::<_, Infallible>(response.map(|body| HeldBody::wrap(body, in_flight)))
                }
            })
        };
        let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
        // hyper's own head timer runs from the moment it waits for a head,
        // idle time included: set past the idle timeout, it only bounds a
        // pipelined head the watchdog does not see (a backstop).
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(self.limits.idle_timeout + self.limits.header_read_timeout);
        builder.http2().timer(TokioTimer::new());
        let mut connection = pin!(builder.serve_connection(io, service));
        let mut watchdog = pin!(watchdog(
            state,
            self.limits.idle_timeout,
            self.limits.header_read_timeout
        ));
        let mut watching = true;
        let mut closing = false;
        // After a graceful close begins: how long the peer has to finish.
        let mut hard_deadline = pin!(tokio::time::sleep(Duration::from_secs(365 * 86_400)));
        loop {
            tokio::select! {
                result = connection.as_mut() => {
                    if let Err(error) = result {
                        tracing::trace!(%error, "connection ended with an error");
                    }
                    return;
                }
                () = self.stop.cancelled(), if !closing => {
                    connection.as_mut().graceful_shutdown();
                    closing = true;
                }
                expiry = &mut watchdog, if watching => {
                    watching = false;
                    match expiry {
                        Expiry::Head => {
                            // Invariant 1: half a head is dropped at once.
                            refused(self.name, Refusal::HeaderTimeout);
                            return;
                        }
                        Expiry::Idle => {
                            connection.as_mut().graceful_shutdown();
                            closing = true;
                            hard_deadline
                                .as_mut()
                                .reset(Instant::now() + self.limits.header_read_timeout);
                        }
                    }
                }
                () = &mut hard_deadline => return,
            }
        }
    }
}

/// What the watchdog needs to know about a connection.
struct State {
    phase: Mutex<Phase>,
    changed: Notify,
}

struct Phase {
    /// Requests whose responses are not yet written or dropped.
    in_flight: usize,
    requests: u64,
    idle_since: Instant,
    /// The first byte read while no request was in progress.
    head_started: Option<Instant>,
    /// `None` until the first bytes arrive.
    http2: Option<bool>,
}

impl State {
    fn new() -> State {
        State {
            phase: Mutex::new(Phase {
                in_flight: 0,
                requests: 0,
                idle_since: Instant::now(),
                head_started: None,
                http2: None,
            }),
            changed: Notify::new(),
        }
    }

    fn phase(&self) -> std::sync::MutexGuard<'_, Phase> {
        self.phase.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn read(&self, bytes: &[u8]) {
        let mut phase = self.phase();
        let http2 = *phase
            .http2
            .get_or_insert_with(|| bytes.starts_with(b"PRI * HTTP/2"));
        if phase.in_flight == 0 && phase.head_started.is_none() && !(http2 && phase.requests > 0) {
            phase.head_started = Some(Instant::now());
            drop(phase);
            self.changed.notify_one();
        }
    }
}

/// The timer of one connection: resolves when it must close (invariant 1).
async fn watchdog(state: Arc<State>, idle: Duration, head: Duration) -> Expiry {
    loop {
        let due = {
            let phase = state.phase();
            if phase.in_flight > 0 {
                None
            } else if let Some(started) = phase.head_started {
                Some((started + head, Expiry::Head))
            } else {
                Some((phase.idle_since + idle, Expiry::Idle))
            }
        };
        match due {
            None => state.changed.notified().await,
            Some((at, expiry)) => {
                if Instant::now() >= at {
                    return expiry;
                }
                tokio::select! {
                    () = state.changed.notified() => {}
                    () = tokio::time::sleep_until(at) => {}
                }
            }
        }
    }
}

/// One request in progress on a connection, until dropped.
struct InFlight(Arc<State>);

impl InFlight {
    fn begin(state: Arc<State>) -> InFlight {
        {
            let mut phase = state.phase();
            phase.in_flight += 1;
            phase.requests += 1;
            phase.head_started = None;
        }
        state.changed.notify_one();
        InFlight(state)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        {
            let mut phase = self.0.phase();
            phase.in_flight -= 1;
            if phase.in_flight == 0 {
                phase.idle_since = Instant::now();
            }
        }
        self.0.changed.notify_one();
    }
}

/// A response body that holds `G` until its last frame is written (or it is
/// dropped): with an [`InFlight`], its request stays in progress, so SSE
/// streams are never idle; the MCP front's per-principal share holds its
/// place the same way.
pub struct HeldBody<G> {
    inner: Body,
    held: Option<G>,
}

impl<G: Send + Unpin + 'static> HeldBody<G> {
    /// `body`, holding `held` until its end.
    pub fn wrap(body: Body, held: G) -> Body {
        Body::new(HeldBody {
            inner: body,
            held: Some(held),
        })
    }
}

impl<G: Unpin> http_body::Body for HeldBody<G> {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None)) {
            this.held = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A request body that fails once it is not complete `timeout` after the
/// head arrived (invariant 2).
struct DeadlineBody {
    inner: Incoming,
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    timeout: Duration,
    listener: Listener,
}

/// The error of a request body that did not arrive in time.
#[derive(Debug, thiserror::Error)]
#[error("request body not complete within {0:?} (limits.body_read_timeout)")]
pub struct BodyTimeout(pub Duration);

impl DeadlineBody {
    fn new(inner: Incoming, timeout: Duration, listener: Listener) -> DeadlineBody {
        use http_body::Body as _;
        let deadline = (!inner.is_end_stream()).then(|| Box::pin(tokio::time::sleep(timeout)));
        DeadlineBody {
            inner,
            deadline,
            timeout,
            listener,
        }
    }
}

impl http_body::Body for DeadlineBody {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(None) => {
                this.deadline = None;
                Poll::Ready(None)
            }
            Poll::Ready(Some(frame)) => Poll::Ready(Some(frame.map_err(Into::into))),
            Poll::Pending => {
                if let Some(deadline) = &mut this.deadline
                    && deadline.as_mut().poll(cx).is_ready()
                {
                    this.deadline = None;
                    refused(this.listener, Refusal::BodyTimeout);
                    return Poll::Ready(Some(Err(Box::new(BodyTimeout(this.timeout)))));
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Whether `error` (from reading a request body) is a [`BodyTimeout`].
pub fn is_body_timeout(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(error);
    while let Some(error) = cause {
        if error.is::<BodyTimeout>() {
            return true;
        }
        cause = error.source();
    }
    false
}

/// The socket, telling the watchdog when bytes arrive.
struct Watched {
    inner: TcpStream,
    state: Arc<State>,
}

impl AsyncRead for Watched {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.state.read(&buf.filled()[before..]);
        }
        polled
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}
