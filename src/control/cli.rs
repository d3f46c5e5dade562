//! The operator CLI (`leasegate runs|lease|ops …`): the control API driven
//! in-process, so the CLI and the API can never disagree. It connects to
//! the database itself, never through a `leasegate serve`: operator acts
//! ([`OperatorCommand::is_operator_act`]) as the role `leasegate_operator`,
//! the rest as `leasegate_app`, so that in a least-privilege deployment the
//! operator's own login (a member of `leasegate_operator` only) does them. Each subcommand
//! is one request (method, REST path, JSON body) to the same router
//! `leasegate serve` serves. Human-readable output by default, the API's
//! JSON with `--json`; exit codes ([`ErrorCode::exit_code`]) tell not found,
//! conflict and lease lost apart from other errors.
//!
//! The ledger's URL is found as every command finds it
//! ([`DatabaseUrl::resolve`]: `--database-url`, `LEASEGATE_DATABASE_URL`,
//! `database_url` of `--config`, the default). With `--config`, the commands
//! act for that config's tenant, as its `leasegate serve` would. A ledger
//! that cannot be opened is told apart ([`ledger_refusal`]): unreachable,
//! login refused, database missing, schema missing, each with its fix and
//! exit code.

use axum::body::Body as HttpBody;
use axum::http::{Method, Request, StatusCode};
use serde_json::{Value, json};
use tower::ServiceExt;

use super::error::{ErrorCode, exit};
use crate::config::{Config, DATABASE_URL_HELP, DatabaseUrl};
use crate::intent::IntegerPolicy;
use crate::ledger::{ConnectError, ConnectFailure, Ledger, LedgerError, LedgerOptions};

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

