//! The worker's heartbeat: renews on its interval; the first renewal it
//! cannot confirm cancels the worker with the cause; it never re-acquires.

use crate::common;

use std::time::Duration;

use common::{TestDb, applied, wait_until, within};
use leasegate::ledger::{Rejection, RunId, RunStatus};
use leasegate::worker::{HeartbeatConfig, LeaseHandle, StopCause};
use serde_json::json;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

const FAST: HeartbeatConfig = HeartbeatConfig {
    ttl_ms: 3_000,
    interval: Duration::from_millis(100),
    renew_timeout: Duration::from_millis(400),
};

/// A fresh pending run whose lease worker `w1` holds through a heartbeating
/// handle on the fast schedule.
async fn w1_holds_a_pending_run(db: &TestDb) -> (RunId, LeaseHandle) {
    let run_id = db.pending_run().await;
    let handle = LeaseHandle::acquire(db.ledger.clone(), run_id, "w1", FAST)
        .await
        .unwrap();
    (run_id, handle)
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn heartbeat_extends_the_lease_and_release_stops_it(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let (run_id, handle) = w1_holds_a_pending_run(&db).await;
    let granted = handle.grant().expires_at;

    wait_until("two renewals to move the expiry", || async {
        (db.lease_expiry(handle.claim().run_id).await > granted).then_some(())
    })
    .await;
    let first_renewal = db.lease_expiry(handle.claim().run_id).await;
    wait_until("a further renewal", || async {
        (db.lease_expiry(handle.claim().run_id).await > first_renewal).then_some(())
    })
    .await;
    assert!(!handle.cancellation().is_cancelled());

    let applied_start = applied(handle.start(handle.grant().revision).await.unwrap());
    applied(
        handle
            .checkpoint_save(applied_start.revision, &json!({"n": 1}))
            .await
            .unwrap(),
    );
    let cancellation = handle.cancellation().clone();
    applied(within("release", handle.release()).await.unwrap());
    assert!(matches!(cancellation.cause(), Some(StopCause::Stopped(_))));
    let (_, _, _, owner, epoch) = db.run_row(run_id).await;
    assert_eq!((owner, epoch), (None, 1), "released, epoch kept");
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn heartbeat_cancels_the_worker_when_another_owner_holds_the_lease(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let (run_id, handle) = w1_holds_a_pending_run(&db).await;

    // Arrange a takeover directly (superuser), as if w1 had been frozen past its TTL.
    sqlx::query("UPDATE worker_leases SET owner = 'w2', epoch = epoch + 1 WHERE run_id = $1")
        .bind(run_id.as_uuid())
        .execute(&db.admin)
        .await
        .unwrap();

    within(
        "the heartbeat to cancel the worker",
        handle.cancellation().cancelled(),
    )
    .await;
    match handle.cancellation().cause() {
        Some(StopCause::LeaseLost(Rejection::LeaseLost { found, .. })) => {
            assert_eq!((found.owner.as_deref(), found.epoch), (Some("w2"), 2));
        }
        other => panic!("expected lease lost, got {other:?}"),
    }
    // Never resurrected: the lease stays w2's.
    let (_, _, _, owner, epoch) = db.run_row(run_id).await;
    assert_eq!((owner.as_deref(), epoch), (Some("w2"), 2));
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn heartbeat_stops_the_worker_when_an_operator_cancels_the_run(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let (run_id, handle) = w1_holds_a_pending_run(&db).await;
    db.operator_cancels(run_id, "ops", Some("stop it")).await;

    within(
        "the heartbeat to cancel the worker",
        handle.cancellation().cancelled(),
    )
    .await;
    assert_eq!(
        handle.cancellation().cause(),
        Some(&StopCause::RunTerminal(RunStatus::Cancelled))
    );
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn unanswered_renewal_cancels_the_worker_and_the_heartbeat_ends(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let (run_id, handle) = w1_holds_a_pending_run(&db).await;

    // Hold the lease row: the next renewal cannot get an answer in time.
    let gate = db.hold_lease_row(run_id).await;
    within(
        "the heartbeat to give up",
        handle.cancellation().cancelled(),
    )
    .await;
    gate.rollback().await.unwrap();

    match handle.cancellation().cause() {
        Some(StopCause::RenewalUnconfirmed(message)) => {
            assert!(message.contains("no answer within 400ms"), "{message}")
        }
        other => panic!("expected an unconfirmed renewal, got {other:?}"),
    }
    // A later rejection does not overwrite the first cause.
    let save = handle.checkpoint_save(0, &json!({})).await.unwrap();
    assert!(!save.is_applied());
    assert!(matches!(
        handle.cancellation().cause(),
        Some(StopCause::RenewalUnconfirmed(_))
    ));
}

#[test]
fn heartbeat_settings_must_let_a_renewal_land_before_expiry() {
    let too_slow = HeartbeatConfig {
        ttl_ms: 1_000,
        interval: Duration::from_millis(800),
        renew_timeout: Duration::from_millis(300),
    };
    assert_eq!(
        too_slow.validate().unwrap_err(),
        "heartbeat interval 800ms + renewal timeout 300ms must be below the ttl 1s"
    );
    assert_eq!(
        HeartbeatConfig { ttl_ms: 0, ..FAST }
            .validate()
            .unwrap_err(),
        "lease ttl must be > 0 ms, got 0 ms"
    );
    assert!(HeartbeatConfig::default().validate().is_ok());
}
