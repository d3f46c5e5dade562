//! The chaos soak, as a cargo example:
//!
//! ```text
//! cargo build --release --bins --example chaos
//! target/release/examples/chaos --intents 2000 --proxies 3 --seed 7
//! ```
//!
//! Creates a fresh database `leasegate_chaos_<tag>` on the local PostgreSQL,
//! starts `--proxies` `leasegate serve` processes in front of the example
//! tool server (all four capabilities, fault injection on), drives
//! `--intents` intents from `--agents` concurrent agents while proxies are
//! SIGKILLed, SIGSTOPped and their database backends terminated, lets the
//! reconcilers settle, prints a report and exits 1 on any invariant
//! violation (`harness.rs` lists them). The database and the work dir are
//! dropped at the end unless `--keep` or a violation.

#[path = "harness.rs"]
mod harness;

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

#[derive(Debug, Parser)]
#[command(name = "chaos", about = "leasegate chaos soak")]
struct Cli {
    #[arg(long, default_value_t = 500)]
    intents: usize,
    #[arg(long, default_value_t = 2)]
    proxies: usize,
    #[arg(long, default_value_t = 8)]
    agents: usize,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Turn every fault off (a baseline).
    #[arg(long)]
    no_faults: bool,
    /// No proxy SIGKILL/SIGSTOP: the database's faults only.
    #[arg(long)]
    no_proxy_faults: bool,
    /// The payments tool as one shared Streamable HTTP server, stopped for
    /// 1-3 s up to three times (connections refused).
    #[arg(long)]
    http_outages: bool,
    /// Fail when an operation whose tool answered does not end with that
    /// answer (meaningful with --no-proxy-faults and the tool crash and
    /// hang rates at 0).
    #[arg(long)]
    answers_settle: bool,
    #[arg(long, default_value_t = 0.04)]
    tool_transient: f64,
    #[arg(long, default_value_t = 0.02)]
    tool_crash: f64,
    #[arg(long, default_value_t = 0.03)]
    tool_hang: f64,
    #[arg(long, default_value_t = 0.10)]
    tool_slow: f64,
    /// Mean milliseconds between two proxy or database faults.
    #[arg(long, default_value_t = 1500)]
    fault_interval_ms: u64,
    /// Restart PostgreSQL once mid-run (`pg_ctlcluster --skip-systemctl-redirect
    /// <VERSION> main restart`). Disturbs everything else on the server.
    #[arg(long, value_name = "VERSION")]
    pg_restart: Option<String>,
    /// Seconds the reconcilers get to settle after the agents finished.
    #[arg(long, default_value_t = 60)]
    settle_secs: u64,
    /// Calls per intent before an agent stops re-calling.
    #[arg(long, default_value_t = 12)]
    attempts: u32,
    /// The leasegate binary (default: beside this example, `../leasegate`).
    #[arg(long)]
    leasegate: Option<PathBuf>,
    /// The example tool server (default: `../leasegate-example-tools`).
    #[arg(long)]
    tools: Option<PathBuf>,
    #[arg(
        long,
        env = "CHAOS_ADMIN_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/postgres"
    )]
    admin_url: String,
    /// Keep the database and the work dir.
    #[arg(long)]
    keep: bool,
}

/// target/<profile>/examples/chaos → target/<profile>/<name>.
fn beside(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    let profile = exe
        .parent()
        .and_then(|examples| examples.parent())
        .map(PathBuf::from)
        .unwrap_or_default();
    profile.join(name)
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let mut settings = harness::Settings::new(
        cli.leasegate.unwrap_or_else(|| beside("leasegate")),
        cli.tools
            .unwrap_or_else(|| beside("leasegate-example-tools")),
    );
    for binary in [&settings.leasegate, &settings.tools] {
        if !binary.is_file() {
            eprintln!(
                "chaos: {} not found: `cargo build --release --bins` (or pass --leasegate/--tools)",
                binary.display()
            );
            return std::process::ExitCode::from(2);
        }
    }
    settings.intents = cli.intents;
    settings.proxies = cli.proxies.max(1);
    settings.agents = cli.agents.max(1);
    settings.seed = cli.seed;
    settings.faults = !cli.no_faults;
    settings.proxy_faults = !cli.no_proxy_faults;
    settings.http_outages = cli.http_outages;
    settings.answers_settle = cli.answers_settle;
    settings.tool_transient = cli.tool_transient;
    settings.tool_crash = cli.tool_crash;
    settings.tool_hang = cli.tool_hang;
    settings.tool_slow = cli.tool_slow;
    settings.fault_interval = Duration::from_millis(cli.fault_interval_ms.max(10));
    settings.pg_restart = cli.pg_restart.map(|version| {
        [
            "pg_ctlcluster",
            "--skip-systemctl-redirect",
            &version,
            "main",
            "restart",
        ]
        .map(str::to_owned)
        .to_vec()
    });
    settings.settle = Duration::from_secs(cli.settle_secs);
    settings.attempts = cli.attempts.max(1);
    settings.admin_url = cli.admin_url;
    settings.keep = cli.keep;
    match harness::run(settings).await {
        Ok(outcome) => {
            print!("{}", outcome.report);
            if outcome.violations.is_empty() {
                std::process::ExitCode::SUCCESS
            } else {
                std::process::ExitCode::FAILURE
            }
        }
        Err(error) => {
            eprintln!("chaos: the soak could not run: {error:#}");
            std::process::ExitCode::from(2)
        }
    }
}
