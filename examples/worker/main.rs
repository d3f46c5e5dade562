//! An example worker: acquires the lease on a run, heartbeats, and saves
//! checkpoints in a loop, printing one JSON line per thing it did on stdout.
//!
//! The process-level tests freeze it with SIGSTOP and thaw it with SIGCONT
//! (seed experiment B). With `--stale-probe`, once it learns it lost the
//! lease it tries every write a stale worker could still attempt — renew,
//! save, complete, fail, release — and prints what the ledger answered.
//!
//! ```text
//! leasegate-example-worker --run-id 0192... --saves 10 --complete
//! ```
//!
//! Exit codes: 0 done, 2 bad arguments, 3 lease not acquired, 4 stopped
//! (lease lost, run terminal or renewal unconfirmed), 1 other errors.

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use leasegate::ledger::{
    AcquireOutcome, Fenced, LeaseClaim, Ledger, LedgerError, LedgerOptions, RunId, RunStatus,
};
use leasegate::worker::{HeartbeatConfig, StopCause, WorkerCancellation, spawn_heartbeat};
use serde_json::{Value, json};

#[derive(Debug, Parser)]
#[command(name = "leasegate-example-worker")]
struct Args {
    #[arg(long, env = "DATABASE_URL")]
    database_url: String,
    /// The run to work on (a UUID).
    #[arg(long)]
    run_id: String,
    /// This worker session's owner name; generated when absent.
    #[arg(long)]
    owner: Option<String>,
    #[arg(long, default_value_t = 30_000)]
    ttl_ms: i64,
    #[arg(long, default_value_t = 5_000)]
    heartbeat_ms: u64,
    #[arg(long, default_value_t = 2_000)]
    renew_timeout_ms: u64,
    /// Pause between checkpoint saves.
    #[arg(long, default_value_t = 100)]
    save_every_ms: u64,
    /// Stop after this many saves (0: until stopped).
    #[arg(long, default_value_t = 0)]
    saves: u64,
    /// After the last save, complete the run and release the lease.
    #[arg(long)]
    complete: bool,
    /// After being stopped, attempt every stale write and report the answers.
    #[arg(long)]
    stale_probe: bool,
}

fn emit(event: &str, fields: Value) {
    let mut line = json!({ "event": event });
    if let (Some(line), Value::Object(fields)) = (line.as_object_mut(), fields) {
        line.extend(fields);
    }
    println!("{line}");
}

