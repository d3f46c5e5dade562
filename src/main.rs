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
    /// Runs: create one for a task, show one.
    Runs {
        #[command(subcommand)]
        command: RunsCommand,
        #[command(flatten)]
        common: Common,
    },
    /// Leases: acquire or take over, renew, release.
    Lease {
        #[command(subcommand)]
        command: LeaseCommand,
        #[command(flatten)]
        common: Common,
    },
    /// Operations: the fate of a call.
    Ops {
        #[command(subcommand)]
        command: OpsCommand,
        #[command(flatten)]
        common: Common,
    },
    /// Create the ledger database if missing and apply the migrations
    /// (schema, protected SQL functions, the leasegate_app role). Running it
    /// again is a no-op.
    Migrate {
        #[arg(long, env = "DATABASE_URL", default_value = DEFAULT_DATABASE_URL)]
        database_url: String,
    },
}

#[derive(Debug, clap::Args)]
struct Common {
    #[arg(long, env = "DATABASE_URL", default_value = DEFAULT_DATABASE_URL, global = true)]
    database_url: String,
    /// Print the API's JSON instead of a table.
    #[arg(long, global = true)]
    json: bool,
}

#[derive(Debug, Subcommand)]
enum RunsCommand {
    /// Create a run for a task (the task is created if new; a retry is a new run).
    Create {
        #[arg(long)]
        task: String,
        #[arg(long, default_value = "default")]
        tenant: String,
        /// Reuse to make the create retry-safe.
        #[arg(long)]
        run_id: Option<String>,
        /// Hold the lease from the start.
        #[arg(long, requires = "ttl_ms")]
        owner: Option<String>,
        #[arg(long, requires = "owner")]
        ttl_ms: Option<i64>,
    },
    /// Show a run: status, revision, checkpoint, lease holder and epoch.
    Show { run_id: String },
}

#[derive(Debug, Subcommand)]
enum LeaseCommand {
    /// Acquire a free lease or take over an expired one (epoch + 1).
    Acquire {
        run_id: String,
        #[arg(long)]
        ttl_ms: i64,
        /// Generated when absent.
        #[arg(long)]
        owner: Option<String>,
    },
    Renew {
        run_id: String,
        #[arg(long)]
        owner: String,
        #[arg(long)]
        epoch: i64,
        #[arg(long)]
        ttl_ms: i64,
    },
    Release {
        run_id: String,
        #[arg(long)]
        owner: String,
        #[arg(long)]
        epoch: i64,
    },
}

