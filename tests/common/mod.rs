//! Shared test harness: a fresh database per test (from `#[sqlx::test]`),
//! a superuser pool for arranging and inspecting, a `Ledger` running as the
//! application role, and condition waits with deadlines.
#![allow(dead_code)]

use std::future::Future;
use std::time::Duration;

use leasegate::ledger::{
    AcquireOutcome, Fenced, LeaseClaim, LeaseGrant, Ledger, LedgerOptions, RunCreateOutcome, RunId,
};
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

pub mod files;
pub mod http;
pub mod intents;
pub mod operator;
pub mod peers;
pub mod prometheus;
pub mod proxy;
pub mod router;
mod rows;
pub mod tokens;
pub mod webdriver;

/// Every wait in a test ends by this deadline, or the test fails.
pub const DEADLINE: Duration = Duration::from_secs(30);

pub struct TestDb {
    /// Superuser pool: arranges states and inspects rows, bypassing fencing.
    pub admin: PgPool,
    /// The ledger as the application uses it (SET ROLE leasegate_app).
    pub ledger: Ledger,
    /// The ledger as an operator uses it (SET ROLE leasegate_operator):
    /// resolve, retry, cancel, failover resolve (migrations/0007).
    pub operator: Ledger,
    /// URL of this test's database, for child processes.
    pub url: String,
}

impl TestDb {
    pub async fn new(pool: PgPoolOptions, connect: PgConnectOptions) -> Self {
        Self::with_options(pool, connect, LedgerOptions::default()).await
    }

    /// The one-at-a-time lock ([`exclusive`]) first, then the test's
    /// database: for the suites that must not contend for the cores.
    pub async fn new_exclusive(
        pool: PgPoolOptions,
        connect: PgConnectOptions,
    ) -> (tokio::sync::MutexGuard<'static, ()>, Self) {
        let exclusive = exclusive().await;
        (exclusive, Self::new(pool, connect).await)
    }

    pub async fn with_options(
        pool: PgPoolOptions,
        connect: PgConnectOptions,
        options: LedgerOptions,
    ) -> Self {
        let url = database_url(&connect);
        let admin = pool
            .max_connections(8)
            .connect_with(connect.clone())
            .await
            .expect("connect the admin pool (is PostgreSQL up at DATABASE_URL?)");
        let operator_options = LedgerOptions {
            session_role: Some(leasegate::ledger::OPERATOR_ROLE.to_owned()),
            max_connections: 2,
            ..options.clone()
        };
        let ledger = Ledger::connect_with(connect.clone(), options)
            .await
            .expect("connect the ledger as the application role");
        let operator = Ledger::connect_with(connect, operator_options)
            .await
            .expect("connect the ledger as the operator role");
        Self {
            admin,
            ledger,
            operator,
            url,
        }
    }

    /// A fresh task with one pending run and a free lease.
    pub async fn pending_run(&self) -> RunId {
        self.pending_run_in("tenant-a").await
    }

    /// A fresh task of `tenant` with one pending run and a free lease.
    pub async fn pending_run_in(&self, tenant: &str) -> RunId {
        let run_id = RunId::generate();
        let task = format!("task-{run_id}");
        match self
            .ledger
            .run_create(run_id, tenant, &task, None)
            .await
            .expect("run_create")
        {
            RunCreateOutcome::Created(summary) => summary.run_id,
            other => panic!("expected a created run, got {other:?}"),
        }
    }

    pub async fn acquire(&self, run_id: RunId, owner: &str, ttl_ms: i64) -> LeaseGrant {
        match self
            .ledger
            .lease_acquire(run_id, owner, ttl_ms)
            .await
            .expect("lease_acquire")
        {
            AcquireOutcome::Acquired(grant) => grant,
            other => panic!("expected to acquire, got {other:?}"),
        }
    }

