//! Benchmark of the proxy's ledger hot path: register-and-claim, then settle
//! (two round trips per tool call), at 1, 8, 32 and 64 concurrent callers,
//! next to pgbench running the same SQL (`register_claim_settle.sql` beside
//! this file) and pgbench running the minimal ceiling (`bench/ceiling/*.sql`: the
//! seed's schema, one function that checks the lease FOR UPDATE and inserts
//! a `dispatching` operation, then one settle UPDATE).
//!
//! ```text
//! cargo run --release --example bench_operations -- [seconds-per-level] [admin-database-url]
//! ```
//!
//! It (re)creates the database `leasegate_bench` (`LEASEGATE_BENCH_DB`
//! names another) and `<that>_ceiling` on the server of the admin URL
//! (default `postgres://postgres@127.0.0.1:5432/postgres`), creates 64 runs
//! leased at epoch 1, and runs leasegate, pgbench (leasegate's SQL) and
//! pgbench (ceiling) per level. Each leasegate caller is one agent run with
//! its own connection, as each pgbench client is. leasegate's connections
//! go through a counting TCP relay, so the table also shows database round
//! trips per call as the wire saw them (a round trip = one Sync of the
//! extended protocol or one simple Query, client to server). Numbers are
//! reported, never asserted.
//!
//! Each level also runs the Rust path with group commit on (the default
//! settings, no window, batches of up to 64, one batch of each
//! kind in flight; docs/operating.md) and prints both paths' p50/p99 per call (register-claim plus
//! settle) and the mean calls per batch statement. `LEASEGATE_BENCH_SKIP_PGBENCH=1`
//! leaves pgbench out (the Rust rows only).

#[path = "../common/mod.rs"]
mod common;

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::database::{recreate, with_database};
use common::pgbench::{self, Pgbench};
use common::stats::{self, Rank};
use leasegate::intent::{IntegerPolicy, Intent, StepRef};
use leasegate::ledger::{
    Fenced, GroupCommitSettings, InitialLease, InlineClaim, LeaseClaim, Ledger, LedgerOptions,
    RunCreateOutcome, RunId, SettleOutcome,
};
use serde_json::json;

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
    let name = std::env::var("LEASEGATE_BENCH_DB").unwrap_or_else(|_| "leasegate_bench".to_owned());
    let url = with_database(&admin_url, &name);
    let ceiling_url = setup_ceiling(&with_database(&admin_url, &format!("{name}_ceiling"))).await?;
    recreate(&url).await?;
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

    let relay = Relay::start(&url).await?;
    println!(
        "{:>8} {:>12} {:>10} {:>14} {:>12} {:>10} {:>10}",
        "callers", "leasegate/s", "trips/call", "pgbench-own/s", "ceiling/s", "lg/ceil", "own/ceil"
    );
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/bench/leasegate/register_claim_settle.sql"
    );
    let ceiling_script = concat!(env!("CARGO_MANIFEST_DIR"), "/bench/ceiling/hotpath_fn.sql");
    for callers in LEVELS {
        // A spinner on a terminal while this level runs; nothing elsewhere.
        let progress = leasegate::progress::Progress::spinner(&format!(
            "{callers} callers: leasegate, then pgbench ({seconds} s each)"
        ));
        let trips_before = relay.round_trips();
        let (ours, calls, breakdown) = leasegate_rate(
            &relay.url,
            callers,
            Duration::from_secs(seconds),
            &tokens,
            None,
        )
        .await?;
        let trips = (relay.round_trips() - trips_before) as f64 / calls.max(1) as f64;
        let trips_before = relay.round_trips();
        let (grouped, grouped_calls, grouped_breakdown) = leasegate_rate(
            &relay.url,
            callers,
            Duration::from_secs(seconds),
            &tokens,
            Some(GroupCommitSettings::default()),
        )
        .await?;
        let grouped_trips =
            (relay.round_trips() - trips_before) as f64 / grouped_calls.max(1) as f64;
        let skip_pgbench = std::env::var_os("LEASEGATE_BENCH_SKIP_PGBENCH").is_some();
        let theirs = if skip_pgbench {
            None
        } else {
            pgbench_rate(&url, script, callers, seconds)?
        };
        let ceiling = match &ceiling_url {
            Some(ceiling_url) if !skip_pgbench => {
                pgbench_rate(ceiling_url, ceiling_script, callers, seconds)?
            }
            _ => None,
        };
        progress.finish();
        let show = |rate: Option<f64>| rate.map_or_else(|| "-".to_owned(), |r| format!("{r:.0}"));
        let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) => format!("{:.2}", a / b),
            _ => "-".to_owned(),
        };
        println!(
            "{callers:>8} {ours:>12.0} {trips:>10.2} {:>14} {:>12} {:>10} {:>10}",
            show(theirs),
            show(ceiling),
            ratio(Some(ours), ceiling),
            ratio(theirs, ceiling),
        );
        println!("{:>8} leasegate: {breakdown}", "");
        println!(
            "{:>8} group commit: {grouped:.0}/s ({:.2}x the single path, {}x ceiling), \
             {grouped_trips:.2} trips/call; {grouped_breakdown}",
            "",
            grouped / ours.max(f64::MIN_POSITIVE),
            ratio(Some(grouped), ceiling),
        );
    }
    Ok(())
}

