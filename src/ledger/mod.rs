//! The PostgreSQL ledger: typed calls of the protected SQL functions.
//!
//! Every write in this module is one call of one SQL function defined in
//! `sql/` (tables in `migrations/`; `schema` applies both), sent as one statement, so it is one short transaction and
//! (once the statement is prepared on the connection) one round trip. The
//! functions lock, validate and write; this module only binds arguments,
//! retries aborted transactions and turns the answer into types.
//!
//! # Invariants (numbering follows docs/architecture.md)
//!
//! 1. Only the current run's current epoch writes workflow state: every
//!    fenced function locks the lease row `FOR UPDATE`, checks owner, epoch,
//!    expiry and the lease token's hash, and writes in the same transaction
//!    (`_lease_fence`). Owner and epoch are public; the token (`token`
//!    module) is the credential, and only its SHA-256 is sent and stored.
//! 2. Within one epoch, writes are ordered by a revision compare-and-swap.
//! 5. No transaction spans a network call: the transaction is the statement.
//! 6. A retry of a task is a new run; terminal runs are never reused.
//! 7. Lease time is the database's `clock_timestamp()`, never this host's.
//! 8. Every status change is appended to `ledger_events` with its actor. A
//!    claim (→ `dispatching`) writes its facts (who, when, which epoch and
//!    worker, which dispatch) on the operation row and is told by the one
//!    event that ends it (settle, mark unknown, not-sent release), which
//!    carries them (`detail.claim`); [`OperationView::claims`] reads them
//!    back.
//!
//! Bodies (request arguments, results, evidence) are written only in the
//! form [`LedgerOptions::bodies`] keeps (as sent, masked, digest only, or
//! sealed: `policy::secrets`) and read back through one walk that decodes
//! and opens them (`stored_json::open`); a body that cannot be opened is a
//! [`LedgerError::Sealed`] naming its operation, never plaintext or a
//! placeholder. Planned intents a policy cannot keep sendable are refused.
//!
//! The application's database role (`leasegate_app`) may execute these
//! functions and SELECT, and nothing else, so no caller can bypass fencing.
//! [`Ledger::connect`] switches every pooled session to that role.
//!
//! # Failure handling
//!
//! - Opening the ledger ([`Ledger::connect_with`], `migrate`,
//!   `create_database_if_missing`): a [`ConnectError`] says which of
//!   [`ConnectFailure`] happened — no server answered, the login was
//!   refused (28P01/28000), no such database (3D000), or no ledger in it —
//!   with the URL without its password; callers add the fix.
//! - SQLSTATE 40001 / 40P01: the transaction was rolled back; the whole call
//!   is sent again, up to [`LedgerOptions::retry_attempts`] times.
//! - Connection lost with the statement in flight (which includes a lost
//!   COMMIT): [`LedgerError::OutcomeUnknown`] — "read back", never success or
//!   failure. A read is sent again instead, on a fresh or validated
//!   session (`pool`: after one session broke, the idle ones are proved
//!   before reuse), up to [`LedgerOptions::retry_attempts`] times.
//!   [`LedgerError::is_transient`] tells the callers that may repeat a
//!   call (the liveness renewal, start-up, the background loops) which
//!   failures a fresh connection may cure. Each call is safe to read back: runs by their caller-chosen id,
//!   leases and revisions by [`Ledger::run_get`].
//! - If the process dies while a call is in flight, the database finishes or
//!   rolls back that one statement on its own; no half-written state exists.

mod access_token;
mod backoff;
mod console;
mod durability;
mod error;
mod group;
mod lease;
mod lease_token;
mod members;
mod operation;
mod operation_rows;
mod operation_types;
mod pool;
mod process;
mod read;
mod reconcile;
mod retention;
mod run;
mod schema;
mod secrets;
mod stored_json;
mod types;
mod verdict;

use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::{PgArguments, PgConnectOptions, PgPoolOptions, PgRow};
use sqlx::query::QueryAs;
use sqlx::{FromRow, Postgres};

