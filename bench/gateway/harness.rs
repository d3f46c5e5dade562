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
//!
//! # Files
//!
//! This file holds the run plan and its [`Settings`]; beside it: `run.rs`
//! (the run, the sweep, the counted round trips), `served.rs` (the upstream
//! and `leasegate serve` as a child), `load.rs` (the leases and the HTTP
//! load generator's cells), `ceiling.rs` (the pgbench side: its databases'
//! SQL and its cells), `wire.rs` (round trips counted on the wire),
//! `report.rs` (what was measured and the tables), `cpu.rs` (where the CPU
//! went), and `../common/` (percentiles, medians, pgbench, scratch databases).

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

#[path = "ceiling.rs"]
mod ceiling;
#[path = "load.rs"]
mod load;
#[path = "report.rs"]
mod report;
#[path = "run.rs"]
mod run;
#[path = "served.rs"]
mod served;
#[path = "wire.rs"]
mod wire;

use ceiling::*;
pub use load::*;
pub use report::*;
pub use run::*;
pub use served::*;
pub use wire::*;

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
            group_commit: true,
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