    /// A running run held by `owner`; returns the claim and the revision.
    pub async fn running_run(&self, owner: &str, ttl_ms: i64) -> (LeaseClaim, i64) {
        let run_id = self.pending_run().await;
        let grant = self.acquire(run_id, owner, ttl_ms).await;
        let applied = match self
            .ledger
            .run_start(&grant.claim, grant.revision)
            .await
            .expect("run_start")
        {
            Fenced::Applied(applied) => applied,
            Fenced::Rejected(rejection) => panic!("start rejected: {rejection}"),
        };
        (grant.claim, applied.revision)
    }

    /// Registers and claims `intent` inline under `lease` as `dispatch_owner`.
    pub async fn claim(
        &self,
        lease: &LeaseClaim,
        intent: &leasegate::intent::Intent,
        dispatch_owner: &str,
        ttl_ms: i64,
    ) -> leasegate::ledger::DispatchClaim {
        let outcome = self
            .ledger
            .operation_register_claim(lease, intent, None, dispatch_owner, ttl_ms)
            .await
            .expect("operation_register_claim");
        match applied(outcome) {
            leasegate::ledger::InlineClaim::Claimed { claim, .. } => claim,
            leasegate::ledger::InlineClaim::Existing(found) => {
                panic!("expected a fresh claim, found {found:?}")
            }
        }
    }

    /// (status, revision, checkpoint, lease owner, lease epoch) as committed.
    pub async fn run_row(
        &self,
        run_id: RunId,
    ) -> (String, i64, serde_json::Value, Option<String>, i64) {
        sqlx::query_as::<
            _,
            (
                String,
                i64,
                sqlx::types::Json<serde_json::Value>,
                Option<String>,
                i64,
            ),
        >(
            "SELECT r.status, r.revision, r.checkpoint, l.owner, l.epoch
               FROM agent_runs r JOIN worker_leases l USING (run_id) WHERE run_id = $1",
        )
        .bind(run_id.as_uuid())
        .fetch_one(&self.admin)
        .await
        .map(|(s, r, c, o, e)| (s, r, c.0, o, e))
        .expect("read the run row")
    }

    /// Marks `claim`'s operation unknown as its holder does when a send
    /// fails or times out (`cause`, with `evidence`); returns the outcome.
    pub async fn holder_marks_unknown(
        &self,
        claim: &leasegate::ledger::DispatchClaim,
        cause: leasegate::ledger::UnknownCause,
        evidence: &serde_json::Value,
    ) -> leasegate::ledger::MarkUnknownOutcome {
        self.ledger
            .operation_mark_unknown(leasegate::ledger::MarkUnknown {
                claim,
                by: leasegate::ledger::UnknownBy::ClaimHolder,
                actor: &claim.dispatch_owner,
                cause,
                evidence,
            })
            .await
            .expect("operation_mark_unknown")
    }

    /// Saves `checkpoint` under `claim` at `revision`; the save must apply.
    pub async fn save_checkpoint(
        &self,
        claim: &LeaseClaim,
        revision: i64,
        checkpoint: &serde_json::Value,
    ) -> leasegate::ledger::Applied {
        applied(
            self.ledger
                .checkpoint_save(claim, revision, checkpoint)
                .await
                .expect("checkpoint_save"),
        )
    }

    /// Completes the run `claim` holds at `revision` (with `result`); the
    /// completion must apply.
    pub async fn complete_run(
        &self,
        claim: &LeaseClaim,
        revision: i64,
        result: Option<&serde_json::Value>,
    ) -> leasegate::ledger::Applied {
        applied(
            self.ledger
                .run_complete(claim, revision, result)
                .await
                .expect("run_complete"),
        )
    }

    /// The operation `operation_id` and its events, as the ledger reports
    /// them; the operation must exist.
    pub async fn operation_view(
        &self,
        operation_id: &leasegate::intent::OperationId,
    ) -> leasegate::ledger::OperationView {
        self.ledger
            .operation_get(operation_id)
            .await
            .expect("operation_get")
            .unwrap_or_else(|| panic!("no operation {}", operation_id.as_str()))
    }