pub use access_token::{
    NewToken, TokenCreateOutcome, TokenRecord, TokenRevokeOutcome, TokenVerdict,
};
pub use backoff::{Backoff, retry_within};
pub use console::{
    ConsoleCounts, LIST_LIMIT, OperationRowSummary, OperationSearch, RunRowSummary, RunSearch,
};
pub use durability::{
    DurabilityFacts, FailoverRecord, FailoverResolveOutcome, FailoverSeen, Lsn, WalPosition,
};
pub use error::{ConnectError, ConnectFailure, Delivery, InvalidInput, LedgerError, redacted_url};
pub use lease::{BatchRenewal, MAX_RENEW_BATCH};
pub use lease_token::LEASE_TOKEN_PREFIX;
pub use members::{MEMBER_PROBE_CHANNEL, MemberJoin, MemberProbes, Readiness, TaskKind, TaskRef};
pub use operation::PlannedCheckpoint;
pub use operation_types::{
    ClaimedOperation, Converge, ConvergeEvidence, ConvergeOutcome, DispatchClaim, Evidence,
    EvidenceKind, InlineClaim, MarkUnknown, MarkUnknownOutcome, OperationClaim, OperationRecord,
    OperationStatus, OperationView, ReconcileItem, Registered, ReleaseUnsentOutcome, ResendVerdict,
    RetryResetOutcome, RetryVerdict, SettleOutcome, Settlement, StaleReason, SupersedeOutcome,
    ToolRoute, UnknownBy, UnknownCause, UnknownSummary,
};
pub use read::{DbHealth, OperationFilter};
pub use retention::{ArchiveBatch, MAX_ARCHIVE_BATCH};
pub use run::InitialLease;
pub use schema::{FUNCTION_FILES, MIGRATOR, functions_digest};
pub use secrets::RotationReport;
pub use types::{
    AcquireOutcome, Applied, Fenced, ForbiddenTransition, LeaseClaim, LeaseGrant, LeaseState,
    LeaseToken, LedgerEvent, Rejection, RunCreateOutcome, RunEvent, RunId, RunStatus, RunSummary,
    RunView, TokenFault,
};

use error::{ErrorClass, classify};
pub use group::{
    GROUP_COMMIT_ENV, GroupCommitCounts, GroupCommitSettings,
    MAX_BATCH_LIMIT as GROUP_COMMIT_MAX_BATCH, MAX_IN_FLIGHT as GROUP_COMMIT_MAX_IN_FLIGHT,
    MAX_WINDOW as GROUP_COMMIT_MAX_WINDOW, env_override as group_commit_env_override,
};

/// The database role the application runs as (created by the migrations).
pub const APP_ROLE: &str = "leasegate_app";

/// The database role of operator acts (created by the migrations): token
/// management (`leasegate tokens …`), re-sealing bodies (`secrets
/// rotate`), resolving and retrying operations, cancelling runs, resolving
/// failovers (migrations/0007). The application role can do none of these.
pub const OPERATOR_ROLE: &str = "leasegate_operator";

