//! The chaos soak: several `leasegate serve` processes on
//! one fresh ledger database, in front of example tool servers of all four
//! capabilities with fault injection, N intents driven by concurrent agents
//! that re-call after errors, while the harness SIGKILLs and SIGSTOPs
//! proxies and terminates their database backends (and, behind a flag,
//! restarts PostgreSQL). At the end it lets the reconcilers settle, reads
//! the ledger and the tools' effect logs, and reports.
//!
//! Shared by `bench/chaos/main.rs` (the CLI) and `tests/external/chaos.rs` (the
//! reduced CI run), which includes this file with `#[path]`.
//!
//! # Invariants checked (any breach is a violation; the run fails)
//!
//! 1. No intent has more than one side effect — for the idempotent tools
//!    (`idempotency_key`, `resource_id`, `operation_query`) and for the
//!    `none` tool alike (leasegate must never re-send a `none` call).
//! 2. No lost intent: every intent an agent issued has an operation row, and
//!    every side effect belongs to an intent's operation.
//! 3. No `succeeded` operation without its side effect.
//! 4. No `failed_final` operation with a side effect.
//! 5. One intent, one operation id: every answer an agent got for a step
//!    names the same operation, and a terminal status an agent was told is
//!    the ledger's final status.
//!
//! `unknown` operations are reported (with and without effect), not failed:
//! a `none` tool's unknown outcome waits for an operator by design.

#![allow(dead_code)]

// `tests/external` includes both the gateway and the chaos harness, so it
// holds this module twice, one copy in each.
#[allow(clippy::duplicate_mod)]
#[path = "../common/mod.rs"]
mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use common::database::{recreate, with_database};
use serde_json::{Value, json};
use sqlx::Row;
use tokio::sync::Mutex;

/// What one soak does.
#[derive(Debug, Clone)]
pub struct Settings {
    pub intents: usize,
    pub proxies: usize,
    pub agents: usize,
    pub seed: u64,
    /// Tool-server and proxy faults on.
    pub faults: bool,
    pub tool_transient: f64,
    pub tool_crash: f64,
    pub tool_hang: f64,
    pub tool_slow: f64,
    /// Mean time between two proxy/database faults.
    pub fault_interval: Duration,
    /// Proxies SIGKILLed and SIGSTOPped among the faults; off: the only
    /// faults are the database's (backends terminated, the restart below).
    pub proxy_faults: bool,
    /// `Some(command line)`: restart PostgreSQL once, mid-run, with it
    /// (e.g. `pg_ctlcluster --skip-systemctl-redirect 15 main restart`, or
    /// a private cluster's `pg_ctl -m immediate restart`: a crash-restart).
    pub pg_restart: Option<Vec<String>>,
    /// How long into the run the restart happens.
    pub pg_restart_after: Duration,
    /// The payments tool as one Streamable HTTP server all proxies share
    /// (instead of a stdio child per proxy), stopped for 1–3 s at a time
    /// (connections refused) up to three times during the run.
    pub http_outages: bool,
    /// Also a violation: an operation whose tool was reached (and, with the
    /// tool and proxy faults off, answered) that does not end with that
    /// answer (`succeeded`/`failed_final`), whatever its capability —
    /// an answer the ledger could not take at first must still land.
    pub answers_settle: bool,
    /// How long the reconcilers get to settle after the agents finished.
    pub settle: Duration,
    /// Calls per intent before an agent gives up on an answer.
    pub attempts: u32,
    pub leasegate: PathBuf,
    pub tools: PathBuf,
    /// A superuser connection to the maintenance database (`postgres`).
    pub admin_url: String,
    /// Keep the database and the work directory at the end.
    pub keep: bool,
}

impl Settings {
    /// The defaults, with the binaries to run.
    pub fn new(leasegate: PathBuf, tools: PathBuf) -> Self {
        Self {
            intents: 500,
            proxies: 2,
            agents: 8,
            seed: 1,
            faults: true,
            tool_transient: 0.04,
            tool_crash: 0.02,
            tool_hang: 0.03,
            tool_slow: 0.10,
            fault_interval: Duration::from_millis(1500),
            proxy_faults: true,
            pg_restart: None,
            pg_restart_after: Duration::from_secs(10),
            http_outages: false,
            answers_settle: false,
            settle: Duration::from_secs(60),
            attempts: 12,
            leasegate,
            tools,
            admin_url: "postgres://postgres@127.0.0.1:5432/postgres".to_owned(),
            keep: false,
        }
    }
}

/// The end of a soak: the printed report and what broke.
#[derive(Debug)]
pub struct Outcome {
    pub report: String,
    pub violations: Vec<String>,
    pub intents: usize,
    pub faults: FaultCounts,
}

/// A tiny seeded generator (xorshift64*), no crate needed.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    pub fn millis(&mut self, low: u64, high: u64) -> Duration {
        Duration::from_millis(low + self.below(high.saturating_sub(low) + 1))
    }
}

/// The four tools, one per capability.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Charge,
    Bucket,
    Job,
    Email,
}

impl Kind {
    const ALL: [Kind; 4] = [Kind::Charge, Kind::Bucket, Kind::Job, Kind::Email];
    fn tool(self) -> &'static str {
        match self {
            Kind::Charge => "payments__charge",
            Kind::Bucket => "provisioner__create_bucket",
            Kind::Job => "jobs__submit_job",
            Kind::Email => "mailer__send_email",
        }
    }
    fn capability(self) -> &'static str {
        match self {
            Kind::Charge => "idempotency_key",
            Kind::Bucket => "resource_id",
            Kind::Job => "operation_query",
            Kind::Email => "none",
        }
    }
    fn effects_file(self) -> &'static str {
        match self {
            Kind::Charge => "charges.jsonl",
            Kind::Bucket => "buckets.jsonl",
            Kind::Job => "jobs.jsonl",
            Kind::Email => "emails.jsonl",
        }
    }
    fn arguments(self, index: usize, label: &str) -> Value {
        match self {
            Kind::Charge => json!({"amount": 100 + index % 900, "currency": "eur"}),
            Kind::Bucket => {
                let region = ["eu", "us", "ap"][index % 3];
                // The agent names its bucket; leasegate finds it by that name.
                json!({"name": label, "region": region, "size": 1 + index % 7})
            }
            Kind::Job => json!({"name": label}),
            Kind::Email => {
                json!({"to": format!("{label}@chaos.test"), "subject": label, "body": "chaos"})
            }
        }
    }
}

