//! The operator commands as `leasegate` parses them (`runs`, `lease`,
//! `ops`, `tokens`): their clap definitions, the options every one of them
//! takes ([`Common`]), and which of them are operator acts, the commands
//! whose SQL only the database role `leasegate_operator` may execute.
//! Flags, help texts and defaults here are the CLI's public surface.

use crate::config::DATABASE_URL_HELP;

/// An operator command, as `leasegate` parses it.
#[derive(Debug, clap::Subcommand)]
pub enum OperatorCommand {
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
}

/// Options of every operator command.
#[derive(Debug, clap::Args)]
pub struct Common {
    #[arg(long, global = true, value_name = "URL", help = DATABASE_URL_HELP)]
    pub database_url: Option<String>,
    /// A leasegate.toml: its database_url, and its tenant (runs of another
    /// tenant are refused, as that config's `leasegate serve` refuses them).
    #[arg(long, global = true, value_name = "FILE")]
    pub config: Option<std::path::PathBuf>,
    /// Print the API's JSON instead of a table.
    #[arg(long, global = true)]
    pub json: bool,
}

#[derive(Debug, clap::Subcommand)]
pub enum RunsCommand {
    /// Create a run for a task (the task is created if new; a retry is a new run).
    Create {
        #[arg(long)]
        task: String,
        /// Default: the --config file's tenant, else "default".
        #[arg(long)]
        tenant: Option<String>,
        /// Reuse to make the create retry-safe.
        #[arg(long)]
        run_id: Option<String>,
        /// Hold the lease from the start (its secret lease_token is printed
        /// this once).
        #[arg(long, requires = "ttl_ms")]
        owner: Option<String>,
        #[arg(long, requires = "owner")]
        ttl_ms: Option<i64>,
    },
    /// Show a run: status, revision, checkpoint, lease holder and epoch.
    Show { run_id: String },
    /// Cancel a run (pending or running) without its lease; its planned
    /// (prepared) operations are cancelled with it. An operator act.
    Cancel {
        run_id: String,
        /// Why (kept in the history).
        #[arg(long)]
        reason: Option<String>,
        /// Who cancels it (default: $USER).
        #[arg(long, env = "USER", default_value = "operator")]
        actor: String,
    },
}

#[derive(Debug, clap::Subcommand)]
pub enum LeaseCommand {
    /// Acquire a free lease or take over an expired one (epoch + 1). Prints
    /// the lease's secret lease_token once: renew and release need it.
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
        /// The lease's secret token, as acquire printed it.
        #[arg(long, env = "LEASEGATE_LEASE_TOKEN", hide_env_values = true)]
        lease_token: String,
        #[arg(long)]
        ttl_ms: i64,
    },
    Release {
        run_id: String,
        #[arg(long)]
        owner: String,
        #[arg(long)]
        epoch: i64,
        /// The lease's secret token, as acquire printed it.
        #[arg(long, env = "LEASEGATE_LEASE_TOKEN", hide_env_values = true)]
        lease_token: String,
    },
}

