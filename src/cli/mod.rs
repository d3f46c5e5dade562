//! The `leasegate` command line: every command the binary runs, from the
//! process's arguments to the exit code. `src/main.rs` only chooses the
//! allocator and calls [`main`], which parses ([`Cli::from_args`]),
//! builds the runtime and runs [`run`] on it. The runtime is built here,
//! not in the binary, so that the whole async call tree is compiled once,
//! in this crate: a binary that blocked on [`run`] itself would compile
//! every future under it again.
//!
//! * `args`: the clap definitions of the top-level commands;
//!   `operator_args`: those of the operator commands (`runs`, `lease`,
//!   `ops`, `tokens`).
//! * `operator`, `operator_request`, `target`, `archive`, `tokens`,
//!   `output`: the operator commands — each of `runs|lease|ops` is one
//!   request to the control API in-process (`crate::control::in_process`),
//!   so the CLI and the API cannot disagree; `ops archive` and `tokens` go to the ledger
//!   directly as `leasegate_operator`. Human-readable output by default,
//!   the API's JSON with `--json`; exit codes
//!   (`crate::control::ErrorCode::exit_code`) tell not found, conflict and
//!   lease lost apart from other errors.
//! * `serve`: `serve` and `stdio`, with ctrl-c/SIGTERM as the shutdown
//!   signal, through [`crate::app::run`] — the same seam the tests use.
//! * `ledger_admin`: `migrate` and `secrets rotate`.
//! * `init`, `check_config`: writing and checking configuration files.
//! * `logging`: the log subscriber of the commands that log.
//! * `failure`: how a failed command is told — a ledger that cannot be
//!   opened exits with the code of the failure (6 unreachable, 7 login
//!   refused, 8 database missing, 9 schema missing, 15 role not granted,
//!   2 an invalid URL), a private PostgreSQL cluster that cannot be
//!   provided 10 (no binaries) or 11 (not started), anything else 1.
//!
//! Every command that opens the ledger finds its URL the same way
//! ([`crate::config::DatabaseUrl::resolve`]).

mod archive;
mod args;
mod check_config;
mod failure;
mod init;
mod ledger_admin;
mod logging;
mod operator;
mod operator_args;
mod operator_request;
mod output;
mod serve;
mod target;
mod tokens;

use std::process::ExitCode;

pub use args::{Cli, Command, InitArgs, SecretsCommand};
pub use failure::ledger_refusal;
pub use operator_args::{
    Common, LeaseCommand, OperatorCommand, OpsCommand, RunsCommand, TokensArgs, TokensCommand,
};
pub use operator_request::{ApiRequest, url_segment};
pub use output::{exit_code, render};

use crate::config::DatabaseUrl;
use crate::telemetry::Tracing;

/// The `leasegate` process: parses the command line, runs the command on
/// a multi-threaded runtime of [`Cli::worker_threads`] threads, and
/// answers the exit code.
pub fn main() -> ExitCode {
    let cli = Cli::from_args();
    match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cli.worker_threads())
        .enable_all()
        .build()
    {
        Ok(runtime) => {
            let code = runtime.block_on(run(cli));
            // A blocking read of stdin (`leasegate stdio` stopped by a
            // signal while its client keeps stdin open) never ends: the
            // process exits without waiting for it.
            runtime.shutdown_timeout(std::time::Duration::from_secs(1));
            code
        }
        Err(error) => {
            eprintln!("leasegate: cannot start the async runtime: {error}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the parsed command; returns the process's exit code.
pub async fn run(cli: Cli) -> ExitCode {
    if let Command::Init(args) = cli.command {
        // Its errors say what failed; rmcp's own logs would repeat them.
        logging::init_logging("warn,rmcp=off", None);
        return match init::init(args).await {
            Ok(()) => ExitCode::SUCCESS,
            Err((code, message)) => {
                eprintln!("leasegate init: {message}");
                ExitCode::from(code)
            }
        };
    }
    if let Command::CheckConfig { files } = &cli.command {
        return ExitCode::from(check_config::check_config(files));
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
    // reported by `run_logged` as before.
    let traces = cli
        .command
        .config_path()
        .and_then(crate::config::read_ahead_telemetry)
        .and_then(|settings| match Tracing::from_settings(&settings) {
            Ok(traces) => traces,
            Err(error) => {
                eprintln!("leasegate: {error}; spans are not exported");
                None
            }
        });
    logging::init_logging(
        &format!("info,rmcp=warn,{}", crate::ledger::SERVER_NOTICES_FILTER),
        traces.as_ref(),
    );
    let mut database = None;
    let outcome = run_logged(cli.command, &mut database).await;
    if let Some(traces) = &traces {
        traces.shutdown();
    }
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => failure::failed(&error, database.as_ref()),
    }
}

/// Runs a command that logs; `database` is set to the ledger's URL once it
/// is known.
async fn run_logged(command: Command, database: &mut Option<DatabaseUrl>) -> anyhow::Result<()> {
    match command {
        Command::Operator(_) | Command::Tokens(_) => {
            unreachable!("answered before logging starts")
        }
        Command::Init(_) => unreachable!("answered with its own exit codes"),
        Command::CheckConfig { .. } => unreachable!("answered with its own exit codes"),
        Command::Serve {
            config,
            listen,
            database_url,
        } => serve::serve(&config, listen, database_url, database).await,
        Command::Stdio {
            config,
            database_url,
            task,
        } => serve::stdio(&config, database_url, task, database).await,
        Command::Secrets(SecretsCommand::Rotate {
            config,
            database_url,
        }) => ledger_admin::secrets_rotate(&config, database_url, database).await,
        Command::Migrate {
            database_url,
            config,
        } => ledger_admin::migrate(database_url, config, database).await,
    }
}
