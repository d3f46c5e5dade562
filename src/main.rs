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

/// mimalloc instead of glibc's malloc: a call allocates and frees many small
/// buffers (JSON values, headers, futures) across the runtime's threads, and
/// with glibc's malloc the proxy spent more CPU per call under load
/// (docs/performance.md). Only the binary chooses: the library
/// leaves the allocator to whoever embeds it.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use clap::{Parser, Subcommand};
use leasegate::app::{Listeners, Proxy};
use leasegate::config::{Config, DATABASE_URL_HELP, DatabaseUrl, RawUpstream, UpstreamTransport};
use leasegate::control::cli::{OperatorCommand, TokensArgs, ledger_refusal};
use leasegate::control::exit;
use leasegate::embedded::EmbeddedError;
use leasegate::ledger::LedgerError;
use leasegate::telemetry::Tracing;

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
    /// Write a leasegate.toml, the default policy and an adapter skeleton per
    /// upstream into --dir, from the tools the upstreams list.
    ///
    /// One upstream: `--name NAME -- COMMAND [ARGS…]` (stdio) or
    /// `--name NAME --url URL` (Streamable HTTP). Several: repeat
    /// `--stdio 'NAME=COMMAND ARGS…'` (split at spaces) and `--http NAME=URL`.
    /// Each is started (or reached) with the same handshake `serve` uses and
    /// its tools are listed. Exit 0: written; 2: bad arguments, or a file
    /// would be overwritten (nothing is written); 1: an upstream could not be
    /// started, reached or listed (nothing is written), or writing failed.
    Init(InitArgs),
    #[command(flatten)]
    Operator(OperatorCommand),
    /// Stored bodies under `encrypted` policies: key rotation.
    #[command(subcommand)]
    Secrets(SecretsCommand),
    /// Bearer tokens for the listeners: create (shown once), list, revoke.
    ///
    /// Tokens are required on both listeners when `[auth] mode =
    /// "required"`, or with the default `mode = "auto"` as soon as a
    /// listener is not loopback. These commands run as the database role
    /// leasegate_operator.
    Tokens(TokensArgs),
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

impl Command {
    /// The config file of the commands that serve (and so may export traces).
    fn config_path(&self) -> Option<&std::path::Path> {
        match self {
            Command::Serve { config, .. } | Command::Stdio { config, .. } => Some(config),
            _ => None,
        }
    }
}

#[derive(Debug, Subcommand)]
enum SecretsCommand {
    /// Re-seal every stored request and result sealed under another key
    /// than the policy's encryption_key_id (the old keys must still be in
    /// encryption_keys). Safe to run while serving, and again. Exit 0: every
    /// operation is under the current key; 1: some could not be opened or
    /// changed meanwhile (listed; run it again).
    Rotate {
        #[arg(long, default_value = "leasegate.toml")]
        config: std::path::PathBuf,
        #[arg(long, value_name = "URL", help = DATABASE_URL_HELP)]
        database_url: Option<String>,
    },
}

#[derive(Debug, clap::Args)]
struct InitArgs {
    /// Directory to write leasegate.toml, policies/ and adapters/ into.
    #[arg(long, default_value = ".")]
    dir: std::path::PathBuf,
    /// Overwrite files that exist.
    #[arg(long)]
    force: bool,
    /// The name of the upstream given by `-- COMMAND…` or --url (its tools
    /// are exposed as NAME__<tool>).
    #[arg(long)]
    name: Option<String>,
    /// A Streamable HTTP upstream's URL (with --name).
    #[arg(long, value_name = "URL")]
    url: Option<String>,
    /// A stdio upstream, NAME=COMMAND ARGS… (split at spaces; repeatable).
    #[arg(long = "stdio", value_name = "NAME=COMMAND")]
    stdio: Vec<String>,
    /// A Streamable HTTP upstream, NAME=URL (repeatable).
    #[arg(long = "http", value_name = "NAME=URL")]
    http: Vec<String>,
    /// A stdio upstream's command and arguments (with --name), after `--`.
    #[arg(last = true, value_name = "COMMAND")]
    command: Vec<String>,
}

