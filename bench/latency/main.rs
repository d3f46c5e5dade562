//! Latency of one MCP `tools/call` on a kept-alive HTTP connection: straight
//! to the upstream, through leasegate as a read-only pass-through, and
//! through leasegate as a gated (ledger-recorded) call — in one run, against
//! the same upstream process. Numbers are reported, never asserted.
//!
//! ```text
//! cargo run --release --example bench_latency -- [calls] [admin-database-url] [callers,…] [rounds]
//! ```
//!
//! The upstream is `@modelcontextprotocol/server-everything` over Streamable
//! HTTP (installed by `.ci/run` under `target/sdk-node`, or set
//! `LEASEGATE_SERVER_EVERYTHING` to its `dist/index.js`), tool `echo`.
//! leasegate fronts it twice: as `ro` (echo read-only: pass-through) and as
//! `fx` (echo side-effecting: register+claim, call, settle; every call a new
//! intent). The ledger is the database `leasegate_bench_latency` on the
//! admin URL's server (default `postgres://postgres@127.0.0.1:5432/postgres`),
//! recreated each run. leasegate runs as users run it: `leasegate serve`
//! (the binary beside this example's directory: `cargo build --release
//! --bins` first), its own process with its own runtime;
//! `LEASEGATE_BENCH_CONFIG` adds top-level lines to its config (for
//! instance `worker_threads = 2`). One client, one connection, calls in
//! sequence.
//!
//! Then throughput:
//! for each caller count (third argument, default `8,32`), that many
//! clients, each on its own kept-alive connection, call `echo` in a loop
//! for 5 s after 1 s of warm-up, straight to the upstream and through
//! leasegate's pass-through, and the calls completed per second are
//! compared (`0`: none).
//!
//! Both are measured in rounds (fourth argument, default 3), the order of
//! the paths reversed every other round, so a machine whose speed drifts
//! during the run moves every path alike: each comparison (added p50,
//! pass-through / direct) is taken within a round, and the report gives
//! every round's and their median.

#[path = "../common/mod.rs"]
mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::stats::{self, Rank};
use leasegate::ledger::{AcquireOutcome, Fenced, Ledger, LedgerOptions, RunCreateOutcome, RunId};
use serde_json::{Value, json};

const ACCEPT: &str = "application/json, text/event-stream";

struct Endpoint {
    client: reqwest::Client,
    url: String,
    headers: Vec<(&'static str, String)>,
}

impl Endpoint {
    async fn post(&self, body: &Value) -> anyhow::Result<(reqwest::header::HeaderMap, String)> {
        let mut request = self
            .client
            .post(&self.url)
            .header("content-type", "application/json")
            .header("accept", ACCEPT)
            .header("mcp-protocol-version", "2025-11-25");
        for (name, value) in &self.headers {
            request = request.header(*name, value);
        }
        let response = request.body(body.to_string()).send().await?;
        let headers = response.headers().clone();
        let status = response.status();
        let text = response.text().await?;
        anyhow::ensure!(status.is_success(), "HTTP {status}: {text}");
        Ok((headers, text))
    }

