//! The `leasegate` command line.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Default ledger database: the machine's local PostgreSQL, trust auth.
const DEFAULT_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/leasegate";

#[derive(Debug, Parser)]
#[command(
    name = "leasegate",
    version,
    about = "MCP tool-call idempotency proxy with a fenced PostgreSQL ledger"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Create the ledger database if missing and apply the migrations
    /// (schema, protected SQL functions, the leasegate_app role). Running it
    /// again is a no-op.
    Migrate {
        #[arg(long, env = "DATABASE_URL", default_value = DEFAULT_DATABASE_URL)]
        database_url: String,
    },
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("leasegate: {}", error_chain(&error));
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Migrate { database_url } => {
            if leasegate::ledger::Ledger::create_database_if_missing(&database_url).await? {
                tracing::info!("created the ledger database");
            }
            leasegate::ledger::Ledger::migrate(&database_url).await?;
            let applied = leasegate::ledger::MIGRATOR.iter().count();
            println!("ledger migrated ({applied} migrations)");
            Ok(())
        }
    }
}

/// The error and its causes on one line, without repeating a cause that the
/// message before it already quotes.
fn error_chain(error: &anyhow::Error) -> String {
    let mut line = error.to_string();
    for cause in error.chain().skip(1) {
        let cause = cause.to_string();
        if !line.contains(&cause) {
            line.push_str(": ");
            line.push_str(&cause);
        }
    }
    line
}
