//! The `leasegate` command line: parses arguments and calls into the
//! library. `serve` binds the configured listeners and hands them, with
//! ctrl-c/SIGTERM as the shutdown signal, to [`leasegate::app::run`] — the
//! same seam the tests use.
//!
//! Every command that opens the ledger finds its URL the same way
//! ([`DatabaseUrl::resolve`]); when the ledger cannot be opened it exits
//! with the code of the failure (6 unreachable, 7 login refused, 8 database
//! missing, 9 schema missing: `control::ErrorCode`), other failures exit 1.
//!
//! `serve` and `stdio` with no database configured and nothing answering at
//! the default start a private PostgreSQL cluster
//! ([`leasegate::app::provide_database`]) and stop it on exit; exit 10 when
//! there are no PostgreSQL binaries for it, 11 when it cannot be started.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use leasegate::app::{Listeners, Proxy};
use leasegate::config::{Config, DATABASE_URL_HELP, DatabaseUrl};
use leasegate::control::cli::{OperatorCommand, ledger_refusal};
use leasegate::control::exit;
use leasegate::embedded::EmbeddedError;
use leasegate::ledger::LedgerError;

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
    /// Run the proxy: MCP over HTTP at http://<listen>/mcp.
    ///
    /// With no database configured and nothing answering at the default
    /// URL, starts a private PostgreSQL cluster (socket only) in
    /// $LEASEGATE_STATE_DIR/pg, else .leasegate/pg, and stops it on exit.
    Serve {
        #[arg(long, default_value = "leasegate.toml")]
        config: std::path::PathBuf,
        /// Override the config's listen address (e.g. 127.0.0.1:0).
        #[arg(long)]
        listen: Option<std::net::SocketAddr>,
        #[arg(long, value_name = "URL", help = DATABASE_URL_HELP)]
        database_url: Option<String>,
    },
    /// Run the proxy on stdin/stdout, for MCP clients that spawn their servers.
    ///
    /// With no database configured and nothing answering at the default
    /// URL, starts a private PostgreSQL cluster as `serve` does.
    Stdio {
        #[arg(long, default_value = "leasegate.toml")]
        config: std::path::PathBuf,
        /// Lease mode `session` for this process: leasegate holds the lease
        /// of this task's run while it serves, taking it over from any
        /// earlier session (a restarted agent fences its predecessor).
        #[arg(long, env = "LEASEGATE_TASK")]
        task: Option<String>,
        #[arg(long, value_name = "URL", help = DATABASE_URL_HELP)]
        database_url: Option<String>,
    },
    /// Validate configuration, adapter and policy files; exit 0 when all are valid.
    CheckConfig {
        /// Files to check: a main config, or files under adapters/ or policies/.
        #[arg(required = true)]
        files: Vec<std::path::PathBuf>,
    },
    #[command(flatten)]
    Operator(OperatorCommand),
    /// Create the ledger database if missing and apply the migrations
    /// (schema, protected SQL functions, the leasegate_app role). Running it
    /// again is a no-op.
    Migrate {
        #[arg(long, value_name = "URL", help = DATABASE_URL_HELP)]
        database_url: Option<String>,
        /// A leasegate.toml whose database_url to migrate.
        #[arg(long, value_name = "FILE")]
        config: Option<std::path::PathBuf>,
    },
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    // Operator commands print only their answer: no logging set up.
    if let Command::Operator(command) = &cli.command {
        return ExitCode::from(command.run().await);
    }
    init_logging();
    let mut database = None;
    match run(cli.command, &mut database).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            // A ledger that cannot be opened: say which and how to fix it.
            let refusal = database.as_ref().and_then(|database| {
                error
                    .chain()
                    .find_map(|cause| cause.downcast_ref::<LedgerError>())
                    .filter(|ledger| ledger.connect_failure().is_some())
                    .map(|ledger| ledger_refusal(ledger, database))
            });
            let private = error
                .chain()
                .find_map(|cause| cause.downcast_ref::<EmbeddedError>());
            match (refusal, private) {
                (Some((code, message)), _) => {
                    eprintln!("leasegate: {message} ({code})");
                    ExitCode::from(code.exit_code())
                }
                (None, Some(private)) => {
                    let default = database
                        .as_ref()
                        .map_or_else(String::new, |d| d.url.clone());
                    eprintln!(
                        "leasegate: no database is configured and nothing answers at the \
                         default ({default}); {private}"
                    );
                    ExitCode::from(if private.is_no_binaries() {
                        exit::NO_POSTGRES_BINARIES
                    } else {
                        exit::PRIVATE_POSTGRES_FAILED
                    })
                }
                (None, None) => {
                    eprintln!("leasegate: {}", error_chain(&error));
                    ExitCode::FAILURE
                }
            }
        }
    }
}