impl TokensArgs {
    /// Runs the command; returns the process exit code.
    pub async fn run(&self) -> u8 {
        use crate::auth::{IssuedToken, Scope};
        use crate::ledger::{NewToken, TokenCreateOutcome, TokenRevokeOutcome};
        let common = &self.common;
        let (database, tenant) = match &common.config {
            Some(path) => match Config::load(path) {
                Ok(mut config) => {
                    config.resolve_database_url(common.database_url.as_deref());
                    (config.database(), Some(config.tenant))
                }
                Err(error) => {
                    return report(common.json, ErrorCode::InvalidInput, &error.to_string());
                }
            },
            None => (
                DatabaseUrl::from_environment(common.database_url.as_deref(), None),
                None,
            ),
        };
        // Refuse bad arguments before connecting.
        let mut expires_in_ms = None;
        if let TokensCommand::Create {
            scope, expires_in, ..
        } = &self.command
        {
            if Scope::parse(scope).is_none() {
                return report(
                    common.json,
                    ErrorCode::InvalidInput,
                    &format!("--scope {scope:?} is not one of agent, operator, admin"),
                );
            }
            if let Some(text) = expires_in {
                match humantime::parse_duration(text) {
                    Ok(duration) if !duration.is_zero() => {
                        expires_in_ms =
                            Some(i64::try_from(duration.as_millis()).unwrap_or(i64::MAX));
                    }
                    _ => {
                        return report(
                            common.json,
                            ErrorCode::InvalidInput,
                            &format!(
                                "--expires-in {text:?} is not a duration like \"30d\" or \"12h\""
                            ),
                        );
                    }
                }
            }
        }
        let options = LedgerOptions {
            max_connections: 2,
            session_role: Some(crate::ledger::OPERATOR_ROLE.to_owned()),
            ..Default::default()
        };
        let ledger = match Ledger::connect(&database.url, options).await {
            Ok(ledger) => ledger,
            Err(error) => {
                let (code, message) = ledger_refusal(&error, &database);
                let hint = if error.connect_failure().is_none() {
                    format!(
                        "{message} (token commands run as the database role {}: the login role \
                         must be allowed to SET ROLE to it)",
                        crate::ledger::OPERATOR_ROLE
                    )
                } else {
                    message
                };
                return report(common.json, code, &hint);
            }
        };
        let answer = match &self.command {
            TokensCommand::Create {
                tenant: asked,
                scope,
                name,
                by,
                ..
            } => {
                let tenant = asked
                    .clone()
                    .or(tenant)
                    .unwrap_or_else(|| "default".to_owned());
                // A random id colliding is astronomically unlikely; retry anyway.
                let mut created = None;
                for _ in 0..3 {
                    let issued = match IssuedToken::mint() {
                        Ok(issued) => issued,
                        Err(error) => {
                            ledger.close().await;
                            return report(
                                common.json,
                                ErrorCode::LedgerUnavailable,
                                &format!("no random bytes from the operating system: {error}"),
                            );
                        }
                    };
                    let outcome = ledger
                        .access_token_create(NewToken {
                            token_id: &issued.token_id,
                            secret_hash: &issued.secret_hash(),
                            tenant: &tenant,
                            scope,
                            name: name.as_deref(),
                            created_by: by,
                            expires_in_ms,
                        })
                        .await;
                    match outcome {
                        Ok(TokenCreateOutcome::IdTaken) => continue,
                        Ok(TokenCreateOutcome::Created {
                            created_at,
                            expires_at,
                        }) => {
                            created = Some(Ok(json!({
                                "token": issued.reveal(), "token_id": issued.token_id,
                                "tenant_id": tenant, "scope": scope, "name": name,
                                "created_at": created_at, "expires_at": expires_at,
                            })));
                            break;
                        }
                        Err(error) => {
                            created = Some(Err(error));
                            break;
                        }
                    }
                }
                created.unwrap_or_else(|| {
                    Err(crate::ledger::LedgerError::Protocol {
                        call: "access_token_create",
                        detail: "three random token ids were taken".into(),
                    })
                })
            }
            TokensCommand::List { tenant: asked } => ledger
                .access_tokens_list(asked.as_deref().or(tenant.as_deref()))
                .await
                .map(|tokens| json!({ "tokens": tokens })),
            TokensCommand::Revoke { token_id, by } => {
                let id = token_id
                    .strip_prefix(crate::auth::TOKEN_PREFIX)
                    .unwrap_or(token_id);
                // A whole token pasted: its id is the part before the secret.
                let id = id.split('_').next().unwrap_or(id);
                match ledger.access_token_revoke(id, by).await {
                    Ok(TokenRevokeOutcome::NotFound) => {
                        ledger.close().await;
                        return report(
                            common.json,
                            ErrorCode::NotFound,
                            &format!("token {id} not found"),
                        );
                    }
                    Ok(outcome) => Ok(json!({
                        "token_id": id, "revoked": true,
                        "already_revoked": outcome == TokenRevokeOutcome::AlreadyRevoked,
                    })),
                    Err(error) => Err(error),
                }
            }
        };
        ledger.close().await;
        let answer = match answer {
            Ok(answer) => answer,
            Err(error) => {
                let error = super::ApiError::from(error);
                return report(common.json, error.code(), &error.message);
            }
        };
        if common.json {
            println!("{answer}");
            return exit::OK;
        }
        match &self.command {
            TokensCommand::Create { .. } => {
                println!("{}", answer["token"].as_str().unwrap_or_default());
                eprintln!(
                    "leasegate: token {} for tenant {} with scope {} (expires: {}). It is shown \
                     only now: store it; send it as `Authorization: Bearer <token>`",
                    text(&answer["token_id"]),
                    text(&answer["tenant_id"]),
                    text(&answer["scope"]),
                    answer["expires_at"].as_str().unwrap_or("never"),
                );
            }
            TokensCommand::List { .. } => {
                let rows: Vec<Vec<String>> = answer["tokens"]
                    .as_array()
                    .map(|tokens| {
                        tokens
                            .iter()
                            .map(|t| {
                                [
                                    "token_id",
                                    "tenant_id",
                                    "scope",
                                    "name",
                                    "created_at",
                                    "expires_at",
                                    "revoked_at",
                                ]
                                .iter()
                                .map(|k| text(&t[*k]))
                                .collect()
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                println!(
                    "{}",
                    table(
                        &[
                            "ID", "TENANT", "SCOPE", "NAME", "CREATED", "EXPIRES", "REVOKED"
                        ],
                        &rows
                    )
                );
            }
            TokensCommand::Revoke { .. } => {
                if answer["already_revoked"] == json!(true) {
                    println!("token {} was already revoked", text(&answer["token_id"]));
                } else {
                    println!("token {} revoked", text(&answer["token_id"]));
                }
            }
        }
        exit::OK
    }
}

/// One control API request: method, path (with query) and JSON body.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiRequest {
    pub method: Method,
    pub path: String,
    pub body: Option<Value>,
}

impl ApiRequest {
    fn get(path: String) -> Self {
        Self {
            method: Method::GET,
            path,
            body: None,
        }
    }

    fn post(path: String, body: Value) -> Self {
        Self {
            method: Method::POST,
            path,
            body: Some(body),
        }
    }
}

impl OperatorCommand {
    fn common(&self) -> &Common {
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

    /// The control API request this command makes.
    pub fn request(&self) -> ApiRequest {
        match self {
            OperatorCommand::Runs { command, .. } => match command {
                RunsCommand::Create {
                    task,
                    tenant,
                    run_id,
                    owner,
                    ttl_ms,
                } => ApiRequest::post(
                    "/v1/runs".to_owned(),
                    json!({"task_id": task, "tenant_id": tenant, "run_id": run_id, "owner": owner, "ttl_ms": ttl_ms}),
                ),
                RunsCommand::Show { run_id } => {
                    ApiRequest::get(format!("/v1/runs/{}", url_segment(run_id)))
                }
                RunsCommand::Cancel {
                    run_id,
                    reason,
                    actor,
                } => ApiRequest::post(
                    format!("/v1/runs/{}/cancel", url_segment(run_id)),
                    json!({"actor": actor, "reason": reason}),
                ),
            },
            OperatorCommand::Lease { command, .. } => match command {
                LeaseCommand::Acquire {
                    run_id,
                    ttl_ms,
                    owner,
                } => ApiRequest::post(
                    format!("/v1/runs/{}/lease", url_segment(run_id)),
                    json!({"owner": owner, "ttl_ms": ttl_ms}),
                ),
                LeaseCommand::Renew {
                    run_id,
                    owner,
                    epoch,
                    lease_token,
                    ttl_ms,
                } => ApiRequest::post(
                    format!("/v1/runs/{}/lease/renew", url_segment(run_id)),
                    json!({"owner": owner, "epoch": epoch, "lease_token": lease_token, "ttl_ms": ttl_ms}),
                ),
                LeaseCommand::Release {
                    run_id,
                    owner,
                    epoch,
                    lease_token,
                } => ApiRequest::post(
                    format!("/v1/runs/{}/lease/release", url_segment(run_id)),
                    json!({"owner": owner, "epoch": epoch, "lease_token": lease_token}),
                ),
            },
            OperatorCommand::Ops { command, .. } => match command {
                OpsCommand::Show { operation_id } => {
                    ApiRequest::get(format!("/v1/operations/{}", url_segment(operation_id)))
                }
                OpsCommand::List { run, status } => {
                    let query = status
                        .as_ref()
                        .map(|s| format!("?status={}", url_segment(s)))
                        .unwrap_or_default();
                    ApiRequest::get(format!("/v1/runs/{}/operations{query}", url_segment(run)))
                }
                OpsCommand::Unknown => ApiRequest::get("/v1/operations/unknown".to_owned()),
                OpsCommand::Resolve {
                    operation_id,
                    succeeded,
                    note,
                    remote_id,
                    actor,
                    ..
                } => ApiRequest::post(
                    format!("/v1/operations/{}/resolve", url_segment(operation_id)),
                    json!({"outcome": if *succeeded { "succeeded" } else { "failed_final" },
                            "note": note, "remote_id": remote_id, "actor": actor}),
                ),
                OpsCommand::Retry {
                    operation_id,
                    note,
                    actor,
                } => ApiRequest::post(
                    format!("/v1/operations/{}/retry", url_segment(operation_id)),
                    json!({"note": note, "actor": actor}),
                ),
                OpsCommand::Failovers { unresolved } => ApiRequest::get(format!(
                    "/v1/failovers{}",
                    if *unresolved { "?unresolved=true" } else { "" }
                )),
                OpsCommand::FailoverResolve {
                    failover_id,
                    reason,
                    by,
                } => ApiRequest::post(
                    format!("/v1/failovers/{}/resolve", url_segment(failover_id)),
                    json!({"by": by, "reason": reason}),
                ),
                // No route: `run` sends it to the ledger directly.
                OpsCommand::Archive { .. } => {
                    ApiRequest::get("/v1/ops-archive-has-no-route".to_owned())
                }
            },
        }
    }

    /// Runs the command against the ledger at `--database-url`: prints the
    /// answer (stdout) or the error (stderr, or stdout with `--json`) and
    /// returns the process exit code.
    pub async fn run(&self) -> u8 {
        let common = self.common();
        if let OperatorCommand::Ops {
            command:
                OpsCommand::Archive {
                    older_than,
                    delete,
                    batch,
                    max_batches,
                },
            ..
        } = self
        {
            return archive(common, older_than, *delete, *batch, *max_batches).await;
        }
        let (database, tenant, bodies) = match &common.config {
            Some(path) => match Config::load(path) {
                Ok(mut config) => {
                    config.resolve_database_url(common.database_url.as_deref());
                    // The policy's keys: sealed bodies are opened for the
                    // reader (`control::operations::readable`).
                    let bodies = config.policy.bodies();
                    (config.database(), Some(config.tenant), bodies)
                }
                Err(error) => {
                    return report(common.json, ErrorCode::InvalidInput, &error.to_string());
                }
            },
            None => (
                DatabaseUrl::from_environment(common.database_url.as_deref(), None),
                None,
                Default::default(),
            ),
        };
        let operator_act = self.is_operator_act();
        let options = LedgerOptions {
            max_connections: 2,
            bodies,
            session_role: Some(
                if operator_act {
                    crate::ledger::OPERATOR_ROLE
                } else {
                    crate::ledger::APP_ROLE
                }
                .to_owned(),
            ),
            ..Default::default()
        };
        let ApiRequest { method, path, body } = self.request();
        let read_only = method == Method::GET;
        let mut connected = Ledger::connect(&database.url, options.clone()).await;
        // A read by a login that is a member of leasegate_operator only (the
        // least-privilege operator's): that role reads every ledger table
        // too, so the read runs as it.
        if read_only
            && !operator_act
            && matches!(
                &connected,
                Err(LedgerError::Connect(ConnectError {
                    failure: ConnectFailure::RoleNotGranted,
                    ..
                }))
            )
        {
            let as_operator = LedgerOptions {
                session_role: Some(crate::ledger::OPERATOR_ROLE.to_owned()),
                ..options
            };
            connected = Ledger::connect(&database.url, as_operator).await;
        }
        let ledger = match connected {
            Ok(ledger) => ledger,
            Err(error) => {
                let (code, message) = ledger_refusal(&error, &database);
                return report(common.json, code, &message);
            }
        };
        let operator = if operator_act {
            super::OperatorLedger::Ready(ledger.clone())
        } else {
            super::OperatorLedger::Unavailable("not an operator command".into())
        };
        let (status, answer) = execute(ledger.clone(), operator, tenant, method, &path, body).await;
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
            return exit::OK;
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
        exit_code(code)
    }
}

/// `leasegate ops archive`: batches of `operations_archive` as the operator
/// role until a batch moves no run (or `max_batches`). Prints one line per
/// batch and the totals (`--json`: one object with the totals).
async fn archive(
    common: &Common,
    older_than: &str,
    delete: bool,
    batch: i32,
    max_batches: Option<u64>,
) -> u8 {
    let window_ms = match humantime::parse_duration(older_than) {
        Ok(duration) if !duration.is_zero() => {
            i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
        }
        _ => {
            return report(
                common.json,
                ErrorCode::InvalidInput,
                &format!("--older-than {older_than:?} is not a duration like \"30d\" or \"12h\""),
            );
        }
    };
    if !(1..=crate::ledger::MAX_ARCHIVE_BATCH).contains(&batch) {
        return report(
            common.json,
            ErrorCode::InvalidInput,
            &format!(
                "--batch {batch} is not 1 to {}",
                crate::ledger::MAX_ARCHIVE_BATCH
            ),
        );
    }
    let (database, tenant) = match &common.config {
        Some(path) => match Config::load(path) {
            Ok(mut config) => {
                config.resolve_database_url(common.database_url.as_deref());
                (config.database(), Some(config.tenant))
            }
            Err(error) => return report(common.json, ErrorCode::InvalidInput, &error.to_string()),
        },
        None => (
            DatabaseUrl::from_environment(common.database_url.as_deref(), None),
            None,
        ),
    };
    let options = LedgerOptions {
        max_connections: 1,
        session_role: Some(crate::ledger::OPERATOR_ROLE.to_owned()),
        ..Default::default()
    };
    let ledger = match Ledger::connect(&database.url, options).await {
        Ok(ledger) => ledger,
        Err(error) => {
            let (code, message) = ledger_refusal(&error, &database);
            return report(common.json, code, &message);
        }
    };
    let mut total = crate::ledger::ArchiveBatch::default();
    let mut batches = 0u64;
    let outcome = loop {
        if max_batches.is_some_and(|max| batches >= max) {
            break Ok(());
        }
        // If we crash here, the batches so far are committed; a batch in
        // flight is wholly moved or untouched (one transaction).
        match ledger
            .operations_archive(window_ms, batch, delete, tenant.as_deref())
            .await
        {
            Ok(moved) if moved.runs == 0 => break Ok(()),
            Ok(moved) => {
                batches += 1;
                total.runs += moved.runs;
                total.operations += moved.operations;
                total.evidence += moved.evidence;
                total.events += moved.events;
                if !common.json {
                    println!(
                        "batch {batches}: {} runs, {} operations, {} evidence, {} events {}",
                        moved.runs,
                        moved.operations,
                        moved.evidence,
                        moved.events,
                        if delete { "deleted" } else { "archived" }
                    );
                }
            }
            Err(error) => break Err(error),
        }
    };
    ledger.close().await;
    if let Err(error) = outcome {
        let api = super::error::ApiError::from(error);
        return report(
            common.json,
            api.code(),
            &format!("archive stopped after {batches} batches: {}", api.message),
        );
    }
    if common.json {
        println!(
            "{}",
            json!({"batches": batches, "deleted": delete, "runs": total.runs, "operations": total.operations,
                   "evidence": total.evidence, "events": total.events})
        );
    } else {
        println!(
            "{} runs, {} operations, {} evidence, {} events {} in {batches} batches (older than {older_than})",
            total.runs,
            total.operations,
            total.evidence,
            total.events,
            if delete { "deleted" } else { "archived" }
        );
    }
    exit::OK
}

/// Prints an error the CLI found before any request (stderr, or the API's
/// error JSON on stdout with `--json`); returns its exit code.
fn report(json: bool, code: ErrorCode, message: &str) -> u8 {
    if json {
        println!("{}", json!({"code": code.as_str(), "message": message}));
    } else {
        eprintln!("leasegate: {message} ({code})");
    }
    code.exit_code()
}

/// What to tell an operator when the ledger at `database` cannot be
/// opened: the error code (and so the exit code) and a message that says
/// which URL was tried, where it came from, and what fixes it.
pub fn ledger_refusal(error: &LedgerError, database: &DatabaseUrl) -> (ErrorCode, String) {
    let Some(connect) = error.connect_failure() else {
        return (
            ErrorCode::LedgerUnavailable,
            format!("the ledger database is unavailable: {error}"),
        );
    };
    let source = &database.source;
    let target = &connect.target;
    let fix = match connect.failure {
        ConnectFailure::InvalidUrl => format!(
            "the URL came from {source}; write it as postgres://user[:password]@host:port/database"
        ),
        ConnectFailure::Unreachable => format!(
            "the URL came from {source}. Start PostgreSQL there (e.g. `sudo systemctl start \
             postgresql`, or `pg_ctlcluster <version> main start`), or point --database-url (or \
             LEASEGATE_DATABASE_URL, or database_url in --config) at a server that runs"
        ),
        ConnectFailure::AuthenticationFailed => format!(
            "the URL came from {source}. Check the user and password in it, or the server's \
             pg_hba.conf"
        ),
        ConnectFailure::DatabaseMissing => format!(
            "the database does not exist; the URL came from {source}. `leasegate migrate \
             --database-url {target}` creates the database and the ledger in it"
        ),
        ConnectFailure::SchemaMissing => format!(
            "the URL came from {source}. Run `leasegate migrate --database-url {target}` to \
             create the ledger there, or point --database-url at the database that holds it"
        ),
        ConnectFailure::RoleNotGranted => format!(
            "the URL came from {source}. Operator acts (ops resolve, ops retry, ops \
             failover-resolve, runs cancel, tokens, secrets rotate) run as the database role \
             leasegate_operator, every other command as leasegate_app (docs/operating.md)"
        ),
    };
    (
        ErrorCode::from(connect.failure),
        format!("{connect}; {fix}"),
    )
}

/// The exit code for an API error code string (1 for a code this build
/// does not know).
pub fn exit_code(code: &str) -> u8 {
    ErrorCode::parse(code).map_or(exit::OTHER, ErrorCode::exit_code)
}

/// Percent-encodes a path segment (ids are UUIDs, but operators paste anything).
pub fn url_segment(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            other => format!("%{other:02X}"),
        })
        .collect()
}

/// Sends one request to the control API in-process (for runs of `tenant`
/// only, when given); returns status and JSON.
pub async fn execute(
    ledger: Ledger,
    operator: super::OperatorLedger,
    tenant: Option<String>,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let router = super::router_with_tools(ledger, operator, IntegerPolicy::Reject, tenant, None);
    let request = Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json")
        .body(match body {
            Some(body) => HttpBody::from(body.to_string()),
            None => HttpBody::empty(),
        })
        .expect("a valid request");
    let response = match router.oneshot(request).await {
        Ok(response) => response,
        Err(never) => match never {},
    };
    let status = response.status();
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap_or_default();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

fn text(value: &Value) -> String {
    match value {
        Value::Null => "-".to_owned(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let widths: Vec<usize> = headers
        .iter()
        .enumerate()
        .map(|(i, h)| {
            rows.iter()
                .map(|r| r[i].chars().count())
                .chain([h.len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |cells: Vec<String>| {
        cells
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c:<width$}", width = widths[i]))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_owned()
    };
    let mut out = vec![line(headers.iter().map(|h| h.to_string()).collect())];
    out.extend(rows.iter().map(|r| line(r.clone())));
    out.join("\n")
}

/// Human-readable rendering of an API answer.
pub fn render(value: &Value) -> String {
    if let Some(operations) = value.get("operations").and_then(Value::as_array) {
        let rows: Vec<Vec<String>> = operations
            .iter()
            .map(|op| {
                [
                    "operation_id",
                    "status",
                    "tool_name",
                    "step_id",
                    "effect_version",
                    "remote_id",
                ]
                .iter()
                .map(|k| text(&op[*k]))
                .collect()
            })
            .collect();
        return table(
            &["OPERATION", "STATUS", "TOOL", "STEP", "V", "REMOTE ID"],
            &rows,
        );
    }
    if let Some(operation) = value.get("operation") {
        let mut out = Vec::new();
        for key in [
            "operation_id",
            "status",
            "tool_name",
            "step_id",
            "effect_version",
            "run_id",
            "request_digest",
            "remote_id",
            "dispatch_owner",
            "dispatch_until",
            "dispatch_count",
        ] {
            out.push(format!("{key:<16} {}", text(&operation[key])));
        }
        out.push(format!("{:<16} {}", "result", text(&operation["result"])));
        out.push(format!(
            "{:<16} {}",
            "request",
            text(&value["request_body"])
        ));
        out.push(String::new());
        out.push("history:".to_owned());
        let rows: Vec<Vec<String>> = value["events"]
            .as_array()
            .map(|events| {
                events
                    .iter()
                    .map(|e| {
                        vec![
                            text(&e["at"]),
                            format!("{} -> {}", text(&e["from_status"]), text(&e["to_status"])),
                            format!("{} {}", text(&e["actor_kind"]), text(&e["actor"])),
                            text(&e["detail"]),
                        ]
                    })
                    .collect()
            })
            .unwrap_or_default();
        out.push(table(&["AT", "CHANGE", "BY", "DETAIL"], &rows));
        let evidence = value["evidence"].as_array().cloned().unwrap_or_default();
        if !evidence.is_empty() {
            out.push(String::new());
            out.push("evidence:".to_owned());
            let rows: Vec<Vec<String>> = evidence
                .iter()
                .map(|e| {
                    vec![
                        text(&e["at"]),
                        text(&e["kind"]),
                        text(&e["source"]),
                        text(&e["outcome"]),
                        text(&e["remote_id"]),
                    ]
                })
                .collect();
            out.push(table(
                &["AT", "KIND", "SOURCE", "OUTCOME", "REMOTE ID"],
                &rows,
            ));
        }
        return out.join("\n");
    }
    match value {
        Value::Object(map) => map
            .iter()
            .map(|(k, v)| format!("{k:<16} {}", text(v)))
            .collect::<Vec<_>>()
            .join("\n"),
        other => text(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A refused login cannot be provoked against the test server (its
    /// pg_hba.conf trusts 127.0.0.1), so its SQLSTATEs are checked here.
    #[test]
    fn each_connect_failure_has_its_code_exit_code_and_fix() {
        use crate::config::DatabaseUrlSource;
        use crate::ledger::ConnectError;
        let database = DatabaseUrl {
            url: "postgres://app:secret@db:5432/leasegate".into(),
            source: DatabaseUrlSource::Env,
        };
        let refusal = |failure| {
            ledger_refusal(
                &LedgerError::Connect(ConnectError {
                    failure,
                    target: crate::ledger::redacted_url(&database.url),
                    detail: "detail".into(),
                }),
                &database,
            )
        };
        for (sqlstate, failure, code, exit, needles) in [
            (
                "28P01",
                ConnectFailure::AuthenticationFailed,
                "database_auth_failed",
                7,
                &[
                    "PostgreSQL refused the login at postgres://app@db:5432/leasegate: detail",
                    "Check the user and password",
                ][..],
            ),
            (
                "28000",
                ConnectFailure::AuthenticationFailed,
                "database_auth_failed",
                7,
                &["refused the login"][..],
            ),
            (
                "3D000",
                ConnectFailure::DatabaseMissing,
                "database_missing",
                8,
                &[
                    "does not exist",
                    "`leasegate migrate --database-url postgres://app@db:5432/leasegate` creates",
                    "the database does not exist",
                ][..],
            ),
            (
                "57P03",
                ConnectFailure::Unreachable,
                "ledger_unavailable",
                6,
                &["no PostgreSQL server answers", "Start PostgreSQL"][..],
            ),
        ] {
            assert_eq!(
                ConnectFailure::of_sqlstate(sqlstate),
                Some(failure),
                "{sqlstate}"
            );
            let (error_code, message) = refusal(failure);
            assert_eq!((error_code.as_str(), error_code.exit_code()), (code, exit));
            assert!(
                message.contains("the URL came from LEASEGATE_DATABASE_URL"),
                "{message}"
            );
            assert!(!message.contains("secret"), "{message}");
            for needle in needles {
                assert!(
                    message.contains(needle),
                    "{needle:?} missing from {message}"
                );
            }
        }
        assert_eq!(ConnectFailure::of_sqlstate("42P01"), None);
        let (code, message) = refusal(ConnectFailure::SchemaMissing);
        assert_eq!((code.as_str(), code.exit_code()), ("schema_missing", 9));
        assert!(message.contains("holds no leasegate ledger"), "{message}");
        let (code, _) = refusal(ConnectFailure::InvalidUrl);
        assert_eq!(code.exit_code(), exit::INVALID_INPUT);
    }

    #[test]
    fn passwords_are_redacted_from_urls() {
        use crate::ledger::redacted_url;
        assert_eq!(
            redacted_url("postgres://u:p@ss@h:1/d?sslmode=require"),
            "postgres://u@h:1/d?sslmode=require"
        );
        assert_eq!(redacted_url("postgres://u@h/d"), "postgres://u@h/d");
        assert_eq!(redacted_url("garbage"), "garbage");
    }

    #[test]
    fn path_segments_are_percent_encoded() {
        assert_eq!(url_segment("a b/c?d"), "a%20b%2Fc%3Fd");
        assert_eq!(url_segment("0192-abc_~.x"), "0192-abc_~.x");
    }
}