/// `leasegate init`'s exit codes.
const INIT_UNREACHABLE: u8 = 1;
const INIT_USAGE: u8 = 2;

fn main() -> ExitCode {
    let cli = Cli::parse();
    // `worker_threads` of the config, read before the runtime exists; a
    // value out of range is reported by the config's full load.
    let worker_threads = cli.command.config_path().map_or_else(
        leasegate::config::default_worker_threads,
        leasegate::config::read_ahead_worker_threads,
    );
    match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(worker_threads)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime.block_on(async_main(cli)),
        Err(error) => {
            eprintln!("leasegate: cannot start the async runtime: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn async_main(cli: Cli) -> ExitCode {
    if let Command::Init(args) = cli.command {
        // Its errors say what failed; rmcp's own logs would repeat them.
        init_logging("warn,rmcp=off", None);
        return match init(args).await {
            Ok(()) => ExitCode::SUCCESS,
            Err((code, message)) => {
                eprintln!("leasegate init: {message}");
                ExitCode::from(code)
            }
        };
    }
    if let Command::CheckConfig { files } = &cli.command {
        return ExitCode::from(check_config(files));
    }
    // Operator commands print only their answer: no logging set up.
    if let Command::Operator(command) = &cli.command {
        return ExitCode::from(command.run().await);
    }
    if let Command::Tokens(command) = &cli.command {
        return ExitCode::from(command.run().await);
    }
    // Traces (`[telemetry]`): read ahead of the config's full load so that
    // the subscriber is set up once; a config that does not load is
    // reported by `run` as before.
    let traces = cli
        .command
        .config_path()
        .and_then(leasegate::config::read_ahead_telemetry)
        .and_then(|settings| match Tracing::from_settings(&settings) {
            Ok(traces) => traces,
            Err(error) => {
                eprintln!("leasegate: {error}; spans are not exported");
                None
            }
        });
    init_logging("info,rmcp=warn", traces.as_ref());
    let mut database = None;
    let outcome = run(cli.command, &mut database).await;
    if let Some(traces) = &traces {
        traces.shutdown();
    }
    match outcome {
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
/// `default`: the filter when `RUST_LOG` is not set.
///
/// Argument and result values never reach the log, whatever `RUST_LOG`
/// says: the libraries that print whole messages below `info` (rmcp prints
/// every request and response at `debug`; the HTTP stacks at `trace`) are
/// held at `info`, unless `LEASEGATE_LOG_BODIES=1` says otherwise — the one
/// explicit, documented setting for debugging with bodies in the log.
fn init_logging(default: &str, traces: Option<&Tracing>) {
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let bodies = log_bodies();
    let no_bodies = tracing_subscriber::filter::filter_fn(move |meta| {
        bodies || *meta.level() <= tracing::Level::INFO || !prints_bodies(meta.target())
    });
    // One filter: RUST_LOG (or the default), and never bodies.
    let filter = tracing_subscriber::filter::FilterExt::and(filter, no_bodies);
    let layer = tracing_subscriber::fmt::layer()
        .with_writer(|| CappedStderr)
        .with_ansi(false);
    // Spans to OpenTelemetry (only leasegate's own: `telemetry`), when
    // `[telemetry] otlp_endpoint` is set.
    let registry = tracing_subscriber::registry().with(traces.map(Tracing::layer));
    if std::env::var("LEASEGATE_LOG_FORMAT").is_ok_and(|format| format == "json") {
        let layer = layer
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_filter(filter);
        registry.with(layer).init();
    } else {
        registry.with(layer.with_filter(filter)).init();
    }
    if bodies {
        tracing::warn!(
            "LEASEGATE_LOG_BODIES is set: tool arguments and results may be logged in full"
        );
    }
}

/// `LEASEGATE_LOG_BODIES=1` (or `true`): let libraries log whole messages.
fn log_bodies() -> bool {
    std::env::var("LEASEGATE_LOG_BODIES").is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"))
}

/// Targets that log whole MCP messages or HTTP bodies below `info`.
fn prints_bodies(target: &str) -> bool {
    ["rmcp", "hyper", "hyper_util", "h2", "reqwest", "sse_stream"]
        .iter()
        .any(|name| target == *name || target.starts_with(&format!("{name}::")))
}

/// stderr, one log event at a time, each cut at
/// `logfield::max_line_bytes` (a backstop for text dependencies log whole;
/// leasegate's own sites clip request-controlled fields).
struct CappedStderr;

impl std::io::Write for CappedStderr {
    fn write(&mut self, event: &[u8]) -> std::io::Result<usize> {
        std::io::stderr().write_all(&leasegate::logfield::cap_line(event))?;
        Ok(event.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

/// Runs `command`; `database` is set to the ledger's URL once it is known.
async fn run(command: Command, database: &mut Option<DatabaseUrl>) -> anyhow::Result<()> {
    match command {
        Command::Operator(_) | Command::Tokens(_) => {
            unreachable!("answered before logging starts")
        }
        Command::Init(_) => unreachable!("answered with its own exit codes"),
        Command::Serve {
            config,
            listen,
            database_url,
        } => {
            let mut config = Config::load(&config)?;
            config.resolve_database_url(database_url.as_deref());
            *database = Some(config.database());
            if let Some(listen) = listen {
                config.http.listen = listen;
                config
                    .check_exposure()
                    .map_err(|message| anyhow::anyhow!("--listen {listen}: {message}"))?;
            }
            let listeners = Listeners::bind(&config).await?;
            // Dropped on an error return: a private cluster stops then too.
            let private = leasegate::app::provide_database(&mut config).await?;
            *database = Some(config.database());
            let config_auth_required = config.auth_required();
            let proxy = Proxy::start(config).await?;
            // Tests read these two lines to find the ephemeral ports.
            if let Some(control) = &listeners.control {
                eprintln!(
                    "leasegate: control API at http://{}/v1",
                    control.local_addr()?
                );
            }
            let address = listeners.mcp.local_addr()?;
            if config_auth_required {
                eprintln!(
                    "leasegate: bearer tokens required on both listeners (`leasegate tokens create`)"
                );
            }
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
                config.lease.mode = leasegate::config::LeaseMode::Session;
                config.session.task = Some(task);
            }
            config.database.max_connections = Some(config.database.connections(true));
            let private = leasegate::app::provide_database(&mut config).await?;
            *database = Some(config.database());
            let proxy = Proxy::start(config).await?;
            let served = proxy.serve_stdio(shutdown_signal()).await;
            proxy.shutdown().await;
            leasegate::app::stop_private(private).await;
            served
        }
        Command::CheckConfig { .. } => unreachable!("answered with its own exit codes"),
        Command::Secrets(SecretsCommand::Rotate {
            config,
            database_url,
        }) => {
            let mut config = Config::load(&config)?;
            config.resolve_database_url(database_url.as_deref());
            *database = Some(config.database());
            // As the operator role: the proxy's role cannot rewrite bodies.
            let options = leasegate::ledger::LedgerOptions {
                max_connections: 2,
                bodies: config.policy.bodies(),
                session_role: Some(leasegate::ledger::OPERATOR_ROLE.to_owned()),
                ..Default::default()
            };
            let ledger = leasegate::ledger::Ledger::connect(&config.database.url, options).await?;
            let progress = leasegate::progress::Progress::spinner("re-sealing stored bodies");
            let report = ledger.secrets_rotate(100).await;
            progress.finish();
            ledger.close().await;
            let report = report?;
            println!(
                "re-sealed {} operations under key {}",
                report.resealed, report.key_id
            );
            for (operation_id, why) in &report.failed {
                println!("not re-sealed: operation {operation_id}: {why}");
            }
            if report.changed_meanwhile > 0 {
                println!(
                    "{} operations changed meanwhile: run it again",
                    report.changed_meanwhile
                );
            }
            println!(
                "re-sealed {} evidence rows under key {}",
                report.evidence_resealed, report.key_id
            );
            for (key_id, count) in &report.evidence_under_other_keys {
                println!(
                    "{count} evidence rows stay sealed under key {key_id} (not re-sealed: see above): keep it in encryption_keys to read them"
                );
            }
            if report.failed.is_empty() && report.changed_meanwhile == 0 {
                Ok(())
            } else {
                anyhow::bail!("rotation incomplete")
            }
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
            // A spinner on a terminal; nothing in CI or a pipe.
            let progress = leasegate::progress::Progress::spinner("migrating the ledger");
            if leasegate::ledger::Ledger::create_database_if_missing(&url).await? {
                tracing::info!("created the ledger database");
            }
            leasegate::ledger::Ledger::migrate(&url).await?;
            progress.finish();
            let applied = leasegate::ledger::MIGRATOR.iter().count();
            println!("ledger migrated ({applied} migrations)");
            Ok(())
        }
    }
}

/// `leasegate check-config`: one line per file; the exit code is the first
/// failing file's problem (`config::Problem::exit_code`: 1 invalid, 12
/// upstream command, 13 database URL, 14 timeouts out of order), 0 when
/// every file is valid.
fn check_config(files: &[std::path::PathBuf]) -> u8 {
    let mut first = None;
    let mut failed = 0;
    for file in files {
        let checked = leasegate::config::check_file(file).and_then(|kind| {
            leasegate::config::check_runnable(file, kind)?;
            Ok(kind)
        });
        match checked {
            Ok(kind) => println!("ok   {} ({kind})", file.display()),
            Err(error) => {
                failed += 1;
                first.get_or_insert(error.problem.exit_code());
                println!("FAIL {error}");
            }
        }
    }
    match first {
        Some(code) => {
            eprintln!("leasegate: {failed} of {} files invalid", files.len());
            code
        }
        None => exit::OK,
    }
}

/// The upstreams `leasegate init` was given, in order, as they go into
/// leasegate.toml; or why not (exit 2).
fn init_upstreams(
    args: &InitArgs,
    cwd: &std::path::Path,
) -> Result<Vec<(String, RawUpstream)>, String> {
    let mut upstreams = Vec::new();
    // A command with a `/` is relative to where init runs, not to --dir:
    // written absolute. A bare name is written as it is.
    let stdio = |command: &str, args: Vec<String>| RawUpstream::Stdio {
        command: if command.contains('/') {
            cwd.join(command).to_string_lossy().into_owned()
        } else {
            command.to_owned()
        },
        args,
        env: Default::default(),
    };
    match (&args.name, &args.url, args.command.split_first()) {
        (Some(_), Some(_), Some(_)) => {
            return Err("give either --url or `-- COMMAND…` with --name, not both".into());
        }
        (Some(name), Some(url), None) => {
            upstreams.push((
                name.clone(),
                RawUpstream::StreamableHttp { url: url.clone() },
            ));
        }
        (Some(name), None, Some((command, rest))) => {
            upstreams.push((name.clone(), stdio(command, rest.to_vec())));
        }
        (Some(name), None, None) => {
            return Err(format!(
                "--name {name}: give the upstream's command after `--` (stdio) or --url URL (Streamable HTTP)"
            ));
        }
        (None, Some(_), _) | (None, None, Some(_)) => {
            return Err(
                "--name NAME is needed with --url or `-- COMMAND…`: the upstream's name".into(),
            );
        }
        (None, None, None) => {}
    }
    for spec in &args.stdio {
        let (name, command) = spec
            .split_once('=')
            .ok_or_else(|| format!("--stdio {spec:?}: expected NAME=COMMAND ARGS…"))?;
        let mut words = command.split_whitespace().map(str::to_owned);
        let Some(program) = words.next() else {
            return Err(format!("--stdio {spec:?}: the command is empty"));
        };
        upstreams.push((name.to_owned(), stdio(&program, words.collect())));
    }
    for spec in &args.http {
        let (name, url) = spec
            .split_once('=')
            .ok_or_else(|| format!("--http {spec:?}: expected NAME=URL"))?;
        upstreams.push((
            name.to_owned(),
            RawUpstream::StreamableHttp {
                url: url.to_owned(),
            },
        ));
    }
    if upstreams.is_empty() {
        return Err("no upstream given: `--name NAME -- COMMAND [ARGS…]`, `--name NAME --url URL`, --stdio NAME=COMMAND or --http NAME=URL".into());
    }
    let mut seen = std::collections::BTreeSet::new();
    for (name, upstream) in &upstreams {
        if let Some(why) = leasegate::config::init::invalid_upstream_name(name) {
            return Err(why);
        }
        if !seen.insert(name.as_str()) {
            return Err(format!("upstream name {name:?} is given twice"));
        }
        if let RawUpstream::StreamableHttp { url } = upstream
            && !(url.starts_with("http://") || url.starts_with("https://"))
        {
            return Err(format!("upstream {name}: {url:?} is not an http(s) URL"));
        }
    }
    Ok(upstreams)
}

/// How an upstream is reached, for messages.
fn describe(upstream: &RawUpstream) -> String {
    match upstream {
        RawUpstream::Stdio { command, args, .. } => {
            let mut line = command.clone();
            for arg in args {
                line.push(' ');
                line.push_str(arg);
            }
            format!("command `{line}`")
        }
        RawUpstream::StreamableHttp { url } => format!("URL {url}"),
    }
}

/// `leasegate init`: (exit code, message) on failure.
async fn init(args: InitArgs) -> Result<(), (u8, String)> {
    use leasegate::config::init::{self as skeleton, InitError, InitUpstream};
    let usage = |message: String| (INIT_USAGE, message);
    let cwd = std::env::current_dir().map_err(|e| (INIT_UNREACHABLE, e.to_string()))?;
    let given = init_upstreams(&args, &cwd).map_err(usage)?;
    // Refuse before starting anything when a file is in the way.
    let planned: Vec<InitUpstream> = given
        .iter()
        .map(|(name, transport)| InitUpstream {
            name: name.clone(),
            transport: transport.clone(),
            server: None,
            tools: Vec::new(),
        })
        .collect();
    let refusal = |error: InitError| match error {
        InitError::Io { .. } => (INIT_UNREACHABLE, error.to_string()),
        _ => (INIT_USAGE, error.to_string()),
    };
    skeleton::check_target(&args.dir, &skeleton::render(&planned), args.force).map_err(refusal)?;

    let dir = args.dir.clone();
    let mut found = Vec::new();
    for (name, upstream) in given {
        let transport = match &upstream {
            RawUpstream::Stdio { command, args, env } => UpstreamTransport::Stdio {
                // What `serve` will run for the written config.
                command: leasegate::config::resolve_command(&dir, command),
                args: args.clone(),
                env: env.clone(),
            },
            RawUpstream::StreamableHttp { url } => {
                UpstreamTransport::StreamableHttp { url: url.clone() }
            }
        };
        let inspected = leasegate::mcp::inspect_upstream(&name, &transport)
            .await
            .map_err(|error| {
                (
                    INIT_UNREACHABLE,
                    format!("{error} ({})", describe(&upstream)),
                )
            })?;
        found.push(InitUpstream {
            name,
            transport: upstream,
            server: inspected.server,
            tools: inspected.tools,
        });
    }
    let written =
        skeleton::write_files(&args.dir, &skeleton::render(&found), args.force).map_err(refusal)?;
    let config = args.dir.join("leasegate.toml");
    // What was written must be what check-config accepts.
    leasegate::config::check_file(&config).map_err(|error| {
        (
            INIT_UNREACHABLE,
            format!("the written configuration does not load (a bug in leasegate init): {error}"),
        )
    })?;
    for upstream in &found {
        let read_only = upstream
            .tools
            .iter()
            .filter(|t| t.read_only_hint == Some(true))
            .count();
        println!(
            "upstream {} ({}): {} tools, {read_only} read-only by annotation, {} side-effecting (capability \"none\")",
            upstream.name,
            describe(&upstream.transport),
            upstream.tools.len(),
            upstream.tools.len() - read_only,
        );
    }
    for path in &written {
        println!("wrote {}", path.display());
    }
    let adapters = args.dir.join("adapters");
    println!(
        "next: review {} (what each tool can promise), then\n  leasegate check-config {}\n  leasegate serve --config {}",
        adapters.display(),
        config.display(),
        config.display()
    );
    Ok(())
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
