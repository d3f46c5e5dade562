//! One upstream connection: its transport (a stdio child or Streamable
//! HTTP), its handshake, its current session (a lost Streamable HTTP
//! session opened again on demand), its state and health as the control API
//! reports them, and ending a child within a grace period. A dead
//! connection makes every call on it fail as not sent (no session, or no
//! connection could be made) or as a transport error after sending
//! (outcome unknown).
//!
//! # Invariants
//!
//! 1. Every state change goes through [`Connection::set_state`], which
//!    keeps the health, the `upstream_up{upstream}` gauge and the state
//!    watch (what the Streamable HTTP probe waits on) in step.
//! 2. A Streamable HTTP upstream's state is what the last exchange with it
//!    proved: an answer (or a reopened session) is `up`; a transport failure
//!    is `down`. A request that timed out proves neither (a slow tool, or a
//!    connection that hangs) and changes nothing.

use super::UpstreamEvent;
use super::client::UpstreamClient;
use super::routes::{CallRoutes, Routed};
use crate::adapter::UpstreamError;
use crate::config::{EnvValue, UpstreamTransport};
use rmcp::service::{ClientInitializeError, Peer, RunningService};
use rmcp::transport::async_rw::AsyncRwTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, Transport};
use rmcp::{RoleClient, ServiceExt};
use serde_json::json;
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;
use tokio::sync::{broadcast, watch};
use tokio_util::sync::CancellationToken;

/// One session of an upstream: the MCP client over one stdio child or one
/// Streamable HTTP connection.
pub(super) type Session = RunningService<RoleClient, UpstreamClient>;

/// Upper bound of the MCP `initialize` handshake of a (re)started session.
pub(super) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a stdio child gets to exit on its own (its stdin closed) before
/// it is killed, at shutdown and after its session ended.
pub(super) const EXIT_GRACE: Duration = Duration::from_secs(1);

/// A child that stayed up this long starts the next restart from the first
/// delay again.
pub(super) const STABLE_AFTER: Duration = Duration::from_secs(30);

/// Whether an upstream can be called now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum UpstreamState {
    /// A session is open (stdio), or the last request reached the server
    /// (Streamable HTTP).
    Up,
    /// The stdio child is gone and its supervisor is starting another; calls
    /// fail at once as not sent.
    Restarting,
    /// Not being restarted: stopped with leasegate, or a Streamable HTTP
    /// server the last request (or reconnect) could not reach; such a
    /// server is probed until it answers (`supervision::watch_http`). Calls
    /// are still tried; background work waits.
    Down,
}

/// One upstream's health, as the control API shows it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct UpstreamHealth {
    pub name: String,
    /// `stdio` or `streamable_http`, as in the config.
    pub transport: &'static str,
    pub state: UpstreamState,
    /// When `state` last changed.
    pub since: chrono::DateTime<chrono::Utc>,
    /// Sessions opened after the first one (a restarted child, a
    /// reconnected HTTP session).
    pub restarts: u64,
    /// Why the upstream last went away or could not be reached; kept after
    /// it is up again, so an operator sees why it restarted.
    pub last_error: Option<String>,
}

pub(super) struct Health {
    pub(super) state: UpstreamState,
    pub(super) since: chrono::DateTime<chrono::Utc>,
    pub(super) restarts: u64,
    pub(super) last_error: Option<String>,
}

/// One upstream: its current session's peer (swapped on restart), the
/// routes of its calls (shared by its sessions), and its health.
pub(super) struct Connection {
    pub(super) name: String,
    pub(super) transport: UpstreamTransport,
    /// The client every session of this upstream serves with.
    pub(super) handler: UpstreamClient,
    /// The live session's peer. `None` while a stdio child is restarting and
    /// after shutdown, so that a call fails at once, as not sent.
    pub(super) peer: std::sync::RwLock<Option<Peer<RoleClient>>>,
    pub(super) health: Mutex<Health>,
    /// The state as it changes, for whoever waits for one (the Streamable
    /// HTTP probe waits for `down`).
    pub(super) state: watch::Sender<UpstreamState>,
    /// A Streamable HTTP upstream's session (a stdio session is owned by its
    /// supervisor); the lock also makes a reconnect happen once.
    pub(super) http: tokio::sync::Mutex<Option<Session>>,
}