fn describe(outcome: &Result<Fenced<leasegate::ledger::Applied>, LedgerError>) -> Value {
    match outcome {
        Ok(Fenced::Applied(applied)) => {
            json!({ "outcome": "applied", "revision": applied.revision, "status": applied.run_status })
        }
        Ok(Fenced::Rejected(rejection)) => {
            json!({ "outcome": rejection.reason(), "message": rejection.to_string() })
        }
        Err(error) => json!({ "outcome": "error", "message": error.to_string() }),
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let run_id: RunId = match args.run_id.parse() {
        Ok(id) => id,
        Err(error) => {
            eprintln!("leasegate-example-worker: {error}");
            return ExitCode::from(2);
        }
    };
    let config = HeartbeatConfig {
        ttl_ms: args.ttl_ms,
        interval: Duration::from_millis(args.heartbeat_ms),
        renew_timeout: Duration::from_millis(args.renew_timeout_ms),
    };
    if let Err(error) = config.validate() {
        eprintln!("leasegate-example-worker: {error}");
        return ExitCode::from(2);
    }
    match work(args, run_id, config).await {
        Ok(code) => code,
        Err(error) => {
            emit("error", json!({ "message": format!("{error:#}") }));
            ExitCode::FAILURE
        }
    }
}

async fn work(args: Args, run_id: RunId, config: HeartbeatConfig) -> anyhow::Result<ExitCode> {
    let ledger = Ledger::connect(&args.database_url, LedgerOptions::default()).await?;
    let owner = args
        .owner
        .clone()
        .unwrap_or_else(|| format!("example-worker-{}-{}", std::process::id(), uuid_suffix()));

    let grant = match ledger.lease_acquire(run_id, &owner, config.ttl_ms).await? {
        AcquireOutcome::Acquired(grant) => grant,
        other => {
            emit("not_acquired", json!({ "outcome": other.label() }));
            return Ok(ExitCode::from(3));
        }
    };
    let claim: LeaseClaim = grant.claim.clone();
    emit(
        "acquired",
        json!({ "owner": claim.owner, "epoch": claim.epoch, "revision": grant.revision,
                "took_over": grant.took_over, "pid": std::process::id() }),
    );

    let cancel = WorkerCancellation::new();
    let heartbeat = spawn_heartbeat(ledger.clone(), claim.clone(), config, cancel.clone());

    let mut revision = grant.revision;
    if grant.run_status == RunStatus::Pending {
        match ledger.run_start(&claim, revision).await? {
            Fenced::Applied(applied) => {
                revision = applied.revision;
                emit("started", json!({ "revision": revision }));
            }
            Fenced::Rejected(rejection) => {
                cancel.cancel_with(StopCause::LeaseLost(rejection));
            }
        }
    }

    let mut saved = 0u64;
    while !cancel.is_cancelled() {
        tokio::select! {
            _ = cancel.cancelled() => break,
            _ = tokio::time::sleep(Duration::from_millis(args.save_every_ms)) => {}
        }
        let checkpoint = json!({ "owner": claim.owner, "epoch": claim.epoch, "step": saved + 1 });
        match ledger.checkpoint_save(&claim, revision, &checkpoint).await {
            Ok(Fenced::Applied(applied)) => {
                revision = applied.revision;
                saved += 1;
                emit("saved", json!({ "revision": revision, "step": saved }));
            }
            outcome @ Ok(Fenced::Rejected(_)) => {
                emit("save_rejected", describe(&outcome));
                if let Ok(Fenced::Rejected(rejection)) = outcome {
                    cancel.cancel_with(StopCause::LeaseLost(rejection));
                }
            }
            Err(error) => {
                // Unknown outcome: do not start the next step (seed 7).
                emit("save_error", json!({ "message": error.to_string() }));
                cancel.cancel_with(StopCause::RenewalUnconfirmed(error.to_string()));
            }
        }
        if args.saves > 0 && saved >= args.saves {
            break;
        }
    }

    if !cancel.is_cancelled() {
        if args.complete {
            let outcome = ledger.run_complete(&claim, revision, None).await;
            emit("completed", describe(&outcome));
        }
        cancel.cancel_with(StopCause::Stopped("done".into()));
        let _ = heartbeat.await;
        let outcome = ledger.lease_release(&claim).await;
        emit("released", describe(&outcome));
        return Ok(ExitCode::SUCCESS);
    }

    let cause = cancel.cause().map(ToString::to_string).unwrap_or_default();
    emit("stopped", json!({ "cause": cause }));
    let _ = heartbeat.await;

    if args.stale_probe {
        // What a stale worker's in-flight code could still try. The ledger
        // must refuse each one.
        let attempts = [
            (
                "lease_renew",
                ledger.lease_renew(&claim, config.ttl_ms).await,
            ),
            (
                "checkpoint_save",
                ledger
                    .checkpoint_save(
                        &claim,
                        revision,
                        &json!({ "owner": claim.owner, "stale": true }),
                    )
                    .await,
            ),
            (
                "run_complete",
                ledger.run_complete(&claim, revision, None).await,
            ),
            (
                "run_fail",
                ledger
                    .run_fail(&claim, revision, &json!("stale worker says failed"))
                    .await,
            ),
            ("lease_release", ledger.lease_release(&claim).await),
        ];
        for (call, outcome) in &attempts {
            let mut fields = describe(outcome);
            fields["call"] = json!(call);
            emit("stale_attempt", fields);
        }
    }
    Ok(ExitCode::from(4))
}

fn uuid_suffix() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..8].to_owned()
}
