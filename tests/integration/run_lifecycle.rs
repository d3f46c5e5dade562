//! Creating runs: task + run + lease in one transaction, retries as new runs,
//! idempotent replay of a create, tenant isolation.

use crate::common;

use common::{TestDb, applied};
use leasegate::ledger::{InitialLease, RunCreateOutcome, RunId, RunStatus};
use serde_json::json;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

async fn created(outcome: RunCreateOutcome) -> leasegate::ledger::RunSummary {
    match outcome {
        RunCreateOutcome::Created(summary) => summary,
        other => panic!("expected a new run, got {other:?}"),
    }
}

async fn active_run(db: &TestDb, tenant: &str, task: &str) -> Option<uuid::Uuid> {
    db.scalar_with(
        "SELECT active_run_id FROM agent_tasks WHERE tenant_id = $1 AND task_id = $2",
        (tenant, task),
    )
    .await
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn retry_of_a_task_is_a_new_run_and_becomes_the_active_run(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let first = created(
        db.ledger
            .run_create(RunId::generate(), "acme", "invoice-42", None)
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(
        (first.attempt, first.status, first.lease_epoch),
        (1, RunStatus::Pending, 0)
    );
    let grant = db.acquire(first.run_id, "w1", 30_000).await;
    let revision = applied(
        db.ledger
            .run_start(&grant.claim, grant.revision)
            .await
            .unwrap(),
    )
    .revision;
    let revision = db
        .save_checkpoint(&grant.claim, revision, &json!({"step": 3}))
        .await
        .revision;
    applied(
        db.ledger
            .run_fail(&grant.claim, revision, &json!({"error": "card declined"}))
            .await
            .unwrap(),
    );

    let second = created(
        db.ledger
            .run_create(RunId::generate(), "acme", "invoice-42", None)
            .await
            .unwrap(),
    )
    .await;
    assert_ne!(second.run_id, first.run_id);
    assert_eq!((second.attempt, second.status), (2, RunStatus::Pending));
    assert_eq!(
        active_run(&db, "acme", "invoice-42").await,
        Some(second.run_id.as_uuid())
    );

    // The old run is untouched and no longer active; its worker cannot reach the new run.
    let old = db.ledger.run_get(first.run_id).await.unwrap().unwrap();
    assert_eq!(
        (old.status, old.checkpoint.clone(), old.active),
        (RunStatus::Failed, json!({"step": 3}), false)
    );
    let new = db.ledger.run_get(second.run_id).await.unwrap().unwrap();
    assert_eq!(
        (new.status, new.revision, new.active),
        (RunStatus::Pending, 0, true)
    );
    let events = db.ledger.run_events(second.run_id).await.unwrap();
    assert_eq!(
        events[0].detail["previous_run_id"],
        json!(first.run_id.to_string())
    );
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn a_task_with_a_live_run_gets_no_second_run(pool: PgPoolOptions, connect: PgConnectOptions) {
    let db = TestDb::new(pool, connect).await;
    let first = created(
        db.ledger
            .run_create(RunId::generate(), "acme", "t", None)
            .await
            .unwrap(),
    )
    .await;
    let refused_id = RunId::generate();
    match db
        .ledger
        .run_create(refused_id, "acme", "t", None)
        .await
        .unwrap()
    {
        RunCreateOutcome::ActiveRunLive(live) => {
            assert_eq!(
                (live.run_id, live.status),
                (first.run_id, RunStatus::Pending)
            )
        }
        other => panic!("expected the live run to be named, got {other:?}"),
    }
    assert!(
        db.ledger.run_get(refused_id).await.unwrap().is_none(),
        "nothing written"
    );
    // Once cancelled, a retry is allowed.
    db.operator_cancels(first.run_id, "ops", None).await;
    let retry = created(
        db.ledger
            .run_create(refused_id, "acme", "t", None)
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(retry.attempt, 2);
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn replaying_a_create_with_the_same_run_id_changes_nothing(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let run_id = RunId::generate();
    let lease = InitialLease {
        owner: "w1",
        ttl_ms: 30_000,
    };
    let first = created(
        db.ledger
            .run_create(run_id, "acme", "t", Some(lease))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(
        (first.lease_owner.as_deref(), first.lease_epoch),
        (Some("w1"), 1)
    );
    let events = db.event_count(run_id).await;

    match db
        .ledger
        .run_create(run_id, "acme", "t", Some(lease))
        .await
        .unwrap()
    {
        // The same run, without the lease token: it is shown once, by the
        // create that took the lease.
        RunCreateOutcome::Exists(summary) => {
            assert!(first.lease_token.is_some());
            assert_eq!(
                summary,
                leasegate::ledger::RunSummary {
                    lease_token: None,
                    ..first.clone()
                }
            )
        }
        other => panic!("expected a replay, got {other:?}"),
    }
    assert_eq!(db.event_count(run_id).await, events);
    assert_eq!(
        db.ledger
            .run_create(run_id, "acme", "another-task", None)
            .await
            .unwrap(),
        RunCreateOutcome::RunIdTaken
    );
    assert_eq!(
        db.ledger
            .run_create(run_id, "other-tenant", "t", None)
            .await
            .unwrap(),
        RunCreateOutcome::RunIdTaken
    );
    let runs = db.row_count("agent_runs").await;
    assert_eq!(runs, 1);
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn tenants_with_the_same_task_name_do_not_share_runs(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let a = created(
        db.ledger
            .run_create(RunId::generate(), "tenant-a", "nightly", None)
            .await
            .unwrap(),
    )
    .await;
    let b = created(
        db.ledger
            .run_create(RunId::generate(), "tenant-b", "nightly", None)
            .await
            .unwrap(),
    )
    .await;
    assert_eq!((a.attempt, b.attempt), (1, 1));
    assert_eq!(
        db.ledger
            .run_get(a.run_id)
            .await
            .unwrap()
            .unwrap()
            .tenant_id,
        "tenant-a"
    );
    assert_eq!(
        db.ledger
            .run_get(b.run_id)
            .await
            .unwrap()
            .unwrap()
            .tenant_id,
        "tenant-b"
    );
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn concurrent_creates_for_one_task_yield_one_live_run(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let creates: Vec<_> = (0..4)
        .map(|_| {
            let ledger = db.ledger.clone();
            tokio::spawn(async move {
                ledger
                    .run_create(RunId::generate(), "acme", "race", None)
                    .await
            })
        })
        .collect();
    let mut created_runs = 0;
    let mut refused = 0;
    for create in creates {
        match common::within("a concurrent create", create)
            .await
            .unwrap()
            .unwrap()
        {
            RunCreateOutcome::Created(_) => created_runs += 1,
            RunCreateOutcome::ActiveRunLive(_) => refused += 1,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!((created_runs, refused), (1, 3));
}