pub(super) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A poisoned lock only means a panic elsewhere mid-update of plain
    // values; they stay usable.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Connection {
    pub(super) fn new(
        name: &str,
        transport: UpstreamTransport,
        events: broadcast::Sender<UpstreamEvent>,
        roots_outside_calls: crate::adapter::RootsOutsideCalls,
    ) -> Self {
        metrics::counter!("upstream_restarts_total", "upstream" => name.to_owned()).increment(0);
        Self {
            name: name.to_owned(),
            transport,
            handler: UpstreamClient {
                name: name.to_owned(),
                routes: CallRoutes::default(),
                events,
                tool_objects: Default::default(),
                roots_outside_calls,
            },
            peer: std::sync::RwLock::new(None),
            health: Mutex::new(Health {
                state: UpstreamState::Down,
                since: chrono::Utc::now(),
                restarts: 0,
                last_error: None,
            }),
            state: watch::Sender::new(UpstreamState::Down),
            http: tokio::sync::Mutex::new(None),
        }
    }

    pub(super) fn routes(&self) -> &CallRoutes {
        &self.handler.routes
    }

    pub(super) fn transport_name(&self) -> &'static str {
        match self.transport {
            UpstreamTransport::Stdio { .. } => "stdio",
            UpstreamTransport::StreamableHttp { .. } => "streamable_http",
        }
    }

    pub(super) fn peer(&self) -> Option<Peer<RoleClient>> {
        self.peer
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    pub(super) fn set_peer(&self, peer: Option<Peer<RoleClient>>) {
        *self
            .peer
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = peer;
    }

    /// Sets the state (and `since` when it changes); an error, when given,
    /// becomes `last_error` (invariant 1).
    pub(super) fn set_state(&self, state: UpstreamState, error: Option<String>) {
        let mut health = lock(&self.health);
        if health.state != state {
            health.state = state;
            health.since = chrono::Utc::now();
        }
        if error.is_some() {
            health.last_error = error;
        }
        let up = if state == UpstreamState::Up { 1.0 } else { 0.0 };
        metrics::gauge!("upstream_up", "upstream" => self.name.clone()).set(up);
        // Under the health lock, so the watch sees changes in their order.
        self.state.send_if_modified(|current| {
            let changed = *current != state;
            *current = state;
            changed
        });
    }

    /// The current session's peer: none while a stdio child restarts (the
    /// call fails as not sent); a lost Streamable HTTP session is opened
    /// again here, within `timeout` (not after `stop`).
    pub(super) async fn session(
        &self,
        timeout: Duration,
        stop: &CancellationToken,
    ) -> Result<Peer<RoleClient>, UpstreamError> {
        if let Some(peer) = self.peer()
            && !peer.is_transport_closed()
        {
            return Ok(peer);
        }
        let UpstreamTransport::StreamableHttp { url } = &self.transport else {
            return Err(self.unavailable());
        };
        let mut session = self.http.lock().await;
        // Another call may have reconnected meanwhile.
        if let Some(peer) = self.peer()
            && !peer.is_transport_closed()
        {
            return Ok(peer);
        }
        if stop.is_cancelled() {
            return Err(self.unavailable());
        }
        let opened = tokio::time::timeout(timeout, open_http(&self.handler, url))
            .await
            .unwrap_or_else(|_| Err(format!("no answer to initialize within {timeout:?}")));
        match opened {
            Ok(opened) => {
                let peer = opened.peer().clone();
                // The old session's loop is over; dropping it frees it.
                *session = Some(opened);
                tracing::info!(upstream = %self.name, "Streamable HTTP session reopened");
                self.replaced(peer.clone());
                Ok(peer)
            }
            Err(error) => {
                let error = format!("reconnecting failed: {error}");
                self.set_state(UpstreamState::Down, Some(error.clone()));
                Err(UpstreamError::NotSent(format!(
                    "upstream {} is down: {error}",
                    self.name
                )))
            }
        }
    }

    /// A new session replaced a lost one: later calls use `peer`, and the
    /// catalog is refreshed as on `notifications/tools/list_changed` (the new
    /// session may serve other tools).
    pub(super) fn replaced(&self, peer: Peer<RoleClient>) {
        // Calls given up on belong to the lost session: nothing about them
        // can arrive any more, and their request ids are reused by the new one.
        self.routes().forget_abandoned();
        self.set_peer(Some(peer));
        lock(&self.health).restarts += 1;
        metrics::counter!("upstream_restarts_total", "upstream" => self.name.clone()).increment(1);
        self.set_state(UpstreamState::Up, None);
        let _ = self.handler.events.send(UpstreamEvent {
            upstream: self.name.clone(),
            method: "notifications/tools/list_changed".into(),
            params: json!({}),
        });
    }

    /// The error of a call made while there is no session: nothing was sent.
    pub(super) fn unavailable(&self) -> UpstreamError {
        let health = lock(&self.health);
        let why = health
            .last_error
            .as_deref()
            .map(|e| format!(" (last error: {e})"))
            .unwrap_or_default();
        let state = match health.state {
            UpstreamState::Restarting => "is restarting",
            UpstreamState::Down => "is down",
            // Up, but its session just ended: the supervisor is about to
            // notice.
            UpstreamState::Up => "lost its session and is restarting",
        };
        UpstreamError::NotSent(format!("upstream {} {state}{why}", self.name))
    }

    /// What a Streamable HTTP request proved about the server: it answered
    /// (up) or failed in transport (down; invariant 2). Stdio health is the
    /// supervisor's.
    pub(super) fn observe_http(&self, reached: Result<(), String>) {
        if matches!(self.transport, UpstreamTransport::StreamableHttp { .. }) {
            match reached {
                Ok(()) => self.set_state(UpstreamState::Up, None),
                Err(error) => self.set_state(UpstreamState::Down, Some(error)),
            }
        }
    }

    /// Whether calls may go out now: `up`. Background work defers while a
    /// stdio child restarts or a Streamable HTTP server is down.
    pub(super) fn accepting_calls(&self) -> bool {
        lock(&self.health).state == UpstreamState::Up
    }

    pub(super) fn health(&self) -> UpstreamHealth {
        let health = lock(&self.health);
        UpstreamHealth {
            name: self.name.clone(),
            transport: self.transport_name(),
            state: health.state,
            since: health.since,
            restarts: health.restarts,
            last_error: health.last_error.clone(),
        }
    }
}