/// What an agent learned about one intent.
#[derive(Debug, Clone)]
struct IntentRecord {
    index: usize,
    kind: Kind,
    label: String,
    run_id: String,
    /// Every operation id an answer named.
    operation_ids: BTreeSet<String>,
    /// The last status an answer reported (`None`: no answer named one).
    last_status: Option<String>,
    /// A terminal status an answer reported.
    terminal: Option<String>,
    calls: u32,
    /// Why the agent stopped without a terminal answer, if it did.
    gave_up: Option<String>,
}

/// Faults the harness injected (the tool servers log theirs in faults.jsonl).
#[derive(Debug, Clone, Default)]
pub struct FaultCounts {
    pub proxy_kills: usize,
    pub proxy_stops: usize,
    pub backend_terminations: usize,
    pub backends_terminated: usize,
    pub pg_restarts: usize,
    /// Times the shared HTTP tool server was stopped.
    pub http_outages: usize,
}

/// The payments tool over Streamable HTTP on a fixed port, restartable.
/// Payments, not the mailer: a server killed mid-call may have acted
/// without answering, and only an `idempotency_key` tool converges every
/// such call without an operator (a same-key retry), so the soak can still
/// demand that every call converge.
struct HttpTools {
    tools: PathBuf,
    state: PathBuf,
    address: String,
    child: Option<tokio::process::Child>,
}

impl HttpTools {
    async fn spawn(&mut self) -> anyhow::Result<()> {
        let mut child = tokio::process::Command::new(&self.tools)
            .args([
                "--tools",
                "payments",
                "--http",
                &self.address,
                "--state-dir",
            ])
            .arg(&self.state)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .context("start the HTTP tool server")?;
        // Listening once a TCP connection is accepted.
        let deadline = Instant::now() + Duration::from_secs(30);
        while tokio::net::TcpStream::connect(&self.address).await.is_err() {
            if let Some(status) = child.try_wait()? {
                bail!("the HTTP tool server exited at start: {status}");
            }
            if Instant::now() > deadline {
                bail!("the HTTP tool server does not listen on {}", self.address);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.child = Some(child);
        Ok(())
    }

    async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill().await;
        }
    }
}

/// One `leasegate serve` process slot: fixed ports, restartable.
struct Proxy {
    index: usize,
    config: PathBuf,
    log: PathBuf,
    mcp: String,
    control: String,
    child: Option<tokio::process::Child>,
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

fn http_client(timeout: Duration) -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(timeout)
        .build()
        .expect("an HTTP client")
}

impl Proxy {
    async fn spawn(&mut self, leasegate: &Path) -> anyhow::Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        let child = tokio::process::Command::new(leasegate)
            .arg("serve")
            .arg("--config")
            .arg(&self.config)
            .env(
                "RUST_LOG",
                std::env::var("CHAOS_PROXY_LOG").unwrap_or_else(|_| "warn".to_owned()),
            )
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("spawn {}", leasegate.display()))?;
        self.child = Some(child);
        // Ready when the control listener answers.
        let client = http_client(Duration::from_secs(2));
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(answer) = client.get(format!("{}/metrics", self.control)).send().await
                && answer.status().is_success()
            {
                return Ok(());
            }
            if let Some(child) = self.child.as_mut()
                && let Some(status) = child.try_wait()?
            {
                bail!(
                    "proxy {} exited at start ({status}); see {}",
                    self.index,
                    self.log.display()
                );
            }
            if Instant::now() > deadline {
                bail!("proxy {} did not answer within 60 s", self.index);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn pid(&self) -> Option<nix::unistd::Pid> {
        self.child
            .as_ref()
            .and_then(|c| c.id())
            .map(|id| nix::unistd::Pid::from_raw(id as i32))
    }

    fn signal(&self, signal: nix::sys::signal::Signal) {
        if let Some(pid) = self.pid() {
            let _ = nix::sys::signal::kill(pid, signal);
        }
    }

    async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill().await;
        }
    }

    /// SIGTERM, then SIGKILL after a grace period.
    async fn stop(&mut self) {
        self.signal(nix::sys::signal::Signal::SIGCONT);
        self.signal(nix::sys::signal::Signal::SIGTERM);
        if let Some(mut child) = self.child.take()
            && tokio::time::timeout(Duration::from_secs(5), child.wait())
                .await
                .is_err()
        {
            let _ = child.kill().await;
        }
    }
}

fn upstream_block(name: &str, set: &str, settings: &Settings, state: &Path, salt: u64) -> String {
    let mut args = vec![
        "--tools".to_owned(),
        set.to_owned(),
        "--state-dir".to_owned(),
        state.display().to_string(),
    ];
    if settings.faults {
        for (flag, value) in [
            ("--fault-transient", settings.tool_transient),
            ("--fault-crash", settings.tool_crash),
            ("--fault-hang", settings.tool_hang),
            ("--fault-slow", settings.tool_slow),
        ] {
            args.push(flag.to_owned());
            args.push(value.to_string());
        }
        args.extend([
            "--fault-hang-ms".to_owned(),
            "3000".to_owned(),
            "--fault-slow-ms".to_owned(),
            "400".to_owned(),
            "--fault-seed".to_owned(),
            (settings.seed ^ salt).to_string(),
        ]);
    }
    format!(
        "[upstreams.{name}]\ntransport = \"stdio\"\ncommand = {:?}\nargs = {}\n\n",
        settings.tools.display().to_string(),
        serde_json::to_string(&args).expect("strings")
    )
}