    async fn call(&self, id: u64, tool: &str, message: &str) -> anyhow::Result<()> {
        let body = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": tool, "arguments": {"message": message}}});
        let (_, text) = self.post(&body).await?;
        anyhow::ensure!(
            text.contains(&format!("Echo: {message}")) && !text.contains("\"isError\":true"),
            "unexpected answer: {text}"
        );
        Ok(())
    }
}

const THROUGHPUT_WARMUP: Duration = Duration::from_secs(1);
const THROUGHPUT_WINDOW: Duration = Duration::from_secs(5);

/// Calls per second completed by `callers` clients calling `tool` in a loop
/// on `endpoint` (each with a connection of its own, from `client`), over
/// [`THROUGHPUT_WINDOW`] after [`THROUGHPUT_WARMUP`].
async fn throughput(
    endpoint: &Endpoint,
    tool: &str,
    callers: usize,
    client: &dyn Fn() -> reqwest::Result<reqwest::Client>,
) -> anyhow::Result<f64> {
    let start = Instant::now() + THROUGHPUT_WARMUP;
    let end = start + THROUGHPUT_WINDOW;
    let mut tasks = Vec::with_capacity(callers);
    for caller in 0..callers {
        let endpoint = Endpoint {
            client: client()?,
            url: endpoint.url.clone(),
            headers: endpoint.headers.clone(),
        };
        let tool = tool.to_owned();
        tasks.push(tokio::spawn(async move {
            let mut counted = 0u64;
            for i in 0u64.. {
                let began = Instant::now();
                if began >= end {
                    break;
                }
                endpoint.call(i, &tool, &format!("t{caller}-{i}")).await?;
                if began >= start && Instant::now() <= end {
                    counted += 1;
                }
            }
            anyhow::Ok(counted)
        }));
    }
    let mut calls = 0u64;
    for task in tasks {
        calls += task.await??;
    }
    Ok(calls as f64 / THROUGHPUT_WINDOW.as_secs_f64())
}

async fn measure(
    endpoint: &Endpoint,
    tool: &str,
    calls: usize,
    label: &str,
) -> anyhow::Result<Vec<Duration>> {
    // On a terminal: calls done of this measurement; elsewhere nothing.
    let progress = leasegate::progress::Progress::bar(
        (calls.min(200) + calls) as u64,
        &format!("{label} (warm-up, then measured)"),
    );
    // Warm up: connection, prepared statements, upstream JIT.
    for i in 0..calls.min(200) {
        endpoint
            .call(i as u64, tool, &format!("warm-{label}-{i}"))
            .await?;
        progress.inc(1);
    }
    let mut samples = Vec::with_capacity(calls);
    for i in 0..calls {
        let started = Instant::now();
        endpoint
            .call(i as u64, tool, &format!("{label}-{i}"))
            .await?;
        samples.push(started.elapsed());
        progress.inc(1);
    }
    progress.finish();
    samples.sort();
    Ok(samples)
}

/// One path's latency in one round: p50 and p99, ms.
#[derive(Clone, Copy)]
struct Latency {
    p50: f64,
    p99: f64,
}

impl Latency {
    fn of(sorted: &[Duration]) -> Self {
        Self {
            p50: stats::percentile_ms(sorted, 0.5, Rank::Round),
            p99: stats::percentile_ms(sorted, 0.99, Rank::Round),
        }
    }
}

/// The paths of the latency table, in the order of an odd round.
const PATHS: [(&str, &str); 3] = [
    ("direct", "echo"),
    ("pass", "ro__echo"),
    ("gated", "fx__echo"),
];

/// `order` reversed in every even round (1-based).
fn round_order<T: Copy>(order: &[T], round: usize) -> Vec<T> {
    let mut order = order.to_vec();
    if round.is_multiple_of(2) {
        order.reverse();
    }
    order
}

fn median_of(values: impl Iterator<Item = f64>) -> f64 {
    stats::median(&mut values.collect::<Vec<_>>())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let calls: usize = args.next().map(|s| s.parse()).transpose()?.unwrap_or(2000);
    let admin_url = args
        .next()
        .unwrap_or_else(|| "postgres://postgres@127.0.0.1:5432/postgres".to_owned());
    let caller_counts: Vec<usize> = args
        .next()
        .unwrap_or_else(|| "8,32".to_owned())
        .split(',')
        .map(|c| c.trim().parse())
        .collect::<Result<Vec<usize>, _>>()?
        .into_iter()
        .filter(|&c| c > 0) // "0": no throughput section
        .collect();
    let rounds: usize = args.next().map(|s| s.parse()).transpose()?.unwrap_or(3);
    anyhow::ensure!(rounds > 0, "rounds must be at least 1");
    let url = common::database::with_database(&admin_url, "leasegate_bench_latency");
    common::database::recreate(&url).await?;
    Ledger::migrate(&url).await?;

    // The upstream: server-everything over Streamable HTTP.
    let everything = std::env::var_os("LEASEGATE_SERVER_EVERYTHING")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(
                "target/sdk-node/node_modules/@modelcontextprotocol/server-everything/dist/index.js",
            )
        });
    anyhow::ensure!(
        everything.exists(),
        "server-everything not found at {}",
        everything.display()
    );
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let mut upstream = tokio::process::Command::new("node")
        .arg(&everything)
        .arg("streamableHttp")
        .env("PORT", port.to_string())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    let upstream_url = format!("http://127.0.0.1:{port}/mcp");
    let deadline = Instant::now() + Duration::from_secs(30);
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        anyhow::ensure!(Instant::now() < deadline, "server-everything did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // leasegate in front of it.
    let dir =
        std::env::temp_dir().join(format!("leasegate-bench-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(dir.join("adapters"))?;
    std::fs::create_dir_all(dir.join("policies"))?;
    std::fs::write(dir.join("policies/bench.toml"), "claim_ttl = \"60s\"\n")?;
    std::fs::write(
        dir.join("adapters/ro.toml"),
        "upstream = \"ro\"\n[tools.echo]\nread_only = true\n",
    )?;
    std::fs::write(
        dir.join("adapters/fx.toml"),
        "upstream = \"fx\"\n[tools.echo]\ncapability = \"none\"\n",
    )?;
    // Extra top-level lines of the served config (`worker_threads = 2`).
    let extra = std::env::var("LEASEGATE_BENCH_CONFIG").unwrap_or_default();
    std::fs::write(
        dir.join("leasegate.toml"),
        format!(
            r#"database_url = "{url}"
tenant = "bench"
listen = "127.0.0.1:0"
control_listen = "off"
adapters = "adapters"
policy = "policies/bench.toml"
migrate = false
{extra}

[upstreams.ro]
transport = "streamable_http"
url = "{upstream_url}"

[upstreams.fx]
transport = "streamable_http"
url = "{upstream_url}"
"#
        ),
    )?;
    // The `leasegate` binary beside this example's directory, served as a
    // user runs it (its own process and runtime, not this one's).
    let binary = std::env::current_exe()?
        .parent()
        .and_then(|examples| examples.parent())
        .map(|profile| profile.join("leasegate"))
        .filter(|binary| binary.exists())
        .ok_or_else(|| {
            anyhow::anyhow!("no leasegate binary beside this example: cargo build --release --bins")
        })?;
    let mut served = tokio::process::Command::new(&binary)
        .arg("serve")
        .arg("--config")
        .arg(dir.join("leasegate.toml"))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let front_url = {
        use tokio::io::AsyncBufReadExt as _;
        let mut lines = tokio::io::BufReader::new(served.stderr.take().expect("piped")).lines();
        let mut log = Vec::new();
        let url = tokio::time::timeout(Duration::from_secs(60), async {
            while let Some(line) = lines.next_line().await? {
                if let Some(url) = line.strip_prefix("leasegate: serving MCP at ") {
                    return anyhow::Ok(url.to_owned());
                }
                log.push(line);
            }
            anyhow::bail!("leasegate serve exited:\n{}", log.join("\n"))
        })
        .await
        .map_err(|_| anyhow::anyhow!("leasegate serve did not listen within 60 s"))??;
        // Keep reading its log so that it never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        url
    };

    // A leased run for the gated calls.
    let ledger = Ledger::connect(&url, LedgerOptions::default()).await?;
    let run_id = RunId::generate();
    let owner = "bench-agent";
    match ledger.run_create(run_id, "bench", "latency", None).await? {
        RunCreateOutcome::Created(_) => {}
        other => anyhow::bail!("run_create: {other:?}"),
    }
    let grant = match ledger.lease_acquire(run_id, owner, 600_000).await? {
        AcquireOutcome::Acquired(grant) => grant,
        other => anyhow::bail!("lease_acquire: {other:?}"),
    };
    if let Fenced::Rejected(rejection) = ledger.run_start(&grant.claim, grant.revision).await? {
        anyhow::bail!("run_start: {rejection}");
    }
    let epoch = grant.claim.epoch.to_string();
    let lease_token = grant
        .claim
        .token
        .as_ref()
        .map(|token| token.expose().to_owned())
        .unwrap_or_default();

    // One kept-alive connection per client (reqwest pools and reuses it).
    let client = || {
        reqwest::Client::builder()
            .pool_max_idle_per_host(1)
            .tcp_nodelay(true)
            .build()
    };
    // server-everything keeps sessions: initialize once, then call.
    let mut direct = Endpoint {
        client: client()?,
        url: upstream_url.clone(),
        headers: Vec::new(),
    };
    let (headers, _) = direct
        .post(
            &json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "bench", "version": "0"}}}),
        )
        .await?;
    let session = headers
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| anyhow::anyhow!("server-everything gave no session id"))?
        .to_owned();
    direct.headers.push(("mcp-session-id", session));
    direct
        .post(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        .await?;
    let pass_through = Endpoint {
        client: client()?,
        url: front_url.clone(),
        headers: Vec::new(),
    };
    let gated = Endpoint {
        client: client()?,
        url: front_url.clone(),
        headers: vec![
            ("leasegate-run-id", run_id.to_string()),
            ("leasegate-owner", owner.to_owned()),
            ("leasegate-epoch", epoch),
            ("leasegate-lease-token", lease_token),
        ],
    };

    let endpoints = [&direct, &pass_through, &gated];
    // latencies[round][path], paths in PATHS order.
    let mut latencies = Vec::with_capacity(rounds);
    for round in 1..=rounds {
        let mut row = [Latency { p50: 0.0, p99: 0.0 }; 3];
        for path in round_order(&[0, 1, 2], round) {
            let (label, tool) = PATHS[path];
            let label = format!("{label} (round {round} of {rounds})");
            row[path] = Latency::of(&measure(endpoints[path], tool, calls, &label).await?);
        }
        latencies.push(row);
    }

    println!(
        "\n{calls} sequential tools/call (echo) per path and round, one kept-alive HTTP/1.1 \
         connection, after {} warm-up calls; {rounds} rounds, the paths' order reversed every \
         other round; ms\n",
        calls.min(200)
    );
    println!(
        "| round | direct p50 | pass-through p50 | gated p50 | pass-through added p50 | gated added p50 | direct p99 | pass-through p99 | gated p99 |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    let cells = |row: &[Latency; 3]| {
        [
            row[0].p50,
            row[1].p50,
            row[2].p50,
            row[1].p50 - row[0].p50,
            row[2].p50 - row[0].p50,
            row[0].p99,
            row[1].p99,
            row[2].p99,
        ]
    };
    let print_row = |name: &str, values: [f64; 8]| {
        let [d, p, g, pa, ga, d99, p99, g99] = values;
        println!(
            "| {name} | {d:.3} | {p:.3} | {g:.3} | {pa:+.3} | {ga:+.3} | {d99:.3} | {p99:.3} | {g99:.3} |"
        );
    };
    for (round, row) in latencies.iter().enumerate() {
        print_row(&(round + 1).to_string(), cells(row));
    }
    if rounds > 1 {
        let medians: [f64; 8] =
            std::array::from_fn(|column| median_of(latencies.iter().map(|row| cells(row)[column])));
        print_row("median", medians);
    }

    if !caller_counts.is_empty() {
        println!(
            "\nthroughput: each caller on its own kept-alive connection, echo in a loop, {} s \
             measured after {} s of warm-up, direct and pass-through alternating ({rounds} \
             rounds, the first path reversed every other round)\n",
            THROUGHPUT_WINDOW.as_secs(),
            THROUGHPUT_WARMUP.as_secs()
        );
        println!(
            "| callers | round | server-everything directly, calls/s | leasegate pass-through, calls/s | pass-through / direct |"
        );
        println!("|---|---|---|---|---|");
        for &callers in &caller_counts {
            let mut ratios = Vec::with_capacity(rounds);
            for round in 1..=rounds {
                let mut rates = [0.0; 2];
                for path in round_order(&[0, 1], round) {
                    let (_, tool) = PATHS[path];
                    rates[path] = throughput(endpoints[path], tool, callers, &client).await?;
                }
                let [direct_rate, pass_rate] = rates;
                ratios.push(pass_rate / direct_rate);
                println!(
                    "| {callers} | {round} | {direct_rate:.0} | {pass_rate:.0} | {:.2} |",
                    pass_rate / direct_rate
                );
            }
            if rounds > 1 {
                println!(
                    "| {callers} | median | | | {:.2} |",
                    stats::median(&mut ratios)
                );
            }
        }
    }

    let _ = served.kill().await;
    ledger.close().await;
    let _ = upstream.kill().await;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