#[derive(Debug, Subcommand)]
enum OpsCommand {
    /// An operation's status, request, result, history and evidence.
    Show { operation_id: String },
    /// A run's operations, optionally of one status.
    List {
        #[arg(long)]
        run: String,
        #[arg(long)]
        status: Option<String>,
    },
    /// How many operations are unknown, and the oldest.
    Unknown,
    /// Resolve an unknown operation by hand, with who and why.
    Resolve {
        operation_id: String,
        #[arg(
            long,
            conflicts_with = "failed_final",
            required_unless_present = "failed_final"
        )]
        succeeded: bool,
        #[arg(long)]
        failed_final: bool,
        #[arg(long)]
        note: String,
        #[arg(long)]
        remote_id: Option<String>,
        /// Who resolves it (default: $USER).
        #[arg(long, env = "USER", default_value = "operator")]
        actor: String,
    },
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(code) = operator_command(&cli).await {
        return ExitCode::from(code);
    }
    // The example tool server speaks MCP on stdout and stays quiet on stderr.
    let default_level = match cli.command {
        Command::ExampleTools { .. } => "warn",
        _ => "info,rmcp=warn",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    // LEASEGATE_LOG_FORMAT=json: one JSON object per line, span fields
    // (run_id, owner, epoch, operation_id, tool) included.
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
        // Answered by `operator_command` before logging starts.
        Command::Runs { .. } | Command::Lease { .. } | Command::Ops { .. } => Ok(()),
        Command::Serve { config, listen } => {
            let mut config = leasegate::config::Config::load(&config)?;
            if let Some(listen) = listen {
                config.listen = listen;
            }
            let proxy = leasegate::app::Proxy::start(config).await?;
            let listener = tokio::net::TcpListener::bind(proxy.config.listen).await?;
            let address = listener.local_addr()?;
            let (stop, _) = tokio::sync::watch::channel(false);
            if let Some(control) = proxy.config.control_listen {
                let control = tokio::net::TcpListener::bind(control).await?;
                eprintln!(
                    "leasegate: control API at http://{}/v1",
                    control.local_addr()?
                );
                let mut stopped = stop.subscribe();
                let router = proxy.control_router();
                tokio::spawn(async move {
                    let shutdown = async move {
                        let _ = stopped.changed().await;
                    };
                    if let Err(error) = leasegate::control::serve(router, control, shutdown).await {
                        tracing::error!(%error, "control API stopped");
                    }
                });
            }
            tracing::info!(%address, "serving MCP at http://{address}/mcp");
            eprintln!("leasegate: serving MCP at http://{address}/mcp");
            proxy
                .serve_http(listener, async move {
                    let _ = tokio::signal::ctrl_c().await;
                    let _ = stop.send(true);
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

/// Runs an operator command (`runs`, `lease`, `ops`) and returns its exit
/// code, or `None` for the other commands.
async fn operator_command(cli: &Cli) -> Option<u8> {
    use axum::http::Method;
    use leasegate::control::cli::{execute, exit, exit_code, render};
    use serde_json::json;

    let (common, method, path, body) = match &cli.command {
        Command::Runs { command, common } => match command {
            RunsCommand::Create {
                task,
                tenant,
                run_id,
                owner,
                ttl_ms,
            } => (
                common,
                Method::POST,
                "/v1/runs".to_owned(),
                Some(
                    json!({"task_id": task, "tenant_id": tenant, "run_id": run_id, "owner": owner, "ttl_ms": ttl_ms}),
                ),
            ),
            RunsCommand::Show { run_id } => {
                (common, Method::GET, format!("/v1/runs/{run_id}"), None)
            }
        },
        Command::Lease { command, common } => match command {
            LeaseCommand::Acquire {
                run_id,
                ttl_ms,
                owner,
            } => (
                common,
                Method::POST,
                format!("/v1/runs/{run_id}/lease"),
                Some(json!({"owner": owner, "ttl_ms": ttl_ms})),
            ),
            LeaseCommand::Renew {
                run_id,
                owner,
                epoch,
                ttl_ms,
            } => (
                common,
                Method::POST,
                format!("/v1/runs/{run_id}/lease/renew"),
                Some(json!({"owner": owner, "epoch": epoch, "ttl_ms": ttl_ms})),
            ),
            LeaseCommand::Release {
                run_id,
                owner,
                epoch,
            } => (
                common,
                Method::POST,
                format!("/v1/runs/{run_id}/lease/release"),
                Some(json!({"owner": owner, "epoch": epoch})),
            ),
        },
        Command::Ops { command, common } => match command {
            OpsCommand::Show { operation_id } => (
                common,
                Method::GET,
                format!("/v1/operations/{}", url_segment(operation_id)),
                None,
            ),
            OpsCommand::List { run, status } => {
                let query = status
                    .as_ref()
                    .map(|s| format!("?status={}", url_segment(s)))
                    .unwrap_or_default();
                (
                    common,
                    Method::GET,
                    format!("/v1/runs/{}/operations{query}", url_segment(run)),
                    None,
                )
            }
            OpsCommand::Unknown => (
                common,
                Method::GET,
                "/v1/operations/unknown".to_owned(),
                None,
            ),
            OpsCommand::Resolve {
                operation_id,
                succeeded,
                note,
                remote_id,
                actor,
                ..
            } => (
                common,
                Method::POST,
                format!("/v1/operations/{}/resolve", url_segment(operation_id)),
                Some(
                    json!({"outcome": if *succeeded { "succeeded" } else { "failed_final" },
                            "note": note, "remote_id": remote_id, "actor": actor}),
                ),
            ),
        },
        _ => return None,
    };
    let options = leasegate::ledger::LedgerOptions {
        max_connections: 2,
        ..Default::default()
    };
    let ledger = match leasegate::ledger::Ledger::connect(&common.database_url, options).await {
        Ok(ledger) => ledger,
        Err(error) => {
            eprintln!("leasegate: {error}");
            return Some(exit::UNAVAILABLE);
        }
    };
    let (status, answer) = execute(ledger.clone(), method, &path, body).await;
    ledger.close().await;
    if status.is_success() {
        println!(
            "{}",
            if common.json {
                answer.to_string()
            } else {
                render(&answer)
            }
        );
        return Some(exit::OK);
    }
    let code = answer["code"].as_str().unwrap_or("error");
    if common.json {
        println!("{answer}");
    } else {
        eprintln!(
            "leasegate: {} ({code})",
            answer["message"].as_str().unwrap_or("request failed")
        );
    }
    Some(exit_code(code))
}

/// Percent-encodes a path segment (ids are UUIDs, but operators paste anything).
fn url_segment(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            other => format!("%{other:02X}"),
        })
        .collect()
}
