//! The `leasegate` command line as clap parses it: the top-level commands
//! (`serve`, `stdio`, `check-config`, `init`, `secrets`, `tokens`,
//! `migrate`, and the operator commands of `super::operator_args`
//! flattened in). Flags, help texts and defaults here are the CLI's public
//! surface.

use clap::Parser as _;

use super::operator_args::{OperatorCommand, TokensArgs};
use crate::config::DATABASE_URL_HELP;

#[derive(Debug, clap::Parser)]
#[command(
    name = "leasegate",
    version,
    about = "MCP tool-call idempotency proxy with a fenced PostgreSQL ledger"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, clap::Subcommand)]
pub enum Command {
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
    /// its tools are listed. Into a --dir with a leasegate.toml already, the
    /// upstreams are added to it (a name it has is refused without
    /// --force). Default ports that are taken are replaced by free ones.
    /// Exit 0: written; 2: bad arguments, or a file would be overwritten
    /// (nothing is written); 1: an upstream could not be started, reached or
    /// listed (nothing is written), or writing failed.
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
    pub fn config_path(&self) -> Option<&std::path::Path> {
        match self {
            Command::Serve { config, .. } | Command::Stdio { config, .. } => Some(config),
            _ => None,
        }
    }
}

#[derive(Debug, clap::Subcommand)]
pub enum SecretsCommand {
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
pub struct InitArgs {
    /// Directory to write leasegate.toml, policies/ and adapters/ into.
    #[arg(long, default_value = ".")]
    pub dir: std::path::PathBuf,
    /// Overwrite files that exist; with a leasegate.toml there already,
    /// replace the upstreams of the names given.
    #[arg(long)]
    pub force: bool,
    /// The name of the upstream given by `-- COMMAND…` or --url (its tools
    /// are exposed as NAME__<tool>).
    #[arg(long)]
    pub name: Option<String>,
    /// A Streamable HTTP upstream's URL (with --name).
    #[arg(long, value_name = "URL")]
    pub url: Option<String>,
    /// A stdio upstream, NAME=COMMAND ARGS… (split at spaces; repeatable).
    #[arg(long = "stdio", value_name = "NAME=COMMAND")]
    pub stdio: Vec<String>,
    /// A Streamable HTTP upstream, NAME=URL (repeatable).
    #[arg(long = "http", value_name = "NAME=URL")]
    pub http: Vec<String>,
    /// An environment variable of the upstream given by --name and `--
    /// COMMAND…` (repeatable). A name that looks secret (it contains TOKEN,
    /// KEY, SECRET or PASSWORD) is written as a reference, { from_env =
    /// "NAME" }, read from leasegate's environment when it starts the
    /// server; its value here only lists the tools now.
    #[arg(long = "env", value_name = "NAME=VALUE")]
    pub env: Vec<String>,
    /// The ledger the new leasegate.toml names: a PostgreSQL URL, or
    /// "embedded" for leasegate's private PostgreSQL in its state
    /// directory. Unset: the default (a server at 127.0.0.1:5432 when one
    /// answers, else the private one), said in a comment.
    #[arg(long, value_name = "URL|embedded")]
    pub database_url: Option<String>,
    /// A stdio upstream's command and arguments (with --name), after `--`.
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

impl Cli {
    /// The command line of this process; on bad arguments, clap prints
    /// the usage and exits 2 (`--help`, `--version`: 0).
    pub fn from_args() -> Self {
        Self::parse()
    }

    /// `worker_threads` of the config, read before the runtime exists; a
    /// value out of range is reported by the config's full load.
    pub fn worker_threads(&self) -> usize {
        self.command.config_path().map_or_else(
            crate::config::default_worker_threads,
            crate::config::read_ahead_worker_threads,
        )
    }
}