/// A response cache would let a proxy answer from a stale page.
pub(super) async fn no_cache(session: &Session) {
    session
        .peer()
        .set_response_cache_config(rmcp::ClientCacheConfig::disabled())
        .await;
}

/// A stdio upstream's child: stdin and stdout piped for MCP, `stderr` as
/// asked, killed when its handle is dropped.
pub(super) fn spawn_stdio(
    command: &std::path::Path,
    args: &[String],
    env: &BTreeMap<String, EnvValue>,
    stderr: std::process::Stdio,
) -> Result<tokio::process::Child, String> {
    let mut values = BTreeMap::new();
    for (name, value) in env {
        let value = value
            .resolve()
            .map_err(|why| format!("{}: env {name}: {why}", command.display()))?;
        values.insert(name, value);
    }
    tokio::process::Command::new(command)
        .args(args)
        .envs(values)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(stderr)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("{}: {e}", command.display()))
}

/// Spawns a stdio upstream's command and does the MCP handshake over its
/// stdin/stdout. The child is killed when its handle is dropped (a failed
/// handshake, a supervisor ended by the runtime).
pub(super) async fn open_stdio(
    handler: &UpstreamClient,
    command: &std::path::Path,
    args: &[String],
    env: &BTreeMap<String, EnvValue>,
) -> Result<(Session, tokio::process::Child), String> {
    let mut child = spawn_stdio(command, args, env, std::process::Stdio::piped())?;
    let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
        return Err("the child's stdin or stdout is not piped".into());
    };
    if let Some(stderr) = child.stderr.take() {
        tokio::spawn(log_stderr(handler.name.clone(), stderr));
    }
    // rmcp reads the child's lines after the tap has kept its tool objects.
    let stdout = super::tool_objects::tap(stdout, handler.tool_objects.clone());
    let session = handshake(handler, AsyncRwTransport::new_client(stdout, stdin)).await?;
    Ok((session, child))
}

