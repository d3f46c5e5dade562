//! The gateway benchmark's harness, shared by
//! `bench/gateway/main.rs` and `tests/external/bench_gateway.rs`.
//!
//! One run measures, side by side on one machine and one PostgreSQL server:
//!
//! * MCP `tools/call` through a `leasegate serve` child process over
//!   kept-alive HTTP/1.1 connections (one per caller) at each caller count:
//!   **gated** (a new intent every call, under explicit leases of
//!   [`RUNS`] pre-created runs), **pass-through** (a read-only tool) and
//!   **replay** (the same intent again); a fixed measured window per cell
//!   after a warm-up that is not counted;
//! * pgbench at the same caller counts and window with the **minimal
//!   ceiling** (`bench/ceiling/`: the seed's schema, `register_and_claim` +
//!   a settle UPDATE) and with **leasegate's own SQL**
//!   (`bench/leasegate/register_claim_settle.sql`);
//! * lease renewal: single renew through the control API next to pgbench
//!   running leasegate's `lease_renew` and the ceiling's `renew.sql`, the
//!   ceiling's batch renewal, and leasegate's batch endpoint
//!   ([`batch_renewal_through_leasegate`]);
//! * database round trips per call: a second `leasegate serve` whose ledger
//!   URL points at a counting TCP proxy in this process ([`CountingProxy`]:
//!   frontend `Sync` and simple `Query` messages, [`FrontendCounter`]);
//! * leasegate's resident memory (`VmRSS`): idle, per idle MCP session (a
//!   third child with `http_sessions = true`), per in-flight call, and
//!   across repeated cells;
//! * where the machine's CPU goes in every leasegate and pgbench hot-path
//!   cell, per call: PostgreSQL, leasegate, its upstream, the load
//!   generator, the rest ([`cpu`]): on a machine where all of them share
//!   the cores, this is what bounds a ratio to the ceiling.
//!
//! Numbers are reported, never asserted. Every answer is checked (a gated
//! call must be a fresh `succeeded` operation, a replay `replayed: true`, a
//! pass-through the tool's own answer); the first wrong answer ends the run
//! with it.
//!
//! # Databases
//!
//! `<prefix>` (the served ledger), `<prefix>_sql` (pgbench on leasegate's
//! SQL) and `<prefix>_ceiling` (pgbench on the ceiling schema), created on the
//! admin URL's server at the start (dropped first if they exist) and dropped
//! at the end. If the harness dies midway they stay, and the next run drops
//! them.
//!
//! # Children
//!
//! Every `leasegate serve` is spawned with `kill_on_drop` and stopped with
//! SIGTERM (then killed after a deadline); it stops its own upstream
//! children. A harness killed with SIGKILL leaves them to the kernel's
//! reparenting: they exit when their stdin closes.

// Shared by the example and tests/external/bench_gateway.rs: each uses part of it.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow, bail, ensure};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _};

// `tests/external` includes both the gateway and the chaos harness, so it
// holds this module twice, one copy in each.
#[allow(clippy::duplicate_mod)]
#[path = "../common/mod.rs"]
mod common;
#[path = "cpu.rs"]
pub mod cpu;

use common::database::{self, with_database};
use common::pgbench::{self as pgbench_run, Pgbench};
use common::stats::{self, Rank};

/// Leased runs the gated and replay callers share (caller `c` uses run `c % RUNS`).
pub const RUNS: usize = 64;
/// The lease ttl of the benchmark's runs and of every renewal (leasegate's
/// ceiling): [`KeepAlive`] renews the served leases every minute, and the
/// pgbench ledger's leases are extended before each pgbench run.
const LEASE_TTL_MS: i64 = 600_000;
const OWNER_PREFIX: &str = "bench-";
const ACCEPT: &str = "application/json, text/event-stream";
const PROTOCOL: &str = "2025-11-25";

const CEILING_SCHEMA: &str = include_str!("../ceiling/schema.sql");
const CEILING_FN: &str = include_str!("../ceiling/fn.sql");
const CEILING_HOTPATH: &str = include_str!("../ceiling/hotpath_fn.sql");
const CEILING_RENEW: &str = include_str!("../ceiling/renew.sql");
const CEILING_RENEW_BATCH: &str = include_str!("../ceiling/renew_batch.sql");
/// Leases one statement of `renew_batch.sql` renews.
const CEILING_BATCH_SIZE: f64 = 100.0;
const LEASEGATE_HOTPATH: &str = include_str!("../leasegate/register_claim_settle.sql");
const LEASEGATE_RENEW: &str = include_str!("../leasegate/renew.sql");

/// Which upstream leasegate fronts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UpstreamChoice {
    /// server-everything when node and its install are found, else the example tools.
    Auto,
    /// `@modelcontextprotocol/server-everything` (`dist/index.js`) over stdio, tool `echo`.
    Everything(Option<PathBuf>),
    /// `leasegate-example-tools --tools jobs` over stdio, tool `get_job`.
    ExampleTools,
}

/// What one run does.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The `leasegate` binary to serve with.
    pub leasegate: PathBuf,
    /// `leasegate-example-tools`, the fallback upstream.
    pub example_tools: PathBuf,
    /// A database on the server to use (its name is replaced).
    pub admin_url: String,
    /// Names of the databases (`<prefix>`, `<prefix>_sql`, `<prefix>_ceiling`).
    pub db_prefix: String,
    pub callers: Vec<usize>,
    /// The measured window of every cell (and pgbench's `-T`, in whole seconds, at least 1).
    pub duration: Duration,
    /// Calls before the measured window, not counted.
    pub warmup: Duration,
    /// Repetitions of the sweep; the table shows medians.
    pub repeat: usize,
    pub upstream: UpstreamChoice,
    /// leasegate's `database_max_connections`.
    pub db_pool: u32,
    /// leasegate's `group_commit`: register-claims and settles
    /// of concurrent calls share statements and commits.
    pub group_commit: bool,
    /// More top-level lines of the served config (`key = value`, e.g.
    /// `group_commit_in_flight = 2`), written after the harness's own.
    pub config_lines: Vec<String>,
    /// Idle MCP sessions opened for the per-session memory.
    pub sessions: usize,
    /// Gated cells at the largest caller count after the sweep (steady-state memory).
    pub growth_cells: usize,
    /// Fresh runs whose first call is counted (round trips of a run's first call).
    pub first_calls: usize,
    /// Callers of the renewal section.
    pub renew_callers: usize,
    /// Worker hosts of the batch renewal row, posting at once, each
    /// renewing [`Settings::batch_leases`] leases of its own per call.
    pub batch_hosts: usize,
    pub batch_leases: usize,
    /// How long an idle leasegate's background round trips are counted.
    pub background_window: Duration,
    /// `pgbench`; `None`: looked up on `PATH`, then `/usr/lib/postgresql/<newest>/bin`.
    pub pgbench: Option<PathBuf>,
    /// Print progress lines on stderr.
    pub verbose: bool,
}

impl Settings {
    /// The full benchmark: 1/8/32/64 callers, 10 s cells after 2 s of warm-up.
    pub fn full(leasegate: PathBuf, example_tools: PathBuf) -> Self {
        Self {
            leasegate,
            example_tools,
            admin_url: "postgres://postgres@127.0.0.1:5432/postgres".to_owned(),
            db_prefix: "bench_gateway".to_owned(),
            callers: vec![1, 8, 32, 64],
            duration: Duration::from_secs(10),
            warmup: Duration::from_secs(2),
            repeat: 1,
            upstream: UpstreamChoice::Auto,
            db_pool: 20,
            group_commit: false,
            config_lines: Vec::new(),
            sessions: 1000,
            growth_cells: 3,
            first_calls: RUNS,
            renew_callers: 32,
            batch_hosts: 4,
            batch_leases: 10_000,
            background_window: Duration::from_secs(10),
            pgbench: None,
            verbose: true,
        }
    }

    /// A smoke run: 1 and 8 callers, 1 s cells, a few sessions.
    pub fn quick(leasegate: PathBuf, example_tools: PathBuf) -> Self {
        Self {
            callers: vec![1, 8],
            duration: Duration::from_secs(1),
            warmup: Duration::from_millis(300),
            sessions: 20,
            growth_cells: 2,
            first_calls: 8,
            renew_callers: 8,
            batch_hosts: 2,
            batch_leases: 50,
            background_window: Duration::from_secs(2),
            ..Self::full(leasegate, example_tools)
        }
    }
}

// ---------------------------------------------------------------------------
// Round trips: the PostgreSQL frontend protocol, counted on the wire.

/// Counts, in the bytes a PostgreSQL client sends, the messages that end a
/// round trip: `Sync` (`S`, the end of an extended-protocol exchange: one
/// per prepared statement executed, or per pipeline), simple `Query` (`Q`)
/// and the legacy `FunctionCall` (`F`). Startup, SSL and GSS requests (no
/// type byte) and authentication are skipped. Bytes may arrive split
/// anywhere; [`FrontendCounter::feed`] keeps the partial header.
///
/// It also attributes work to SQL text: each `Execute` (`E`) to the
/// statement its `Bind` named (as the `Parse` that prepared it on this
/// connection said, first [`STATEMENT_PREFIX`] bytes), each simple query to
/// its text (`executions`).
///
/// TLS cannot be read: the proxied URL says `sslmode=disable`.
#[derive(Debug, Default)]
pub struct FrontendCounter {
    /// After the StartupMessage: every message has a type byte.
    typed: bool,
    header: Vec<u8>,
    /// The current message's type, when its body is kept (`P`, `B`, `Q`).
    kept_type: Option<u8>,
    /// The start of the current message's body, for `P`, `B` and `Q`.
    body: Vec<u8>,
    /// Bytes of the current message's body still to come.
    remaining: usize,
    /// Prepared statement name → its SQL text (this connection's).
    statements: std::collections::HashMap<String, String>,
    /// The SQL text of the statement last bound.
    bound: Option<String>,
    /// Since the last `Sync`: a `Parse` seen, an `Execute` seen.
    parsed: bool,
    executed: bool,
    pub round_trips: u64,
    pub messages: u64,
    /// SQL text → executions (extended protocol) or simple queries.
    pub executions: BTreeMap<String, u64>,
}

/// [`FrontendCounter::executions`]' name for a `Sync` that ends a `Parse`
/// without an `Execute`: a statement prepared (sqlx: once per connection).
pub const PREPARE: &str = "(Parse + Sync: a statement prepared)";
/// … and for a `Sync` with nothing before it: a connection check (sqlx's
/// pool pings every connection it hands out, `test_before_acquire`).
pub const SYNC_ALONE: &str =
    "(Sync alone: a connection check, e.g. sqlx's test_before_acquire ping)";

/// How much of a statement's text names it in [`FrontendCounter::executions`].
pub const STATEMENT_PREFIX: usize = 120;

impl FrontendCounter {
    const SSL_REQUEST: u32 = 80_877_103;
    const GSS_REQUEST: u32 = 80_877_104;
    /// Body bytes kept of a `P`, `B` or `Q` message (names and the SQL's start).
    const KEEP: usize = 1024;

