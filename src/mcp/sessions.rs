//! MCP sessions over HTTP (`http_sessions = true`), bounded: rmcp's
//! `LocalSessionManager` with an idle timeout (`limits.session_idle_timeout`)
//! and at most `limits.max_sessions` sessions.
//!
//! # Invariants
//!
//! 1. At most `max_sessions` sessions exist. A new session beyond that
//!    evicts the least recently used idle session (no request in progress
//!    on it; an open standalone GET stream does not make a session busy),
//!    which ends its worker and frees what it held; its next request gets
//!    404 (MCP: "session not found", the client starts a new session).
//! 2. When every session is busy, `initialize` is refused with 503 and
//!    `Retry-After` before a session is made ([`BoundedSessions::full`]).
//! 3. A session with no message for `session_idle_timeout` ends (rmcp's
//!    `keep_alive`), and is forgotten here through `close_session`.
//! 4. A session belongs to the authenticated principal that created it
//!    (`token:<id>`, with tokens required): a request naming it with
//!    another principal's credentials is answered as for an unknown session
//!    (404), so a known `Mcp-Session-Id` is no credential. Without tokens
//!    every caller is the same anonymous local principal, and nothing is
//!    bound.
//! 5. One principal holds at most `limits.max_sessions_per_principal`
//!    sessions: its new session beyond that evicts its own least recently
//!    used idle session (or, all busy, is refused 503), never another's.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::Stream;
use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::transport::streamable_http_server::session::local::{
    LocalSessionManager, LocalSessionManagerError,
};
use rmcp::transport::streamable_http_server::session::{
    RestoreOutcome, ServerSseMessage, SessionId, SessionManager,
};

tokio::task_local! {
    /// The principal whose `initialize` is being served (set by the HTTP
    /// layer around rmcp, which makes the session in the same task).
    static CREATOR: Option<String>;
}

/// Runs `serve` (an `initialize` request) on behalf of `principal`.
pub async fn creating<F: std::future::Future>(principal: Option<String>, serve: F) -> F::Output {
    CREATOR.scope(principal, serve).await
}

/// See the module docs.
pub struct BoundedSessions {
    inner: LocalSessionManager,
    max: usize,
    per_principal: usize,
    /// Session → the principal that created it (invariant 4).
    owners: Mutex<HashMap<SessionId, String>>,
    /// When this manager was made: `Usage::last_used` counts from it.
    epoch: Instant,
    usage: Mutex<HashMap<SessionId, Arc<Usage>>>,
}

#[derive(Default)]
struct Usage {
    /// Milliseconds since `epoch` of the last request.
    last_used: AtomicU64,
    /// Request-wise streams open.
    busy: AtomicUsize,
}

#[derive(Debug, thiserror::Error)]
pub enum SessionsError {
    #[error(transparent)]
    Local(#[from] LocalSessionManagerError),
    #[error("{0} MCP sessions are open and all are busy (limits.max_sessions)")]
    Full(usize),
}

type SseStream = Pin<Box<dyn Stream<Item = ServerSseMessage> + Send + Sync>>;

impl BoundedSessions {
    pub fn new(max: usize, per_principal: usize, idle_timeout: Duration) -> BoundedSessions {
        let mut inner = LocalSessionManager::default();
        inner.session_config.keep_alive = Some(idle_timeout);
        BoundedSessions {
            inner,
            max,
            per_principal,
            owners: Mutex::new(HashMap::new()),
            epoch: Instant::now(),
            usage: Mutex::new(HashMap::new()),
        }
    }

    fn usage(&self) -> std::sync::MutexGuard<'_, HashMap<SessionId, Arc<Usage>>> {
        self.usage.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn touch(&self, id: &SessionId) -> Option<Arc<Usage>> {
        let usage = self.usage().get(id).cloned()?;
        usage.last_used.store(self.now(), Ordering::Relaxed);
        Some(usage)
    }