/// Settings of a [`Ledger`]. The defaults suit a 30 s lease TTL and a 5 s
/// heartbeat; the ceiling keeps a typo from parking a run for
/// days.
#[derive(Debug, Clone)]
pub struct LedgerOptions {
    /// Largest lease TTL a caller may ask for, in milliseconds.
    pub max_lease_ttl_ms: i64,
    /// Largest dispatch claim TTL, in milliseconds.
    pub max_claim_ttl_ms: i64,
    /// Role every pooled session switches to (`SET ROLE`). `None` keeps the
    /// login role, which should then itself lack table write rights.
    pub session_role: Option<String>,
    /// Server-side cap on one call, lock waits included.
    pub statement_timeout: Duration,
    /// Attempts for a call whose transaction keeps aborting with 40001/40P01,
    /// and for a read whose session keeps breaking.
    pub retry_attempts: u32,
    pub max_connections: u32,
    /// How long to wait for a pooled connection before reporting
    /// [`LedgerError::Unavailable`].
    pub acquire_timeout: Duration,
    /// How long connecting waits for the server's first answer before
    /// reporting it unreachable: `serve` and `stdio` give it their whole
    /// `database_connect_timeout`, so the wait they report is the one
    /// applied.
    pub connect_timeout: Duration,
    pub application_name: String,
    /// Every pooled session sets `synchronous_commit` to at least `on`
    /// (`remote_apply` is kept), so that no role or database default can
    /// weaken what an acknowledged commit waits for (policy `durability =
    /// "sync_replica"`).
    pub synchronous_commit_at_least_on: bool,
    /// What is stored of request arguments, results and evidence (policy
    /// `request_body`, `result_body`), and the keys sealed bodies are
    /// opened with: applied on every path that writes a body, and every
    /// read opens (`stored_json::open`).
    pub bodies: crate::policy::Bodies,
    /// Group commit of register-claims and settles (`group/`): `None`
    /// sends each call alone. The default is on, with the default window
    /// and batch size, unless `LEASEGATE_GROUP_COMMIT` is off
    /// ([`group::env_override`]).
    pub group_commit: Option<GroupCommitSettings>,
}

impl Default for LedgerOptions {
    fn default() -> Self {
        Self {
            max_lease_ttl_ms: 10 * 60 * 1000,
            max_claim_ttl_ms: 10 * 60 * 1000,
            session_role: Some(APP_ROLE.to_owned()),
            statement_timeout: Duration::from_secs(10),
            retry_attempts: 5,
            max_connections: 10,
            acquire_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(5),
            application_name: "leasegate".to_owned(),
            synchronous_commit_at_least_on: false,
            bodies: crate::policy::Bodies::default(),
            group_commit: group::env_override()
                .unwrap_or(true)
                .then(GroupCommitSettings::default),
        }
    }
}

/// Handle to the ledger. Cheap to clone (the pool is shared).
#[derive(Debug, Clone)]
pub struct Ledger {
    pool: pool::SessionPool,
    /// Shared by the clones (keeps a `Ledger` small to move and clone).
    options: std::sync::Arc<LedgerOptions>,
    /// The group committer's queues, when `options.group_commit` is set.
    group: Option<std::sync::Arc<group::Group>>,
}

/// Longest text accepted for owners, tenants, task ids and actors (the
/// limits every edge enforces too, with the same character set).
use crate::ids::{MAX_OWNER_LEN, MAX_TASK_LEN, MAX_TENANT_LEN};

impl Ledger {
    /// Connects with a database URL; see [`Ledger::connect_with`].
    pub async fn connect(url: &str, options: LedgerOptions) -> Result<Self, LedgerError> {
        let connect = PgConnectOptions::from_str(url)
            .map_err(|source| connect_error(&redacted_url(url), source))?;
        Self::connect_with(connect, options).await
    }

    /// Opens a pool whose sessions run as [`LedgerOptions::session_role`]
    /// with the statement timeout applied, after checking on one connection
    /// that the server answers, accepts the login, has the database and
    /// holds a migrated ledger (each failure a [`ConnectFailure`]).
    pub async fn connect_with(
        connect: PgConnectOptions,
        options: LedgerOptions,
    ) -> Result<Self, LedgerError> {
        preflight(&connect, &options).await?;
        let connect = connect.application_name(&options.application_name);
        // Opens sessions as calls need them (preflight just proved the
        // server, login, database and role).
        let pool = pool::SessionPool::new(
            connect,
            pool::Setup {
                statement_timeout: options.statement_timeout,
                synchronous_commit_at_least_on: options.synchronous_commit_at_least_on,
                role: options.session_role.clone(),
            },
            options.max_connections,
            options.acquire_timeout,
        )
        .map_err(|source| LedgerError::Unavailable {
            call: "connect",
            source,
        })?;
        let mut ledger = Self {
            pool,
            options: std::sync::Arc::new(options),
            group: None,
        };
        if let Some(settings) = ledger.options.group_commit {
            ledger.group = Some(group::Group::start(&ledger, settings));
        }
        Ok(ledger)
    }

