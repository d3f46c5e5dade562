//! The ledger's connection pool: `deadpool` over sqlx's `PgConnection`.
//!
//! Why not `sqlx::PgPool`: sqlx 0.9 pings every connection when it goes
//! back to its pool (`PoolConnection`'s release path sends a `Sync` and
//! waits for `ReadyForQuery`, with no option to turn it off). Every ledger
//! call is one statement, so that ping doubled the round trips on the wire
//! (4 per gated call instead of 2) and kept each connection busy for one
//! more round trip after its answer was read. This pool hands a connection
//! back with no traffic at all.
//!
//! # Invariants
//!
//! - A connection goes back to the pool only after its statement was sent
//!   and its answer read up to the server's error or the last row
//!   ([`Checkout::finished`]); sqlx's `PgConnection` reads whatever remains
//!   of that answer (up to `ReadyForQuery`) before it sends the next
//!   statement. Every statement is its own transaction, so the session is
//!   in none. A checkout dropped before that —
//!   the caller's future was cancelled mid-statement — takes the connection
//!   out of the pool and closes it, so no later call can read a stranger's
//!   answer. (sqlx would drain it with the ping instead; closing is the
//!   simpler guarantee, and cancellation is rare.)
//! - A connection whose statement failed with a broken session (08xxx,
//!   57Pxx, I/O) is discarded by the caller ([`Checkout::broke`]); one
//!   that died while idle surfaces as such an error on its next use (as
//!   with `test_before_acquire(false)` before), never as a wrong answer.
//! - Sessions die together more often than alone (a server restart, an
//!   administrator terminating backends, a middlebox dropping idle
//!   connections): once one broke, every session that was idle in the
//!   pool at that moment is validated with one round trip (a `Sync`,
//!   answered by `ReadyForQuery`) before it is handed out again, and is
//!   replaced by a new one if it fails. So after a broken session the
//!   next call gets a working one; on the hot path, with no session
//!   broken, nothing is sent.
//! - Every connection is set up once, when opened ([`Setup`]): statement
//!   timeout, the `synchronous_commit` floor, the session role.
//! - A connection idle longer than [`IDLE_TIMEOUT`] is closed instead of
//!   handed out (the server or a middlebox may have dropped it meanwhile).
//!
//! On a crash nothing here is durable: the database finishes or rolls back
//! each statement in flight on its own.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use deadpool::managed::{self, Metrics, Object, PoolError, RecycleError, RecycleResult};
use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::{ConnectOptions, Connection};

/// A pooled connection idle longer than this is closed, not handed out.
pub(super) const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// What every new session runs before its first call.
#[derive(Debug, Clone)]
pub(super) struct Setup {
    pub statement_timeout: Duration,
    /// At least `on` (`remote_apply` kept): a commit returns once the
    /// synchronous standbys flushed it.
    pub synchronous_commit_at_least_on: bool,
    /// `SET ROLE` to this role (`None`: the login's own).
    pub role: Option<String>,
}

/// Opens and recycles ledger sessions for `deadpool`.
#[derive(Debug)]
pub(super) struct Sessions {
    connect: PgConnectOptions,
    setup: Setup,
    /// When a session last broke: sessions idle since before it are
    /// validated before their next use (module invariants).
    last_broken: Arc<LastBroken>,
}

/// The instant a pooled session last broke, shared by the pool and its
/// checkouts.
#[derive(Debug, Default)]
struct LastBroken(Mutex<Option<Instant>>);

