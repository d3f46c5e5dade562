//! The reproducible gateway benchmark: gated,
//! pass-through and replayed MCP `tools/call` through a `leasegate serve`
//! child at 1/8/32/64 callers next to pgbench on the minimal ceiling and on
//! leasegate's own SQL, lease renewal, database round trips per call and
//! resident memory — one run, one table. The harness and its invariants are
//! `harness.rs` beside this file.
//!
//! ```text
//! cargo build --release --bins --examples
//! target/release/examples/bench_gateway [--quick] [--repeat N] [--duration SECS] …
//! ```
//!
//! It serves with the `leasegate` binary next to it (`target/release/`;
//! `--leasegate PATH` to choose) and needs PostgreSQL at the admin URL with
//! a role that may create databases, and pgbench. Numbers are reported,
//! never asserted.

mod harness;

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

#[derive(Parser, Debug)]
#[command(about = "leasegate's gateway benchmark: leasegate vs pgbench ceilings in one run")]
struct Cli {
    /// A smoke run: 1 and 8 callers, 1 s cells, 20 sessions (defaults below still overridable).
    #[arg(long)]
    quick: bool,
    /// Repetitions of the sweep; the table shows medians.
    #[arg(long)]
    repeat: Option<usize>,
    /// Measured seconds per cell (pgbench's -T; whole seconds for pgbench).
    #[arg(long)]
    duration: Option<f64>,
    /// Warm-up seconds per leasegate cell, not counted.
    #[arg(long)]
    warmup: Option<f64>,
    /// Caller counts, comma-separated.
    #[arg(long, value_delimiter = ',')]
    callers: Option<Vec<usize>>,
    /// Any database URL of the PostgreSQL server to use (its database name is replaced).
    #[arg(long, default_value = "postgres://postgres@127.0.0.1:5432/postgres")]
    admin_url: String,
    /// Prefix of the databases created (and dropped at the end).
    #[arg(long, default_value = "bench_gateway")]
    db_prefix: String,
    /// `auto` (server-everything when node and its install are found), `everything`, `example-tools`.
    #[arg(long, default_value = "auto")]
    upstream: String,
    /// server-everything's `dist/index.js` (default: LEASEGATE_SERVER_EVERYTHING, then target/sdk-node).
    #[arg(long)]
    server_everything: Option<PathBuf>,
    /// The `leasegate` binary (default: beside this example's directory, i.e. target/<profile>/leasegate).
    #[arg(long)]
    leasegate: Option<PathBuf>,
    /// The example tool server (default: beside `leasegate`).
    #[arg(long)]
    example_tools: Option<PathBuf>,
    /// pgbench (default: PATH, then the newest /usr/lib/postgresql/*/bin).
    #[arg(long)]
    pgbench: Option<PathBuf>,
    /// leasegate's database_max_connections.
    #[arg(long)]
    db_pool: Option<u32>,
    /// Serve with `group_commit = false` (every gated call its own
    /// statement); by default the served config keeps group commit on, as
    /// leasegate does.
    #[arg(long)]
    single_path: bool,
    /// A top-level line of the served config, `key = value` (repeatable), e.g.
    /// `--config 'group_commit_in_flight = 2'`.
    #[arg(long = "config")]
    config_lines: Vec<String>,
    /// Idle MCP sessions opened for the per-session memory.
    #[arg(long)]
    sessions: Option<usize>,
    /// Callers of the renewal section.
    #[arg(long)]
    renew_callers: Option<usize>,
    /// Worker hosts of the batch renewal row (posting at once).
    #[arg(long)]
    batch_hosts: Option<usize>,
    /// Leases each worker host renews per batch call.
    #[arg(long)]
    batch_leases: Option<usize>,
    /// Extra gated cells at the largest caller count, memory read after each.
    #[arg(long)]
    growth_cells: Option<usize>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let here = std::env::current_exe()?;
    // target/<profile>/examples/bench_gateway → target/<profile>/leasegate
    let profile_dir = here
        .parent()
        .and_then(|examples| examples.parent())
        .map(PathBuf::from)
        .unwrap_or_default();
    let leasegate = cli
        .leasegate
        .clone()
        .unwrap_or_else(|| profile_dir.join("leasegate"));
    anyhow::ensure!(
        leasegate.is_file(),
        "no leasegate binary at {} (cargo build --release --bins, or --leasegate PATH)",
        leasegate.display()
    );
    let example_tools = cli.example_tools.clone().unwrap_or_else(|| {
        leasegate
            .parent()
            .unwrap_or(&profile_dir)
            .join("leasegate-example-tools")
    });
    let mut settings = if cli.quick {
        harness::Settings::quick(leasegate, example_tools)
    } else {
        harness::Settings::full(leasegate, example_tools)
    };
    settings.admin_url = cli.admin_url;
    settings.db_prefix = cli.db_prefix;
    settings.upstream = match cli.upstream.as_str() {
        "auto" => harness::UpstreamChoice::Auto,
        "everything" => harness::UpstreamChoice::Everything(cli.server_everything),
        "example-tools" => harness::UpstreamChoice::ExampleTools,
        other => anyhow::bail!("--upstream {other:?}: expected auto, everything or example-tools"),
    };
    if let Some(repeat) = cli.repeat {
        settings.repeat = repeat;
    }
    if let Some(seconds) = cli.duration {
        settings.duration = Duration::try_from_secs_f64(seconds)?;
    }
    if let Some(seconds) = cli.warmup {
        settings.warmup = Duration::try_from_secs_f64(seconds)?;
    }
    if let Some(callers) = cli.callers {
        anyhow::ensure!(
            callers.iter().all(|&c| c > 0),
            "--callers: every count must be at least 1"
        );
        settings.callers = callers;
    }
    if let Some(pool) = cli.db_pool {
        settings.db_pool = pool;
    }
    settings.group_commit = !cli.single_path;
    settings.config_lines = cli.config_lines.clone();
    if let Some(sessions) = cli.sessions {
        settings.sessions = sessions;
    }
    if let Some(callers) = cli.renew_callers {
        anyhow::ensure!(callers > 0, "--renew-callers must be at least 1");
        settings.renew_callers = callers;
    }
    if let Some(hosts) = cli.batch_hosts {
        settings.batch_hosts = hosts;
    }
    if let Some(leases) = cli.batch_leases {
        anyhow::ensure!(
            (1..=10_000).contains(&leases),
            "--batch-leases must be 1 to 10000 (the endpoint's limit)"
        );
        settings.batch_leases = leases;
    }
    if let Some(cells) = cli.growth_cells {
        settings.growth_cells = cells;
    }
    settings.pgbench = cli.pgbench;
    let report = harness::run(&settings).await?;
    println!("{}", report.to_markdown());
    Ok(())
}