    /// Applies the migrations with the privileges of `url`'s login role
    /// (which must own the schema, and create the application role if it is
    /// missing). Running it again is a no-op.
    pub async fn migrate(url: &str) -> Result<(), LedgerError> {
        Self::migrate_within(url, CONNECT_TIMEOUT).await
    }

    /// [`Ledger::migrate`], waiting up to `wait` for the server to answer.
    pub async fn migrate_within(url: &str, wait: Duration) -> Result<(), LedgerError> {
        let target = redacted_url(url);
        let connect =
            PgConnectOptions::from_str(url).map_err(|source| connect_error(&target, source))?;
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(wait)
            .connect_with(connect)
            .await
            .map_err(|source| connect_error(&target, source))?;
        let result = async {
            MIGRATOR.run(&pool).await.map_err(|error| match error {
                // Migrations before the first release were rewritten once
                // (the functions moved to sql/); say so instead of a checksum.
                sqlx::migrate::MigrateError::VersionMismatch(version) => LedgerError::Protocol {
                    call: "migrate",
                    detail: format!(
                        "migration {version} applied to this database differs from this \
                             build's: the database was created by a pre-release development \
                             build of leasegate; drop it (or use a new database) and start again"
                    ),
                },
                other => LedgerError::Migrate(other),
            })?;
            let mut conn = pool
                .acquire()
                .await
                .map_err(|source| LedgerError::Unavailable {
                    call: "migrate",
                    source,
                })?;
            schema::apply(&mut conn)
                .await
                .map_err(|source| LedgerError::Database {
                    call: "migrate (sql/ functions)",
                    source,
                })?;
            Ok::<(), LedgerError>(())
        }
        .await;
        pool.close().await;
        result
    }

    /// Creates the database named in `url` if it does not exist yet.
    /// Returns whether it was created.
    pub async fn create_database_if_missing(url: &str) -> Result<bool, LedgerError> {
        Self::create_database_if_missing_within(url, CONNECT_TIMEOUT).await
    }

    /// [`Ledger::create_database_if_missing`], waiting up to `wait` for
    /// each answer of the server.
    pub async fn create_database_if_missing_within(
        url: &str,
        wait: Duration,
    ) -> Result<bool, LedgerError> {
        use sqlx::migrate::MigrateDatabase;
        let target = redacted_url(url);
        // Both connect to the server's maintenance database (`postgres`).
        let failed = |source: sqlx::Error| match ConnectFailure::of(&source) {
            Some(_) => connect_error(&target, source),
            None => LedgerError::Database {
                call: "create_database",
                source,
            },
        };
        let exists = tokio::time::timeout(wait, Postgres::database_exists(url))
            .await
            .map_err(|_| timed_out(&target, wait))?
            .map_err(failed)?;
        if exists {
            return Ok(false);
        }
        tokio::time::timeout(wait, Postgres::create_database(url))
            .await
            .map_err(|_| timed_out(&target, wait))?
            .map_err(failed)?;
        Ok(true)
    }

    /// Whether anything accepts a connection at `url`'s server address (a
    /// TCP connect to host:port, or the Unix socket), within `timeout`. It
    /// says nothing about the login or the database; an unparseable URL
    /// counts as answering, so that opening it reports the URL.
    pub async fn server_answers(url: &str, timeout: Duration) -> bool {
        let Ok(options) = PgConnectOptions::from_str(url) else {
            return true;
        };
        let port = options.get_port();
        let attempt = async {
            match options.get_socket() {
                Some(dir) => {
                    let socket = dir.join(format!(".s.PGSQL.{port}"));
                    tokio::net::UnixStream::connect(socket).await.is_ok()
                }
                None => tokio::net::TcpStream::connect((options.get_host(), port))
                    .await
                    .is_ok(),
            }
        };
        tokio::time::timeout(timeout, attempt)
            .await
            .unwrap_or(false)
    }

