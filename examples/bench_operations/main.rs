//! Benchmark of the proxy's ledger hot path: register-and-claim, then settle
//! (two round trips per tool call), at 1, 8, 32 and 64 concurrent callers,
//! next to pgbench running the same SQL function calls
//! (`register_claim_settle.sql` beside this file).
//!
//! ```text
//! cargo run --release --example bench_operations -- [seconds-per-level] [admin-database-url]
//! ```
//!
//! It (re)creates the database `leasegate_bench` on the server of the admin
//! URL (default `postgres://postgres@127.0.0.1:5432/postgres`), creates 64
//! runs leased at epoch 1, and alternates leasegate and pgbench per level.
//! Each leasegate caller is one agent run with its own connection, as each
//! pgbench client is. Numbers are reported, never asserted.

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use leasegate::intent::{IntegerPolicy, Intent, StepRef};
use leasegate::ledger::{
    Fenced, InitialLease, InlineClaim, LeaseClaim, Ledger, LedgerOptions, RunCreateOutcome, RunId,
    SettleOutcome,
};
use serde_json::json;
use sqlx::migrate::MigrateDatabase;

const LEVELS: [usize; 4] = [1, 8, 32, 64];
const RUNS: usize = 64;

fn run_id(client: usize) -> RunId {
    format!("00000000-0000-7000-8000-{client:012}")
        .parse()
        .expect("a valid uuid")
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let seconds: u64 = args.next().map(|s| s.parse()).transpose()?.unwrap_or(10);
    let admin_url = args
        .next()
        .unwrap_or_else(|| "postgres://postgres@127.0.0.1:5432/postgres".to_owned());
    let base = admin_url
        .rsplit_once('/')
        .map(|(b, _)| b)
        .unwrap_or(&admin_url);
    let url = format!("{base}/leasegate_bench");
    if sqlx::Postgres::database_exists(&url).await? {
        sqlx::Postgres::force_drop_database(&url).await?;
    }
    sqlx::Postgres::create_database(&url).await?;
    Ledger::migrate(&url).await?;

    let setup = Ledger::connect(&url, LedgerOptions::default()).await?;
    let mut tokens = Vec::with_capacity(RUNS);
    for client in 0..RUNS {
        let owner = format!("bench-{client}");
        let lease = InitialLease {
            owner: &owner,
            ttl_ms: 600_000,
        };
        let created = setup
            .run_create(
                run_id(client),
                "bench",
                &format!("task-{client}"),
                Some(lease),
            )
            .await?;
        let RunCreateOutcome::Created(created) = created else {
            anyhow::bail!("run {client}: {created:?}");
        };
        tokens.push(created.lease_token);
    }
    let tokens = Arc::new(tokens);
    print_settings(&url, seconds).await?;
    setup.close().await;

    println!(
        "{:>8} {:>16} {:>16} {:>8}",
        "callers", "leasegate/s", "pgbench/s", "ratio"
    );
    for callers in LEVELS {
        // A spinner on a terminal while this level runs; nothing elsewhere.
        let progress = leasegate::progress::Progress::spinner(&format!(
            "{callers} callers: leasegate, then pgbench ({seconds} s each)"
        ));
        let (ours, breakdown) =
            leasegate_rate(&url, callers, Duration::from_secs(seconds), &tokens).await?;
        let theirs = pgbench_rate(&url, callers, seconds)?;
        progress.finish();
        match theirs {
            Some(theirs) => println!(
                "{callers:>8} {ours:>16.0} {theirs:>16.0} {:>8.2}",
                ours / theirs
            ),
            None => println!(
                "{callers:>8} {ours:>16.0} {:>16} {:>8}",
                "(no pgbench)", "-"
            ),
        }
        println!("{:>8} leasegate: {breakdown}", "");
    }
    Ok(())
}

/// Calls per second of register-and-claim + settle through the Rust ledger.
/// Nanoseconds spent per phase, summed over all calls of a level.
#[derive(Default)]
struct Phases {
    intent: AtomicU64,
    register_claim: AtomicU64,
    settle: AtomicU64,
}

fn add(counter: &AtomicU64, since: Instant) {
    counter.fetch_add(since.elapsed().as_nanos() as u64, Ordering::Relaxed);
}