/// The minimal ceiling's database (`bench/ceiling/schema.sql`, `fn.sql`),
/// or `None` without psql.
async fn setup_ceiling(url: &str) -> anyhow::Result<Option<String>> {
    recreate(url).await?;
    for file in ["schema.sql", "fn.sql"] {
        let path = format!("{}/bench/ceiling/{file}", env!("CARGO_MANIFEST_DIR"));
        let output = match Command::new("psql")
            .args(["-q", "-v", "ON_ERROR_STOP=1", "-f", &path, url])
            .output()
        {
            Ok(output) => output,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(error) => return Err(error.into()),
        };
        anyhow::ensure!(
            output.status.success(),
            "psql -f {file}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(Some(url.to_owned()))
}

/// A TCP relay in front of PostgreSQL that counts round trips: Sync
/// (extended protocol) and Query (simple protocol) messages from client to
/// server, after each connection's startup packets.
struct Relay {
    url: String,
    trips: Arc<AtomicU64>,
}

impl Relay {
    async fn start(url: &str) -> anyhow::Result<Relay> {
        // postgres://[user@]host[:port]/database[?…]
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| anyhow::anyhow!("not a URL: {url}"))?;
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        let (user, host_port) = match authority.rsplit_once('@') {
            Some((user, host_port)) => (format!("{user}@"), host_port),
            None => (String::new(), authority),
        };
        let upstream = if host_port.contains(':') {
            host_port.to_owned()
        } else {
            format!("{host_port}:5432")
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        // The relay reads the protocol: no TLS through it.
        let database = path.split('?').next().unwrap_or("");
        let relayed = format!("{scheme}://{user}127.0.0.1:{port}/{database}?sslmode=disable");
        let trips = Arc::new(AtomicU64::new(0));
        let counter = trips.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let upstream = upstream.clone();
                let counter = counter.clone();
                tokio::spawn(async move {
                    let _ = relay_one(client, &upstream, counter).await;
                });
            }
        });
        Ok(Relay {
            url: relayed,
            trips,
        })
    }

    fn round_trips(&self) -> u64 {
        self.trips.load(Ordering::Relaxed)
    }
}

