//! Measures the ledger's protected calls on the local PostgreSQL: latency of
//! sequential checkpoint saves and lease renewals, and how many transactions
//! each call commits (from pg_stat_database), in one run.
//!
//! ```text
//! cargo run --release --example bench_ledger -- [calls] [database-url]
//! ```
//!
//! It migrates (and if needed creates) the database, creates one run, and
//! calls each function `calls` times in a row on one pooled connection.

#[path = "../common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::stats::{self, Rank};
use leasegate::ledger::{AcquireOutcome, Fenced, Ledger, LedgerOptions, RunCreateOutcome, RunId};
use serde_json::json;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let calls: usize = args.next().map(|n| n.parse()).transpose()?.unwrap_or(2_000);
    let url = args
        .next()
        .unwrap_or_else(|| "postgres://postgres@127.0.0.1:5432/leasegate_bench".to_owned());
    Ledger::create_database_if_missing(&url).await?;
    Ledger::migrate(&url).await?;
    let options = LedgerOptions {
        max_connections: 1,
        ..LedgerOptions::default()
    };
    let ledger = Ledger::connect(&url, options).await?;
    let health = ledger.health().await?;
    println!(
        "postgres {} as {}, {} sequential calls per function, 1 connection",
        health.server_version, health.current_user, calls
    );

    let run_id = RunId::generate();
    let RunCreateOutcome::Created(_) = ledger
        .run_create(run_id, "bench", &format!("bench-{run_id}"), None)
        .await?
    else {
        anyhow::bail!("run not created");
    };
    let AcquireOutcome::Acquired(grant) = ledger.lease_acquire(run_id, "bench", 60_000).await?
    else {
        anyhow::bail!("lease not acquired");
    };
    let claim = grant.claim;
    let Fenced::Applied(started) = ledger.run_start(&claim, grant.revision).await? else {
        anyhow::bail!("run not started");
    };
    let mut revision = started.revision;

    let xid_before = ledger.transaction_id().await?;
    let mut save_latencies = Vec::with_capacity(calls);
    // On a terminal: calls done; elsewhere nothing.
    let progress =
        leasegate::progress::Progress::bar(2 * calls as u64, "checkpoint_save, then lease_renew");
    for step in 0..calls {
        progress.inc(1);
        let began = Instant::now();
        let outcome = ledger
            .checkpoint_save(&claim, revision, &json!({ "step": step, "note": "bench" }))
            .await?;
        save_latencies.push(began.elapsed());
        revision = outcome.into_result()?.revision;
    }
    let mut renew_latencies = Vec::with_capacity(calls);
    for _ in 0..calls {
        progress.inc(1);
        let began = Instant::now();
        ledger.lease_renew(&claim, 60_000).await?.into_result()?;
        renew_latencies.push(began.elapsed());
    }
    progress.finish();
    let xid_after = ledger.transaction_id().await?;
    report("checkpoint_save", &mut save_latencies);
    report("lease_renew", &mut renew_latencies);
    println!(
        "transactions per call: {:.3} (transaction ids assigned between two readings / calls; \
         other writers on the cluster would add to it)",
        (xid_after - xid_before - 1) as f64 / (2 * calls) as f64
    );
    Ok(())
}

fn report(name: &str, latencies: &mut [Duration]) {
    latencies.sort();
    let at = |q: f64| stats::percentile(latencies, q, Rank::Floor).expect("at least one call");
    let total: Duration = latencies.iter().sum();
    println!(
        "{name:>16}: {:>7.0} calls/s  p50 {:>6.0} µs  p99 {:>6.0} µs  max {:>6.0} µs",
        latencies.len() as f64 / total.as_secs_f64(),
        at(0.5).as_secs_f64() * 1e6,
        at(0.99).as_secs_f64() * 1e6,
        at(1.0).as_secs_f64() * 1e6,
    );
}