#[derive(Debug, clap::Subcommand)]
pub enum OpsCommand {
    /// An operation's status, request, result, history and evidence.
    Show { operation_id: String },
    /// Operations, newest first, a page at a time (GET /v1/operations):
    /// of one run, status or tool when given.
    List {
        /// Only this run's operations.
        #[arg(long)]
        run: Option<String>,
        #[arg(long)]
        status: Option<String>,
        /// Only this exposed tool name's operations.
        #[arg(long)]
        tool: Option<String>,
        /// Rows per page, 1 to 1000 (default 100).
        #[arg(long)]
        limit: Option<u32>,
        /// The page after the one that printed this cursor.
        #[arg(long)]
        cursor: Option<String>,
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
    /// Let the reconciler try an unknown operation again: its same-key
    /// retry budget starts over (e.g. after an upstream outage).
    Retry {
        operation_id: String,
        #[arg(long)]
        note: String,
        /// Who asks (default: $USER).
        #[arg(long, env = "USER", default_value = "operator")]
        actor: String,
    },
    /// The failovers leasegate recorded (lossy ones hold dispatch until
    /// resolved).
    Failovers {
        /// Only the unresolved ones.
        #[arg(long)]
        unresolved: bool,
    },
    /// Resolve a lossy failover after comparing the ledger with the tools'
    /// own records: dispatch resumes at every process's next check.
    FailoverResolve {
        failover_id: String,
        /// What was compared and decided (kept on the failover).
        #[arg(long)]
        reason: String,
        /// Who resolves it (default: $USER).
        #[arg(long, env = "USER", default_value = "operator")]
        by: String,
    },
    /// Retention: move the settled history of terminal runs older than the
    /// window (their operations, evidence and events) to the archive tables,
    /// in batches, until none is left. Archived operations stay answerable
    /// by `ops show` (marked archived). Runs on the ledger directly as the
    /// database role `leasegate_operator`.
    Archive {
        /// The window, e.g. "30d": runs terminal and operations settled for
        /// at least this long.
        #[arg(long)]
        older_than: String,
        /// Delete instead of archiving (the fate query then answers "not
        /// found" for them).
        #[arg(long)]
        delete: bool,
        /// Runs per batch (one transaction each), 1 to 10000.
        #[arg(long, default_value_t = 1000)]
        batch: i32,
        /// Stop after this many batches (default: until nothing is left).
        #[arg(long)]
        max_batches: Option<u64>,
    },
}

/// `leasegate tokens …`: bearer tokens for the listeners (`crate::auth`).
/// The commands work on the ledger directly, as the database role
/// `leasegate_operator` (the proxy's role cannot mint or revoke tokens): the
/// login role of the URL must be allowed to `SET ROLE leasegate_operator`
/// (a superuser, or `GRANT leasegate_operator TO my_login`).
#[derive(Debug, clap::Args)]
pub struct TokensArgs {
    #[command(subcommand)]
    pub command: TokensCommand,
    #[command(flatten)]
    pub common: Common,
}

#[derive(Debug, clap::Subcommand)]
pub enum TokensCommand {
    /// Create a token; it is printed once and cannot be shown again.
    Create {
        /// The tenant it acts for (default: the --config file's tenant, else "default").
        #[arg(long)]
        tenant: Option<String>,
        /// agent (tool calls, runs, leases), operator (bodies, resolve,
        /// cancel, retry) or admin (everything).
        #[arg(long)]
        scope: String,
        /// A label to tell tokens apart in `tokens list`.
        #[arg(long)]
        name: Option<String>,
        /// How long it is valid, e.g. "30d", "12h" (default: until revoked).
        #[arg(long, value_name = "DURATION")]
        expires_in: Option<String>,
        /// Who creates it (default: $USER).
        #[arg(long, env = "USER", default_value = "operator")]
        by: String,
    },
    /// List tokens (never their secrets), optionally of one tenant.
    List {
        #[arg(long)]
        tenant: Option<String>,
    },
    /// Revoke a token for good (by its id, the part after `lgt_`): it is
    /// refused from its next request on.
    Revoke {
        token_id: String,
        /// Who revokes it (default: $USER).
        #[arg(long, env = "USER", default_value = "operator")]
        by: String,
    },
}

impl OperatorCommand {
    pub(super) fn common(&self) -> &Common {
        match self {
            OperatorCommand::Runs { common, .. }
            | OperatorCommand::Lease { common, .. }
            | OperatorCommand::Ops { common, .. } => common,
        }
    }

    /// Whether this command is an operator act, whose SQL only the
    /// database role `leasegate_operator` may execute (migrations/0007):
    /// `runs cancel`, `ops resolve`, `ops retry`, `ops failover-resolve`.
    /// Such a command connects as that role for all of its work (reads
    /// included), so that it works from a login that is a member of
    /// `leasegate_operator` only; every other command runs as
    /// `leasegate_app`.
    pub fn is_operator_act(&self) -> bool {
        matches!(
            self,
            OperatorCommand::Runs {
                command: RunsCommand::Cancel { .. },
                ..
            } | OperatorCommand::Ops {
                command: OpsCommand::Resolve { .. }
                    | OpsCommand::Retry { .. }
                    | OpsCommand::FailoverResolve { .. },
                ..
            }
        )
    }
}