    /// Reads `bytes`, the next piece of the client's stream.
    pub fn feed(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            if self.remaining > 0 {
                let n = self.remaining.min(bytes.len());
                if self.kept_type.is_some() {
                    let room = Self::KEEP.saturating_sub(self.body.len()).min(n);
                    self.body.extend_from_slice(&bytes[..room]);
                }
                self.remaining -= n;
                bytes = &bytes[n..];
                if self.remaining == 0 {
                    self.end_of_message();
                }
                continue;
            }
            // Untyped: length (4) + code (4); typed: type (1) + length (4).
            let need = if self.typed { 5 } else { 8 };
            let n = (need - self.header.len()).min(bytes.len());
            self.header.extend_from_slice(&bytes[..n]);
            bytes = &bytes[n..];
            if self.header.len() < need {
                return;
            }
            self.messages += 1;
            if self.typed {
                let kind = self.header[0];
                let length = u32::from_be_bytes(self.header[1..5].try_into().unwrap()) as usize;
                if matches!(kind, b'S' | b'Q' | b'F') {
                    self.round_trips += 1;
                }
                match kind {
                    b'P' => self.parsed = true,
                    b'E' => {
                        self.executed = true;
                        if let Some(sql) = &self.bound {
                            *self.executions.entry(sql.clone()).or_default() += 1;
                        }
                    }
                    b'S' => {
                        // A Sync that ends no execution is a round trip of its own.
                        if !self.executed {
                            let what = if self.parsed { PREPARE } else { SYNC_ALONE };
                            *self.executions.entry(what.to_owned()).or_default() += 1;
                        }
                        (self.parsed, self.executed) = (false, false);
                    }
                    _ => {}
                }
                self.kept_type = matches!(kind, b'P' | b'B' | b'Q').then_some(kind);
                self.remaining = length.saturating_sub(4);
            } else {
                let length = u32::from_be_bytes(self.header[0..4].try_into().unwrap()) as usize;
                let code = u32::from_be_bytes(self.header[4..8].try_into().unwrap());
                // A StartupMessage (a protocol version) ends the untyped part;
                // an SSL or GSS request is followed by another untyped message.
                self.typed = code != Self::SSL_REQUEST && code != Self::GSS_REQUEST;
                self.kept_type = None;
                self.remaining = length.saturating_sub(8);
            }
            self.header.clear();
            if self.remaining == 0 {
                self.end_of_message();
            }
        }
    }

    fn end_of_message(&mut self) {
        let body = std::mem::take(&mut self.body);
        let mut fields = body.split(|&b| b == 0);
        let text =
            |bytes: Option<&[u8]>| String::from_utf8_lossy(bytes.unwrap_or_default()).into_owned();
        match self.kept_type.take() {
            Some(b'P') => {
                let name = text(fields.next());
                let sql = statement_key(&text(fields.next()));
                self.statements.insert(name, sql);
            }
            Some(b'B') => {
                let _portal = fields.next();
                let name = text(fields.next());
                self.bound = self.statements.get(&name).cloned();
            }
            Some(b'Q') => {
                let sql = statement_key(&text(fields.next()));
                *self.executions.entry(sql).or_default() += 1;
            }
            _ => {}
        }
    }
}

/// SQL text with its whitespace folded, cut to [`STATEMENT_PREFIX`] bytes.
fn statement_key(sql: &str) -> String {
    let folded = sql.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut end = folded.len().min(STATEMENT_PREFIX);
    while !folded.is_char_boundary(end) {
        end -= 1;
    }
    folded[..end].to_owned()
}

/// A TCP proxy to PostgreSQL that counts, over all its connections, the
/// round trips clients start ([`FrontendCounter`]). Connections are relayed
/// with `TCP_NODELAY` on both sides; it lives as long as its tasks.
pub struct CountingProxy {
    pub port: u16,
    round_trips: Arc<AtomicU64>,
    /// SQL text → executions, over all connections.
    executions: Arc<Mutex<BTreeMap<String, u64>>>,
    accept: tokio::task::JoinHandle<()>,
}

impl CountingProxy {
    pub async fn start(target: (String, u16)) -> anyhow::Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let round_trips = Arc::new(AtomicU64::new(0));
        let executions = Arc::new(Mutex::new(BTreeMap::new()));
        let counted = round_trips.clone();
        let executed = executions.clone();
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let target = target.clone();
                let counted = counted.clone();
                let executed = executed.clone();
                tokio::spawn(async move {
                    let Ok(server) =
                        tokio::net::TcpStream::connect((target.0.as_str(), target.1)).await
                    else {
                        return;
                    };
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    let (mut client_read, mut client_write) = client.into_split();
                    let (mut server_read, mut server_write) = server.into_split();
                    let upstream = async move {
                        let mut counter = FrontendCounter::default();
                        let mut buffer = vec![0u8; 64 * 1024];
                        loop {
                            let n = match client_read.read(&mut buffer).await {
                                Ok(0) | Err(_) => break,
                                Ok(n) => n,
                            };
                            let before = counter.round_trips;
                            counter.feed(&buffer[..n]);
                            if !counter.executions.is_empty() {
                                let mut executed = executed.lock().unwrap();
                                for (sql, count) in std::mem::take(&mut counter.executions) {
                                    *executed.entry(sql).or_default() += count;
                                }
                            }
                            counted.fetch_add(counter.round_trips - before, Ordering::Relaxed);
                            if server_write.write_all(&buffer[..n]).await.is_err() {
                                break;
                            }
                        }
                        let _ = server_write.shutdown().await;
                    };
                    let downstream = async move {
                        let _ = tokio::io::copy(&mut server_read, &mut client_write).await;
                        let _ = client_write.shutdown().await;
                    };
                    tokio::join!(upstream, downstream);
                });
            }
        });
        Ok(Self {
            port,
            round_trips,
            executions,
            accept,
        })
    }

    /// Round trips counted so far.
    pub fn count(&self) -> u64 {
        self.round_trips.load(Ordering::Relaxed)
    }

    /// Executions per SQL text so far.
    pub fn executions(&self) -> BTreeMap<String, u64> {
        self.executions.lock().unwrap().clone()
    }
}

impl Drop for CountingProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

// ---------------------------------------------------------------------------
// Databases and the machine.

/// Host and port of a `postgres://` URL (defaults 127.0.0.1 and 5432).
pub fn host_port(url: &str) -> anyhow::Result<(String, u16)> {
    let rest = url
        .split_once("://")
        .map(|(_, rest)| rest)
        .ok_or_else(|| anyhow!("not a URL: {url}"))?;
    let authority = rest.split(['/', '?']).next().unwrap_or_default();
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, hp)| hp);
    let (host, port) = match host_port.rsplit_once(':') {
        Some((host, port)) if !host.ends_with(']') || host.starts_with('[') => {
            (host, port.parse().context("the URL's port")?)
        }
        _ => (host_port, 5432),
    };
    let host = if host.is_empty() { "127.0.0.1" } else { host };
    Ok((host.trim_matches(['[', ']']).to_owned(), port))
}

fn run_id_of(client: usize) -> leasegate::ledger::RunId {
    format!("00000000-0000-7000-8000-{client:012}")
        .parse()
        .expect("a valid uuid")
}

/// The seed's schema, the ceiling's function and its 1,000 leased runs.
async fn setup_ceiling(url: &str) -> anyhow::Result<()> {
    use sqlx::Connection as _;
    let mut connection = sqlx::PgConnection::connect(url).await?;
    sqlx::raw_sql("SET client_min_messages = warning")
        .execute(&mut connection)
        .await?;
    sqlx::raw_sql(CEILING_SCHEMA)
        .execute(&mut connection)
        .await?;
    sqlx::raw_sql(CEILING_FN).execute(&mut connection).await?;
    connection.close().await?;
    Ok(())
}

/// leasegate's ledger with [`RUNS`] runs `00000000-0000-7000-8000-<n>` leased
/// by `bench-<n>` at epoch 1 (as `bench/operations` does).
async fn setup_leasegate_sql(url: &str) -> anyhow::Result<()> {
    use leasegate::ledger::{InitialLease, Ledger, LedgerOptions, RunCreateOutcome};
    Ledger::migrate(url).await?;
    let ledger = Ledger::connect(url, LedgerOptions::default()).await?;
    for client in 0..RUNS {
        let owner = format!("{OWNER_PREFIX}{client}");
        let created = ledger
            .run_create(
                run_id_of(client),
                "bench",
                &format!("task-{client}"),
                Some(InitialLease {
                    owner: &owner,
                    ttl_ms: LEASE_TTL_MS,
                }),
            )
            .await?;
        ensure!(
            matches!(created, RunCreateOutcome::Created(_)),
            "run {client}: {created:?}"
        );
    }
    ledger.close().await;
    Ok(())
}

/// What the run was measured on.
#[derive(Clone, Debug, Default)]
pub struct Environment {
    pub date: String,
    pub cores: usize,
    pub cpu_model: String,
    pub ram: String,
    pub server_version: String,
    /// `name = setting[unit]` of the settings that matter for commit cost.
    pub settings: Vec<(String, String)>,
    pub upstream: String,
    pub leasegate: String,
    pub pgbench: String,
    /// `/proc/loadavg`'s 1/5/15-minute load at the start and at the end (a shared machine is noisy).
    pub load_start: String,
    pub load_end: String,
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|text| {
            text.split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_else(|_| "unknown".to_owned())
}

async fn environment(admin_url: &str) -> anyhow::Result<Environment> {
    use sqlx::Connection as _;
    let mut connection = sqlx::PgConnection::connect(admin_url).await?;
    let server_version: String = sqlx::query_scalar("SHOW server_version")
        .fetch_one(&mut connection)
        .await?;
    let settings: Vec<(String, String)> = sqlx::query_as(
        "SELECT name, setting || coalesce(' ' || unit, '') FROM pg_settings
          WHERE name IN ('synchronous_commit', 'fsync', 'shared_buffers', 'wal_sync_method',
                         'commit_delay', 'max_connections', 'full_page_writes', 'wal_level')
          ORDER BY name",
    )
    .fetch_all(&mut connection)
    .await?;
    connection.close().await?;
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu_model = cpuinfo
        .lines()
        .find_map(|line| line.strip_prefix("model name"))
        .and_then(|rest| rest.split_once(':'))
        .map(|(_, model)| model.trim().to_owned())
        .unwrap_or_else(|| "unknown".to_owned());
    let ram = std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|line| line.strip_prefix("MemTotal:"))
        .and_then(|rest| rest.split_whitespace().next()?.parse::<f64>().ok())
        .map(|kib| format!("{:.1} GiB", kib / 1024.0 / 1024.0))
        .unwrap_or_else(|| "unknown".to_owned());
    Ok(Environment {
        date: chrono::Utc::now().format("%Y-%m-%d %H:%M UTC").to_string(),
        cores: std::thread::available_parallelism().map_or(0, |n| n.get()),
        cpu_model,
        ram,
        server_version,
        settings,
        load_start: load_average(),
        ..Environment::default()
    })
}

// ---------------------------------------------------------------------------
// The upstream and leasegate as a child process.

