//! Seed experiments A, C and D (section 11) against a real PostgreSQL.
//! Experiment B, which needs a frozen process, is in `acceptance_b_process.rs`.

use crate::common;

use std::sync::{Arc, Mutex};

use common::{TestDb, within};
use leasegate::ledger::{AcquireOutcome, Fenced, Rejection};
use serde_json::json;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn acceptance_a_two_sequential_saves_in_one_epoch_both_apply(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let (claim, start_revision) = db.running_run("worker-a", 30_000).await;

    let first = db
        .save_checkpoint(&claim, start_revision, &json!({"step": 1}))
        .await;
    let second = db
        .save_checkpoint(&claim, first.revision, &json!({"step": 2}))
        .await;

    assert_eq!(first.revision, start_revision + 1);
    assert_eq!(second.revision, start_revision + 2);
    let (status, revision, checkpoint, owner, epoch) = db.run_row(claim.run_id).await;
    assert_eq!(status, "running");
    assert_eq!(revision, start_revision + 2);
    assert_eq!(checkpoint, json!({"step": 2}));
    assert_eq!((owner.as_deref(), epoch), (Some("worker-a"), claim.epoch));
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn acceptance_c_concurrent_saves_with_the_same_expected_revision_apply_exactly_once(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let (claim, revision) = db.running_run("worker-c", 30_000).await;
    const WRITERS: usize = 4;

    // Hold the lease row so that every save is in flight at the same time,
    // then let them race for it.
    let gate = db.hold_lease_row(claim.run_id).await;
    let saves: Vec<_> = (0..WRITERS)
        .map(|writer| {
            let ledger = db.ledger.clone();
            let claim = claim.clone();
            tokio::spawn(async move {
                let checkpoint = json!({ "writer": writer });
                let outcome = ledger.checkpoint_save(&claim, revision, &checkpoint).await;
                (checkpoint, outcome)
            })
        })
        .collect();
    db.wait_lock_waiters("checkpoint_save", WRITERS).await;
    gate.commit().await.unwrap();

    let mut winners = Vec::new();
    let mut losers = Vec::new();
    for save in saves {
        let (checkpoint, outcome) = within("a concurrent save", save).await.unwrap();
        match outcome.unwrap() {
            Fenced::Applied(applied) => winners.push((checkpoint, applied.revision)),
            Fenced::Rejected(rejection) => losers.push(rejection),
        }
    }
    assert_eq!(winners.len(), 1, "exactly one save applies: {winners:?}");
    let (winning_checkpoint, winning_revision) = winners.pop().unwrap();
    assert_eq!(winning_revision, revision + 1);
    for loser in &losers {
        assert_eq!(
            loser,
            &Rejection::Conflict {
                expected_revision: revision,
                found: revision + 1
            }
        );
    }
    let (_, stored_revision, stored_checkpoint, _, _) = db.run_row(claim.run_id).await;
    assert_eq!(stored_revision, revision + 1, "revision moved by one only");
    assert_eq!(stored_checkpoint, winning_checkpoint);
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn acceptance_d_takeover_waits_for_the_transaction_that_locked_the_lease_row(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    // A short TTL so that A's lease expires while A's transaction is held.
    let (claim_a, revision) = db.running_run("worker-a", 1_000).await;
    let order = Arc::new(Mutex::new(Vec::<&'static str>::new()));

    // Worker A's protected transaction, held open at a barrier after the
    // save function locked the lease row and validated A's lease.
    let mut tx_a = db.admin.begin().await.unwrap();
    sqlx::query("SET LOCAL ROLE leasegate_app")
        .execute(&mut *tx_a)
        .await
        .unwrap();
    let (outcome, saved_revision): (String, i64) =
        sqlx::query_as("SELECT outcome, revision FROM checkpoint_save($1, $2, $3, $4, $5, $6)")
            .bind(claim_a.run_id.as_uuid())
            .bind(&claim_a.owner)
            .bind(claim_a.epoch)
            .bind(claim_a.token.as_ref().map(|t| t.sha256()))
            .bind(revision)
            .bind(sqlx::types::Json(json!({"writer": "a"})))
            .fetch_one(&mut *tx_a)
            .await
            .unwrap();
    assert_eq!(
        (outcome.as_str(), saved_revision),
        ("applied", revision + 1)
    );
    order
        .lock()
        .unwrap()
        .push("a validated and wrote, uncommitted");

    db.wait_lease_expired(claim_a.run_id).await;
    let takeover = {
        let ledger = db.ledger.clone();
        let order = order.clone();
        let run_id = claim_a.run_id;
        tokio::spawn(async move {
            let outcome = ledger.lease_acquire(run_id, "worker-b", 30_000).await;
            order.lock().unwrap().push("b acquired");
            outcome
        })
    };
    db.wait_lock_waiters("lease_acquire", 1).await;
    assert!(
        !takeover.is_finished(),
        "B must wait while A holds the lease row"
    );
    order.lock().unwrap().push("b blocked on the lease row");

    order.lock().unwrap().push("a commits");
    tx_a.commit().await.unwrap();

    let grant = match within("B's takeover", takeover).await.unwrap().unwrap() {
        AcquireOutcome::Acquired(grant) => grant,
        other => panic!("B should take over after A's commit, got {other:?}"),
    };
    assert_eq!(
        *order.lock().unwrap(),
        vec![
            "a validated and wrote, uncommitted",
            "b blocked on the lease row",
            "a commits",
            "b acquired"
        ]
    );
    // B judged the row as A's committed transaction left it: it sees A's
    // write, and takes the next epoch.
    assert!(grant.took_over);
    assert_eq!(grant.claim.epoch, claim_a.epoch + 1);
    assert_eq!(grant.revision, revision + 1);
    // From now on A cannot write.
    let late = db
        .ledger
        .checkpoint_save(
            &claim_a,
            revision + 1,
            &json!({"writer": "a", "late": true}),
        )
        .await
        .unwrap();
    assert!(
        matches!(late.rejection(), Some(Rejection::LeaseLost { found, .. }) if found.owner.as_deref() == Some("worker-b") && found.epoch == claim_a.epoch + 1),
        "A's late save must be rejected as lease lost, got {late:?}"
    );
    let (_, stored_revision, checkpoint, owner, epoch) = db.run_row(claim_a.run_id).await;
    assert_eq!(stored_revision, revision + 1);
    assert_eq!(checkpoint, json!({"writer": "a"}));
    assert_eq!(
        (owner.as_deref(), epoch),
        (Some("worker-b"), claim_a.epoch + 1)
    );
}