async fn leasegate_rate(
    url: &str,
    callers: usize,
    duration: Duration,
    tokens: &Arc<Vec<Option<leasegate::ledger::LeaseToken>>>,
) -> anyhow::Result<(f64, String)> {
    let options = LedgerOptions {
        max_connections: callers as u32,
        ..LedgerOptions::default()
    };
    let ledger = Ledger::connect(url, options).await?;
    let done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let phases = Arc::new(Phases::default());
    let started = Instant::now();
    let tasks: Vec<_> = (0..callers)
        .map(|client| {
            let (ledger, done, stop, phases) =
                (ledger.clone(), done.clone(), stop.clone(), phases.clone());
            let token = tokens[client].clone();
            tokio::spawn(async move {
                let lease = LeaseClaim {
                    run_id: run_id(client),
                    owner: format!("bench-{client}"),
                    epoch: 1,
                    token,
                };
                let dispatch_owner = format!("leasegate-{client}");
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    let began = Instant::now();
                    let step = StepRef {
                        step_id: format!("rust-{}-{n}", uuid::Uuid::new_v4()),
                        effect_version: 1,
                    };
                    let intent = Intent::new(
                        "bench",
                        lease.run_id,
                        Some(step),
                        "bench__create",
                        &json!({ "n": n }),
                        IntegerPolicy::Reject,
                    )?;
                    add(&phases.intent, began);
                    let began = Instant::now();
                    let claim = match ledger
                        .operation_register_claim(&lease, &intent, None, &dispatch_owner, 60_000)
                        .await?
                    {
                        Fenced::Applied(InlineClaim::Claimed { claim, .. }) => claim,
                        other => anyhow::bail!("not claimed: {other:?}"),
                    };
                    add(&phases.register_claim, began);
                    let began = Instant::now();
                    match ledger
                        .operation_settle(
                            &claim,
                            leasegate::ledger::Settlement::Succeeded,
                            Some("remote"),
                            &json!({ "ok": true }),
                        )
                        .await?
                    {
                        SettleOutcome::Settled(_) => {}
                        other => anyhow::bail!("not settled: {other:?}"),
                    }
                    add(&phases.settle, began);
                    done.fetch_add(1, Ordering::Relaxed);
                }
                anyhow::Ok(())
            })
        })
        .collect();
    tokio::time::sleep(duration).await;
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await??;
    }
    let elapsed = started.elapsed();
    ledger.close().await;
    let calls = done.load(Ordering::Relaxed).max(1) as f64;
    let mean_ms = |counter: &AtomicU64| counter.load(Ordering::Relaxed) as f64 / calls / 1e6;
    let breakdown = format!(
        "intent {:.3} ms, register_claim {:.3} ms, settle {:.3} ms (mean per call)",
        mean_ms(&phases.intent),
        mean_ms(&phases.register_claim),
        mean_ms(&phases.settle)
    );
    Ok((
        done.load(Ordering::Relaxed) as f64 / elapsed.as_secs_f64(),
        breakdown,
    ))
}

/// Transactions per second pgbench reports for the same calls, or `None`
/// when pgbench is not installed.
fn pgbench_rate(url: &str, clients: usize, seconds: u64) -> anyhow::Result<Option<f64>> {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/bench_operations/register_claim_settle.sql"
    );
    let threads = clients.min(2);
    let output = match Command::new("pgbench")
        .args(["-n", "-M", "prepared", "-f", script])
        .args([
            "-c",
            &clients.to_string(),
            "-j",
            &threads.to_string(),
            "-T",
            &seconds.to_string(),
        ])
        .arg(url)
        .output()
    {
        Ok(output) => output,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(error.into()),
    };
    let stdout = String::from_utf8_lossy(&output.stdout);
    anyhow::ensure!(
        output.status.success(),
        "pgbench failed: {}{}",
        stdout,
        String::from_utf8_lossy(&output.stderr)
    );
    let tps = stdout
        .lines()
        .find_map(|line| line.strip_prefix("tps = "))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|number| number.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no tps in pgbench output: {stdout}"))?;
    Ok(Some(tps))
}

async fn print_settings(url: &str, seconds: u64) -> anyhow::Result<()> {
    let options = LedgerOptions {
        session_role: None,
        max_connections: 1,
        ..LedgerOptions::default()
    };
    let ledger = Ledger::connect(url, options).await?;
    let health = ledger.health().await?;
    ledger.close().await;
    let settings = Command::new("psql")
        .args(["-Atc", "SELECT string_agg(name || '=' || setting, ' ' ORDER BY name) FROM pg_settings \
            WHERE name IN ('synchronous_commit','fsync','wal_sync_method','shared_buffers','max_connections','commit_delay')", url])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_else(|_| "(psql not available)".to_owned());
    println!(
        "PostgreSQL {} on this machine ({} cores), {seconds} s per level",
        health.server_version,
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0)
    );
    println!("settings: {settings}");
    Ok(())
}