    pub fn options(&self) -> &LedgerOptions {
        &self.options
    }

    /// What the group committer sent so far (`None`: group commit is off).
    pub fn group_commit_counts(&self) -> Option<GroupCommitCounts> {
        self.group.as_ref().map(|group| group.counts())
    }

    /// Refuses new calls and closes the idle sessions; a call in flight
    /// finishes, and its session is closed when it comes back.
    pub async fn close(&self) {
        self.pool.close().await;
    }

    fn check_ttl(&self, ttl_ms: i64) -> Result<(), InvalidInput> {
        check_ttl_within("lease ttl", ttl_ms, self.options.max_lease_ttl_ms)
    }

    fn check_claim_ttl(&self, ttl_ms: i64) -> Result<(), InvalidInput> {
        check_ttl_within("claim ttl", ttl_ms, self.options.max_claim_ttl_ms)
    }

    /// Sends one statement, retrying the whole transaction on 40001/40P01.
    /// `writes` says whether a broken connection leaves the outcome unknown
    /// (a write) or merely failed (a read).
    async fn invoke<'q, O>(
        &self,
        call: &'static str,
        writes: bool,
        build: impl Fn() -> QueryAs<'q, Postgres, O, PgArguments>,
    ) -> Result<O, LedgerError>
    where
        O: for<'r> FromRow<'r, PgRow> + Send + Unpin,
    {
        self.invoke_optional(call, writes, build)
            .await?
            .ok_or_else(|| LedgerError::Protocol {
                call,
                detail: "no row in the answer".to_owned(),
            })
    }

    /// [`Ledger::invoke`] for statements that may answer no row.
    async fn invoke_optional<'q, O>(
        &self,
        call: &'static str,
        writes: bool,
        build: impl Fn() -> QueryAs<'q, Postgres, O, PgArguments>,
    ) -> Result<Option<O>, LedgerError>
    where
        O: for<'r> FromRow<'r, PgRow> + Send + Unpin,
    {
        Ok(self
            .invoke_all(call, writes, build)
            .await?
            .into_iter()
            .next())
    }

    /// [`Ledger::invoke`] for statements that answer any number of rows.
    async fn invoke_all<'q, O>(
        &self,
        call: &'static str,
        writes: bool,
        build: impl Fn() -> QueryAs<'q, Postgres, O, PgArguments>,
    ) -> Result<Vec<O>, LedgerError>
    where
        O: for<'r> FromRow<'r, PgRow> + Send + Unpin,
    {
        let mut attempt = 1;
        loop {
            let mut conn = self
                .pool
                .checkout()
                .await
                .map_err(|source| LedgerError::Unavailable { call, source })?;
            let error = match build().fetch_all(conn.connection()).await {
                Ok(rows) => {
                    conn.finished();
                    return Ok(rows);
                }
                Err(error) => error,
            };
            match classify(&error) {
                ErrorClass::RetryTransaction(sqlstate) => {
                    if attempt >= self.options.retry_attempts {
                        return Err(LedgerError::RetryBudgetSpent {
                            call,
                            attempts: attempt,
                            sqlstate,
                        });
                    }
                    tracing::debug!(call, attempt, sqlstate, "transaction aborted; retrying");
                    conn.finished();
                    tokio::time::sleep(retry_backoff(attempt)).await;
                    attempt += 1;
                }
                ErrorClass::Refused => {
                    conn.finished();
                    return Err(LedgerError::Database {
                        call,
                        source: error,
                    });
                }
                ErrorClass::InFlight => {
                    // The session may be broken; never hand it out again
                    // (and the pool validates its idle siblings).
                    conn.broke();
                    // A read is sent again, on a session the pool has
                    // validated or opened since: a lone dead connection
                    // costs a reader nothing.
                    if !writes && attempt < self.options.retry_attempts {
                        tracing::debug!(call, attempt, %error, "session broke under a read; reading again");
                        attempt += 1;
                        continue;
                    }
                    return Err(if writes {
                        LedgerError::OutcomeUnknown {
                            call,
                            source: error,
                        }
                    } else {
                        LedgerError::Unavailable {
                            call,
                            source: error,
                        }
                    });
                }
                ErrorClass::Undecodable => {
                    // Rows may be left unread: do not reuse the session.
                    conn.discard();
                    return Err(LedgerError::Protocol {
                        call,
                        detail: error.to_string(),
                    });
                }
            }
        }
    }
}

