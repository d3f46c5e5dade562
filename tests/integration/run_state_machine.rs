//! The run state machine of seed section 7, in the database: every
//! (status, event) pair, lease-loss rules, and release/acquire epochs.

use crate::common;

use common::{TestDb, applied};
use leasegate::ledger::{
    AcquireOutcome, Fenced, ForbiddenTransition, LeaseClaim, Rejection, RunEvent, RunId, RunStatus,
};
use serde_json::json;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

/// A run in `status`, still leased by "worker"; returns the claim and revision.
async fn run_in(db: &TestDb, status: RunStatus) -> (LeaseClaim, i64) {
    let run_id = db.pending_run().await;
    let grant = db.acquire(run_id, "worker", 30_000).await;
    let claim = grant.claim;
    let mut revision = grant.revision;
    if status == RunStatus::Pending {
        return (claim, revision);
    }
    revision = applied(db.ledger.run_start(&claim, revision).await.unwrap()).revision;
    let last = match status {
        RunStatus::Pending | RunStatus::Running => return (claim, revision),
        RunStatus::Succeeded => db.ledger.run_complete(&claim, revision, None).await,
        RunStatus::Failed => db.ledger.run_fail(&claim, revision, &json!("boom")).await,
        RunStatus::Cancelled => db.operator.run_cancel(claim.run_id, "operator", None).await,
    };
    (claim, applied(last.unwrap()).revision)
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn database_follows_the_transition_table_for_every_status_and_event(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    for from in RunStatus::ALL {
        for event in RunEvent::ALL {
            let (claim, revision) = run_in(&db, from).await;
            let events_before = db.event_count(claim.run_id).await;
            let outcome = match event {
                RunEvent::Start => db.ledger.run_start(&claim, revision).await,
                RunEvent::SaveCheckpoint => {
                    db.ledger
                        .checkpoint_save(&claim, revision, &json!({"saved": true}))
                        .await
                }
                RunEvent::Complete => db.ledger.run_complete(&claim, revision, None).await,
                RunEvent::Fail => db.ledger.run_fail(&claim, revision, &json!("x")).await,
                RunEvent::Cancel => {
                    db.operator
                        .run_cancel(claim.run_id, "operator", Some("test"))
                        .await
                }
            }
            .unwrap();
            let (status, stored_revision, _, _, _) = db.run_row(claim.run_id).await;
            let case = format!("{from} + {event:?}");
            match from.transition(event) {
                Ok(to) => {
                    let applied = match outcome {
                        Fenced::Applied(applied) => applied,
                        Fenced::Rejected(rejection) => panic!("{case}: rejected: {rejection}"),
                    };
                    assert_eq!(applied.run_status, to, "{case}");
                    assert_eq!(applied.revision, revision + 1, "{case}");
                    assert_eq!(
                        (status.as_str(), stored_revision),
                        (to.as_str(), revision + 1),
                        "{case}"
                    );
                    let expected_events = if to == from { 0 } else { 1 };
                    assert_eq!(
                        db.event_count(claim.run_id).await - events_before,
                        expected_events,
                        "{case}"
                    );
                }
                Err(forbidden) => {
                    let expected = match forbidden {
                        ForbiddenTransition::Terminal(status) => Rejection::Terminal { status },
                        ForbiddenTransition::WrongStatus { expected, found } => {
                            Rejection::WrongStatus { expected, found }
                        }
                    };
                    assert_eq!(outcome, Fenced::Rejected(expected), "{case}");
                    assert_eq!(
                        (status.as_str(), stored_revision),
                        (from.as_str(), revision),
                        "{case}: unchanged"
                    );
                    assert_eq!(
                        db.event_count(claim.run_id).await,
                        events_before,
                        "{case}: no event"
                    );
                }
            }
        }
    }
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn worker_that_lost_its_lease_cannot_mark_the_run_failed_or_succeeded(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let (old, revision) = db.running_run("old-owner", 30_000).await;
    applied(db.ledger.lease_release(&old).await.unwrap());
    let new = db.acquire(old.run_id, "new-owner", 30_000).await;

    for outcome in [
        db.ledger
            .run_fail(&old, revision, &json!("stale says failed"))
            .await,
        db.ledger
            .run_complete(&old, revision, Some(&json!({"stale": true})))
            .await,
        db.ledger
            .checkpoint_save(&old, revision, &json!({"stale": true}))
            .await,
    ] {
        match outcome.unwrap() {
            Fenced::Rejected(Rejection::LeaseLost { expected, found }) => {
                assert_eq!(expected, old);
                assert_eq!(found.owner.as_deref(), Some("new-owner"));
                assert_eq!(found.epoch, new.claim.epoch);
            }
            other => panic!("expected lease lost, got {other:?}"),
        }
    }
    let (status, stored_revision, checkpoint, owner, epoch) = db.run_row(old.run_id).await;
    assert_eq!((status.as_str(), stored_revision), ("running", revision));
    assert_eq!(checkpoint, json!({}));
    assert_eq!((owner.as_deref(), epoch), (Some("new-owner"), 2));
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn expired_lease_is_never_resurrected_by_its_owner(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let (claim, revision) = db.running_run("sleepy", 200).await;
    db.wait_lease_expired(claim.run_id).await;

    // Nobody took over, yet the expired owner may neither renew nor save.
    let renew = db.ledger.lease_renew(&claim, 30_000).await.unwrap();
    let save = db
        .ledger
        .checkpoint_save(&claim, revision, &json!({"late": 1}))
        .await
        .unwrap();
    for outcome in [renew, save] {
        match outcome {
            Fenced::Rejected(rejection @ Rejection::LeaseLost { .. }) => {
                let Rejection::LeaseLost { found, .. } = &rejection else {
                    unreachable!()
                };
                assert!(found.expired);
                assert_eq!(
                    (found.owner.as_deref(), found.epoch),
                    (Some("sleepy"), claim.epoch)
                );
                assert!(
                    rejection
                        .to_string()
                        .starts_with("lease lost: epoch 1 of owner sleepy expired at"),
                    "{rejection}"
                );
            }
            other => panic!("expected lease lost, got {other:?}"),
        }
    }
    // It may still release what it held, which frees the run for the next owner.
    applied(db.ledger.lease_release(&claim).await.unwrap());
    let next = db.acquire(claim.run_id, "next", 30_000).await;
    assert!(
        !next.took_over,
        "a released lease is acquired, not taken over"
    );
    assert_eq!(next.claim.epoch, claim.epoch + 1);
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn release_keeps_the_epoch_and_the_next_acquire_increments_it(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let run_id = db.pending_run().await;
    let mut epochs = Vec::new();
    for round in 0..3 {
        let grant = db.acquire(run_id, &format!("owner-{round}"), 30_000).await;
        epochs.push(grant.claim.epoch);
        // A stranger cannot release it.
        let stranger = LeaseClaim {
            owner: "stranger".into(),
            ..grant.claim.clone()
        };
        assert!(matches!(
            db.ledger.lease_release(&stranger).await.unwrap(),
            Fenced::Rejected(Rejection::LeaseLost { .. })
        ));
        applied(db.ledger.lease_release(&grant.claim).await.unwrap());
        let (_, _, _, owner, epoch) = db.run_row(run_id).await;
        assert_eq!(
            (owner, epoch),
            (None, grant.claim.epoch),
            "release keeps the epoch"
        );
        // Releasing twice is refused: the lease is no longer this owner's.
        assert!(matches!(
            db.ledger.lease_release(&grant.claim).await.unwrap(),
            Fenced::Rejected(Rejection::LeaseLost { .. })
        ));
    }
    assert_eq!(epochs, vec![1, 2, 3]);
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn acquire_reports_busy_missing_and_terminal_runs_apart(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let (holder, revision) = db.running_run("holder", 30_000).await;

    match db
        .ledger
        .lease_acquire(holder.run_id, "rival", 30_000)
        .await
        .unwrap()
    {
        AcquireOutcome::Busy { owner, expires_at } => {
            assert_eq!(owner, "holder");
            assert!(expires_at > chrono::Utc::now() - chrono::Duration::minutes(5));
        }
        other => panic!("expected busy, got {other:?}"),
    }
    assert_eq!(
        db.ledger
            .lease_acquire(RunId::generate(), "rival", 30_000)
            .await
            .unwrap(),
        AcquireOutcome::NotFound
    );
    db.complete_run(&holder, revision, None).await;
    applied(db.ledger.lease_release(&holder).await.unwrap());
    assert_eq!(
        db.ledger
            .lease_acquire(holder.run_id, "rival", 30_000)
            .await
            .unwrap(),
        AcquireOutcome::Terminal {
            status: RunStatus::Succeeded
        }
    );
    let (_, _, _, owner, epoch) = db.run_row(holder.run_id).await;
    assert_eq!((owner, epoch), (None, 1), "refused acquires change nothing");
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn cancelled_run_refuses_every_worker_write_and_renewal(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let (claim, revision) = db.running_run("worker", 30_000).await;
    db.operator_cancels(claim.run_id, "ops@example", Some("customer asked"))
        .await;
    let cancelled = Fenced::Rejected(Rejection::Terminal {
        status: RunStatus::Cancelled,
    });
    assert_eq!(
        db.ledger.lease_renew(&claim, 30_000).await.unwrap(),
        cancelled
    );
    assert_eq!(
        db.ledger
            .checkpoint_save(&claim, revision + 1, &json!({}))
            .await
            .unwrap(),
        cancelled
    );
    assert_eq!(
        db.operator
            .run_cancel(claim.run_id, "ops@example", None)
            .await
            .unwrap(),
        cancelled
    );
    let events = db.ledger.run_events(claim.run_id).await.unwrap();
    let cancel = events
        .iter()
        .find(|e| e.to_status == "cancelled")
        .expect("cancel event");
    assert_eq!(
        (
            cancel.from_status.as_deref(),
            cancel.actor_kind.as_str(),
            cancel.actor.as_deref()
        ),
        (Some("running"), "operator", Some("ops@example"))
    );
    assert_eq!(cancel.detail["reason"], "customer asked");
    // The worker still releases what it holds.
    applied(db.ledger.lease_release(&claim).await.unwrap());
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn database_status_values_equal_the_rust_enum(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let (definition, in_database) = db.status_constraint("agent_runs").await;
    let mut in_rust: Vec<String> = RunStatus::ALL
        .iter()
        .map(|s| s.as_str().to_owned())
        .collect();
    in_rust.sort();
    assert_eq!(in_database, in_rust, "from {definition}");
}

/// (subject, from, to, actor, epoch)
type HistoryRow<'a> = (
    &'a str,
    Option<&'a str>,
    &'a str,
    Option<&'a str>,
    Option<i64>,
);

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn every_run_status_change_is_in_the_event_history_with_its_actor(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let (claim, revision) = db.running_run("w1", 30_000).await;
    let revision = db
        .save_checkpoint(&claim, revision, &json!({"n": 1}))
        .await
        .revision;
    db.complete_run(&claim, revision, Some(&json!({"result": "ok"})))
        .await;
    applied(db.ledger.lease_release(&claim).await.unwrap());
    let events = db.ledger.run_events(claim.run_id).await.unwrap();
    let history: Vec<HistoryRow> = events
        .iter()
        .map(|e| {
            (
                e.subject.as_str(),
                e.from_status.as_deref(),
                e.to_status.as_str(),
                e.actor.as_deref(),
                e.epoch,
            )
        })
        .collect();
    assert_eq!(
        history,
        vec![
            ("run", None, "pending", None, None),
            ("lease", Some("free"), "held", Some("w1"), Some(1)),
            ("run", Some("pending"), "running", Some("w1"), Some(1)),
            ("run", Some("running"), "succeeded", Some("w1"), Some(1)),
            ("lease", Some("held"), "free", Some("w1"), Some(1)),
        ]
    );
    let view = db.ledger.run_get(claim.run_id).await.unwrap().unwrap();
    assert_eq!(view.status, RunStatus::Succeeded);
    assert_eq!(view.checkpoint, json!({"result": "ok"}));
}