/// The tool calls of the chosen upstream: exposed names and a check of the answer.
#[derive(Clone, Debug)]
struct Tools {
    description: String,
    /// Side-effecting (`capability = "none"`) under the upstream `fx`.
    gated: &'static str,
    /// The same tool read-only under the upstream `ro`.
    pass_through: &'static str,
    everything: bool,
}

impl Tools {
    fn arguments(&self, unique: &str) -> Value {
        if self.everything {
            json!({ "message": unique })
        } else {
            json!({ "job_id": unique })
        }
    }

    /// Whether `answer` is the tool's answer to `unique`.
    fn answered(&self, answer: &str, unique: &str) -> bool {
        if self.everything {
            answer.contains(&format!("Echo: {unique}"))
        } else {
            answer.contains("\"found\":false")
        }
    }
}

/// The upstream's config lines (`[upstreams.ro]`, `[upstreams.fx]`) and adapters.
struct UpstreamConfig {
    tools: Tools,
    toml: String,
    adapter_ro: String,
    adapter_fx: String,
}

fn upstream_config(settings: &Settings, state: &Path) -> anyhow::Result<UpstreamConfig> {
    let everything = match &settings.upstream {
        UpstreamChoice::ExampleTools => None,
        UpstreamChoice::Everything(path) => Some(
            path.clone()
                .or_else(default_server_everything)
                .ok_or_else(|| anyhow!("server-everything not found (see docs/benchmarks.md)"))?,
        ),
        UpstreamChoice::Auto => default_server_everything().filter(|_| node_available()),
    };
    Ok(match everything {
        Some(entry) => {
            let stdio = format!(
                "transport = \"stdio\"\ncommand = \"node\"\nargs = [{:?}, \"stdio\"]\n",
                entry.display().to_string()
            );
            UpstreamConfig {
                tools: Tools {
                    description: format!(
                        "@modelcontextprotocol/server-everything `echo` over stdio ({})",
                        entry.display()
                    ),
                    gated: "fx__echo",
                    pass_through: "ro__echo",
                    everything: true,
                },
                toml: format!("[upstreams.ro]\n{stdio}\n[upstreams.fx]\n{stdio}"),
                adapter_ro: "upstream = \"ro\"\n[tools.echo]\nread_only = true\n".to_owned(),
                adapter_fx: "upstream = \"fx\"\n[tools.echo]\ncapability = \"none\"\n".to_owned(),
            }
        }
        None => {
            let stdio = format!(
                "transport = \"stdio\"\ncommand = {:?}\nargs = [\"--tools\", \"jobs\", \"--state-dir\", {:?}]\n",
                settings.example_tools.display().to_string(),
                state.display().to_string()
            );
            UpstreamConfig {
                tools: Tools {
                    description:
                        "leasegate-example-tools `get_job` over stdio (no server-everything)"
                            .to_owned(),
                    gated: "fx__get_job",
                    pass_through: "ro__get_job",
                    everything: false,
                },
                toml: format!("[upstreams.ro]\n{stdio}\n[upstreams.fx]\n{stdio}"),
                adapter_ro: "upstream = \"ro\"\n[tools.get_job]\nread_only = true\n".to_owned(),
                adapter_fx: "upstream = \"fx\"\n[tools.get_job]\ncapability = \"none\"\n"
                    .to_owned(),
            }
        }
    })
}

/// `LEASEGATE_SERVER_EVERYTHING`, else the suite's install under `target/sdk-node`.
fn default_server_everything() -> Option<PathBuf> {
    std::env::var_os("LEASEGATE_SERVER_EVERYTHING")
        .map(PathBuf::from)
        .or_else(|| {
            Some(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(
                "target/sdk-node/node_modules/@modelcontextprotocol/server-everything/dist/index.js",
            ))
        })
        .filter(|path| path.is_file())
}

fn node_available() -> bool {
    std::process::Command::new("node")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

/// How one `leasegate serve` child is configured.
struct ServeOptions<'a> {
    name: &'a str,
    database_url: String,
    control: bool,
    http_sessions: bool,
}

/// A `leasegate serve` child: its listeners and its pid (for `VmRSS`).
struct Served {
    child: tokio::process::Child,
    mcp: String,
    /// Base URL without `/v1`; empty with the control API off.
    control: String,
    /// The last lines it logged (for a failure's message).
    log: Arc<Mutex<Vec<String>>>,
    dir: PathBuf,
    /// The ledger it serves.
    database_url: String,
}

impl Served {
    async fn start(
        settings: &Settings,
        upstream: &UpstreamConfig,
        options: ServeOptions<'_>,
    ) -> anyhow::Result<Self> {
        let dir = std::env::temp_dir().join(format!(
            "leasegate-bench-gateway-{}-{}",
            options.name,
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::create_dir_all(dir.join("adapters"))?;
        std::fs::create_dir_all(dir.join("policies"))?;
        std::fs::write(dir.join("policies/bench.toml"), "claim_ttl = \"60s\"\n")?;
        std::fs::write(dir.join("adapters/ro.toml"), &upstream.adapter_ro)?;
        std::fs::write(dir.join("adapters/fx.toml"), &upstream.adapter_fx)?;
        let config = format!(
            r#"database_url = "{url}"
database_max_connections = {pool}
group_commit = {group_commit}
tenant = "bench"
listen = "127.0.0.1:0"
control_listen = "{control}"
adapters = "adapters"
policy = "policies/bench.toml"
migrate = false
http_sessions = {sessions}
{extra}
[limits]
max_sessions = {max_sessions}

{upstreams}"#,
            url = options.database_url,
            pool = settings.db_pool,
            group_commit = settings.group_commit,
            control = if options.control {
                "127.0.0.1:0"
            } else {
                "off"
            },
            sessions = options.http_sessions,
            extra = settings
                .config_lines
                .iter()
                .map(|line| format!("{line}\n"))
                .collect::<String>(),
            max_sessions = settings.sessions.max(1000) + 100,
            upstreams = upstream.toml,
        );
        std::fs::write(dir.join("leasegate.toml"), config)?;
        let mut child = tokio::process::Command::new(&settings.leasegate)
            .arg("serve")
            .arg("--config")
            .arg(dir.join("leasegate.toml"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("spawn {}", settings.leasegate.display()))?;
        let mut lines = tokio::io::BufReader::new(child.stderr.take().expect("piped")).lines();
        let log = Arc::new(Mutex::new(Vec::new()));
        let (mut mcp, mut control) = (None, None);
        let started = tokio::time::timeout(Duration::from_secs(120), async {
            while mcp.is_none() || (options.control && control.is_none()) {
                let Some(line) = lines.next_line().await? else {
                    bail!(
                        "leasegate serve ({}) exited:\n{}",
                        options.name,
                        log.lock().unwrap().join("\n")
                    );
                };
                if let Some(url) = line.strip_prefix("leasegate: serving MCP at ") {
                    mcp = Some(url.to_owned());
                }
                if let Some(url) = line.strip_prefix("leasegate: control API at ") {
                    control = Some(url.trim_end_matches("/v1").to_owned());
                }
                log.lock().unwrap().push(line);
            }
            anyhow::Ok(())
        })
        .await;
        match started {
            Ok(result) => result?,
            Err(_) => bail!(
                "leasegate serve ({}) did not listen within 120 s:\n{}",
                options.name,
                log.lock().unwrap().join("\n")
            ),
        }
        let kept = log.clone();
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                let mut log = kept.lock().unwrap();
                if log.len() >= 200 {
                    log.drain(..100);
                }
                log.push(line);
            }
        });
        Ok(Self {
            child,
            mcp: mcp.expect("announced"),
            control: control.unwrap_or_default(),
            log,
            dir,
            database_url: options.database_url.clone(),
        })
    }

    /// Resident memory in KiB (`VmRSS` of `/proc/<pid>/status`).
    fn rss_kib(&self) -> anyhow::Result<u64> {
        let pid = self.child.id().ok_or_else(|| anyhow!("leasegate exited"))?;
        rss_kib(pid)
    }

    fn log_tail(&self) -> String {
        let log = self.log.lock().unwrap();
        log[log.len().saturating_sub(20)..].join("\n")
    }

    /// SIGTERM, then SIGKILL after 30 s.
    async fn stop(mut self) -> anyhow::Result<()> {
        if let Some(pid) = self.child.id() {
            // SAFETY: kill(2) on our own child's pid.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) };
        }
        if tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .is_err()
        {
            self.child.kill().await?;
        }
        let _ = std::fs::remove_dir_all(&self.dir);
        Ok(())
    }
}

/// `VmRSS` of process `pid`, in KiB.
pub fn rss_kib(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    parse_vm_rss(&status).ok_or_else(|| anyhow!("no VmRSS in /proc/{pid}/status"))
}

/// The `VmRSS:  1234 kB` line of a `/proc/<pid>/status` text, in KiB.
pub fn parse_vm_rss(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
}

// ---------------------------------------------------------------------------
// Callers.

/// A leased run the gated and replay callers call under.
#[derive(Clone, Debug)]
struct Lease {
    run_id: String,
    owner: String,
    epoch: i64,
    token: String,
}

async fn post_json(
    client: &reqwest::Client,
    url: &str,
    body: &Value,
) -> anyhow::Result<(u16, Value)> {
    let response = client
        .post(url)
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await?;
    let status = response.status().as_u16();
    let text = response.text().await?;
    let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
    Ok((status, value))
}

/// [`RUNS`] runs created through the control API, each leased by `bench-<n>`
/// and started.
async fn create_leases(
    control: &str,
    task_prefix: &str,
    count: usize,
) -> anyhow::Result<Vec<Lease>> {
    let client = client()?;
    let mut leases = Vec::with_capacity(count);
    for n in 0..count {
        let owner = format!("{OWNER_PREFIX}{n}");
        let (status, created) = post_json(
            &client,
            &format!("{control}/v1/runs"),
            &json!({"tenant_id": "bench", "task_id": format!("{task_prefix}-{n}"),
                    "owner": owner, "ttl_ms": LEASE_TTL_MS}),
        )
        .await?;
        ensure!(status == 201, "POST /v1/runs: {status} {created}");
        let lease = Lease {
            run_id: created["run_id"]
                .as_str()
                .ok_or_else(|| anyhow!("no run_id in {created}"))?
                .to_owned(),
            owner,
            epoch: created["lease"]["epoch"].as_i64().unwrap_or(1),
            token: created["lease_token"]
                .as_str()
                .ok_or_else(|| anyhow!("no lease_token in {created}"))?
                .to_owned(),
        };
        let (status, started) = post_json(
            &client,
            &format!("{control}/v1/runs/{}/start", lease.run_id),
            &json!({"owner": lease.owner, "epoch": lease.epoch, "lease_token": lease.token,
                    "expected_revision": 0}),
        )
        .await?;
        ensure!(status == 200, "start {}: {status} {started}", lease.run_id);
        leases.push(lease);
    }
    Ok(leases)
}

/// Renews `leases` through the control API every minute until dropped (a
/// run of the benchmark outlasts one lease ttl).
struct KeepAlive(tokio::task::JoinHandle<()>);