/// A log filter directive that keeps the server's NOTICEs (sqlx logs them
/// at info: "relation … already exists, skipping" at every start) out of
/// the default log; they say nothing an operator acts on.
pub const SERVER_NOTICES_FILTER: &str = "sqlx::postgres::notice=warn";

/// Why `url` cannot be a ledger URL, if it cannot: it must be a
/// `postgres://` or `postgresql://` URL that the driver parses (what
/// [`Ledger::connect`] would refuse, said before anything is tried). The
/// answer never quotes the password.
pub fn url_problem(url: &str) -> Option<String> {
    let scheme = url.split_once("://").map(|(scheme, _)| scheme);
    match scheme {
        None => Some("is not a URL: expected postgres://USER@HOST:PORT/DATABASE".to_owned()),
        Some(scheme)
            if !(scheme.eq_ignore_ascii_case("postgres")
                || scheme.eq_ignore_ascii_case("postgresql")) =>
        {
            Some(format!(
                "is not a PostgreSQL URL: the scheme is {:?}, expected \"postgres\" or \"postgresql\"",
                scheme.chars().take(40).collect::<String>()
            ))
        }
        Some(_) => PgConnectOptions::from_str(url).err().map(|error| {
            // The driver's message may quote the URL: say only what kind.
            let detail = match error {
                sqlx::Error::Configuration(inner) => redacted_url(&inner.to_string()),
                other => redacted_url(&other.to_string()),
            };
            format!("does not parse as a PostgreSQL URL: {detail}")
        }),
    }
}

/// How long `migrate` and `create_database_if_missing` wait for a server
/// (`leasegate migrate`); `serve` and `stdio` wait their
/// `database_connect_timeout` instead.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A connect-phase driver error as a [`LedgerError`]: a [`ConnectError`]
/// when it is one of the kinds told apart, otherwise `Unavailable`.
fn connect_error(target: &str, source: sqlx::Error) -> LedgerError {
    match ConnectFailure::of(&source) {
        Some(failure) => LedgerError::Connect(ConnectError {
            failure,
            target: target.to_owned(),
            detail: match &source {
                sqlx::Error::Database(db) => db.message().to_owned(),
                sqlx::Error::PoolTimedOut => "timed out".to_owned(),
                other => other.to_string(),
            },
        }),
        None => LedgerError::Unavailable {
            call: "connect",
            source,
        },
    }
}

/// The wait that ran out is named: it is what the operator can change.
fn timed_out(target: &str, wait: Duration) -> LedgerError {
    LedgerError::Connect(ConnectError {
        failure: ConnectFailure::Unreachable,
        target: target.to_owned(),
        detail: format!("no answer within {wait:?}"),
    })
}

/// The URL of `connect` without its password.
fn target_of(connect: &PgConnectOptions) -> String {
    let user = connect.get_username();
    let database = connect.get_database().unwrap_or(user);
    match connect.get_socket() {
        Some(socket) => format!("postgres://{user}@/{database}?host={}", socket.display()),
        None => format!(
            "postgres://{user}@{}:{}/{database}",
            connect.get_host(),
            connect.get_port()
        ),
    }
}

