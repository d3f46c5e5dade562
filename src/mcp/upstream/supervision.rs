//! Keeps each upstream connected: a stdio child is restarted with a
//! doubling, jittered backoff that resets once it has stayed up for a
//! while, and each new session is announced to the front (its catalog is
//! re-listed); a Streamable HTTP server that went down is probed on the same
//! backoff until it answers.
//!
//! # Invariants
//!
//! 1. A Streamable HTTP upstream is never left `down` without a probe
//!    pending: whatever marked it down, [`watch_http`] pings it (reopening
//!    its session if that ended) until one answer marks it `up`. So the
//!    work that waits for `up` (the reconciler's) is never stranded, and
//!    the `upstream_up` gauge returns to 1 without any agent calling.
//! 2. A probe is an MCP `ping` (or, when the session ended, `initialize`):
//!    it never calls a tool, so it can have no side effect and spends no
//!    retry budget.

use super::connection::{
    Connection, EXIT_GRACE, STABLE_AFTER, Session, UpstreamState, end_child, open_stdio,
};
use crate::config::UpstreamTransport;
use rmcp::model::{ClientRequest, PingRequest};
use rmcp::service::{PeerRequestOptions, ServiceError};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// Upper bound of one probe of a Streamable HTTP upstream that is down
/// (reopening its session, then the ping).
pub(super) const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// Restart delays: exponential from [`Backoff::FIRST`] to [`Backoff::CAP`],
/// each with ±20% jitter so that upstreams that died together do not
/// restart in lockstep.
pub(super) struct Backoff {
    pub(super) next: Duration,
}

impl Backoff {
    const FIRST: Duration = Duration::from_millis(100);
    const CAP: Duration = Duration::from_secs(10);

    pub(super) fn new() -> Self {
        Self { next: Self::FIRST }
    }

    pub(super) fn reset(&mut self) {
        self.next = Self::FIRST;
    }

    pub(super) fn next_delay(&mut self) -> Duration {
        let base = self.next;
        self.next = (base * 2).min(Self::CAP);
        // A randomly keyed hasher is random enough for jitter.
        let random = std::hash::BuildHasher::hash_one(
            &std::collections::hash_map::RandomState::new(),
            Instant::now(),
        );
        let unit = (random >> 11) as f64 / (1u64 << 53) as f64;
        base.mul_f64(0.8 + 0.4 * unit)
    }
}

/// Keeps one stdio upstream running until `stop` (see "Supervision" in the
/// module docs).
pub(super) async fn supervise(
    connection: Arc<Connection>,
    mut session: Session,
    mut child: tokio::process::Child,
    stop: CancellationToken,
) {
    let UpstreamTransport::Stdio { command, args, env } = connection.transport.clone() else {
        return;
    };
    let mut backoff = Backoff::new();
    loop {
        let started = Instant::now();
        let close = session.cancellation_token();
        let ended = session.waiting();
        tokio::pin!(ended);
        let quit = tokio::select! {
            quit = &mut ended => quit,
            () = stop.cancelled() => {
                connection.set_peer(None);
                // Closing the session closes the child's stdin: an MCP
                // server exits on EOF. One that does not is killed.
                close.cancel();
                let _ = tokio::time::timeout(EXIT_GRACE, &mut ended).await;
                end_child(&mut child, EXIT_GRACE).await;
                connection.set_state(UpstreamState::Down, None);
                return;
            }
        };
        // Calls from here on fail as not sent; calls already handed to the
        // lost session end with "transport closed" (maybe sent).
        connection.set_peer(None);
        // Its stdout closed; it may still run (or be a zombie): end it.
        let exit = end_child(&mut child, EXIT_GRACE).await;
        let why = match quit {
            Ok(quit) => format!("session ended ({quit:?}), child: {exit}"),
            Err(error) => format!("session task failed ({error}), child: {exit}"),
        };
        tracing::warn!(upstream = %connection.name, why = %crate::logfield::clip_display(&why), "stdio upstream lost; restarting it");
        connection.set_state(UpstreamState::Restarting, Some(why));
        if started.elapsed() >= STABLE_AFTER {
            backoff.reset();
        }
        (session, child) = loop {
            let delay = backoff.next_delay();
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                () = stop.cancelled() => {
                    connection.set_state(UpstreamState::Down, None);
                    return;
                }
            }
            // A child spawned by an attempt that `stop` interrupts is killed
            // when the attempt is dropped.
            let opened = tokio::select! {
                opened = open_stdio(&connection.handler, &command, &args, &env) => opened,
                () = stop.cancelled() => {
                    connection.set_state(UpstreamState::Down, None);
                    return;
                }
            };
            match opened {
                Ok(opened) => break opened,
                Err(error) => {
                    tracing::warn!(upstream = %connection.name, %error, "restart failed; retrying");
                    connection.set_state(
                        UpstreamState::Restarting,
                        Some(format!("restart failed: {error}")),
                    );
                }
            }
        };
        tracing::info!(upstream = %connection.name, "stdio upstream restarted");
        connection.replaced(session.peer().clone());
    }
}

