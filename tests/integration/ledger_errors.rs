//! Bad input gets a clear error and writes nothing; database faults are
//! classified by what the caller may conclude (seed section 7 error table).

use crate::common;

use std::process::Stdio;

use common::{TestDb, applied, within};
use leasegate::ledger::{
    AcquireOutcome, Applied, Delivery, Fenced, InitialLease, InvalidInput, LeaseClaim, LedgerError,
    LedgerOptions, Rejection, RunId,
};
use serde_json::{Value, json};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

fn invalid(result: Result<impl std::fmt::Debug, LedgerError>) -> InvalidInput {
    match result {
        Err(LedgerError::InvalidInput(invalid)) => invalid,
        other => panic!("expected invalid input, got {other:?}"),
    }
}

/// Starts saving `checkpoint` under `claim` at `revision` in the
/// background, for a test that acts on the save's connection meanwhile.
fn spawn_save(
    db: &TestDb,
    claim: &LeaseClaim,
    revision: i64,
    checkpoint: Value,
) -> tokio::task::JoinHandle<Result<Fenced<Applied>, LedgerError>> {
    let ledger = db.ledger.clone();
    let claim = claim.clone();
    tokio::spawn(async move { ledger.checkpoint_save(&claim, revision, &checkpoint).await })
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn invalid_ttls_are_refused_before_anything_is_written(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let options = LedgerOptions {
        max_lease_ttl_ms: 60_000,
        ..LedgerOptions::default()
    };
    let db = TestDb::with_options(pool, connect, options).await;
    let (claim, _) = db.running_run("worker", 30_000).await;
    let before = (
        db.run_row(claim.run_id).await,
        db.event_count(claim.run_id).await,
    );

    let cases = [
        (0, "lease ttl must be > 0 ms, got 0 ms"),
        (-5, "lease ttl must be > 0 ms, got -5 ms"),
        (
            60_001,
            "lease ttl 60001 ms is above the ceiling of 60000 ms",
        ),
    ];
    for (ttl_ms, message) in cases {
        let error = invalid(db.ledger.lease_acquire(claim.run_id, "other", ttl_ms).await);
        assert_eq!(error.to_string(), message);
        assert_eq!(error.code(), "invalid_ttl");
        let error = invalid(db.ledger.lease_renew(&claim, ttl_ms).await);
        assert_eq!(error.to_string(), message);
        let create = db
            .ledger
            .run_create(
                RunId::generate(),
                "acme",
                "fresh",
                Some(InitialLease { owner: "w", ttl_ms }),
            )
            .await;
        assert!(
            matches!(&create, Err(e) if e.delivery() == Delivery::NotSent),
            "{create:?}"
        );
    }
    assert_eq!(
        (
            db.run_row(claim.run_id).await,
            db.event_count(claim.run_id).await
        ),
        before
    );
    let tasks = db.row_count("agent_tasks").await;
    assert_eq!(tasks, 1, "the refused create wrote no task");

    // The database refuses a non-positive TTL on its own as well.
    let mut tx = db.admin.begin().await.unwrap();
    sqlx::query("SET LOCAL ROLE leasegate_app")
        .execute(&mut *tx)
        .await
        .unwrap();
    let error = sqlx::query("SELECT * FROM lease_renew($1, 'worker', 1, NULL, 0)")
        .bind(claim.run_id.as_uuid())
        .execute(&mut *tx)
        .await
        .unwrap_err();
    assert_eq!(
        error.as_database_error().unwrap().code().as_deref(),
        Some("22023")
    );
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn unknown_runs_and_malformed_ids_are_named_and_write_nothing(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let missing = RunId::generate();
    let claim = leasegate::ledger::LeaseClaim {
        run_id: missing,
        owner: "w".into(),
        epoch: 1,
        token: None,
    };
    assert_eq!(
        db.ledger.lease_acquire(missing, "w", 1_000).await.unwrap(),
        AcquireOutcome::NotFound
    );
    let not_found = Fenced::Rejected(Rejection::NotFound);
    assert_eq!(
        db.ledger.lease_renew(&claim, 1_000).await.unwrap(),
        not_found
    );
    assert_eq!(db.ledger.lease_release(&claim).await.unwrap(), not_found);
    assert_eq!(
        db.ledger
            .checkpoint_save(&claim, 0, &json!({}))
            .await
            .unwrap(),
        not_found
    );
    assert_eq!(db.ledger.run_start(&claim, 0).await.unwrap(), not_found);
    assert_eq!(
        db.operator.run_cancel(missing, "ops", None).await.unwrap(),
        not_found
    );
    assert!(db.ledger.run_get(missing).await.unwrap().is_none());

    let error = "42".parse::<RunId>().unwrap_err();
    assert_eq!(error.code(), "invalid_run_id");
    let error = invalid(db.ledger.lease_acquire(RunId::generate(), "", 1_000).await);
    assert_eq!(
        error.to_string(),
        "owner must be 1 to 200 characters, got 0"
    );
    let long_owner = "o".repeat(201);
    invalid(
        db.ledger
            .lease_acquire(RunId::generate(), &long_owner, 1_000)
            .await,
    );
    invalid(
        db.ledger
            .run_create(RunId::generate(), "", "task", None)
            .await,
    );

    // The example worker refuses a malformed run id with exit code 2.
    let output = within(
        "the worker to refuse its arguments",
        tokio::process::Command::new(env!("CARGO_BIN_EXE_leasegate-example-worker"))
            .args(["--database-url", &db.url, "--run-id", "not-a-uuid"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .output(),
    )
    .await
    .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("invalid run id \"not-a-uuid\""));

    let counts: (i64, i64, i64) = db
        .query_row(
            "SELECT (SELECT count(*) FROM agent_tasks), (SELECT count(*) FROM agent_runs), (SELECT count(*) FROM ledger_events)",
        )
        .await;
    assert_eq!(counts, (0, 0, 0), "nothing written");
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn connection_lost_with_a_write_in_flight_is_outcome_unknown_and_read_back_decides(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let (claim, revision) = db.running_run("worker", 30_000).await;

    // Keep the save in flight (blocked on the lease row), then cut its connection.
    let gate = db.hold_lease_row(claim.run_id).await;
    let save = spawn_save(&db, &claim, revision, json!({"cut": true}));
    let pids = db.wait_lock_waiters("checkpoint_save", 1).await;
    let terminated: bool = db.scalar("SELECT pg_terminate_backend($1)", pids[0]).await;
    assert!(terminated);
    let error = within("the cut save", save).await.unwrap().unwrap_err();
    assert!(
        matches!(
            error,
            LedgerError::OutcomeUnknown {
                call: "checkpoint_save",
                ..
            }
        ),
        "{error:?}"
    );
    assert_eq!(error.delivery(), Delivery::Unknown);
    assert!(
        error.to_string().starts_with("outcome unknown: read back"),
        "{error}"
    );
    gate.rollback().await.unwrap();

    // Reading back from the primary tells what happened: not applied.
    let view = db.ledger.run_get(claim.run_id).await.unwrap().unwrap();
    assert_eq!(view.revision, revision);
    // The ledger keeps working on fresh connections.
    db.save_checkpoint(&claim, revision, &json!({"after": true}))
        .await;
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn deadlock_victim_is_retried_as_a_whole_transaction(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let (claim, revision) = db.running_run("worker", 30_000).await;
    let run = claim.run_id.as_uuid();

    // The test's transaction takes the run row first, the save takes the
    // lease row and then waits for the run row; the test then asks for the
    // lease row: a deadlock. The save's backend detects it and is aborted
    // with 40P01; the ledger sends the whole call again.
    let mut other = db.admin.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM agent_runs WHERE run_id = $1 FOR UPDATE")
        .bind(run)
        .execute(&mut *other)
        .await
        .unwrap();
    let save = spawn_save(&db, &claim, revision, json!({"retried": true}));
    db.wait_lock_waiters("checkpoint_save", 1).await;
    sqlx::query("SELECT 1 FROM worker_leases WHERE run_id = $1 FOR UPDATE")
        .bind(run)
        .execute(&mut *other)
        .await
        .expect("the save is the deadlock victim, so this lock is granted");
    // The retried save now waits on the lease row this transaction holds.
    db.wait_lock_waiters("checkpoint_save", 1).await;
    other.commit().await.unwrap();

    let outcome = within("the retried save", save)
        .await
        .unwrap()
        .expect("retried, not failed");
    assert_eq!(applied(outcome).revision, revision + 1);
    let (_, stored, checkpoint, _, _) = db.run_row(claim.run_id).await;
    assert_eq!(
        (stored, checkpoint),
        (revision + 1, json!({"retried": true}))
    );
}