impl KeepAlive {
    fn start(control: &str, leases: &[Lease]) -> anyhow::Result<Self> {
        let client = client()?;
        let control = control.to_owned();
        let leases = leases.to_vec();
        Ok(Self(tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(60)).await;
                for lease in &leases {
                    let url = format!("{control}/v1/runs/{}/lease/renew", lease.run_id);
                    let body = json!({"owner": lease.owner, "epoch": lease.epoch,
                                      "lease_token": lease.token, "ttl_ms": LEASE_TTL_MS});
                    match post_json(&client, &url, &body).await {
                        Ok((200, _)) => {}
                        Ok((status, answer)) => {
                            eprintln!(
                                "bench_gateway: keep-alive renew {}: {status} {answer}",
                                lease.run_id
                            )
                        }
                        Err(error) => eprintln!("bench_gateway: keep-alive renew: {error:#}"),
                    }
                }
            }
        })))
    }
}

impl Drop for KeepAlive {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Extends every lease of the pgbench ledger (as the superuser, straight to
/// the table: benchmark setup, not a fenced write) before a pgbench run.
async fn extend_sql_leases(url: &str) -> anyhow::Result<()> {
    use sqlx::Connection as _;
    let mut connection = sqlx::PgConnection::connect(url).await?;
    sqlx::query(
        "UPDATE worker_leases SET expires_at = clock_timestamp() + $1 * interval '1 millisecond'",
    )
    .bind(LEASE_TTL_MS as f64)
    .execute(&mut connection)
    .await?;
    connection.close().await?;
    Ok(())
}

/// One kept-alive HTTP/1.1 connection (reqwest keeps one idle connection per host).
fn client() -> anyhow::Result<reqwest::Client> {
    Ok(reqwest::Client::builder()
        .pool_max_idle_per_host(1)
        .tcp_nodelay(true)
        .timeout(Duration::from_secs(60))
        .build()?)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    Gated,
    PassThrough,
    Replay,
}

impl Kind {
    fn label(self) -> &'static str {
        match self {
            Kind::Gated => "gated (new intent per call)",
            Kind::PassThrough => "pass-through (read-only tool)",
            Kind::Replay => "replay (same intent again)",
        }
    }
}

/// What one caller sends: its connection and, for gated and replay calls, its lease.
struct Caller {
    client: reqwest::Client,
    index: usize,
    lease: Option<Lease>,
}

/// The shared parts of a cell.
struct Target {
    mcp: String,
    tools: Tools,
    /// Distinguishes the cells of one run, so no gated call replays an earlier one.
    nonce: String,
}

impl Caller {
    async fn call(&self, target: &Target, kind: Kind, n: u64) -> anyhow::Result<()> {
        let unique = match kind {
            Kind::Replay => format!("replay-{}", self.index),
            _ => format!("{}-{}-{n}", target.nonce, self.index),
        };
        let mut params = json!({
            "name": if kind == Kind::PassThrough { target.tools.pass_through } else { target.tools.gated },
            "arguments": target.tools.arguments(&unique),
        });
        if kind != Kind::PassThrough {
            params["_meta"] = json!({"dev.leasegate/step": {"step_id": format!("s-{unique}")}});
        }
        let body = json!({"jsonrpc": "2.0", "id": n, "method": "tools/call", "params": params});
        let mut request = self
            .client
            .post(&target.mcp)
            .header("content-type", "application/json")
            .header("accept", ACCEPT)
            .header("mcp-protocol-version", PROTOCOL);
        if let (Some(lease), true) = (&self.lease, kind != Kind::PassThrough) {
            request = request
                .header("leasegate-run-id", &lease.run_id)
                .header("leasegate-owner", &lease.owner)
                .header("leasegate-epoch", lease.epoch.to_string())
                .header("leasegate-lease-token", &lease.token);
        }
        let response = request.body(body.to_string()).send().await?;
        let status = response.status();
        let text = response.text().await?;
        let replay_expected = match kind {
            Kind::Gated => Some(false),
            Kind::Replay if n > 0 => Some(true),
            _ => None,
        };
        let fine = status.is_success()
            && target.tools.answered(&text, &unique)
            && !text.contains("\"isError\":true")
            && !text.contains("\"error\":{")
            && replay_expected
                .is_none_or(|replayed| text.contains(&format!("\"replayed\":{replayed}")));
        ensure!(
            fine,
            "{} call {n} of caller {}: HTTP {status}: {}",
            kind.label(),
            self.index,
            text.chars().take(600).collect::<String>()
        );
        Ok(())
    }
}

/// What one cell measured.
#[derive(Clone, Debug, Default)]
pub struct Cell {
    pub calls: u64,
    pub rate: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// leasegate's `VmRSS` near the end of the window, callers still in flight.
    pub rss_kib: Option<u64>,
    /// Where the machine's CPU went during the window, per call.
    pub cpu: Option<cpu::CpuPerCall>,
}

/// Runs `callers` callers of `kind` against `target`: each primes (replay:
/// records its intent), all start together, warm up for `warmup`, and the
/// calls that start and end inside the next `duration` are counted.
async fn cell(
    target: &Arc<Target>,
    leases: &[Lease],
    kind: Kind,
    callers: usize,
    warmup: Duration,
    duration: Duration,
    served: Option<&Served>,
) -> anyhow::Result<Cell> {
    let barrier = Arc::new(tokio::sync::Barrier::new(callers + 1));
    let (window_tx, window_rx) = tokio::sync::watch::channel(None::<(Instant, Instant)>);
    let mut tasks = Vec::with_capacity(callers);
    for index in 0..callers {
        let caller = Caller {
            client: client()?,
            index,
            lease: (!leases.is_empty()).then(|| leases[index % leases.len()].clone()),
        };
        let (target, barrier, mut window_rx) = (target.clone(), barrier.clone(), window_rx.clone());
        tasks.push(tokio::spawn(async move {
            // Prime: the connection, and for a replay the recorded intent.
            let primed = caller.call(&target, kind, 0).await;
            barrier.wait().await;
            primed?;
            let (start, end) = window_rx
                .wait_for(Option::is_some)
                .await?
                .expect("set before the barrier opened");
            let mut samples = Vec::new();
            let mut n = 1;
            loop {
                let began = Instant::now();
                if began >= end {
                    break;
                }
                caller.call(&target, kind, n).await?;
                n += 1;
                let ended = Instant::now();
                if began >= start && ended <= end {
                    samples.push(ended - began);
                }
            }
            anyhow::Ok(samples)
        }));
    }
    barrier.wait().await;
    let start = Instant::now() + warmup;
    let end = start + duration;
    window_tx.send(Some((start, end)))?;
    let leasegate_pid = served.and_then(|served| served.child.id());
    tokio::time::sleep_until(start.into()).await;
    let cpu_start = cpu::CpuSample::take(leasegate_pid);
    // Resident memory with every caller in flight: sampled at 90% of the window.
    let mut rss_kib = None;
    if let Some(served) = served {
        tokio::time::sleep_until((start + duration.mul_f64(0.9)).into()).await;
        rss_kib = served.rss_kib().ok();
    }
    tokio::time::sleep_until(end.into()).await;
    let cpu_end = cpu::CpuSample::take(leasegate_pid);
    let mut samples = Vec::new();
    for task in tasks {
        match task.await? {
            Ok(mut more) => samples.append(&mut more),
            Err(error) => {
                let log = served.map(Served::log_tail).unwrap_or_default();
                return Err(error.context(format!("leasegate's last log lines:\n{log}")));
            }
        }
    }
    samples.sort();
    Ok(Cell {
        calls: samples.len() as u64,
        rate: samples.len() as f64 / duration.as_secs_f64(),
        p50_ms: stats::percentile_ms(&samples, 0.5, Rank::Round),
        p99_ms: stats::percentile_ms(&samples, 0.99, Rank::Round),
        rss_kib,
        cpu: cpu_start.per_call(&cpu_end, samples.len() as u64, cpu::Load::ThisProcess),
    })
}

/// Single lease renewals through the control API, `callers` at once, each
/// renewing its own run's lease in a loop.
async fn renew_cell(
    control: &str,
    leases: &[Lease],
    callers: usize,
    warmup: Duration,
    duration: Duration,
) -> anyhow::Result<Cell> {
    let (window_tx, window_rx) = tokio::sync::watch::channel(None::<(Instant, Instant)>);
    let mut tasks = Vec::new();
    for index in 0..callers {
        let lease = leases[index % leases.len()].clone();
        let client = client()?;
        let url = format!("{control}/v1/runs/{}/lease/renew", lease.run_id);
        let body = json!({"owner": lease.owner, "epoch": lease.epoch, "lease_token": lease.token,
                          "ttl_ms": LEASE_TTL_MS});
        let mut window_rx = window_rx.clone();
        tasks.push(tokio::spawn(async move {
            let (start, end) = window_rx.wait_for(Option::is_some).await?.expect("set");
            let mut samples = Vec::new();
            loop {
                let began = Instant::now();
                if began >= end {
                    break;
                }
                let (status, answer) = post_json(&client, &url, &body).await?;
                ensure!(status == 200, "renew {}: {status} {answer}", lease.run_id);
                let ended = Instant::now();
                if began >= start && ended <= end {
                    samples.push(ended - began);
                }
            }
            anyhow::Ok(samples)
        }));
    }
    let start = Instant::now() + warmup;
    window_tx.send(Some((start, start + duration)))?;
    let mut samples = Vec::new();
    for task in tasks {
        samples.append(&mut task.await??);
    }
    samples.sort();
    Ok(Cell {
        calls: samples.len() as u64,
        rate: samples.len() as f64 / duration.as_secs_f64(),
        p50_ms: stats::percentile_ms(&samples, 0.5, Rank::Round),
        p99_ms: stats::percentile_ms(&samples, 0.99, Rank::Round),
        rss_kib: None,
        cpu: None,
    })
}

/// Batch lease renewal through leasegate (`POST /v1/leases/renew`, each
/// lease answered renewed or lost): one caller per worker host of `hosts`,
/// all at once, each renewing all its own leases in one call per round,
/// on its own kept-alive connection. The rate counts leases renewed per
/// second; p50/p99 are per call. A lease answered lost ends the run with
/// the answer.
async fn batch_renewal_through_leasegate(
    control: &str,
    hosts: &[Vec<Lease>],
    warmup: Duration,
    duration: Duration,
) -> anyhow::Result<Option<Cell>> {
    if hosts.is_empty() {
        return Ok(None);
    }
    let (window_tx, window_rx) = tokio::sync::watch::channel(None::<(Instant, Instant)>);
    let mut tasks = Vec::new();
    for held in hosts {
        let held: Vec<Value> = held
            .iter()
            .map(|lease| {
                json!({"run_id": lease.run_id, "owner": lease.owner, "epoch": lease.epoch,
                       "lease_token": lease.token})
            })
            .collect();
        // Serialized once; the answer is read for its two counts only (the
        // load generator shares the two cores with what it measures).
        let body = json!({"ttl_ms": LEASE_TTL_MS, "leases": held}).to_string();
        let client = client()?;
        let url = format!("{control}/v1/leases/renew");
        let mut window_rx = window_rx.clone();
        tasks.push(tokio::spawn(async move {
            #[derive(serde::Deserialize)]
            struct Counts {
                renewed: u64,
                lost: u64,
            }
            let (start, end) = window_rx.wait_for(Option::is_some).await?.expect("set");
            let mut samples = Vec::new();
            let mut renewed_in_window = 0u64;
            loop {
                let began = Instant::now();
                if began >= end {
                    break;
                }
                let response = client
                    .post(&url)
                    .header("content-type", "application/json")
                    .body(body.clone())
                    .send()
                    .await?;
                let status = response.status().as_u16();
                let bytes = response.bytes().await?;
                ensure!(
                    status == 200,
                    "batch renew: {status} {}",
                    String::from_utf8_lossy(&bytes[..bytes.len().min(500)])
                );
                let counts: Counts = serde_json::from_slice(&bytes)?;
                ensure!(
                    counts.lost == 0,
                    "batch renew lost leases: {}",
                    String::from_utf8_lossy(&bytes[..bytes.len().min(2000)])
                );
                let ended = Instant::now();
                if began >= start && ended <= end {
                    samples.push(ended - began);
                    renewed_in_window += counts.renewed;
                }
            }
            anyhow::Ok((samples, renewed_in_window))
        }));
    }
    let start = Instant::now() + warmup;
    window_tx.send(Some((start, start + duration)))?;
    let mut samples = Vec::new();
    let mut renewed = 0u64;
    for task in tasks {
        let (mut own, count) = task.await??;
        samples.append(&mut own);
        renewed += count;
    }
    if samples.is_empty() {
        return Ok(None);
    }
    samples.sort();
    Ok(Some(Cell {
        calls: renewed,
        rate: renewed as f64 / duration.as_secs_f64(),
        p50_ms: stats::percentile_ms(&samples, 0.5, Rank::Round),
        p99_ms: stats::percentile_ms(&samples, 0.99, Rank::Round),
        rss_kib: None,
        cpu: None,
    }))
}

/// `hosts` × `per_host` leased, running runs of tenant `bench` for the
/// batch renewal row, made in one statement on the served database (tens
/// of thousands of acquires through the API would measure the set-up):
/// host `h` is `batch-host-<h>` at epoch 1, each lease's token
/// `lgl_batch_<run id>` (its SHA-256 stored, as an acquire stores it), two
/// hours to live.
async fn create_batch_leases(
    url: &str,
    hosts: usize,
    per_host: usize,
) -> anyhow::Result<Vec<Vec<Lease>>> {
    use sqlx::Connection as _;
    if hosts == 0 || per_host == 0 {
        return Ok(Vec::new());
    }
    let mut connection = sqlx::PgConnection::connect(url).await?;
    let rows: Vec<(String, String)> = sqlx::query_as(
        "WITH g AS (SELECT i, gen_random_uuid() AS run_id FROM generate_series(1, $1::bigint * $2) i),
              t AS (INSERT INTO agent_tasks (tenant_id, task_id) SELECT 'bench', 'batch-' || i FROM g),
              r AS (INSERT INTO agent_runs (run_id, tenant_id, task_id, attempt, status)
                    SELECT run_id, 'bench', 'batch-' || i, 1, 'running' FROM g)
         INSERT INTO worker_leases (run_id, owner, epoch, expires_at, token_sha256)
         SELECT run_id, 'batch-host-' || ((i - 1) / $2 + 1), 1, clock_timestamp() + interval '2 hours',
                sha256(convert_to('lgl_batch_' || run_id::text, 'UTF8'))
           FROM g RETURNING run_id::text, owner",
    )
    .bind(hosts as i64)
    .bind(per_host as i64)
    .fetch_all(&mut connection)
    .await?;
    sqlx::query("ANALYZE worker_leases, agent_runs")
        .execute(&mut connection)
        .await?;
    connection.close().await?;
    let mut by_host: Vec<Vec<Lease>> = vec![Vec::with_capacity(per_host); hosts];
    for (run_id, owner) in rows {
        let host: usize = owner
            .strip_prefix("batch-host-")
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| anyhow!("unexpected owner {owner}"))?;
        by_host[host - 1].push(Lease {
            token: format!("lgl_batch_{run_id}"),
            run_id,
            owner,
            epoch: 1,
        });
    }
    Ok(by_host)
}

