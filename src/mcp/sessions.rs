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

/// See the module docs.
pub struct BoundedSessions {
    inner: LocalSessionManager,
    max: usize,
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
    pub fn new(max: usize, idle_timeout: Duration) -> BoundedSessions {
        let mut inner = LocalSessionManager::default();
        inner.session_config.keep_alive = Some(idle_timeout);
        BoundedSessions {
            inner,
            max,
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

    /// Picks and forgets the least recently used idle session, if the cap
    /// is reached (invariant 1). `Err`: every session is busy.
    fn pick_victim(&self) -> Result<Option<SessionId>, SessionsError> {
        let mut usage = self.usage();
        if usage.len() < self.max {
            return Ok(None);
        }
        let victim = usage
            .iter()
            .filter(|(_, u)| u.busy.load(Ordering::Relaxed) == 0)
            .min_by_key(|(_, u)| u.last_used.load(Ordering::Relaxed))
            .map(|(id, _)| id.clone())
            .ok_or(SessionsError::Full(self.max))?;
        usage.remove(&victim);
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
        while let Some(victim) = self.pick_victim()? {
            metrics::counter!("mcp_sessions_evicted_total").increment(1);
            tracing::debug!(session = %crate::logfield::clip(&victim), "idle MCP session evicted");
            self.inner.close_session(&victim).await?;
            crate::http_server::note_ended();
        }
        let (id, transport) = self.inner.create_session().await?;
        let usage = Arc::new(Usage::default());
        usage.last_used.store(self.now(), Ordering::Relaxed);
        self.usage().insert(id.clone(), usage);
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