    /// Settles `claim`'s operation as succeeded, with `remote_id` and
    /// `result`, as its holder does when the tool answers.
    pub async fn settle_succeeded(
        &self,
        claim: &leasegate::ledger::DispatchClaim,
        remote_id: Option<&str>,
        result: &serde_json::Value,
    ) -> leasegate::ledger::SettleOutcome {
        self.ledger
            .operation_settle(
                claim,
                leasegate::ledger::Settlement::Succeeded,
                remote_id,
                result,
            )
            .await
            .expect("operation_settle")
    }

    /// Cancels the run as operator `actor` (with `reason`); the cancel must
    /// apply.
    pub async fn operator_cancels(&self, run_id: RunId, actor: &str, reason: Option<&str>) {
        applied(
            self.operator
                .run_cancel(run_id, actor, reason)
                .await
                .expect("run_cancel"),
        );
    }

    /// Opens a superuser transaction holding the run's lease row `FOR
    /// UPDATE`: every fenced write of the run waits until it ends.
    pub async fn hold_lease_row(
        &self,
        run_id: RunId,
    ) -> sqlx::Transaction<'static, sqlx::Postgres> {
        let mut gate = self.admin.begin().await.unwrap();
        sqlx::query("SELECT 1 FROM worker_leases WHERE run_id = $1 FOR UPDATE")
            .bind(run_id.as_uuid())
            .execute(&mut *gate)
            .await
            .unwrap();
        gate
    }

    /// `tables`' contents as one digest, a table at a time: equal before
    /// and after means nothing in them was written.
    pub async fn tables_digest(&self, tables: &[&str]) -> String {
        let mut parts = Vec::new();
        for table in tables {
            let digest: Option<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                "SELECT md5(string_agg(t::text, '|' ORDER BY t::text)) FROM {table} t"
            )))
            .fetch_one(&self.admin)
            .await
            .unwrap();
            parts.push(format!("{table}={}", digest.unwrap_or_default()));
        }
        parts.join(" ")
    }

    /// The `status` CHECK constraint of `table`: its definition, and the
    /// values it allows (the quoted literals in it), sorted.
    pub async fn status_constraint(&self, table: &str) -> (String, Vec<String>) {
        let definition: String = sqlx::query_scalar(
            "SELECT pg_get_constraintdef(c.oid) FROM pg_constraint c
              WHERE c.conrelid = $1::regclass AND c.contype = 'c'
                AND pg_get_constraintdef(c.oid) LIKE '%status%'",
        )
        .bind(table)
        .fetch_one(&self.admin)
        .await
        .unwrap();
        let mut values: Vec<String> = definition
            .split('\'')
            .skip(1)
            .step_by(2)
            .map(str::to_owned)
            .collect();
        values.sort();
        (definition, values)
    }

    pub async fn event_count(&self, run_id: RunId) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM ledger_events WHERE run_id = $1")
            .bind(run_id.as_uuid())
            .fetch_one(&self.admin)
            .await
            .expect("count events")
    }

    /// Every event names a run the ledger holds and, if it names an
    /// operation, a live operation of that run (the archive moves an
    /// operation's events with it): the invariant `ledger_events` keeps
    /// without foreign keys since migrations/0011. Returns how many events
    /// were checked; callers assert they checked some.
    pub async fn assert_events_name_ledger_rows(&self) -> i64 {
        let (checked, orphans): (i64, Vec<String>) = sqlx::query_as(
            "SELECT (SELECT count(*) FROM ledger_events),
                    COALESCE(array_agg(format('event %s: run %s, operation %s', e.event_id, e.run_id,
                                              e.operation_id)), '{}')
               FROM ledger_events e
              WHERE NOT EXISTS (SELECT 1 FROM agent_runs r WHERE r.run_id = e.run_id)
                 OR (e.operation_id IS NOT NULL
                     AND NOT EXISTS (SELECT 1 FROM tool_operations o
                                      WHERE o.operation_id = e.operation_id AND o.run_id = e.run_id))",
        )
        .fetch_one(&self.admin)
        .await
        .expect("look for events that name no ledger row");
        assert!(
            orphans.is_empty(),
            "events naming no ledger row: {orphans:?}"
        );
        checked
    }

    /// Waits until the run's lease has expired on the database clock.
    pub async fn wait_lease_expired(&self, run_id: RunId) {
        wait_until("the lease to expire on the database clock", || async {
            let expired: bool = sqlx::query_scalar(
                "SELECT expires_at <= clock_timestamp() FROM worker_leases WHERE run_id = $1",
            )
            .bind(run_id.as_uuid())
            .fetch_one(&self.admin)
            .await
            .expect("read lease");
            expired.then_some(())
        })
        .await
    }

    /// Waits until `count` backends of this database wait on a row lock while
    /// running a statement that contains `statement`; returns their pids.
    pub async fn wait_lock_waiters(&self, statement: &str, count: usize) -> Vec<i32> {
        let pattern = format!("%{statement}%");
        wait_until(
            &format!("{count} backend(s) blocked in {statement}"),
            || async {
                let pids: Vec<i32> = sqlx::query_scalar(
                    "SELECT pid FROM pg_stat_activity
                  WHERE datname = current_database() AND wait_event_type = 'Lock'
                    AND query LIKE $1 AND pid <> pg_backend_pid()",
                )
                .bind(&pattern)
                .fetch_all(&self.admin)
                .await
                .expect("read pg_stat_activity");
                (pids.len() >= count).then_some(pids)
            },
        )
        .await
    }
}