/// One connection before the pool: the pool retries a refused connection
/// and a failing session setup until its acquire timeout and then reports
/// only "timed out", so the kinds of [`ConnectFailure`] are told apart
/// here. A ledger is there when its function record table, a protected
/// function and the application role exist (`leasegate migrate` makes all
/// three).
async fn preflight(connect: &PgConnectOptions, options: &LedgerOptions) -> Result<(), LedgerError> {
    use sqlx::Connection;
    let target = target_of(connect);
    let mut conn = tokio::time::timeout(
        options.connect_timeout,
        sqlx::PgConnection::connect_with(connect),
    )
    .await
    .map_err(|_| timed_out(&target, options.connect_timeout))?
    .map_err(|source| connect_error(&target, source))?;
    let checked: Result<(bool, bool, bool, bool, String), sqlx::Error> = sqlx::query_as(
        "SELECT to_regclass('ledger_functions') IS NOT NULL, \
                EXISTS (SELECT 1 FROM pg_proc WHERE proname = 'run_create' \
                        AND pronamespace = (SELECT oid FROM pg_namespace WHERE nspname = current_schema())), \
                $1::text IS NULL OR EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1), \
                CASE WHEN $1::text IS NULL \
                       OR NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1) THEN true \
                     ELSE pg_has_role($1, 'MEMBER') END, \
                session_user::text",
    )
    .bind(options.session_role.as_deref())
    .fetch_one(&mut conn)
    .await;
    let _ = conn.close().await;
    let (tables, functions, role, member, login) =
        checked.map_err(|source| LedgerError::Database {
            call: "connect (schema check)",
            source,
        })?;
    if !member && let Some(role) = &options.session_role {
        return Err(LedgerError::Connect(ConnectError {
            failure: ConnectFailure::RoleNotGranted,
            target,
            detail: format!(
                "the login role {login:?} is not a member of {role:?}, so its sessions cannot \
                 SET ROLE {role}; grant it (`GRANT {role} TO \"{login}\"`, as the schema owner) \
                 or use a login that is a member"
            ),
        }));
    }
    let missing = [
        (!tables).then_some("the ledger tables"),
        (!functions).then_some("the ledger functions"),
        (!role).then_some("the application role"),
    ];
    let missing: Vec<&str> = missing.into_iter().flatten().collect();
    if missing.is_empty() {
        return Ok(());
    }
    Err(LedgerError::Connect(ConnectError {
        failure: ConnectFailure::SchemaMissing,
        target,
        detail: format!("missing {}", missing.join(", ")),
    }))
}

/// 5 ms, 10 ms, 20 ms, ... capped at 200 ms, with jitter so that two
/// deadlock victims do not collide again in lockstep.
fn retry_backoff(attempt: u32) -> Duration {
    let base = 5u64 << attempt.min(6).saturating_sub(1);
    let jitter = u64::from(uuid::Uuid::new_v4().as_bytes()[0]) % (base / 2 + 1);
    Duration::from_millis((base + jitter).min(200))
}

fn check_ttl_within(what: &'static str, ttl_ms: i64, ceiling_ms: i64) -> Result<(), InvalidInput> {
    if ttl_ms <= 0 {
        return Err(InvalidInput::TtlNotPositive { what, ttl_ms });
    }
    if ttl_ms > ceiling_ms {
        return Err(InvalidInput::TtlAboveCeiling {
            what,
            ttl_ms,
            ceiling_ms,
        });
    }
    Ok(())
}

/// Free text (not an identifier): 1 to `max` characters of anything.
fn check_length(field: &'static str, value: &str, max: usize) -> Result<(), InvalidInput> {
    let len = value.chars().count();
    if len == 0 || len > max {
        return Err(InvalidInput::TextLength { field, len, max });
    }
    Ok(())
}

/// An owner, tenant, task id or actor: 1 to `max` visible ASCII characters
/// (`ids::check_identifier`), checked before anything is sent.
fn check_text(field: &'static str, value: &str, max: usize) -> Result<(), InvalidInput> {
    crate::ids::check_identifier(field, value, max).map_err(InvalidInput::from)
}