// ---------------------------------------------------------------------------
// pgbench.

/// Transactions per second and per-transaction latency percentiles of one
/// pgbench run (`-M prepared`, `-l` per-transaction log).
fn pgbench(
    pgbench: &Path,
    url: &str,
    script: &str,
    clients: usize,
    duration: Duration,
    scratch: &Path,
) -> anyhow::Result<Cell> {
    let dir = scratch.join(format!("pgbench-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir)?;
    let script_file = dir.join("script.sql");
    std::fs::write(&script_file, script)?;
    let seconds = duration.as_secs().max(1);
    let postgres_before = cpu::postgres_processes();
    let cpu_start = cpu::CpuSample::take(None);
    let output = Pgbench {
        program: pgbench,
        url,
        script: &script_file,
        clients,
        seconds,
        log_dir: Some(&dir),
    }
    .output()?;
    // pgbench's backends are reaped into the postmaster's time before the reading.
    cpu::settle_postgres(postgres_before, Duration::from_secs(5));
    let cpu_end = cpu::CpuSample::take(None);
    let rate = pgbench_run::Report::parse(&output)?.tps;
    let mut samples = pgbench_run::read_log(&dir)?;
    let _ = std::fs::remove_dir_all(&dir);
    samples.sort();
    Ok(Cell {
        calls: samples.len() as u64,
        rate,
        p50_ms: stats::percentile_ms(&samples, 0.5, Rank::Round),
        p99_ms: stats::percentile_ms(&samples, 0.99, Rank::Round),
        rss_kib: None,
        cpu: cpu_start.per_call(&cpu_end, samples.len() as u64, cpu::Load::ReapedChildren),
    })
}

// ---------------------------------------------------------------------------
// The run.

/// Rows of the report, in print order; several values each with `--repeat`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Measure {
    Leasegate(Kind),
    PgbenchLeasegate,
    PgbenchCeiling,
    RenewControlApi,
    PgbenchRenewLeasegate,
    PgbenchRenewCeiling,
    PgbenchRenewBatchCeiling,
    BatchRenewLeasegate,
}

/// Round trips counted through the proxy for one kind of call.
#[derive(Clone, Debug, Default)]
pub struct RoundTrips {
    pub calls: u64,
    /// Everything counted during the window.
    pub raw: u64,
    /// Per call, with the background loops' share (their idle rate over the window) taken out.
    pub per_call: f64,
    pub raw_per_call: f64,
    /// Executions per call by SQL text during the window (background work included), most first.
    pub statements: Vec<(String, f64)>,
}

/// Resident memory of leasegate, KiB.
#[derive(Clone, Debug, Default)]
pub struct Memory {
    /// After start, before any call.
    pub idle_kib: u64,
    /// The sessions child: idle, then with `sessions` idle MCP sessions open.
    pub sessions: usize,
    pub sessions_idle_kib: u64,
    pub sessions_open_kib: u64,
    /// Gated cells at the smallest and largest caller count, callers in flight.
    pub load: Option<(usize, u64, usize, u64)>,
    /// After each of the growth cells (gated, largest caller count).
    pub growth_kib: Vec<u64>,
    /// After every cell is done.
    pub idle_after_kib: u64,
}

/// Everything one run measured.
#[derive(Clone, Debug, Default)]
pub struct Report {
    pub environment: Environment,
    pub settings_line: String,
    /// Per (measure, callers): one cell per repetition.
    pub cells: BTreeMap<(Measure, usize), Vec<Cell>>,
    /// Per kind, counted at `round_trip_callers`; "first call of a run" under `None`.
    pub round_trips: BTreeMap<Option<Kind>, RoundTrips>,
    pub round_trip_callers: usize,
    /// Background round trips per second of an idle leasegate.
    pub background_per_s: f64,
    pub memory: Memory,
    /// (hosts, leases per call) of the batch renewal row.
    pub batch_shape: (usize, usize),
}

fn progress(settings: &Settings, what: impl std::fmt::Display) {
    if settings.verbose {
        eprintln!("bench_gateway: {what}");
    }
}

/// Runs the whole benchmark.
pub async fn run(settings: &Settings) -> anyhow::Result<Report> {
    ensure!(settings.repeat >= 1, "--repeat must be at least 1");
    ensure!(!settings.callers.is_empty(), "no caller counts");
    let pgbench_path = settings
        .pgbench
        .clone()
        .or_else(pgbench_run::find)
        .ok_or_else(|| {
            anyhow!("pgbench not found on PATH nor in /usr/lib/postgresql/*/bin (apt-get install postgresql-contrib, or --pgbench)")
        })?;
    let mut report = Report {
        environment: environment(&settings.admin_url).await?,
        ..Report::default()
    };
    let served_url = with_database(&settings.admin_url, &settings.db_prefix);
    let sql_url = with_database(&settings.admin_url, &format!("{}_sql", settings.db_prefix));
    let ceiling_url = with_database(
        &settings.admin_url,
        &format!("{}_ceiling", settings.db_prefix),
    );
    let scratch = std::env::temp_dir().join(format!(
        "leasegate-bench-gateway-{}",
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::create_dir_all(scratch.join("state"))?;
    let result = measure(
        settings,
        &pgbench_path,
        &mut report,
        [&served_url, &sql_url, &ceiling_url],
        &scratch,
    )
    .await;
    for url in [&served_url, &sql_url, &ceiling_url] {
        if let Err(error) = database::drop(url).await {
            eprintln!("bench_gateway: could not drop {url}: {error:#}");
        }
    }
    let _ = std::fs::remove_dir_all(&scratch);
    report.environment.load_end = load_average();
    result.map(|()| report)
}

async fn measure(
    settings: &Settings,
    pgbench_path: &Path,
    report: &mut Report,
    [served_url, sql_url, ceiling_url]: [&String; 3],
    scratch: &Path,
) -> anyhow::Result<()> {
    progress(settings, "creating the databases");
    database::recreate(served_url).await?;
    leasegate::ledger::Ledger::migrate(served_url).await?;
    database::recreate(sql_url).await?;
    setup_leasegate_sql(sql_url).await?;
    database::recreate(ceiling_url).await?;
    setup_ceiling(ceiling_url).await?;

    let upstream = upstream_config(settings, &scratch.join("state"))?;
    let environment = &mut report.environment;
    environment.upstream = upstream.tools.description.clone();
    environment.leasegate = settings.leasegate.display().to_string();
    environment.pgbench = pgbench_path.display().to_string();
    report.settings_line = format!(
        "{} s measured per cell after {} s of warm-up, {} repetition(s) (medians), callers {:?}, \
         {RUNS} leased runs, leasegate database_max_connections = {}, group_commit = {}{}",
        settings.duration.as_secs_f64(),
        settings.warmup.as_secs_f64(),
        settings.repeat,
        settings.callers,
        settings.db_pool,
        settings.group_commit,
        settings
            .config_lines
            .iter()
            .map(|line| format!(", {line}"))
            .collect::<String>()
    );

    // The main child: every throughput cell, the renewals, memory under load.
    progress(settings, "starting leasegate serve");
    let main = Served::start(
        settings,
        &upstream,
        ServeOptions {
            name: "main",
            database_url: served_url.clone(),
            control: true,
            http_sessions: false,
        },
    )
    .await?;
    let outcome = sweep(
        settings,
        pgbench_path,
        report,
        &main,
        &upstream,
        [sql_url, ceiling_url],
        scratch,
    )
    .await;
    main.stop().await?;
    outcome?;

    // Round trips: the same configuration with its ledger behind the counting proxy.
    counted(settings, report, &upstream, served_url).await?;

    // Memory per idle MCP session.
    progress(
        settings,
        format!("opening {} idle MCP sessions", settings.sessions),
    );
    let sessions = Served::start(
        settings,
        &upstream,
        ServeOptions {
            name: "sessions",
            database_url: served_url.clone(),
            control: false,
            http_sessions: true,
        },
    )
    .await?;
    let outcome = idle_sessions(settings, &sessions).await;
    sessions.stop().await?;
    let (idle, open) = outcome?;
    report.memory.sessions = settings.sessions;
    report.memory.sessions_idle_kib = idle;
    report.memory.sessions_open_kib = open;
    Ok(())
}

/// The throughput sweep, renewals and growth cells against `main`.
async fn sweep(
    settings: &Settings,
    pgbench_path: &Path,
    report: &mut Report,
    main: &Served,
    upstream: &UpstreamConfig,
    [sql_url, ceiling_url]: [&String; 2],
    scratch: &Path,
) -> anyhow::Result<()> {
    // Memory settles after start (upstream handshakes, pool connections).
    tokio::time::sleep(Duration::from_secs(1)).await;
    report.memory.idle_kib = main.rss_kib()?;
    let leases = create_leases(&main.control, "bench", RUNS).await?;
    let batch_hosts = create_batch_leases(
        &main.database_url,
        settings.batch_hosts,
        settings.batch_leases,
    )
    .await?;
    report.batch_shape = (settings.batch_hosts, settings.batch_leases);
    let _keep_alive = KeepAlive::start(&main.control, &leases)?;
    let mut nonce = 0u64;
    let target = |nonce: &mut u64| {
        *nonce += 1;
        Arc::new(Target {
            mcp: main.mcp.clone(),
            tools: upstream.tools.clone(),
            nonce: format!("c{nonce}-{}", uuid::Uuid::new_v4().simple()),
        })
    };
    let mut record = |measure: Measure, callers: usize, cell: Cell| {
        report
            .cells
            .entry((measure, callers))
            .or_default()
            .push(cell);
    };
    for repetition in 1..=settings.repeat {
        for &callers in &settings.callers {
            for kind in [Kind::Gated, Kind::PassThrough, Kind::Replay] {
                progress(
                    settings,
                    format!(
                        "repetition {repetition}: {} at {callers} callers",
                        kind.label()
                    ),
                );
                let measured = cell(
                    &target(&mut nonce),
                    &leases,
                    kind,
                    callers,
                    settings.warmup,
                    settings.duration,
                    Some(main),
                )
                .await?;
                record(Measure::Leasegate(kind), callers, measured);
            }
            progress(
                settings,
                format!("repetition {repetition}: pgbench at {callers} callers"),
            );
            extend_sql_leases(sql_url).await?;
            let theirs = pgbench(
                pgbench_path,
                sql_url,
                LEASEGATE_HOTPATH,
                callers,
                settings.duration,
                scratch,
            )?;
            record(Measure::PgbenchLeasegate, callers, theirs);
            let ceiling = pgbench(
                pgbench_path,
                ceiling_url,
                CEILING_HOTPATH,
                callers,
                settings.duration,
                scratch,
            )?;
            record(Measure::PgbenchCeiling, callers, ceiling);
        }
        // Renewal.
        let callers = settings.renew_callers;
        progress(
            settings,
            format!("repetition {repetition}: renewals at {callers} callers"),
        );
        let api = renew_cell(
            &main.control,
            &leases,
            callers,
            settings.warmup,
            settings.duration,
        )
        .await?;
        record(Measure::RenewControlApi, callers, api);
        extend_sql_leases(sql_url).await?;
        let theirs = pgbench(
            pgbench_path,
            sql_url,
            LEASEGATE_RENEW,
            callers,
            settings.duration,
            scratch,
        )?;
        record(Measure::PgbenchRenewLeasegate, callers, theirs);
        let ceiling = pgbench(
            pgbench_path,
            ceiling_url,
            CEILING_RENEW,
            callers,
            settings.duration,
            scratch,
        )?;
        record(Measure::PgbenchRenewCeiling, callers, ceiling);
        let mut batch = pgbench(
            pgbench_path,
            ceiling_url,
            CEILING_RENEW_BATCH,
            callers,
            settings.duration,
            scratch,
        )?;
        batch.rate *= CEILING_BATCH_SIZE;
        record(Measure::PgbenchRenewBatchCeiling, callers, batch);
        if let Some(ours) = batch_renewal_through_leasegate(
            &main.control,
            &batch_hosts,
            settings.warmup,
            settings.duration,
        )
        .await?
        {
            record(Measure::BatchRenewLeasegate, settings.batch_hosts, ours);
        }
    }
    let smallest = *settings.callers.iter().min().expect("callers");
    let largest = *settings.callers.iter().max().expect("callers");
    let rss_at = |callers: usize| {
        report.cells[&(Measure::Leasegate(Kind::Gated), callers)]
            .iter()
            .filter_map(|cell| cell.rss_kib)
            .collect::<Vec<_>>()
    };
    if let (Some(low), Some(high)) = (
        stats::upper_median(&rss_at(smallest)),
        stats::upper_median(&rss_at(largest)),
    ) {
        report.memory.load = Some((smallest, low, largest, high));
    }
    // Steady state: the same gated cell again and again; memory after each.
    for round in 1..=settings.growth_cells {
        progress(
            settings,
            format!("growth cell {round}: gated at {largest} callers"),
        );
        cell(
            &target(&mut nonce),
            &leases,
            Kind::Gated,
            largest,
            settings.warmup,
            settings.duration,
            Some(main),
        )
        .await?;
        report.memory.growth_kib.push(main.rss_kib()?);
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    report.memory.idle_after_kib = main.rss_kib()?;
    Ok(())
}

/// Round trips per call through the counting proxy: the background rate
/// while idle, a run's first call, then one cell of each kind.
async fn counted(
    settings: &Settings,
    report: &mut Report,
    upstream: &UpstreamConfig,
    served_url: &str,
) -> anyhow::Result<()> {
    let proxy = CountingProxy::start(host_port(&settings.admin_url)?).await?;
    let database = served_url
        .rsplit_once('/')
        .map(|(_, db)| db.split('?').next().unwrap_or(db))
        .unwrap_or(&settings.db_prefix);
    let user = settings
        .admin_url
        .split_once("://")
        .and_then(|(_, rest)| rest.split_once('@'))
        .map_or("postgres".to_owned(), |(user, _)| user.to_owned());
    let proxied = format!(
        "postgres://{user}@127.0.0.1:{}/{database}?sslmode=disable",
        proxy.port
    );
    progress(
        settings,
        "starting leasegate serve behind the counting proxy",
    );
    let served = Served::start(
        settings,
        upstream,
        ServeOptions {
            name: "counted",
            database_url: proxied,
            control: true,
            http_sessions: false,
        },
    )
    .await?;
    let outcome = async {
        // No keep-alive here: this phase is far shorter than a lease ttl,
        // and its renewals would be counted.
        let leases = create_leases(&served.control, "counted", RUNS).await?;
        let fresh =
            create_leases(&served.control, "first-call", settings.first_calls.max(1)).await?;
        // What the background loops cost with no call at all.
        let window = settings.background_window;
        let before = proxy.count();
        tokio::time::sleep(window).await;
        let background_per_s = (proxy.count() - before) as f64 / window.as_secs_f64();
        report.background_per_s = background_per_s;
        let tools = upstream.tools.clone();
        let callers = 1;
        report.round_trip_callers = callers;
        // Enough uncounted calls first that every pooled connection has
        // prepared its statements (sqlx prepares once per connection).
        let warmup_calls = 3 * u64::from(settings.db_pool);
        for kind in [Kind::Gated, Kind::PassThrough, Kind::Replay] {
            progress(settings, format!("counting round trips: {}", kind.label()));
            let target = Arc::new(Target {
                mcp: served.mcp.clone(),
                tools: tools.clone(),
                nonce: format!("rt-{}", uuid::Uuid::new_v4().simple()),
            });
            let caller = Caller {
                client: client()?,
                index: 0,
                lease: leases.first().cloned(),
            };
            let warm_until = Instant::now() + settings.warmup;
            let mut n = 0;
            while n < warmup_calls || Instant::now() < warm_until {
                caller.call(&target, kind, n).await?;
                n += 1;
            }
            let began = Instant::now();
            let before = proxy.count();
            let executed_before = proxy.executions();
            let mut calls = 0;
            while began.elapsed() < settings.duration {
                caller.call(&target, kind, n).await?;
                n += 1;
                calls += 1;
            }
            let raw = proxy.count() - before;
            let mut counted = round_trips(raw, calls, began.elapsed(), background_per_s);
            counted.statements = per_call(&executed_before, &proxy.executions(), calls);
            report.round_trips.insert(Some(kind), counted);
        }
        // One call on each fresh run: the first call of a run (the pool is warm by now).
        let target = Arc::new(Target {
            mcp: served.mcp.clone(),
            tools: tools.clone(),
            nonce: format!("first-{}", uuid::Uuid::new_v4().simple()),
        });
        let callers: Vec<Caller> = fresh
            .iter()
            .enumerate()
            .map(|(index, lease)| {
                Ok(Caller {
                    client: client()?,
                    index,
                    lease: Some(lease.clone()),
                })
            })
            .collect::<anyhow::Result<_>>()?;
        let began = Instant::now();
        let before = proxy.count();
        let executed_before = proxy.executions();
        for caller in &callers {
            caller.call(&target, Kind::Gated, 1).await?;
        }
        let calls = fresh.len() as u64;
        let mut counted = round_trips(
            proxy.count() - before,
            calls,
            began.elapsed(),
            background_per_s,
        );
        counted.statements = per_call(&executed_before, &proxy.executions(), calls);
        report.round_trips.insert(None, counted);
        anyhow::Ok(())
    }
    .await;
    served.stop().await?;
    outcome
}

/// Executions per call of each SQL text between two snapshots, most first.
fn per_call(
    before: &BTreeMap<String, u64>,
    after: &BTreeMap<String, u64>,
    calls: u64,
) -> Vec<(String, f64)> {
    let mut out: Vec<(String, f64)> = after
        .iter()
        .filter_map(|(sql, &count)| {
            let delta = count - before.get(sql).copied().unwrap_or(0);
            (delta > 0).then(|| (sql.clone(), delta as f64 / calls.max(1) as f64))
        })
        .collect();
    out.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    out
}

fn round_trips(raw: u64, calls: u64, elapsed: Duration, background_per_s: f64) -> RoundTrips {
    let calls_f = calls.max(1) as f64;
    let background = background_per_s * elapsed.as_secs_f64();
    RoundTrips {
        calls,
        raw,
        raw_per_call: raw as f64 / calls_f,
        per_call: ((raw as f64 - background) / calls_f).max(0.0),
        statements: Vec::new(),
    }
}

/// `VmRSS` idle, then with `settings.sessions` MCP sessions open and idle.
async fn idle_sessions(settings: &Settings, served: &Served) -> anyhow::Result<(u64, u64)> {
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle = served.rss_kib()?;
    let client = client()?;
    let mut ids = Vec::with_capacity(settings.sessions);
    for n in 0..settings.sessions {
        let response = client
            .post(&served.mcp)
            .header("content-type", "application/json")
            .header("accept", ACCEPT)
            .body(
                json!({"jsonrpc": "2.0", "id": n, "method": "initialize", "params": {
                    "protocolVersion": PROTOCOL, "capabilities": {},
                    "clientInfo": {"name": "bench-gateway", "version": "0"}}})
                .to_string(),
            )
            .send()
            .await?;
        let session = response
            .headers()
            .get("mcp-session-id")
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned);
        let status = response.status();
        let text = response.text().await?;
        let session =
            session.ok_or_else(|| anyhow!("initialize gave no session: {status} {text}"))?;
        let response = client
            .post(&served.mcp)
            .header("content-type", "application/json")
            .header("accept", ACCEPT)
            .header("mcp-protocol-version", PROTOCOL)
            .header("mcp-session-id", &session)
            .body(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}).to_string())
            .send()
            .await?;
        ensure!(
            response.status().is_success(),
            "notifications/initialized: {}",
            response.status()
        );
        ids.push(session);
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let open = served.rss_kib()?;
    Ok((idle, open))
}

// ---------------------------------------------------------------------------
// The table.

/// The medians of one row's repetitions.
#[derive(Clone, Copy, Debug)]
pub struct Medians {
    pub rate: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub rss_kib: Option<u64>,
}

impl Report {
    /// Medians over the repetitions of (measure, callers).
    pub fn medians(&self, measure: Measure, callers: usize) -> Option<Medians> {
        let cells = self.cells.get(&(measure, callers))?;
        let pick =
            |f: fn(&Cell) -> f64| stats::median(&mut cells.iter().map(f).collect::<Vec<_>>());
        Some(Medians {
            rate: pick(|c| c.rate),
            p50_ms: pick(|c| c.p50_ms),
            p99_ms: pick(|c| c.p99_ms),
            rss_kib: stats::upper_median(
                &cells.iter().filter_map(|c| c.rss_kib).collect::<Vec<_>>(),
            ),
        })
    }

    /// The report as Markdown: the header (machine, PostgreSQL, method) and one table.
    pub fn to_markdown(&self) -> String {
        use std::fmt::Write as _;
        let e = &self.environment;
        let mut out = String::new();
        let _ = writeln!(out, "bench_gateway, {}", e.date);
        let _ = writeln!(
            out,
            "machine: {} cores, {}, {} RAM",
            e.cores, e.cpu_model, e.ram
        );
        let settings = e
            .settings
            .iter()
            .map(|(name, value)| format!("{name} = {value}"))
            .collect::<Vec<_>>()
            .join(", ");
        let _ = writeln!(out, "PostgreSQL {}: {settings}", e.server_version);
        let _ = writeln!(out, "upstream: {}", e.upstream);
        let _ = writeln!(out, "leasegate: {}; pgbench: {}", e.leasegate, e.pgbench);
        let _ = writeln!(
            out,
            "load average (1/5/15 min): {} at the start, {} at the end",
            e.load_start, e.load_end
        );
        let _ = writeln!(out, "method: {}", self.settings_line);
        let _ = writeln!(
            out,
            "round trips: a second leasegate (same config) with its ledger behind a counting TCP proxy, \
             {} caller, counted after 3 × database_max_connections warm-up calls; per call net of the idle \
             background rate (raw: everything counted); pgbench rows: statements in the script",
            self.round_trip_callers
        );
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "| measure | callers | calls/s | p50 ms | p99 ms | ratio | DB round trips per call | leasegate RSS |"
        );
        let _ = writeln!(out, "|---|---|---|---|---|---|---|---|");
        let mib = |kib: u64| format!("{:.1} MiB", kib as f64 / 1024.0);
        let row = |out: &mut String,
                   label: &str,
                   callers: String,
                   m: Option<Medians>,
                   ratio: String,
                   trips: String,
                   rss: String| {
            let (rate, p50, p99) = match m {
                Some(m) => (
                    format!("{:.0}", m.rate),
                    format!("{:.2}", m.p50_ms),
                    format!("{:.2}", m.p99_ms),
                ),
                None => ("—".into(), "—".into(), "—".into()),
            };
            let _ = writeln!(
                out,
                "| {label} | {callers} | {rate} | {p50} | {p99} | {ratio} | {trips} | {rss} |"
            );
        };
        let trips_of = |kind: Option<Kind>| {
            self.round_trips
                .get(&kind)
                .map(|t| {
                    format!(
                        "{:.2} (raw {:.2}, {} calls)",
                        t.per_call, t.raw_per_call, t.calls
                    )
                })
                .unwrap_or_else(|| "—".into())
        };
        let mut callers_seen: Vec<usize> = self
            .cells
            .keys()
            .filter(|(measure, _)| matches!(measure, Measure::Leasegate(_)))
            .map(|(_, callers)| *callers)
            .collect();
        callers_seen.sort();
        callers_seen.dedup();
        for callers in callers_seen {
            let ceiling = self.medians(Measure::PgbenchCeiling, callers);
            let ratio_to_ceiling = |m: Option<Medians>| match (m, ceiling) {
                (Some(m), Some(c)) if c.rate > 0.0 => format!("{:.2} × ceiling", m.rate / c.rate),
                _ => "—".into(),
            };
            for kind in [Kind::Gated, Kind::PassThrough, Kind::Replay] {
                let m = self.medians(Measure::Leasegate(kind), callers);
                let trips = if callers == self.round_trip_callers {
                    trips_of(Some(kind))
                } else {
                    String::new()
                };
                let ratio = if kind == Kind::Gated {
                    ratio_to_ceiling(m)
                } else {
                    String::new()
                };
                let rss = m.and_then(|m| m.rss_kib).map(mib).unwrap_or_default();
                row(
                    &mut out,
                    &format!("leasegate, {}", kind.label()),
                    callers.to_string(),
                    m,
                    ratio,
                    trips,
                    rss,
                );
            }
            let m = self.medians(Measure::PgbenchLeasegate, callers);
            row(
                &mut out,
                "pgbench, leasegate's own SQL (register-claim + settle)",
                callers.to_string(),
                m,
                ratio_to_ceiling(m),
                "2 (script)".into(),
                String::new(),
            );
            row(
                &mut out,
                "pgbench, minimal ceiling (register_and_claim + settle UPDATE)",
                callers.to_string(),
                ceiling,
                String::new(),
                "2 (script)".into(),
                String::new(),
            );
        }
        row(
            &mut out,
            "leasegate, gated: the first call of a fresh run",
            "1".into(),
            None,
            String::new(),
            trips_of(None),
            String::new(),
        );
        row(
            &mut out,
            "leasegate idle: background round trips per second",
            "—".into(),
            None,
            String::new(),
            format!("{:.2}/s", self.background_per_s),
            String::new(),
        );
        let renew_callers = self
            .cells
            .keys()
            .find(|(measure, _)| *measure == Measure::RenewControlApi)
            .map(|(_, callers)| *callers);
        if let Some(callers) = renew_callers {
            let same_sql = self.medians(Measure::PgbenchRenewLeasegate, callers);
            let api = self.medians(Measure::RenewControlApi, callers);
            let ratio = match (api, same_sql) {
                (Some(a), Some(s)) if s.rate > 0.0 => {
                    format!("{:.2} × pgbench lease_renew", a.rate / s.rate)
                }
                _ => "—".into(),
            };
            row(
                &mut out,
                "renew one lease: control API `POST /v1/runs/{id}/lease/renew`",
                callers.to_string(),
                api,
                ratio,
                String::new(),
                String::new(),
            );
            let ceiling = self.medians(Measure::PgbenchRenewCeiling, callers);
            let ratio = match (same_sql, ceiling) {
                (Some(a), Some(c)) if c.rate > 0.0 => {
                    format!("{:.2} × ceiling renew", a.rate / c.rate)
                }
                _ => "—".into(),
            };
            row(
                &mut out,
                "renew one lease: pgbench, leasegate's `lease_renew`",
                callers.to_string(),
                same_sql,
                ratio,
                "1 (script)".into(),
                String::new(),
            );
            row(
                &mut out,
                "renew one lease: pgbench, ceiling `renew.sql`",
                callers.to_string(),
                ceiling,
                String::new(),
                "1 (script)".into(),
                String::new(),
            );
            let batch_ceiling = self.medians(Measure::PgbenchRenewBatchCeiling, callers);
            row(
                &mut out,
                "batch renewal (leases/s): pgbench, ceiling `renew_batch.sql` (100 per statement)",
                callers.to_string(),
                batch_ceiling,
                String::new(),
                "1 per 100 leases (script)".into(),
                String::new(),
            );
            let (hosts, per_call) = self.batch_shape;
            let label = format!(
                "batch renewal (leases/s): leasegate `POST /v1/leases/renew`, {hosts} worker hosts at once, {per_call} leases per call"
            );
            match self.medians(Measure::BatchRenewLeasegate, hosts) {
                Some(ours) => row(
                    &mut out,
                    &label,
                    hosts.to_string(),
                    Some(ours),
                    format!("{:.2} × 100,000/s", ours.rate / 100_000.0),
                    String::new(),
                    String::new(),
                ),
                None => row(
                    &mut out,
                    &label,
                    "—".into(),
                    None,
                    "not measured".into(),
                    String::new(),
                    String::new(),
                ),
            }
        }
        let m = &self.memory;
        row(
            &mut out,
            "leasegate RSS idle, after start (no call yet)",
            "—".into(),
            None,
            String::new(),
            String::new(),
            mib(m.idle_kib),
        );
        if m.sessions > 0 {
            let per = (m.sessions_open_kib as f64 - m.sessions_idle_kib as f64) / m.sessions as f64;
            row(
                &mut out,
                &format!(
                    "leasegate RSS with {} idle MCP sessions (http_sessions = true; idle before: {})",
                    m.sessions,
                    mib(m.sessions_idle_kib)
                ),
                "—".into(),
                None,
                format!("{per:.1} KiB per session"),
                String::new(),
                mib(m.sessions_open_kib),
            );
        }
        if let Some((low_callers, low, high_callers, high)) = m.load {
            let per =
                (high as f64 - low as f64) / (high_callers as f64 - low_callers as f64).max(1.0);
            row(
                &mut out,
                &format!(
                    "leasegate RSS under gated load, {low_callers} → {high_callers} callers in flight"
                ),
                format!("{low_callers} → {high_callers}"),
                None,
                format!("{per:.1} KiB per in-flight call"),
                String::new(),
                format!("{} → {}", mib(low), mib(high)),
            );
        }
        if let (Some(first), Some(last)) = (m.growth_kib.first(), m.growth_kib.last()) {
            let steps = m
                .growth_kib
                .iter()
                .map(|&k| mib(k))
                .collect::<Vec<_>>()
                .join(" → ");
            row(
                &mut out,
                &format!(
                    "leasegate RSS after each of {} more gated cells (steady state)",
                    m.growth_kib.len()
                ),
                "—".into(),
                None,
                format!(
                    "{:+.1} MiB first → last",
                    (*last as f64 - *first as f64) / 1024.0
                ),
                String::new(),
                steps,
            );
        }
        row(
            &mut out,
            "leasegate RSS idle, after every cell",
            "—".into(),
            None,
            String::new(),
            String::new(),
            mib(m.idle_after_kib),
        );
        let _ = writeln!(out);
        for (kind, label) in [
            (Some(Kind::Gated), "a gated call"),
            (None, "the first call of a fresh run"),
            (Some(Kind::Replay), "a replay"),
            (Some(Kind::PassThrough), "a pass-through call"),
        ] {
            let Some(trips) = self.round_trips.get(&kind) else {
                continue;
            };
            let _ = writeln!(
                out,
                "Statements per call of {label} (counting proxy, background included):"
            );
            for (sql, per) in trips.statements.iter().filter(|(_, per)| *per >= 0.05) {
                let _ = writeln!(out, "  {per:6.2}  {sql}");
            }
        }
        self.cpu_markdown(&mut out);
        out
    }

    /// Medians over the repetitions of each part's CPU per call.
    pub fn cpu_medians(&self, measure: Measure, callers: usize) -> Option<cpu::CpuPerCall> {
        let cells: Vec<cpu::CpuPerCall> = self
            .cells
            .get(&(measure, callers))?
            .iter()
            .filter_map(|cell| cell.cpu)
            .collect();
        if cells.is_empty() {
            return None;
        }
        let pick = |f: fn(&cpu::CpuPerCall) -> f64| {
            stats::median(&mut cells.iter().map(f).collect::<Vec<_>>())
        };
        Some(cpu::CpuPerCall {
            postgres_ms: pick(|c| c.postgres_ms),
            leasegate_ms: pick(|c| c.leasegate_ms),
            upstream_ms: pick(|c| c.upstream_ms),
            load_ms: pick(|c| c.load_ms),
            other_ms: pick(|c| c.other_ms),
            busy: pick(|c| c.busy),
        })
    }

    /// The second table: where the machine's CPU went per call, and the two
    /// ratios it bounds (see `cpu.rs`).
    fn cpu_markdown(&self, out: &mut String) {
        use std::fmt::Write as _;
        let mut callers_seen: Vec<usize> = self
            .cells
            .iter()
            .filter(|((measure, _), cells)| {
                matches!(
                    measure,
                    Measure::Leasegate(_) | Measure::PgbenchLeasegate | Measure::PgbenchCeiling
                ) && cells.iter().any(|cell| cell.cpu.is_some())
            })
            .map(|((_, callers), _)| *callers)
            .collect();
        callers_seen.sort();
        callers_seen.dedup();
        if callers_seen.is_empty() {
            return;
        }
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "Where the CPU goes, ms of CPU per call (utime + stime from /proc over the measured window, \
             medians of the repetitions; load generator: this process's HTTP callers, or pgbench; other: \
             the machine's busy time not charged to those processes). \
             \"CPU bound\": the ceiling's total per call over this row's, the ratio to the ceiling this \
             machine allows when both saturate its cores; \"DB bound\": the ceiling's PostgreSQL per call \
             over this row's, the ratio were PostgreSQL alone on its cores the limit."
        );
        let _ = writeln!(
            out,
            "| measure | callers | PostgreSQL | leasegate | upstream | load generator | other | total | machine busy | CPU bound | DB bound |"
        );
        let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|---|---|");
        for callers in callers_seen {
            let ceiling = self.cpu_medians(Measure::PgbenchCeiling, callers);
            let rows = [
                (Measure::Leasegate(Kind::Gated), "leasegate, gated"),
                (
                    Measure::Leasegate(Kind::PassThrough),
                    "leasegate, pass-through",
                ),
                (Measure::Leasegate(Kind::Replay), "leasegate, replay"),
                (Measure::PgbenchLeasegate, "pgbench, leasegate's own SQL"),
                (Measure::PgbenchCeiling, "pgbench, minimal ceiling"),
            ];
            for (measure, label) in rows {
                let is_call = matches!(
                    measure,
                    Measure::Leasegate(Kind::Gated) | Measure::PgbenchLeasegate
                );
                let Some(c) = self.cpu_medians(measure, callers) else {
                    continue;
                };
                let (cpu_bound, db_bound) = match ceiling {
                    Some(ceiling) if is_call && c.total_ms() > 0.0 && c.postgres_ms > 0.0 => (
                        format!("{:.2} ×", ceiling.total_ms() / c.total_ms()),
                        format!("{:.2} ×", ceiling.postgres_ms / c.postgres_ms),
                    ),
                    _ => (String::new(), String::new()),
                };
                let _ = writeln!(
                    out,
                    "| {label} | {callers} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:.0} % | {cpu_bound} | {db_bound} |",
                    c.postgres_ms,
                    c.leasegate_ms,
                    c.upstream_ms,
                    c.load_ms,
                    c.other_ms,
                    c.total_ms(),
                    c.busy * 100.0
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A typed message: type, length (body + 4), body.
    fn message(kind: u8, body: &[u8]) -> Vec<u8> {
        let mut out = vec![kind];
        out.extend_from_slice(&((body.len() + 4) as u32).to_be_bytes());
        out.extend_from_slice(body);
        out
    }

    /// An untyped startup-phase message: length, code, rest.
    fn untyped(code: u32, rest: &[u8]) -> Vec<u8> {
        let mut out = ((rest.len() + 8) as u32).to_be_bytes().to_vec();
        out.extend_from_slice(&code.to_be_bytes());
        out.extend_from_slice(rest);
        out
    }

    /// What sqlx sends for a connection, two prepared statements, a ping
    /// and a simple query: SSLRequest, StartupMessage (with parameters that
    /// hold bytes looking like 'S' and 'Q'), a password, Parse/Bind/Describe/
    /// Execute/Sync twice, Sync, Query, Terminate.
    fn conversation() -> Vec<u8> {
        let mut bytes = untyped(FrontendCounter::SSL_REQUEST, b"");
        bytes.extend(untyped(196_608, b"user\0postgres\0options\0-c S=Q\0\0"));
        bytes.extend(message(b'p', b"secret S Q\0"));
        for _ in 0..2 {
            bytes.extend(message(b'P', b"\0SELECT 'S', 'Q'\0\0\0"));
            bytes.extend(message(b'B', b"\0\0\0\0\0\0\0\0"));
            bytes.extend(message(b'D', b"P\0"));
            bytes.extend(message(b'E', b"\0\0\0\0\0"));
            bytes.extend(message(b'S', b""));
        }
        bytes.extend(message(b'S', b""));
        bytes.extend(message(b'Q', b"SELECT 1\0"));
        bytes.extend(message(b'X', b""));
        bytes
    }

    #[test]
    fn the_frontend_counter_counts_syncs_and_queries_however_the_bytes_are_split() {
        let bytes = conversation();
        let mut whole = FrontendCounter::default();
        whole.feed(&bytes);
        assert_eq!(whole.round_trips, 4, "three Syncs and one Query");
        assert_eq!(whole.messages, 2 + 1 + 10 + 3, "every message seen once");
        for chunk in [1, 2, 3, 5, 7, 13] {
            let mut split = FrontendCounter::default();
            for piece in bytes.chunks(chunk) {
                split.feed(piece);
            }
            assert_eq!(split.round_trips, 4, "split into {chunk}-byte pieces");
            assert_eq!(
                split.messages, whole.messages,
                "split into {chunk}-byte pieces"
            );
            assert_eq!(
                split.executions, whole.executions,
                "split into {chunk}-byte pieces"
            );
        }
        let executions: Vec<(&str, u64)> = whole
            .executions
            .iter()
            .map(|(sql, n)| (sql.as_str(), *n))
            .collect();
        assert_eq!(
            executions,
            [(SYNC_ALONE, 1), ("SELECT 'S', 'Q'", 2), ("SELECT 1", 1)]
        );
    }

    #[test]
    fn a_connection_without_ssl_request_starts_typed_after_the_startup_message() {
        let mut counter = FrontendCounter::default();
        counter.feed(&untyped(196_608, b"user\0postgres\0\0"));
        counter.feed(&message(b'Q', b"BEGIN\0"));
        counter.feed(&message(b'S', b""));
        assert_eq!(counter.round_trips, 2);
    }

    #[tokio::test]
    async fn the_counting_proxy_counts_what_a_real_client_sends() {
        use sqlx::Connection as _;
        let url = std::env::var("DATABASE_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned());
        let proxy = CountingProxy::start(host_port(&url).unwrap())
            .await
            .unwrap();
        let (_, rest) = url.split_once("://").unwrap();
        let user = rest.split_once('@').map_or("postgres", |(user, _)| user);
        let database = with_database(&url, "postgres");
        let database = database
            .rsplit_once('/')
            .unwrap()
            .1
            .split('?')
            .next()
            .unwrap();
        let proxied = format!(
            "postgres://{user}@127.0.0.1:{}/{database}?sslmode=disable",
            proxy.port
        );
        let mut connection = sqlx::PgConnection::connect(&proxied).await.unwrap();
        let after_connect = proxy.count();
        for n in 0..5i64 {
            let echoed: i64 = sqlx::query_scalar("SELECT $1::bigint")
                .bind(n)
                .fetch_one(&mut connection)
                .await
                .unwrap();
            assert_eq!(echoed, n);
        }
        sqlx::raw_sql("SELECT 1")
            .execute(&mut connection)
            .await
            .unwrap();
        let counted = proxy.count() - after_connect;
        // Five executions of one prepared statement (its preparation is a
        // round trip of its own in sqlx) and one simple query.
        assert_eq!(
            counted, 7,
            "round trips for 5 prepared executions and a simple query"
        );
        let executions = proxy.executions();
        assert_eq!(
            executions.get("SELECT $1::bigint"),
            Some(&5),
            "{executions:?}"
        );
        assert_eq!(executions.get(PREPARE), Some(&1), "{executions:?}");
        assert_eq!(executions.get("SELECT 1"), Some(&1), "{executions:?}");
        connection.close().await.unwrap();
    }

    #[test]
    fn hosts_and_memory_are_read() {
        assert_eq!(
            host_port("postgres://u:p@db.example:6543/d").unwrap(),
            ("db.example".to_owned(), 6543)
        );
        assert_eq!(
            host_port("postgres://u@h/d").unwrap(),
            ("h".to_owned(), 5432)
        );
        assert_eq!(parse_vm_rss("Name:\tx\nVmRSS:\t   12345 kB\n"), Some(12345));
    }
}