/// A stdio upstream's stderr, one log record per line (target
/// `leasegate::upstream_stderr`, at `info`, with the upstream's name), so
/// that leasegate's log stays one record per line in either format — JSON
/// included — however the server writes. A line is clipped like any
/// request-controlled text (`logfield`), bytes that are not UTF-8
/// replaced; the task ends with the child.
async fn log_stderr(upstream: String, stderr: tokio::process::ChildStderr) {
    use tokio::io::AsyncBufReadExt;
    let mut lines = tokio::io::BufReader::new(stderr).split(b'\n');
    while let Ok(Some(bytes)) = lines.next_segment().await {
        let line = String::from_utf8_lossy(&bytes);
        let line = line.trim_end();
        if !line.is_empty() {
            tracing::info!(target: "leasegate::upstream_stderr",
                upstream = %crate::logfield::clip(&upstream), line = %crate::logfield::clip(line));
        }
    }
}

/// The MCP `initialize` handshake over `inner`, with per-request routing of
/// what the upstream sends, within [`HANDSHAKE_TIMEOUT`].
pub(super) async fn handshake<X>(handler: &UpstreamClient, inner: X) -> Result<Session, String>
where
    Routed<X>: Transport<RoleClient> + Send + 'static,
{
    let transport = Routed {
        inner,
        routes: handler.routes.clone(),
    };
    let session =
        match tokio::time::timeout(HANDSHAKE_TIMEOUT, handler.clone().serve(transport)).await {
            Ok(Ok(session)) => session,
            // Without rmcp's wrapper, which names leasegate's transport types.
            Ok(Err(ClientInitializeError::TransportError { error, context })) => {
                return Err(format!(
                    "{} ({context})",
                    super::dynamic_transport_failure(&error)
                ));
            }
            Ok(Err(error)) => return Err(error.to_string()),
            Err(_) => {
                return Err(format!(
                    "no answer to initialize within {HANDSHAKE_TIMEOUT:?}"
                ));
            }
        };
    no_cache(&session).await;
    Ok(session)
}

/// Opens a Streamable HTTP session (the `initialize` request); its
/// `tools/list` answers are read by the tool objects' tap before rmcp
/// decodes them.
pub(super) async fn open_http(handler: &UpstreamClient, url: &str) -> Result<Session, String> {
    let client = crate::mcp::http_headers::PerCallHeaders::default()
        .with_tool_list_tap(handler.tool_objects.http_tap());
    handshake(
        handler,
        StreamableHttpClientTransport::with_client(
            client,
            StreamableHttpClientTransportConfig::with_uri(url),
        ),
    )
    .await
}

/// Waits up to `grace` for the child to exit, then kills it; reaps it
/// either way. Says how it ended.
pub(super) async fn end_child(child: &mut tokio::process::Child, grace: Duration) -> String {
    match tokio::time::timeout(grace, child.wait()).await {
        Ok(Ok(status)) => status.to_string(),
        Ok(Err(error)) => format!("cannot wait for it: {error}"),
        Err(_) => match child.kill().await {
            Ok(()) => format!("killed by leasegate after {grace:?}"),
            Err(error) => format!("cannot kill it: {error}"),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Streamable HTTP server nobody listens for: reopening its session
    /// is "not sent", says why without leasegate's type names, and marks
    /// the upstream down.
    #[tokio::test]
    async fn a_refused_reconnect_is_not_sent_and_marks_the_upstream_down() {
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/mcp", closed.local_addr().unwrap());
        drop(closed);
        let (events, _) = broadcast::channel(1);
        let connection = Connection::new(
            "payments",
            UpstreamTransport::StreamableHttp { url },
            events,
            Default::default(),
        );
        connection.set_state(UpstreamState::Up, None);
        let Err(UpstreamError::NotSent(message)) = connection
            .session(Duration::from_secs(10), &CancellationToken::new())
            .await
        else {
            panic!("a refused reconnect is not sent");
        };
        assert!(
            message.contains("payments is down") && message.contains("refused"),
            "{message}"
        );
        assert!(!message.contains("leasegate::"), "{message}");
        assert_eq!(connection.health().state, UpstreamState::Down);
        assert!(!connection.accepting_calls());
        assert_eq!(*connection.state.borrow(), UpstreamState::Down);
    }
}