/// Logs to stderr; `LEASEGATE_LOG_FORMAT=json`: one JSON object per line,
/// span fields (run_id, owner, epoch, operation_id, tool) included.
fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,rmcp=warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false);
    if std::env::var("LEASEGATE_LOG_FORMAT").is_ok_and(|format| format == "json") {
        builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .init();
    } else {
        builder.init();
    }
}

/// Runs `command`; `database` is set to the ledger's URL once it is known.
async fn run(command: Command, database: &mut Option<DatabaseUrl>) -> anyhow::Result<()> {
    match command {
        Command::Operator(_) => unreachable!("answered before logging starts"),
        Command::Serve {
            config,
            listen,
            database_url,
        } => {
            let mut config = Config::load(&config)?;
            config.resolve_database_url(database_url.as_deref());
            *database = Some(config.database());
            if let Some(listen) = listen {
                config.listen = listen;
            }
            let listeners = Listeners::bind(&config).await?;
            // Dropped on an error return: a private cluster stops then too.
            let private = leasegate::app::provide_database(&mut config).await?;
            *database = Some(config.database());
            let proxy = Proxy::start(config).await?;
            // Tests read these two lines to find the ephemeral ports.
            if let Some(control) = &listeners.control {
                eprintln!(
                    "leasegate: control API at http://{}/v1",
                    control.local_addr()?
                );
            }
            let address = listeners.mcp.local_addr()?;
            tracing::info!(%address, "serving MCP at http://{address}/mcp");
            eprintln!("leasegate: serving MCP at http://{address}/mcp");
            let served = leasegate::app::run(proxy, listeners, shutdown_signal()).await;
            leasegate::app::stop_private(private).await;
            served
        }
        Command::Stdio {
            config,
            database_url,
            task,
        } => {
            let mut config = Config::load(&config)?;
            config.resolve_database_url(database_url.as_deref());
            *database = Some(config.database());
            if let Some(task) = task {
                config.lease_mode = leasegate::config::LeaseMode::Session;
                config.session_task = Some(task);
            }
            let private = leasegate::app::provide_database(&mut config).await?;
            *database = Some(config.database());
            let proxy = Proxy::start(config).await?;
            let served = proxy.serve_stdio().await;
            proxy.shutdown().await;
            leasegate::app::stop_private(private).await;
            served
        }
        Command::CheckConfig { files } => {
            let mut failed = 0;
            for file in &files {
                match leasegate::config::check_file(file) {
                    Ok(kind) => println!("ok   {} ({kind})", file.display()),
                    Err(error) => {
                        failed += 1;
                        println!("FAIL {error}");
                    }
                }
            }
            if failed > 0 {
                anyhow::bail!("{failed} of {} files invalid", files.len());
            }
            Ok(())
        }
        Command::Migrate {
            database_url,
            config,
        } => {
            let resolved = match config {
                Some(path) => {
                    let mut config = Config::load(&path)?;
                    config.resolve_database_url(database_url.as_deref());
                    config.database()
                }
                None => DatabaseUrl::from_environment(database_url.as_deref(), None),
            };
            let url = resolved.url.clone();
            *database = Some(resolved);
            if leasegate::ledger::Ledger::create_database_if_missing(&url).await? {
                tracing::info!("created the ledger database");
            }
            leasegate::ledger::Ledger::migrate(&url).await?;
            let applied = leasegate::ledger::MIGRATOR.iter().count();
            println!("ledger migrated ({applied} migrations)");
            Ok(())
        }
    }
}

/// Completes on ctrl-c (SIGINT) or SIGTERM.
async fn shutdown_signal() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(error) => {
                tracing::warn!(%error, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = terminate => {}
    }
    tracing::info!("shutting down");
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