async fn relay_one(
    client: tokio::net::TcpStream,
    upstream: &str,
    trips: Arc<AtomicU64>,
) -> anyhow::Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    client.set_nodelay(true)?;
    let server = tokio::net::TcpStream::connect(upstream).await?;
    server.set_nodelay(true)?;
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let back =
        tokio::spawn(async move { tokio::io::copy(&mut server_read, &mut client_write).await });
    // Client to server: parse message boundaries to count Sync and Query.
    let mut pending: Vec<u8> = Vec::new();
    let mut started = false;
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        let n = client_read.read(&mut buffer).await?;
        if n == 0 {
            break;
        }
        server_write.write_all(&buffer[..n]).await?;
        pending.extend_from_slice(&buffer[..n]);
        loop {
            if !started {
                // Startup phase: untyped, length-prefixed packets.
                if pending.len() < 8 {
                    break;
                }
                let len = u32::from_be_bytes(pending[0..4].try_into()?) as usize;
                let code = u32::from_be_bytes(pending[4..8].try_into()?);
                if pending.len() < len {
                    break;
                }
                pending.drain(..len);
                if code == 196_608 {
                    started = true;
                }
                continue;
            }
            if pending.len() < 5 {
                break;
            }
            let kind = pending[0];
            let len = u32::from_be_bytes(pending[1..5].try_into()?) as usize;
            if pending.len() < len + 1 {
                break;
            }
            if kind == b'S' || kind == b'Q' {
                trips.fetch_add(1, Ordering::Relaxed);
            }
            pending.drain(..len + 1);
        }
    }
    back.abort();
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
    group_commit: Option<GroupCommitSettings>,
) -> anyhow::Result<(f64, u64, String)> {
    let options = LedgerOptions {
        max_connections: callers as u32,
        group_commit,
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
                let mut latencies = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    let call_began = Instant::now();
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
                    // As the proxy calls it: the tenant judged in the same
                    // statement, the settle with its WAL sample.
                    let claim = match ledger
                        .operation_register_claim_in(
                            Some("bench"),
                            &lease,
                            &intent,
                            None,
                            &dispatch_owner,
                            60_000,
                        )
                        .await?
                        .0
                    {
                        Fenced::Applied(InlineClaim::Claimed { claim, .. }) => claim,
                        other => anyhow::bail!("not claimed: {other:?}"),
                    };
                    add(&phases.register_claim, began);
                    let began = Instant::now();
                    match ledger
                        .operation_settle_acknowledged(
                            &claim,
                            leasegate::ledger::Settlement::Succeeded,
                            Some("remote"),
                            &json!({ "ok": true }),
                        )
                        .await?
                        .0
                    {
                        SettleOutcome::Settled(_) => {}
                        other => anyhow::bail!("not settled: {other:?}"),
                    }
                    add(&phases.settle, began);
                    latencies.push(call_began.elapsed());
                    done.fetch_add(1, Ordering::Relaxed);
                }
                anyhow::Ok(latencies)
            })
        })
        .collect();
    tokio::time::sleep(duration).await;
    stop.store(true, Ordering::Relaxed);
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await??);
    }
    let elapsed = started.elapsed();
    let counts = ledger.group_commit_counts();
    ledger.close().await;
    latencies.sort();
    let at = |q: f64| {
        stats::percentile(&latencies, q, Rank::FloorOfCount).map_or(0.0, |d| d.as_secs_f64() * 1e3)
    };
    let calls = done.load(Ordering::Relaxed).max(1) as f64;
    let mean_ms = |counter: &AtomicU64| counter.load(Ordering::Relaxed) as f64 / calls / 1e6;
    let breakdown = format!(
        "intent {:.3} ms, register_claim {:.3} ms, settle {:.3} ms (mean per call); \
         p50 {:.2} ms, p99 {:.2} ms{}",
        mean_ms(&phases.intent),
        mean_ms(&phases.register_claim),
        mean_ms(&phases.settle),
        at(0.5),
        at(0.99),
        counts.map_or_else(String::new, |c| format!(
            "; calls per statement: register {:.1}, settle {:.1}",
            c.register_items as f64 / c.register_batches.max(1) as f64,
            c.settle_items as f64 / c.settle_batches.max(1) as f64
        )),
    );
    Ok((
        done.load(Ordering::Relaxed) as f64 / elapsed.as_secs_f64(),
        done.load(Ordering::Relaxed),
        breakdown,
    ))
}

/// Transactions per second pgbench reports for the same calls, or `None`
/// when pgbench is not installed.
fn pgbench_rate(
    url: &str,
    script: &str,
    clients: usize,
    seconds: u64,
) -> anyhow::Result<Option<f64>> {
    let run = Pgbench {
        program: Path::new("pgbench"),
        url,
        script: Path::new(script),
        clients,
        seconds,
        log_dir: None,
    }
    .run();
    match run {
        Ok(report) => Ok(Some(report.tps)),
        Err(error) if pgbench::not_found(&error) => Ok(None),
        Err(error) => Err(error),
    }
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