/// Watches one Streamable HTTP upstream until `stop`: whenever it is
/// `down`, probes it after each backoff delay until it is `up` again
/// (invariant 1). A call that reaches it meanwhile marks it `up` as well.
pub(super) async fn watch_http(connection: Arc<Connection>, stop: CancellationToken) {
    let mut state = connection.state.subscribe();
    loop {
        tokio::select! {
            down = state.wait_for(|state| *state == UpstreamState::Down) => {
                // The sender lives in `connection`, held here: never closed.
                if down.is_err() {
                    return;
                }
            }
            () = stop.cancelled() => return,
        }
        let why = connection.health().last_error.unwrap_or_default();
        tracing::warn!(upstream = %connection.name, why = %crate::logfield::clip(&why),
            "Streamable HTTP upstream down; probing it until it answers");
        let mut backoff = Backoff::new();
        while *state.borrow_and_update() == UpstreamState::Down {
            tokio::select! {
                () = tokio::time::sleep(backoff.next_delay()) => {}
                () = stop.cancelled() => return,
            }
            tokio::select! {
                () = probe(&connection, &stop) => {}
                () = stop.cancelled() => return,
            }
        }
    }
}

/// One probe (invariant 2): an answer, even an error answer, marks the
/// upstream `up`; a transport failure keeps it `down` with the failure as
/// its last error; no answer within [`PROBE_TIMEOUT`] proves nothing.
async fn probe(connection: &Connection, stop: &CancellationToken) {
    // A session that cannot be reopened marks the upstream down itself.
    let Ok(peer) = connection.session(PROBE_TIMEOUT, stop).await else {
        return;
    };
    let ping = ClientRequest::PingRequest(PingRequest {
        method: Default::default(),
        extensions: Default::default(),
    });
    let answer = match peer
        .send_request_with_option(ping, PeerRequestOptions::with_timeout(PROBE_TIMEOUT))
        .await
    {
        Ok(handle) => handle.await_response().await,
        Err(error) => Err(error),
    };
    match answer {
        Ok(_) | Err(ServiceError::McpError(_)) => {
            if !connection.accepting_calls() {
                tracing::info!(upstream = %connection.name, "Streamable HTTP upstream answers again: up");
            }
            connection.observe_http(Ok(()));
        }
        Err(ServiceError::Timeout { .. }) => {
            tracing::debug!(upstream = %connection.name, "probe got no answer in time; still down");
        }
        Err(error) => connection.observe_http(Err(super::transport_failure(&error))),
    }
}

#[cfg(test)]
mod supervision_tests {
    use super::*;

    #[test]
    fn restart_delays_double_to_the_cap_with_jitter_and_reset() {
        let mut backoff = Backoff::new();
        let within = |delay: Duration, base: Duration| {
            delay >= base.mul_f64(0.8) && delay <= base.mul_f64(1.2)
        };
        let mut base = Backoff::FIRST;
        for _ in 0..12 {
            let delay = backoff.next_delay();
            assert!(within(delay, base), "{delay:?} is not {base:?} ± 20%");
            base = (base * 2).min(Backoff::CAP);
        }
        assert_eq!(base, Backoff::CAP, "the cap was reached");
        backoff.reset();
        let delay = backoff.next_delay();
        assert!(within(delay, Backoff::FIRST), "{delay:?} after a reset");
    }
}
