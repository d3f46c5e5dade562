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
    /// Run the proxy: MCP over HTTP at http://<listen>/mcp.
    Serve {
        #[arg(long, default_value = "leasegate.toml")]
        config: std::path::PathBuf,
        /// Override the config's listen address (e.g. 127.0.0.1:0).
        #[arg(long)]
        listen: Option<std::net::SocketAddr>,
    },
    /// Run the proxy on stdin/stdout, for MCP clients that spawn their servers.
    Stdio {
        #[arg(long, default_value = "leasegate.toml")]
        config: std::path::PathBuf,
    },
    /// Validate configuration, adapter and policy files; exit 0 when all are valid.
    CheckConfig {
        /// Files to check: a main config, or files under adapters/ or policies/.
        #[arg(required = true)]
        files: Vec<std::path::PathBuf>,
    },
    /// The example tool server with counted side effects (quickstart, tests).
    ExampleTools {
        /// payments, mailer or all.
        #[arg(long, default_value = "all")]
        tools: leasegate::mcp::example_tools::ToolSet,
        /// Where side effects are recorded (charges.jsonl, emails.jsonl).
        #[arg(long, default_value = ".leasegate-example")]
        state_dir: std::path::PathBuf,
        /// Serve Streamable HTTP on this address instead of stdio.
        #[arg(long)]
        http: Option<std::net::SocketAddr>,
    },
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
    let cli = Cli::parse();
    // The example tool server speaks MCP on stdout and stays quiet on stderr.
    let default_level = match cli.command {
        Command::ExampleTools { .. } => "warn",
        _ => "info,rmcp=warn",
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level)),
        )
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
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
        Command::Serve { config, listen } => {
            let mut config = leasegate::config::Config::load(&config)?;
            if let Some(listen) = listen {
                config.listen = listen;
            }
            let proxy = leasegate::app::Proxy::start(config).await?;
            let listener = tokio::net::TcpListener::bind(proxy.config.listen).await?;
            let address = listener.local_addr()?;
            tracing::info!(%address, "serving MCP at http://{address}/mcp");
            eprintln!("leasegate: serving MCP at http://{address}/mcp");
            proxy
                .serve_http(listener, async {
                    let _ = tokio::signal::ctrl_c().await;
                })
                .await?;
            proxy.shutdown().await;
            Ok(())
        }
        Command::Stdio { config } => {
            let config = leasegate::config::Config::load(&config)?;
            let proxy = leasegate::app::Proxy::start(config).await?;
            proxy.serve_stdio().await?;
            proxy.shutdown().await;
            Ok(())
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
        Command::ExampleTools {
            tools,
            state_dir,
            http,
        } => match http {
            None => leasegate::mcp::example_tools::serve_stdio(tools, state_dir).await,
            Some(address) => {
                let listener = tokio::net::TcpListener::bind(address).await?;
                eprintln!("example tools at http://{}/mcp", listener.local_addr()?);
                leasegate::mcp::example_tools::serve_http(tools, state_dir, listener).await
            }
        },
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
