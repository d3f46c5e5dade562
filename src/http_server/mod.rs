//! Bounded serving: how both HTTP listeners (the MCP front and the control
//! API) are served so that no client can hold more of the process than
//! `[limits]` allows (`config::Limits`).
//!
//! * `serve`: the accept loop and one hyper connection per socket (HTTP/1.1
//!   and HTTP/2), with a per-connection watchdog for the header-read and
//!   idle timeouts, a deadline on every request body, a cap on open
//!   connections, `TCP_NODELAY`, and graceful shutdown.
//! * `rate`: per-principal rate limits (429 with `Retry-After`).
//! * [`refused`]: the one counter of every refusal,
//!   `http_refused_total{listener, reason}`, with the fixed reasons of
//!   [`Refusal`] — never a request-controlled label value.
//! * [`raise_fd_limit`], [`return_memory`]: the process's file descriptors
//!   and freed heap.
//! * [`request_never_started`]: what an HTTP client's error proves about a
//!   request (hyper's types stay in this module).
//!
//! # Invariants
//!
//! 1. A connection with no request in progress is closed after
//!    `idle_timeout`; one that has sent a byte of a request head is closed
//!    when the head is not complete `header_read_timeout` after that byte.
//!    "In progress" lasts until the response's last byte is written or the
//!    response is dropped, so SSE streams and long calls are never cut by
//!    either timeout.
//! 2. A request body not complete `body_read_timeout` after its head fails
//!    to read (the handler answers, the connection is not reused).
//! 3. At most `max_connections` connections per listener are served, and
//!    at most `max_connections_per_peer` from one peer address when peers
//!    have a share (so one peer cannot hold the others' room); more are
//!    answered 503 when possible and closed at once, counted. An accept
//!    error (out of file descriptors) backs off and is logged at most once
//!    per [`ACCEPT_ERROR_LOG_INTERVAL`].
//! 4. A refusal logs at most one short line (`debug`), its text clipped
//!    (`logfield`).

mod listener;
pub mod rate;
pub mod serve;

pub use listener::{Arrived, Listener, Peer};
pub use serve::{HeldBody, serve};

use std::time::Duration;

/// Whether an HTTP client's error (or one of its causes) is hyper's
/// "canceled": the connection failed before the request was started on
/// it, so no byte of the request left (hyper hands such a request back).
pub fn request_never_started(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(error);
    while let Some(inner) = cause {
        if inner
            .downcast_ref::<hyper::Error>()
            .is_some_and(hyper::Error::is_canceled)
        {
            return true;
        }
        cause = inner.source();
    }
    false
}

/// How often a burst of accept errors is logged (one line, with a count).
pub const ACCEPT_ERROR_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// Why a request or connection was refused: the `reason` label of
/// `http_refused_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// `max_connections` reached: the connection was closed at once.
    MaxConnections,
    /// The peer address's share (`max_connections_per_peer`) reached: the
    /// connection was closed at once.
    MaxConnectionsPerPeer,
    /// A request head not complete within `header_read_timeout`.
    HeaderTimeout,
    /// A request body not complete within `body_read_timeout`.
    BodyTimeout,
    /// The principal's rate limit (429).
    RateLimited,
    /// `max_sessions` reached and every session busy (503).
    MaxSessions,
    /// A body above the listener's size limit (413).
    BodyTooLarge,
    /// The principal's share of requests in flight on the MCP front
    /// (`max_in_flight_per_principal`) reached (429).
    MaxInFlightPerPrincipal,
    /// A `Host` the listener does not serve (403).
    Host,
    /// An `Origin` that may not call the listener (403).
    Origin,
}

impl Refusal {
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::MaxConnections => "max_connections",
            Refusal::MaxConnectionsPerPeer => "max_connections_per_peer",
            Refusal::HeaderTimeout => "header_timeout",
            Refusal::BodyTimeout => "body_timeout",
            Refusal::RateLimited => "rate_limited",
            Refusal::MaxSessions => "max_sessions",
            Refusal::BodyTooLarge => "body_too_large",
            Refusal::MaxInFlightPerPrincipal => "max_in_flight_per_principal",
            Refusal::Host => "host",
            Refusal::Origin => "origin",
        }
    }
}

/// Counts one refusal on `listener`.
pub fn refused(listener: Listener, reason: Refusal) {
    metrics::counter!("http_refused_total", "listener" => listener.as_str(), "reason" => reason.as_str())
        .increment(1);
}

/// Raises this process's soft limit of open files towards its hard limit,
/// so that `needed` descriptors fit; returns the soft limit now in force.
/// The caller compares it with what the listeners may hold.
pub fn raise_fd_limit(needed: u64) -> std::io::Result<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    if limit.rlim_cur >= needed as libc::rlim_t {
        return Ok(limit.rlim_cur);
    }
    let raised = libc::rlimit {
        rlim_cur: (needed as libc::rlim_t).min(limit.rlim_max),
        rlim_max: limit.rlim_max,
    };
    // SAFETY: setrlimit reads one rlimit struct we own.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(raised.rlim_cur)
}

/// Hands freed heap back to the operating system (glibc keeps freed
/// memory of many small allocations — sessions, connection buffers — in its
/// arenas otherwise, and the resident size stays at its peak). The
/// `leasegate` binary allocates with mimalloc (src/main.rs), which purges
/// freed pages itself; there this trims only what lives in glibc's heap,
/// and it is the whole job for embedders that keep glibc's malloc.
pub fn return_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free memory of the allocator.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Counts a connection or session that ended (for the memory upkeep).
pub fn note_ended() {
    serve::ENDED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

/// Runs [`return_memory`] every `every` while `stop` is not cancelled, when
/// connections or sessions ended since the last pass ([`note_ended`]).
pub fn spawn_memory_upkeep(every: Duration, stop: tokio_util::sync::CancellationToken) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut seen = 0;
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            let now = serve::ENDED.load(std::sync::atomic::Ordering::Relaxed);
            if now != seen {
                seen = now;
                tokio::task::spawn_blocking(return_memory);
            }
        }
    });
}
