//! The load generator: the benchmark's leased runs and their keep-alive, the
//! HTTP callers of each kind, and the cells they run (gated, replay and
//! pass-through calls, single renewals, batch renewal through leasegate).

use super::*;

pub(super) fn run_id_of(client: usize) -> leasegate::ledger::RunId {
    format!("00000000-0000-7000-8000-{client:012}")
        .parse()
        .expect("a valid uuid")
}

/// A leased run the gated and replay callers call under.
#[derive(Clone, Debug)]
pub(super) struct Lease {
    run_id: String,
    owner: String,
    epoch: i64,
    token: String,
}

/// `POST url` with a JSON `body`, sent.
async fn post(
    client: &reqwest::Client,
    url: &str,
    body: String,
) -> reqwest::Result<reqwest::Response> {
    client
        .post(url)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
}

pub(super) async fn post_json(
    client: &reqwest::Client,
    url: &str,
    body: &Value,
) -> anyhow::Result<(u16, Value)> {
    let response = post(client, url, body.to_string()).await?;
    let status = response.status().as_u16();
    let text = response.text().await?;
    let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
    Ok((status, value))
}

/// [`RUNS`] runs created through the control API, each leased by `bench-<n>`
/// and started.
pub(super) async fn create_leases(
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
pub(super) struct KeepAlive(tokio::task::JoinHandle<()>);

impl KeepAlive {
    pub(super) fn start(control: &str, leases: &[Lease]) -> anyhow::Result<Self> {
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

/// One kept-alive HTTP/1.1 connection (reqwest keeps one idle connection per host).
pub(super) fn client() -> anyhow::Result<reqwest::Client> {
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
    pub(super) fn label(self) -> &'static str {
        match self {
            Kind::Gated => "gated (new intent per call)",
            Kind::PassThrough => "pass-through (read-only tool)",
            Kind::Replay => "replay (same intent again)",
        }
    }
}

/// What one caller sends: its connection and, for gated and replay calls, its lease.
pub(super) struct Caller {
    pub(super) client: reqwest::Client,
    pub(super) index: usize,
    pub(super) lease: Option<Lease>,
}

/// The shared parts of a cell.
pub(super) struct Target {
    pub(super) mcp: String,
    pub(super) tools: Tools,
    /// Distinguishes the cells of one run, so no gated call replays an earlier one.
    pub(super) nonce: String,
}

impl Caller {
    pub(super) async fn call(&self, target: &Target, kind: Kind, n: u64) -> anyhow::Result<()> {
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
    /// The served process's group-commit statements during the window.
    pub batches: Option<BatchSizes>,
}

/// Mean calls per group-commit statement of each kind over a window (from
/// `leasegate_group_commit_batch_size` on the control API's `/metrics`);
/// `None` for a kind that sent no statement in it.
#[derive(Debug, Clone, Copy, Default)]
pub struct BatchSizes {
    pub register: Option<f64>,
    pub settle: Option<f64>,
    pub renew: Option<f64>,
}

/// The group-commit statement kinds as `/metrics` labels them.
const BATCH_CALLS: [&str; 3] = [
    "operation_register_claim_batch",
    "operation_settle_batch",
    "lease_renew_batch",
];

/// (sum, count) of `leasegate_group_commit_batch_size` per kind, in
/// [`BATCH_CALLS`] order; `None` when `/metrics` cannot be read.
async fn batch_totals(control: &str) -> Option<[(f64, f64); 3]> {
    let text = client()
        .ok()?
        .get(format!("{control}/metrics"))
        .send()
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    let mut totals = [(0.0, 0.0); 3];
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("leasegate_group_commit_batch_size_") else {
            continue;
        };
        let (series, value) = rest.rsplit_once(' ')?;
        let value: f64 = value.parse().ok()?;
        for (slot, call) in totals.iter_mut().zip(BATCH_CALLS) {
            if series.contains(&format!("call=\"{call}\"")) {
                if series.starts_with("sum{") {
                    slot.0 = value;
                } else if series.starts_with("count{") {
                    slot.1 = value;
                }
            }
        }
    }
    Some(totals)
}

impl BatchSizes {
    fn between(before: &[(f64, f64); 3], after: &[(f64, f64); 3]) -> Self {
        let mean = |i: usize| {
            let (calls, statements) = (after[i].0 - before[i].0, after[i].1 - before[i].1);
            (statements > 0.0).then(|| calls / statements)
        };
        Self {
            register: mean(0),
            settle: mean(1),
            renew: mean(2),
        }
    }
}

impl Cell {
    /// `calls` at `rate`, the p50 and p99 of `samples` (sorted here); no
    /// memory or CPU reading.
    pub(super) fn of_samples(samples: &mut [Duration], calls: u64, rate: f64) -> Self {
        samples.sort();
        Cell {
            calls,
            rate,
            p50_ms: stats::percentile_ms(samples, 0.5, Rank::Round),
            p99_ms: stats::percentile_ms(samples, 0.99, Rank::Round),
            rss_kib: None,
            cpu: None,
            batches: None,
        }
    }
}

/// Runs `callers` callers of `kind` against `target`: each primes (replay:
/// records its intent), all start together, warm up for `warmup`, and the
/// calls that start and end inside the next `duration` are counted.
pub(super) async fn cell(
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
    let control = served.map(|served| served.control.as_str());
    tokio::time::sleep_until(start.into()).await;
    let batches_start = match control {
        Some(control) => batch_totals(control).await,
        None => None,
    };
    let cpu_start = cpu::CpuSample::take(leasegate_pid);
    // Resident memory with every caller in flight: sampled at 90% of the window.
    let mut rss_kib = None;
    if let Some(served) = served {
        tokio::time::sleep_until((start + duration.mul_f64(0.9)).into()).await;
        rss_kib = served.rss_kib().ok();
    }
    tokio::time::sleep_until(end.into()).await;
    let cpu_end = cpu::CpuSample::take(leasegate_pid);
    let batches = match (control, batches_start) {
        (Some(control), Some(before)) => batch_totals(control)
            .await
            .map(|after| BatchSizes::between(&before, &after)),
        _ => None,
    };
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
    let calls = samples.len() as u64;
    Ok(Cell {
        rss_kib,
        batches,
        cpu: cpu_start.per_call(&cpu_end, calls, cpu::Load::ThisProcess),
        ..Cell::of_samples(&mut samples, calls, calls as f64 / duration.as_secs_f64())
    })
}

/// Single lease renewals through the control API, `callers` at once, each
/// renewing its own run's lease in a loop.
pub(super) async fn renew_cell(
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
    let calls = samples.len() as u64;
    Ok(Cell::of_samples(
        &mut samples,
        calls,
        calls as f64 / duration.as_secs_f64(),
    ))
}

/// Batch lease renewal through leasegate (`POST /v1/leases/renew`, each
/// lease answered renewed or lost): one caller per worker host of `hosts`,
/// all at once, each renewing all its own leases in one call per round,
/// on its own kept-alive connection. The rate counts leases renewed per
/// second; p50/p99 are per call. A lease answered lost ends the run with
/// the answer.
pub(super) async fn batch_renewal_through_leasegate(
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
                let response = post(&client, &url, body.clone()).await?;
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
    Ok(Some(Cell::of_samples(
        &mut samples,
        renewed,
        renewed as f64 / duration.as_secs_f64(),
    )))
}

/// `hosts` × `per_host` leased, running runs of tenant `bench` for the
/// batch renewal row, made in one statement on the served database (tens
/// of thousands of acquires through the API would measure the set-up):
/// host `h` is `batch-host-<h>` at epoch 1, each lease's token
/// `lgl_batch_<run id>` (its SHA-256 stored, as an acquire stores it), two
/// hours to live.
pub(super) async fn create_batch_leases(
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