const ADAPTERS: [(&str, &str); 4] = [
    (
        "payments.toml",
        r#"upstream = "payments"
timeout = "1500ms"
[tools.charge]
capability = "idempotency_key"
operation_id_argument = "idempotency_key"
key_retention = "24h"
remote_id_pointer = "/charge_id"
[tools.get_charge]
read_only = true
"#,
    ),
    (
        "mailer.toml",
        r#"upstream = "mailer"
timeout = "1500ms"
[tools.send_email]
capability = "none"
remote_id_pointer = "/message_id"
[tools.mail_stats]
read_only = true
"#,
    ),
    (
        "provisioner.toml",
        r#"upstream = "provisioner"
timeout = "1500ms"
[tools.create_bucket]
capability = "resource_id"
resource_id_pointer = "/name"
resend_after_not_found = "4s"
query_tool = "get_bucket"
query_argument = "name"
query_resource_pointer = "/bucket"
query_remote_id_pointer = "/bucket/bucket_id"
match_fields = ["region", "size"]
remote_id_pointer = "/bucket_id"
[tools.get_bucket]
read_only = true
"#,
    ),
    (
        "jobs.toml",
        r#"upstream = "jobs"
timeout = "1500ms"
[tools.submit_job]
capability = "operation_query"
operation_id_meta = "example.dev/job_id"
query_tool = "get_job"
query_argument = "job_id"
query_remote_id_pointer = "/job/job_seq"
resend_after_not_found = "4s"
remote_id_pointer = "/job_seq"
[tools.get_job]
read_only = true
"#,
    ),
];

/// Claims shorter than the default so that a killed or frozen proxy's work
/// is picked up within seconds; still longer than every tool timeout.
const POLICY: &str = r#"claim_ttl = "4s"
in_flight_wait = "1s"
step_identity = "explicit"
dispatch_interval = "250ms"
claim_expiry_interval = "250ms"
reconcile_interval = "250ms"
reconcile_claim_ttl = "5s"
reconcile_retries = 20
"#;

/// How long the unknown operations must stay unchanged for the settle
/// phase to end before its deadline (twice the reconcile claim TTL).
const QUIET: Duration = Duration::from_secs(10);

