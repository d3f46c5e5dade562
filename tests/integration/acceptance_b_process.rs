//! Seed experiment B at process level: a real worker process holding the
//! lease is frozen with SIGSTOP, its lease expires, another worker takes
//! over and saves, then the frozen one is thawed with SIGCONT. Everything the
//! stale worker tries is rejected and the new owner's state is untouched.

use crate::common;

use std::process::Stdio;

use common::{TestDb, wait_until, within};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::{Value, json};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use tokio::process::Command;

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn acceptance_b_thawed_worker_cannot_renew_save_complete_or_release_after_takeover(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let run_id = db.pending_run().await;

    let child = Command::new(env!("CARGO_BIN_EXE_leasegate-example-worker"))
        .args(["--database-url", &db.url, "--run-id", &run_id.to_string()])
        .args([
            "--owner",
            "worker-1",
            "--ttl-ms",
            "1500",
            "--heartbeat-ms",
            "300",
        ])
        .args([
            "--renew-timeout-ms",
            "500",
            "--save-every-ms",
            "50",
            "--stale-probe",
        ])
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn the example worker");
    let pid = Pid::from_raw(child.id().expect("worker pid") as i32);

    // Freeze worker 1 at a point observed in the database: it holds the
    // lease, started the run and saved at least twice.
    wait_until("worker 1 to start the run and save twice", || async {
        let (status, revision, _, owner, _) = db.run_row(run_id).await;
        (status == "running" && revision >= 3 && owner.as_deref() == Some("worker-1")).then_some(())
    })
    .await;
    kill(pid, Signal::SIGSTOP).expect("SIGSTOP worker 1");

    db.wait_lease_expired(run_id).await;
    let grant = db.acquire(run_id, "worker-2", 30_000).await;
    assert!(grant.took_over);
    assert_eq!(grant.claim.epoch, 2, "worker 2 holds the next epoch");
    let saved = db
        .save_checkpoint(&grant.claim, grant.revision, &json!({"owner": "worker-2"}))
        .await;
    let before = db.run_row(run_id).await;
    let lease_expiry_before = db.lease_expiry(run_id).await;
    let takeover_event: i64 = db
        .scalar(
            "SELECT max(event_id) FROM ledger_events WHERE run_id = $1 AND actor = 'worker-2'",
            run_id.as_uuid(),
        )
        .await;

    kill(pid, Signal::SIGCONT).expect("SIGCONT worker 1");
    let output = within("worker 1 to exit after thawing", child.wait_with_output())
        .await
        .expect("worker 1 output");
    let lines: Vec<Value> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).expect("worker prints JSON lines"))
        .collect();

    assert_eq!(
        output.status.code(),
        Some(4),
        "worker 1 stops as stale: {lines:#?}"
    );
    let stopped = lines
        .iter()
        .find(|line| line["event"] == "stopped")
        .expect("worker 1 reports why it stopped");
    assert!(
        stopped["cause"]
            .as_str()
            .is_some_and(|cause| !cause.is_empty()),
        "{stopped}"
    );
    let stale: Vec<(&str, &str)> = lines
        .iter()
        .filter(|line| line["event"] == "stale_attempt")
        .map(|line| {
            (
                line["call"].as_str().unwrap(),
                line["outcome"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        stale,
        vec![
            ("lease_renew", "lease_lost"),
            ("checkpoint_save", "lease_lost"),
            ("run_complete", "lease_lost"),
            ("run_fail", "lease_lost"),
            ("lease_release", "lease_lost"),
        ]
    );

    // Worker 2's epoch, revision, checkpoint and lease are exactly as it left them.
    let after = db.run_row(run_id).await;
    assert_eq!(after, before);
    assert_eq!(
        after,
        (
            "running".to_owned(),
            saved.revision,
            json!({"owner": "worker-2"}),
            Some("worker-2".to_owned()),
            2
        )
    );
    let lease_expiry_after = db.lease_expiry(run_id).await;
    assert_eq!(
        lease_expiry_after, lease_expiry_before,
        "worker 1 extended nothing"
    );
    let stale_events: i64 = db
        .scalar_with(
            "SELECT count(*) FROM ledger_events WHERE run_id = $1 AND event_id > $2",
            (run_id.as_uuid(), takeover_event),
        )
        .await;
    assert_eq!(stale_events, 0, "no status change after the takeover");
}
