//! The report: the machine and settings it ran on ([`Environment`]), every
//! cell's measures by row ([`Measure`]), and the tables printed from their
//! medians.

use super::*;

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

pub(super) fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|text| {
            text.split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_else(|_| "unknown".to_owned())
}

pub(super) async fn environment(admin_url: &str) -> anyhow::Result<Environment> {
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
        self.batch_markdown(&mut out);
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

    /// The third table: how many calls each group-commit statement carried
    /// during the gated cells (medians of the repetitions).
    fn batch_markdown(&self, out: &mut String) {
        use std::fmt::Write as _;
        let rows: Vec<(usize, [Option<f64>; 3])> = self
            .cells
            .iter()
            .filter(|((measure, _), _)| *measure == Measure::Leasegate(Kind::Gated))
            .filter_map(|((_, callers), cells)| {
                let sizes: Vec<_> = cells.iter().filter_map(|cell| cell.batches).collect();
                if sizes.is_empty() {
                    return None;
                }
                let median = |pick: fn(&load::BatchSizes) -> Option<f64>| {
                    let values: Vec<f64> = sizes.iter().filter_map(pick).collect();
                    stats::upper_median(&values)
                };
                Some((
                    *callers,
                    [
                        median(|b| b.register),
                        median(|b| b.settle),
                        median(|b| b.renew),
                    ],
                ))
            })
            .collect();
        if rows.is_empty() {
            return;
        }
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "Group commit during the gated cells: calls per statement (`leasegate_group_commit_batch_size` \
             on `/metrics` over the measured window, a lone call counting as a statement of one; medians of \
             the repetitions; renews are the keep-alive heartbeats)."
        );
        let _ = writeln!(out, "| callers | register-claim | settle | lease renew |");
        let _ = writeln!(out, "|---|---|---|---|");
        let shown = |value: Option<f64>| value.map_or("–".to_owned(), |v| format!("{v:.1}"));
        for (callers, [register, settle, renew]) in rows {
            let _ = writeln!(
                out,
                "| {callers} | {} | {} | {} |",
                shown(register),
                shown(settle),
                shown(renew)
            );
        }
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