impl LastBroken {
    fn mark(&self) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
    }

    fn get(&self) -> Option<Instant> {
        *self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl managed::Manager for Sessions {
    type Type = PgConnection;
    type Error = sqlx::Error;

    async fn create(&self) -> Result<PgConnection, sqlx::Error> {
        let mut conn = self.connect.connect().await?;
        let statement_timeout_ms = self.setup.statement_timeout.as_millis().to_string();
        sqlx::query("SELECT set_config('statement_timeout', $1, false)")
            .bind(statement_timeout_ms)
            .execute(&mut conn)
            .await?;
        if self.setup.synchronous_commit_at_least_on {
            sqlx::query(
                "SELECT set_config('synchronous_commit', \
                 CASE WHEN current_setting('synchronous_commit') = 'remote_apply' \
                      THEN 'remote_apply' ELSE 'on' END, false)",
            )
            .execute(&mut conn)
            .await?;
        }
        if let Some(role) = &self.setup.role {
            sqlx::query("SELECT set_config('role', $1, false)")
                .bind(role)
                .execute(&mut conn)
                .await?;
        }
        Ok(conn)
    }

    async fn recycle(
        &self,
        conn: &mut PgConnection,
        metrics: &Metrics,
    ) -> RecycleResult<sqlx::Error> {
        if metrics.last_used() > IDLE_TIMEOUT {
            return Err(RecycleError::message(
                "idle for longer than the idle timeout",
            ));
        }
        // Last handed out before a sibling broke: it may have died the same
        // way, so one round trip proves it first (a failure here makes the
        // pool try the next session or open a new one).
        let handed_out = metrics.recycled.unwrap_or(metrics.created);
        if self
            .last_broken
            .get()
            .is_some_and(|broke| handed_out <= broke)
        {
            conn.ping().await?;
        }
        // Otherwise no round trip: a checkout returns its connection only
        // once the answer was read in full (see the module's invariants).
        Ok(())
    }
}

/// The ledger's pool of sessions.
#[derive(Clone)]
pub(super) struct SessionPool {
    inner: managed::Pool<Sessions>,
    last_broken: Arc<LastBroken>,
}

impl std::fmt::Debug for SessionPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let status = self.inner.status();
        f.debug_struct("SessionPool")
            .field("max_size", &status.max_size)
            .field("size", &status.size)
            .field("available", &status.available)
            .finish()
    }
}

impl SessionPool {
    /// A pool of at most `max_size` sessions; waiting for a free one and
    /// opening a new one are each bounded by `acquire_timeout`. Opens
    /// nothing yet.
    pub fn new(
        connect: PgConnectOptions,
        setup: Setup,
        max_size: u32,
        acquire_timeout: Duration,
    ) -> Result<Self, sqlx::Error> {
        let last_broken = Arc::new(LastBroken::default());
        let sessions = Sessions {
            connect,
            setup,
            last_broken: last_broken.clone(),
        };
        let inner = managed::Pool::builder(sessions)
            .max_size(max_size.max(1) as usize)
            .wait_timeout(Some(acquire_timeout))
            .create_timeout(Some(acquire_timeout))
            .recycle_timeout(Some(acquire_timeout))
            .runtime(deadpool::Runtime::Tokio1)
            .build()
            .map_err(|error| sqlx::Error::Configuration(error.to_string().into()))?;
        Ok(Self { inner, last_broken })
    }

    /// A session for one statement, with sqlx's error for every way of not
    /// getting one (`PoolTimedOut`, `PoolClosed`, or the connect error).
    pub async fn checkout(&self) -> Result<Checkout, sqlx::Error> {
        match self.inner.get().await {
            Ok(conn) => Ok(Checkout {
                conn: Some(conn),
                last_broken: self.last_broken.clone(),
            }),
            Err(PoolError::Backend(error)) => Err(error),
            Err(PoolError::Timeout(_)) => Err(sqlx::Error::PoolTimedOut),
            Err(PoolError::Closed) => Err(sqlx::Error::PoolClosed),
            Err(other) => Err(sqlx::Error::Configuration(other.to_string().into())),
        }
    }

    /// How this pool opens its sessions (for a listener of its own).
    pub fn connect_options(&self) -> PgConnectOptions {
        self.inner.manager().connect.clone()
    }

    /// Refuses new checkouts and closes the idle sessions (each with a
    /// `Terminate` message). Sessions in use are closed as they come back.
    pub async fn close(&self) {
        self.inner.close();
        let idle = self.inner.retain(|_, _| false);
        for conn in idle.removed {
            let _ = conn.close().await;
        }
    }
}

/// A session taken from the pool for one statement. Dropped unfinished, it
/// closes the session instead of returning it (module invariants).
pub(super) struct Checkout {
    conn: Option<Object<Sessions>>,
    last_broken: Arc<LastBroken>,
}

impl Checkout {
    pub fn connection(&mut self) -> &mut PgConnection {
        self.conn
            .as_mut()
            .expect("a checkout holds its session until finished or discarded")
    }

    /// The answer was read in full: the session goes back to the pool.
    pub fn finished(mut self) {
        drop(self.conn.take());
    }

    /// The session may hold unread rows: it never goes back.
    pub fn discard(mut self) {
        if let Some(conn) = self.conn.take() {
            drop(Object::take(conn));
        }
    }

    /// The session broke: it never goes back, and every session idle in
    /// the pool now is validated before its next use.
    pub fn broke(self) {
        self.last_broken.mark();
        self.discard();
    }
}

impl Drop for Checkout {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            drop(Object::take(conn));
        }
    }
}