/// The URL of the database `connect` names, for child processes and
/// configs.
pub fn database_url(connect: &PgConnectOptions) -> String {
    format!(
        "postgres://{}@{}:{}/{}",
        connect.get_username(),
        connect.get_host(),
        connect.get_port(),
        connect
            .get_database()
            .expect("sqlx::test names the database"),
    )
}

/// A TCP listener on 127.0.0.1 that accepts connections and never says a
/// word (a wrong port, a stuck proxy): its URL, with a password.
pub fn silent_server_url() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        // Held open, never answered, until the test process ends.
        let mut held = Vec::new();
        for stream in listener.incoming().flatten() {
            held.push(stream);
        }
    });
    format!("postgres://postgres:sekret@127.0.0.1:{port}/leasegate")
}

/// Whether process `pid` has exited (a zombie not reaped yet counts).
pub fn process_exited(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        // "pid (comm) S …": the state follows the last ')'.
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])),
    }
}

/// Polls `probe` until it yields `Some`, failing the test after [`DEADLINE`].
pub async fn wait_until<T, F, Fut>(what: &str, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        if let Some(value) = probe().await {
            return value;
        }
        if tokio::time::Instant::now() >= deadline {
            panic!("timed out after {DEADLINE:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Awaits `future`, failing the test after [`DEADLINE`].
pub async fn within<T>(what: &str, future: impl Future<Output = T>) -> T {
    tokio::time::timeout(DEADLINE, future)
        .await
        .unwrap_or_else(|_| panic!("timed out after {DEADLINE:?} waiting for {what}"))
}

pub fn applied<T: std::fmt::Debug>(outcome: Fenced<T>) -> T {
    match outcome {
        Fenced::Applied(value) => value,
        Fenced::Rejected(rejection) => panic!("expected the write to apply, got: {rejection}"),
    }
}

/// `text` with every `from` replaced by `to`, failing the test when `from`
/// does not occur: a fixture edit must not silently do nothing.
#[track_caller]
pub fn replace_exactly(text: &str, from: &str, to: &str) -> String {
    assert!(
        text.contains(from),
        "the fixture no longer contains {from:?}:\n{text}"
    );
    text.replace(from, to)
}

/// One at a time: the suites that start clusters, browsers, SDK clients or
/// many processes time out when they contend for the cores, and they share
/// one test binary. Hold the guard for the whole test.
pub async fn exclusive() -> tokio::sync::MutexGuard<'static, ()> {
    static LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    LOCK.lock().await
}