    /// Sessions held now.
    pub fn len(&self) -> usize {
        self.usage().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether a new session would be refused: the cap is reached and no
    /// session is idle (invariant 2).
    pub fn full(&self) -> bool {
        let usage = self.usage();
        usage.len() >= self.max && usage.values().all(|u| u.busy.load(Ordering::Relaxed) > 0)
    }

    fn owners(&self) -> std::sync::MutexGuard<'_, HashMap<SessionId, String>> {
        self.owners.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether `principal` may use session `id` (invariant 4): a session
    /// made by no authenticated principal, or by this one.
    pub fn may_use(&self, id: &str, principal: Option<&str>) -> bool {
        match self.owners().get(id) {
            None => true,
            Some(owner) => principal == Some(owner.as_str()),
        }
    }

    /// Picks and forgets the least recently used idle session, if a cap is
    /// reached: `creator`'s own cap (invariant 5), else the process's
    /// (invariant 1). `Err`: every candidate is busy.
    fn pick_victim(&self, creator: Option<&str>) -> Result<Option<SessionId>, SessionsError> {
        let owners = self.owners();
        let mut usage = self.usage();
        let own =
            |id: &SessionId| creator.is_some() && owners.get(id).map(String::as_str) == creator;
        let held = usage.keys().filter(|id| own(id)).count();
        let candidates: Vec<(&SessionId, &Arc<Usage>)> =
            if creator.is_some() && held >= self.per_principal {
                usage.iter().filter(|(id, _)| own(id)).collect()
            } else if usage.len() >= self.max {
                usage.iter().collect()
            } else {
                return Ok(None);
            };
        let victim = candidates
            .into_iter()
            .filter(|(_, u)| u.busy.load(Ordering::Relaxed) == 0)
            .min_by_key(|(_, u)| u.last_used.load(Ordering::Relaxed))
            .map(|(id, _)| id.clone())
            .ok_or(SessionsError::Full(self.max))?;
        usage.remove(&victim);
        drop(owners);
        self.owners().remove(&victim);
        Ok(Some(victim))
    }

    fn tracked(&self, id: &SessionId, stream: SseStream) -> SseStream {
        match self.touch(id) {
            Some(usage) => {
                usage.busy.fetch_add(1, Ordering::Relaxed);
                let guard = Busy(usage);
                Box::pin(futures::StreamExt::map(stream, move |item| {
                    let _ = &guard;
                    item
                }))
            }
            None => stream,
        }
    }
}

/// One open request-wise stream of a session.
struct Busy(Arc<Usage>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.busy.fetch_sub(1, Ordering::Relaxed);
    }
}

impl SessionManager for BoundedSessions {
    type Error = SessionsError;
    type Transport = <LocalSessionManager as SessionManager>::Transport;

    async fn create_session(&self) -> Result<(SessionId, Self::Transport), Self::Error> {
        let creator = CREATOR.try_with(Clone::clone).ok().flatten();
        while let Some(victim) = self.pick_victim(creator.as_deref())? {
            metrics::counter!("mcp_sessions_evicted_total").increment(1);
            tracing::debug!(session = %crate::logfield::clip(&victim), "idle MCP session evicted");
            self.inner.close_session(&victim).await?;
            crate::http_server::note_ended();
        }
        let (id, transport) = self.inner.create_session().await?;
        let usage = Arc::new(Usage::default());
        usage.last_used.store(self.now(), Ordering::Relaxed);
        self.usage().insert(id.clone(), usage);
        if let Some(creator) = creator {
            self.owners().insert(id.clone(), creator);
        }
        metrics::gauge!("mcp_sessions_open").set(self.len() as f64);
        Ok((id, transport))
    }

    async fn initialize_session(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<ServerJsonRpcMessage, Self::Error> {
        self.touch(id);
        Ok(self.inner.initialize_session(id, message).await?)
    }

    async fn has_session(&self, id: &SessionId) -> Result<bool, Self::Error> {
        Ok(self.inner.has_session(id).await?)
    }

    async fn close_session(&self, id: &SessionId) -> Result<(), Self::Error> {
        let known = self.usage().remove(id).is_some();
        self.owners().remove(id);
        self.inner.close_session(id).await?;
        if known {
            crate::http_server::note_ended();
        }
        metrics::gauge!("mcp_sessions_open").set(self.len() as f64);
        Ok(())
    }

    async fn create_stream(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        let stream = self.inner.create_stream(id, message).await?;
        Ok(self.tracked(id, Box::pin(stream)))
    }

    async fn accept_message(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<(), Self::Error> {
        self.touch(id);
        Ok(self.inner.accept_message(id, message).await?)
    }

    async fn create_standalone_stream(
        &self,
        id: &SessionId,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.touch(id);
        Ok(self.inner.create_standalone_stream(id).await?)
    }

    async fn resume(
        &self,
        id: &SessionId,
        last_event_id: String,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.touch(id);
        Ok(self.inner.resume(id, last_event_id).await?)
    }

    async fn restore_session(
        &self,
        id: SessionId,
    ) -> Result<RestoreOutcome<Self::Transport>, Self::Error> {
        // No session store is configured: rmcp does not call this.
        Ok(self.inner.restore_session(id).await?)
    }

    fn event_store(
        &self,
    ) -> Option<Arc<dyn rmcp::transport::streamable_http_server::session::EventStore>> {
        self.inner.event_store()
    }
}