/// Runs one soak and reports. Errors are harness failures (could not set
/// up), not invariant violations.
pub async fn run(settings: Settings) -> anyhow::Result<Outcome> {
    let started = Instant::now();
    let tag = format!("{:08x}", Rng::new(settings.seed ^ nanos()).next() as u32);
    let database = format!("leasegate_chaos_{tag}");
    let work = std::env::temp_dir().join(format!("leasegate-chaos-{tag}"));
    let state = work.join("state");
    std::fs::create_dir_all(work.join("adapters"))?;
    std::fs::create_dir_all(&state)?;

    let admin = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect(&settings.admin_url)
        .await
        .with_context(|| format!("connect to {} (PostgreSQL)", settings.admin_url))?;
    let database_url = with_database(&settings.admin_url, &database);
    recreate(&database_url).await?;
    let migrate = tokio::process::Command::new(&settings.leasegate)
        .arg("migrate")
        .arg("--database-url")
        .arg(&database_url)
        .output()
        .await
        .context("run leasegate migrate")?;
    if !migrate.status.success() {
        bail!(
            "leasegate migrate failed: {}",
            String::from_utf8_lossy(&migrate.stderr)
        );
    }

    for (file, text) in ADAPTERS {
        std::fs::write(work.join("adapters").join(file), text)?;
    }
    std::fs::write(work.join("policy.toml"), POLICY)?;
    let http_tools = if settings.http_outages {
        let mut http = HttpTools {
            tools: settings.tools.clone(),
            state: state.clone(),
            address: format!("127.0.0.1:{}", free_port()?),
            child: None,
        };
        http.spawn().await?;
        Some(Arc::new(Mutex::new(http)))
    } else {
        None
    };
    let mut proxies = Vec::new();
    for index in 0..settings.proxies {
        let (mcp_port, control_port) = (free_port()?, free_port()?);
        let mut config = format!(
            "database_url = {database_url:?}\ndatabase_max_connections = 6\ntenant = \"chaos\"\n\
             listen = \"127.0.0.1:{mcp_port}\"\ncontrol_listen = \"127.0.0.1:{control_port}\"\n\
             adapters = \"adapters\"\npolicy = \"policy.toml\"\nmigrate = false\n\n\
             # Every agent calls from one loopback address: the soak measures the\n\
             # ledger under faults, not the per-principal rate limit.\n\
             [limits]\nrate_limit = 0\n\n"
        );
        for (salt, (name, set)) in [
            ("payments", "payments"),
            ("mailer", "mailer"),
            ("provisioner", "provisioner"),
            ("jobs", "jobs"),
        ]
        .into_iter()
        .enumerate()
        {
            let salt = (index * 16 + salt) as u64;
            match &http_tools {
                Some(http) if name == "payments" => config.push_str(&format!(
                    "[upstreams.payments]\ntransport = \"streamable_http\"\nurl = \"http://{}/mcp\"\n\n",
                    http.lock().await.address
                )),
                _ => config.push_str(&upstream_block(name, set, &settings, &state, salt)),
            }
        }
        let path = work.join(format!("proxy-{index}.toml"));
        std::fs::write(&path, config)?;
        let mut proxy = Proxy {
            index,
            config: path,
            log: work.join(format!("proxy-{index}.log")),
            mcp: format!("http://127.0.0.1:{mcp_port}/mcp"),
            control: format!("http://127.0.0.1:{control_port}"),
            child: None,
        };
        proxy.spawn(&settings.leasegate).await?;
        proxies.push(Arc::new(Mutex::new(proxy)));
    }
    let mcp_urls: Vec<String> = futures_urls(&proxies, |p| p.mcp.clone()).await;
    let control_urls: Vec<String> = futures_urls(&proxies, |p| p.control.clone()).await;
    let setup = started.elapsed();

    // The agents.
    let next = Arc::new(AtomicUsize::new(0));
    let records = Arc::new(std::sync::Mutex::new(Vec::<IntentRecord>::new()));
    // On a terminal: intents answered so far; elsewhere (CI) nothing.
    let progress = Arc::new(leasegate::progress::Progress::bar(
        settings.intents as u64,
        "chaos: intents answered",
    ));
    let ticker = progress.is_drawn().then(|| {
        let (progress, records) = (progress.clone(), records.clone());
        tokio::spawn(async move {
            loop {
                let answered = records.lock().map_or(0, |r| r.len());
                progress.set_position(answered as u64);
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
    });
    let mut agents = Vec::new();
    for agent in 0..settings.agents {
        let ctx = AgentCtx {
            agent,
            settings: settings.clone(),
            mcp: mcp_urls.clone(),
            control: control_urls.clone(),
            next: next.clone(),
            records: records.clone(),
            client: http_client(Duration::from_secs(6)),
            rng: std::sync::Mutex::new(Rng::new(settings.seed.wrapping_add(1 + agent as u64))),
        };
        agents.push(tokio::spawn(async move { ctx.run().await }));
    }

    // The chaos monkey.
    let done = Arc::new(AtomicBool::new(false));
    let monkey = {
        let settings = settings.clone();
        let proxies = proxies.clone();
        let done = done.clone();
        let admin = admin.clone();
        let database = database.clone();
        let http_tools = http_tools.clone();
        tokio::spawn(
            async move { monkey(settings, proxies, http_tools, admin, database, done).await },
        )
    };
    for agent in agents {
        agent.await?;
    }
    if let Some(ticker) = ticker {
        ticker.abort();
    }
    progress.finish();
    let driven = started.elapsed() - setup;
    done.store(true, Ordering::SeqCst);
    let faults = monkey.await??;

    // Settle: no more faults; every proxy and tool server up; the
    // reconcilers get `settle`.
    std::fs::write(state.join("calm"), "")?;
    if let Some(http) = &http_tools {
        let mut http = http.lock().await;
        if http.child.is_none() {
            http.spawn().await?;
        }
    }
    for proxy in &proxies {
        let mut proxy = proxy.lock().await;
        proxy.signal(nix::sys::signal::Signal::SIGCONT);
        let exited = match proxy.child.as_mut() {
            Some(child) => child.try_wait()?.is_some(),
            None => true,
        };
        if exited {
            proxy.spawn(&settings.leasegate).await?;
        }
    }
    let ledger = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect(&database_url)
        .await?;
    // Done when nothing is prepared or dispatching and the unknown
    // operations of the tools that can converge stopped changing for
    // `QUIET` (an operation_query or resource_id operation whose request
    // never reached the tool stays unknown: not found proves nothing).
    let settle_started = Instant::now();
    let mut last_change = (Instant::now(), -1i64);
    let settling = leasegate::progress::Progress::spinner("chaos: settling");
    loop {
        let (moving, unknown): (i64, i64) = sqlx::query_as(
            "SELECT count(*) FILTER (WHERE status IN ('prepared', 'dispatching')),
                    count(*) FILTER (WHERE status = 'unknown' AND (tool_name <> $1 OR $2))
               FROM tool_operations",
        )
        .bind(Kind::Email.tool())
        .bind(settings.answers_settle)
        .fetch_one(&ledger)
        .await?;
        if moving > 0 || unknown != last_change.1 {
            last_change = (Instant::now(), unknown);
        }
        settling.set_message(&format!(
            "chaos: settling ({moving} in flight, {unknown} unknown)"
        ));
        let quiet = moving == 0 && (unknown == 0 || last_change.0.elapsed() > QUIET);
        if quiet || settle_started.elapsed() > settings.settle {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    settling.finish();
    let settled_in = settle_started.elapsed();

    // Read the ledger and the effect logs.
    let rows = sqlx::query(
        "SELECT run_id::text AS run_id, operation_id, status, tool_name, dispatch_count,
                reconcile_attempts FROM tool_operations",
    )
    .fetch_all(&ledger)
    .await?;
    ledger.close().await;
    let mut operations: HashMap<String, Vec<OperationRow>> = HashMap::new();
    for row in rows {
        operations
            .entry(row.try_get("run_id")?)
            .or_default()
            .push(OperationRow {
                operation_id: row.try_get("operation_id")?,
                status: row.try_get("status")?,
                tool_name: row.try_get("tool_name")?,
                dispatch_count: row.try_get("dispatch_count")?,
                reconcile_attempts: row.try_get("reconcile_attempts")?,
            });
    }
    let effects = EffectLogs::read(&state);

    // After its outages the HTTP tool server is back: every proxy must say
    // so (its health, hence the gauge and the "upstream down" alert).
    let mut health_violations = Vec::new();
    if http_tools.is_some() {
        let client = http_client(Duration::from_secs(5));
        for control in &control_urls {
            let deadline = Instant::now() + Duration::from_secs(15);
            loop {
                let state = match client.get(format!("{control}/v1/upstreams")).send().await {
                    Ok(answer) => answer.json::<Value>().await.ok().and_then(|listed| {
                        listed["upstreams"].as_array()?.iter().find_map(|u| {
                            (u["name"] == "payments")
                                .then(|| u["state"].as_str().map(str::to_owned))?
                        })
                    }),
                    Err(_) => None,
                };
                if state.as_deref() == Some("up") {
                    break;
                }
                if Instant::now() > deadline {
                    health_violations.push(format!(
                        "{control}: the HTTP payments server is back but its health says {state:?}, not up"
                    ));
                    break;
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
    }

    for proxy in &proxies {
        proxy.lock().await.stop().await;
    }
    if let Some(http) = &http_tools {
        http.lock().await.kill().await;
    }
    reap_tool_servers(&state);

    let records = std::mem::take(&mut *records.lock().unwrap_or_else(|e| e.into_inner()));
    let mut outcome = judge(&settings, &records, &operations, &effects, faults);
    for violation in health_violations {
        outcome
            .report
            .push_str(&format!("VIOLATION: {violation}\n"));
        outcome.violations.push(violation);
    }
    let mut head = String::new();
    head.push_str(&format!(
        "leasegate chaos soak\n\
         method: {} agents drive {} intents (one run each, explicit step, lease from the control \
         API) through {} `leasegate serve` processes on database {database}; tools: payments \
         charge (idempotency_key), provisioner create_bucket (resource_id), jobs submit_job \
         (operation_query), mailer send_email (none), one stdio child per tool per proxy; an \
         agent re-calls the same step through a random proxy after an error or unknown (up to {} \
         calls, more while no operation was named)\n\
         settings: seed {}, faults {} (proxy faults {}), tool faults per call: transient {}, crash after effect {}, \
         hang after effect {} (3 s, tool timeout 1.5 s), slow {} (up to 400 ms); proxy/db fault \
         every ~{} ms (SIGKILL+restart, SIGSTOP 1-6 s (claim_ttl 4 s), pg_terminate_backend of every backend), \
         PostgreSQL restart: {}; policy claim_ttl 4s, reconcile every 250 ms, settle deadline {} s \
         (earlier once nothing is prepared or dispatching and the unknowns stayed unchanged \
         for 10 s)\n\
         time: setup {:.1} s, agents {:.1} s, settle {:.1} s, work dir {}\n",
        settings.agents,
        settings.intents,
        settings.proxies,
        settings.attempts,
        settings.seed,
        if settings.faults { "on" } else { "off" },
        if settings.proxy_faults { "on" } else { "off" },
        settings.tool_transient,
        settings.tool_crash,
        settings.tool_hang,
        settings.tool_slow,
        settings.fault_interval.as_millis(),
        settings
            .pg_restart
            .as_ref()
            .map_or("off".to_owned(), |command| command.join(" ")),
        settings.settle.as_secs(),
        setup.as_secs_f64(),
        driven.as_secs_f64(),
        settled_in.as_secs_f64(),
        work.display(),
    ));
    outcome.report = head + &outcome.report;

    let keep = settings.keep || !outcome.violations.is_empty();
    if keep {
        outcome.report.push_str(&format!(
            "kept: database {database}, work dir {} (logs, effect files)\n",
            work.display()
        ));
    } else {
        let _ = common::database::drop(&database_url).await;
        let _ = std::fs::remove_dir_all(&work);
    }
    admin.close().await;
    Ok(outcome)
}

async fn futures_urls(
    proxies: &[Arc<Mutex<Proxy>>],
    pick: impl Fn(&Proxy) -> String,
) -> Vec<String> {
    let mut urls = Vec::new();
    for proxy in proxies {
        urls.push(pick(&*proxy.lock().await));
    }
    urls
}

fn nanos() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or_default()
}

/// Ends the tool server children a killed proxy left behind: processes
/// whose command line names this soak's own state dir (unique per run).
fn reap_tool_servers(state: &Path) {
    let needle = state.display().to_string();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return;
    };
    for entry in entries.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        if args.iter().any(|a| a == &needle) && args.iter().any(|a| a == "--state-dir") {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

struct AgentCtx {
    agent: usize,
    settings: Settings,
    mcp: Vec<String>,
    control: Vec<String>,
    next: Arc<AtomicUsize>,
    records: Arc<std::sync::Mutex<Vec<IntentRecord>>>,
    client: reqwest::Client,
    rng: std::sync::Mutex<Rng>,
}

/// What one call through a proxy answered.
enum Answer {
    /// An operation with this status (`unknown` included).
    Operation { id: String, status: String },
    /// A JSON-RPC error, maybe naming the operation (in progress elsewhere).
    Refused {
        code: i64,
        message: String,
        operation: Option<String>,
    },
    /// No answer (connection refused, reset, timeout, unreadable body).
    None(String),
}

impl AgentCtx {
    fn draw(&self, n: u64) -> u64 {
        self.rng.lock().unwrap_or_else(|e| e.into_inner()).below(n)
    }

    async fn run(&self) {
        loop {
            let index = self.next.fetch_add(1, Ordering::SeqCst);
            if index >= self.settings.intents {
                return;
            }
            let record = self.intent(index).await;
            self.records
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(record);
        }
    }

    async fn intent(&self, index: usize) -> IntentRecord {
        let kind = Kind::ALL[self.draw(4) as usize];
        let label = format!("chaos-{index}");
        let mut run_id = uuid::Uuid::new_v4().to_string();
        let owner = format!("agent-{}", self.agent);
        let mut record = IntentRecord {
            index,
            kind,
            label: label.clone(),
            run_id: run_id.clone(),
            operation_ids: BTreeSet::new(),
            last_status: None,
            terminal: None,
            calls: 0,
            gave_up: None,
        };
        // The run and its lease in one request; the run id is ours, so a
        // retry after a lost answer is the same run (200, same lease). That
        // replay does not carry the lease token (it was shown once, in the
        // lost answer): the run is then cancelled (an operator route, no
        // lease needed; nothing was registered under it) and a new run
        // created for the task.
        let mut create = json!({"tenant_id": "chaos", "task_id": label, "run_id": run_id,
                                "owner": owner, "ttl_ms": 600_000});
        let mut epoch = None;
        for attempt in 0..60u32 {
            let control = &self.control[self.draw(self.control.len() as u64) as usize];
            let sent = self
                .client
                .post(format!("{control}/v1/runs"))
                .header("content-type", "application/json")
                .body(create.to_string())
                .send()
                .await;
            if let Ok(answer) = sent {
                let status = answer.status().as_u16();
                let body: Value = answer
                    .text()
                    .await
                    .ok()
                    .and_then(|t| serde_json::from_str(&t).ok())
                    .unwrap_or(Value::Null);
                if (status == 200 || status == 201) && body["lease"]["owner"] == owner.as_str() {
                    if let Some(token) = body["lease_token"].as_str() {
                        epoch = body["lease"]["epoch"]
                            .as_i64()
                            .map(|e| (e, token.to_owned()));
                        break;
                    }
                    self.cancel_run(&run_id).await;
                    run_id = uuid::Uuid::new_v4().to_string();
                    record.run_id = run_id.clone();
                    create["run_id"] = json!(run_id);
                    continue;
                }
                // A live run of this task that is not the one asked for:
                // an earlier run of ours whose cancel above was lost to a
                // fault (the task ids are this intent's own). Cancel it and
                // create again.
                if status == 409
                    && body["code"] == "active_run_live"
                    && body["detail"]["lease"]["owner"] == owner.as_str()
                    && let Some(live) = body["detail"]["run_id"].as_str()
                    && live != run_id
                {
                    self.cancel_run(live).await;
                    continue;
                }
                if status < 500 {
                    record.gave_up = Some(format!("create run: {status} {body}"));
                    return record;
                }
            }
            tokio::time::sleep(backoff(attempt)).await;
        }
        let Some((epoch, token)) = epoch else {
            record.gave_up = Some("create run: no answer".to_owned());
            return record;
        };

        let arguments = kind.arguments(index, &label);
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
            "name": kind.tool(), "arguments": arguments,
            "_meta": {"dev.leasegate/step": {"step_id": "do", "effect_version": 1}}}})
        .to_string();
        // Budget: `attempts` calls; while no answer named an operation
        // (the intent may not be recorded yet) up to four times as many.
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            record.calls = attempt;
            let mcp = &self.mcp[self.draw(self.mcp.len() as u64) as usize];
            match self.call(mcp, &body, &run_id, &owner, epoch, &token).await {
                Answer::Operation { id, status } => {
                    record.operation_ids.insert(id);
                    record.last_status = Some(status.clone());
                    if status == "succeeded" || status == "failed_final" {
                        record.terminal = Some(status);
                        return record;
                    }
                }
                Answer::Refused {
                    code,
                    message,
                    operation,
                } => {
                    if let Some(id) = operation {
                        record.operation_ids.insert(id);
                    }
                    record.gave_up = Some(format!("error {code}: {message}"));
                }
                Answer::None(why) => record.gave_up = Some(format!("no answer: {why}")),
            }
            let budget = if record.operation_ids.is_empty() {
                self.settings.attempts * 4
            } else {
                self.settings.attempts
            };
            if attempt >= budget {
                if record.gave_up.is_none() {
                    record.gave_up = Some(format!(
                        "still {} after {attempt} calls",
                        record.last_status.as_deref().unwrap_or("?")
                    ));
                }
                return record;
            }
            tokio::time::sleep(backoff(attempt)).await;
        }
    }

    /// Cancels `run_id` through the control API (an operator route, no
    /// lease needed), retrying through faults until some control listener
    /// answers below 500 (200, or a refusal because the run is already
    /// terminal or was never created) or the attempts run out.
    async fn cancel_run(&self, run_id: &str) {
        let cancel = json!({"actor": "chaos-harness", "reason": "lease token lost"});
        for attempt in 0..30u32 {
            let control = &self.control[self.draw(self.control.len() as u64) as usize];
            let sent = self
                .client
                .post(format!("{control}/v1/runs/{run_id}/cancel"))
                .header("content-type", "application/json")
                .body(cancel.to_string())
                .send()
                .await;
            if matches!(&sent, Ok(answer) if answer.status().as_u16() < 500) {
                return;
            }
            tokio::time::sleep(backoff(attempt)).await;
        }
    }

    async fn call(
        &self,
        mcp: &str,
        body: &str,
        run_id: &str,
        owner: &str,
        epoch: i64,
        token: &str,
    ) -> Answer {
        let sent = self
            .client
            .post(mcp)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2025-11-25")
            .header("leasegate-run-id", run_id)
            .header("leasegate-owner", owner)
            .header("leasegate-epoch", epoch.to_string())
            .header("leasegate-lease-token", token)
            .body(body.to_owned())
            .send()
            .await;
        let answer = match sent {
            Ok(answer) => answer,
            Err(error) => return Answer::None(error.to_string()),
        };
        let status = answer.status();
        let text = match answer.text().await {
            Ok(text) => text,
            Err(error) => return Answer::None(error.to_string()),
        };
        let Some(message) = parse_rpc(&text) else {
            return Answer::None(format!("HTTP {status}: {}", truncate(&text, 200)));
        };
        if let Some(error) = message.get("error") {
            return Answer::Refused {
                code: error["code"].as_i64().unwrap_or_default(),
                message: truncate(error["message"].as_str().unwrap_or_default(), 200),
                operation: error["data"]["operation_id"].as_str().map(str::to_owned),
            };
        }
        let result = &message["result"];
        let note = &result["_meta"]["dev.leasegate/operation"];
        match (note["operation_id"].as_str(), note["status"].as_str()) {
            (Some(id), Some(status)) => Answer::Operation {
                id: id.to_owned(),
                status: status.to_owned(),
            },
            _ => Answer::None(format!(
                "a result without an operation: {}",
                truncate(&result.to_string(), 200)
            )),
        }
    }
}

fn backoff(attempt: u32) -> Duration {
    Duration::from_millis((100u64 << attempt.min(5)).min(2000))
}

fn truncate(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_owned(),
    }
}

/// The JSON-RPC response in a body: plain JSON or an SSE stream.
fn parse_rpc(text: &str) -> Option<Value> {
    if text.trim_start().starts_with('{') {
        return serde_json::from_str(text).ok();
    }
    text.lines()
        .rev()
        .filter_map(|line| line.strip_prefix("data:"))
        .filter_map(|data| serde_json::from_str::<Value>(data.trim()).ok())
        .find(|message| message.get("id").is_some())
}

/// The proxy and database faults, until `done`.
async fn monkey(
    settings: Settings,
    proxies: Vec<Arc<Mutex<Proxy>>>,
    http_tools: Option<Arc<Mutex<HttpTools>>>,
    admin: sqlx::PgPool,
    database: String,
    done: Arc<AtomicBool>,
) -> anyhow::Result<FaultCounts> {
    let mut counts = FaultCounts::default();
    if !settings.faults {
        return Ok(counts);
    }
    let mut rng = Rng::new(settings.seed ^ 0x00C0_FFEE);
    let started = Instant::now();
    let interval = settings.fault_interval.as_millis() as u64;
    // Every fourth fault (the first included) is an HTTP outage, while any
    // are left.
    let mut round: u64 = 0;
    while !done.load(Ordering::SeqCst) {
        tokio::time::sleep(rng.millis(interval / 2, interval * 3 / 2)).await;
        if done.load(Ordering::SeqCst) {
            break;
        }
        if let Some(restart) = &settings.pg_restart
            && counts.pg_restarts == 0
            && started.elapsed() > settings.pg_restart_after
        {
            let (program, args) = restart.split_first().context("an empty restart command")?;
            let out = tokio::process::Command::new(program)
                .args(args)
                .output()
                .await
                .with_context(|| format!("run {restart:?}"))?;
            if !out.status.success() {
                bail!(
                    "{restart:?} failed: {}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            counts.pg_restarts += 1;
            continue;
        }
        round += 1;
        // Not the first round: that one terminates backends, so a short
        // soak sees every kind of fault before its intents are done.
        if let Some(http) = &http_tools
            && counts.http_outages < 3
            && round % 4 == 2
        {
            // Down: connections refused until it is back on the same port.
            let mut http = http.lock().await;
            http.kill().await;
            counts.http_outages += 1;
            tokio::time::sleep(rng.millis(1000, 3000)).await;
            http.spawn().await?;
            continue;
        }
        let victim = &proxies[rng.below(proxies.len() as u64) as usize];
        let fault = if settings.proxy_faults {
            rng.below(3)
        } else {
            2
        };
        match fault {
            0 => {
                let mut proxy = victim.lock().await;
                proxy.kill().await;
                counts.proxy_kills += 1;
                tokio::time::sleep(rng.millis(200, 1500)).await;
                proxy.spawn(&settings.leasegate).await?;
            }
            1 => {
                let proxy = victim.lock().await;
                proxy.signal(nix::sys::signal::Signal::SIGSTOP);
                counts.proxy_stops += 1;
                tokio::time::sleep(rng.millis(1000, 6000)).await;
                proxy.signal(nix::sys::signal::Signal::SIGCONT);
            }
            _ => {
                // The admin session itself may have died with a restart:
                // a terminate that cannot run is skipped, not fatal.
                let terminated: Result<i64, _> = sqlx::query_scalar(
                    "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                      WHERE datname = $1 AND pid <> pg_backend_pid()) AS t",
                )
                .bind(&database)
                .fetch_one(&admin)
                .await;
                if let Ok(terminated) = terminated {
                    counts.backend_terminations += 1;
                    counts.backends_terminated += terminated as usize;
                }
            }
        }
    }
    Ok(counts)
}

#[derive(Debug, Clone)]
struct OperationRow {
    operation_id: String,
    status: String,
    tool_name: String,
    dispatch_count: i32,
    reconcile_attempts: i32,
}

/// The tools' own records: side effects per key, calls per key, faults.
struct EffectLogs {
    /// (kind, key) → side effects; the key is the operation id, or the
    /// intent's label for the mailer (which never sees an operation id).
    effects: HashMap<(Kind, String), usize>,
    /// (kind, key) → calls that reached the tool.
    calls: HashMap<(Kind, String), usize>,
    faults: BTreeMap<String, usize>,
}

fn jsonl(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect()
}

impl EffectLogs {
    fn key(kind: Kind, line: &Value) -> Option<String> {
        let field = match kind {
            Kind::Charge => "idempotency_key",
            Kind::Bucket => "name",
            Kind::Job => "job_id",
            Kind::Email => "subject",
        };
        if let Some(key) = line[field].as_str() {
            return Some(key.to_owned());
        }
        if kind == Kind::Email {
            // calls.jsonl has the recipient only.
            return line["to"]
                .as_str()?
                .strip_suffix("@chaos.test")
                .map(str::to_owned);
        }
        None
    }

    fn read(state: &Path) -> Self {
        let mut effects = HashMap::new();
        for kind in Kind::ALL {
            for line in jsonl(&state.join(kind.effects_file())) {
                let key = Self::key(kind, &line).unwrap_or_default();
                *effects.entry((kind, key)).or_default() += 1;
            }
        }
        let mut calls = HashMap::new();
        for line in jsonl(&state.join("calls.jsonl")) {
            let kind = match line["tool"].as_str() {
                Some("charge") => Kind::Charge,
                Some("create_bucket") => Kind::Bucket,
                Some("submit_job") => Kind::Job,
                Some("send_email") if line.get("cancelled").is_none() => Kind::Email,
                _ => continue,
            };
            let key = Self::key(kind, &line).unwrap_or_default();
            *calls.entry((kind, key)).or_default() += 1;
        }
        let mut faults = BTreeMap::new();
        for line in jsonl(&state.join("faults.jsonl")) {
            let name = format!(
                "{} {}",
                line["fault"].as_str().unwrap_or("?"),
                line["tool"].as_str().unwrap_or("?")
            );
            *faults.entry(name).or_default() += 1;
        }
        Self {
            effects,
            calls,
            faults,
        }
    }
}

fn histogram(values: impl Iterator<Item = usize>) -> String {
    let mut counts = BTreeMap::new();
    for value in values {
        *counts.entry(value).or_insert(0usize) += 1;
    }
    counts
        .iter()
        .map(|(value, count)| format!("{value}: {count}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Checks the invariants and writes the body of the report.
fn judge(
    settings: &Settings,
    records: &[IntentRecord],
    operations: &HashMap<String, Vec<OperationRow>>,
    logs: &EffectLogs,
    faults: FaultCounts,
) -> Outcome {
    let mut violations = Vec::new();
    let mut claimed: BTreeSet<(Kind, String)> = BTreeSet::new();
    // Per kind: statuses, effects per intent, calls per intent, unknowns.
    let mut statuses: BTreeMap<Kind, BTreeMap<String, usize>> = BTreeMap::new();
    let mut effect_counts: BTreeMap<Kind, Vec<usize>> = BTreeMap::new();
    let mut call_counts: BTreeMap<Kind, Vec<usize>> = BTreeMap::new();
    let mut unknown_with: BTreeMap<Kind, usize> = BTreeMap::new();
    let mut unknown_without: BTreeMap<Kind, usize> = BTreeMap::new();
    let mut agent_calls = Vec::new();
    let mut unknowns = Vec::new();
    let mut gave_up = 0usize;
    let mut dispatches = Vec::new();
    for record in records {
        agent_calls.push(record.calls as usize);
        if record.terminal.is_none() {
            gave_up += 1;
        }
        let rows = operations
            .get(&record.run_id)
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        let what = format!(
            "intent {} ({}, run {}, calls {}, agent saw {:?}, last error {:?})",
            record.label,
            record.kind.tool(),
            record.run_id,
            record.calls,
            record.last_status,
            record.gave_up
        );
        let row = match rows {
            [row] => row,
            [] => {
                violations.push(format!("lost intent: no operation row for {what}"));
                *statuses
                    .entry(record.kind)
                    .or_default()
                    .entry("(no row)".into())
                    .or_default() += 1;
                // Effects under its label (mailer) still count as its own.
                let key = (record.kind, record.label.clone());
                if let Some(n) = logs.effects.get(&key) {
                    claimed.insert(key);
                    violations.push(format!("{n} side effect(s) of a lost {what}"));
                }
                continue;
            }
            more => {
                violations.push(format!(
                    "one intent, {} operation rows: {what}: {:?}",
                    more.len(),
                    more.iter().map(|r| &r.operation_id).collect::<Vec<_>>()
                ));
                &more[0]
            }
        };
        if row.tool_name != record.kind.tool() {
            violations.push(format!(
                "operation {} is for {}: {what}",
                row.operation_id, row.tool_name
            ));
        }
        if record.operation_ids.len() > 1
            || record
                .operation_ids
                .iter()
                .any(|id| id != &row.operation_id)
        {
            violations.push(format!(
                "answers named operations {:?}, the ledger has {}: {what}",
                record.operation_ids, row.operation_id
            ));
        }
        let key = match record.kind {
            Kind::Email | Kind::Bucket => (record.kind, record.label.clone()),
            kind => (kind, row.operation_id.clone()),
        };
        let effects = logs.effects.get(&key).copied().unwrap_or(0);
        let calls = logs.calls.get(&key).copied().unwrap_or(0);
        claimed.insert(key);
        *statuses
            .entry(record.kind)
            .or_default()
            .entry(row.status.clone())
            .or_default() += 1;
        effect_counts.entry(record.kind).or_default().push(effects);
        call_counts.entry(record.kind).or_default().push(calls);
        dispatches.push(row.dispatch_count.max(0) as usize);
        let what = format!("{what}, operation {} {}", row.operation_id, row.status);
        if effects > 1 {
            violations.push(format!(
                "duplicate effect: {effects} side effects ({} capability, {calls} calls reached \
                 the tool, dispatch_count {}, reconcile_attempts {}): {what}",
                record.kind.capability(),
                row.dispatch_count,
                row.reconcile_attempts
            ));
        }
        match row.status.as_str() {
            "succeeded" if effects == 0 => {
                violations.push(format!("succeeded without a side effect: {what}"))
            }
            "failed_final" if effects > 0 => violations.push(format!(
                "failed_final with {effects} side effect(s): {what}"
            )),
            "unknown" => {
                if effects > 0 {
                    *unknown_with.entry(record.kind).or_default() += 1;
                } else {
                    *unknown_without.entry(record.kind).or_default() += 1;
                }
                unknowns.push(format!(
                    "{} {} operation {}: {effects} effect(s), {calls} call(s) reached the tool, \
                     dispatch_count {}, reconcile_attempts {}",
                    record.label,
                    record.kind.tool(),
                    row.operation_id,
                    row.dispatch_count,
                    row.reconcile_attempts
                ));
            }
            _ => {}
        }
        if settings.answers_settle
            && calls > 0
            && !matches!(row.status.as_str(), "succeeded" | "failed_final")
        {
            violations.push(format!(
                "the tool was reached {calls} time(s) and answered, but the operation did not \
                 end with its answer ({} capability, dispatch_count {}, reconcile_attempts {}): \
                 {what}",
                record.kind.capability(),
                row.dispatch_count,
                row.reconcile_attempts
            ));
        }
        if let Some(told) = &record.terminal
            && told != &row.status
        {
            violations.push(format!(
                "an agent was told {told}, the ledger ends {}: {what}",
                row.status
            ));
        }
    }
    let mut orphans = 0usize;
    for (key, n) in &logs.effects {
        if !claimed.contains(key) {
            orphans += n;
            violations.push(format!(
                "{n} side effect(s) of {} under {:?} belong to no intent's operation (lost intent)",
                key.0.tool(),
                key.1
            ));
        }
    }
    if records.len() != settings.intents {
        violations.push(format!(
            "{} intents were driven, {} asked for",
            records.len(),
            settings.intents
        ));
    }

    let mut report = String::new();
    report.push_str(&format!(
        "faults: proxy SIGKILL+restart {}, proxy SIGSTOP {}, backend terminations {} ({} \
         backends), PostgreSQL restarts {}, HTTP tool server outages {}; tool faults: {}\n",
        faults.proxy_kills,
        faults.proxy_stops,
        faults.backend_terminations,
        faults.backends_terminated,
        faults.pg_restarts,
        faults.http_outages,
        if logs.faults.is_empty() {
            "none".to_owned()
        } else {
            logs.faults
                .iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect::<Vec<_>>()
                .join(", ")
        }
    ));
    report.push_str(&format!(
        "intents: {} ({} ended without a terminal answer to the agent); calls per intent: {}; \
         dispatches per operation: {}\n",
        records.len(),
        gave_up,
        histogram(agent_calls.into_iter()),
        histogram(dispatches.into_iter()),
    ));
    report.push_str(
        "tool (capability)                              intents  statuses | side effects per intent | calls reaching the tool per intent | unknown with / without effect\n",
    );
    for kind in Kind::ALL {
        let effects = effect_counts.remove(&kind).unwrap_or_default();
        let calls = call_counts.remove(&kind).unwrap_or_default();
        let status = statuses
            .get(&kind)
            .map(|s| {
                s.iter()
                    .map(|(k, v)| format!("{k} {v}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_default();
        report.push_str(&format!(
            "{:<46} {:>7}  {} | {} | {} | {} / {}\n",
            format!("{} ({})", kind.tool(), kind.capability()),
            effects.len(),
            status,
            histogram(effects.into_iter()),
            histogram(calls.into_iter()),
            unknown_with.get(&kind).copied().unwrap_or(0),
            unknown_without.get(&kind).copied().unwrap_or(0),
        ));
    }
    report.push_str(&format!("side effects of no intent: {orphans}\n"));
    if !unknowns.is_empty() {
        report.push_str(&format!("unknown operations ({}):\n", unknowns.len()));
        for unknown in unknowns.iter().take(20) {
            report.push_str(&format!("  - {unknown}\n"));
        }
    }
    if violations.is_empty() {
        report.push_str("invariants: all held (no duplicate effect, no lost intent, no succeeded without effect, no failed_final with effect)\n");
    } else {
        report.push_str(&format!("VIOLATIONS: {}\n", violations.len()));
        for violation in violations.iter().take(50) {
            report.push_str(&format!("  - {violation}\n"));
        }
    }
    Outcome {
        report,
        violations,
        intents: records.len(),
        faults,
    }
}
