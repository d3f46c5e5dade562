//! The main configuration file (`leasegate.toml`) and the loading of the
//! adapter and policy files it points to.
//!
//! ```toml
//! database_url = "postgres://postgres@127.0.0.1:5432/leasegate"
//! tenant = "default"
//! listen = "127.0.0.1:8640"       # MCP front: http://<listen>/mcp
//! adapters = "adapters"           # directory, relative to this file
//! policy = "policies/default.toml"
//!
//! [upstreams.payments]
//! transport = "stdio"
//! command = "leasegate-example-tools"
//! args = ["--tools", "payments"]
//!
//! [upstreams.mailer]
//! transport = "streamable_http"
//! url = "http://127.0.0.1:9000/mcp"
//! ```
//!
//! # Stdio commands
//!
//! A stdio upstream's `command` is resolved when the file is loaded:
//!
//! 1. with a `/` in it, it is a path, relative to this file's directory
//!    (`"./bin/tools"`, `"../tools/server"`) unless absolute;
//! 2. a bare name is looked up first in the directory of the running
//!    `leasegate` executable — so tools installed or built beside it
//!    (`target/release/leasegate-example-tools`) are found without a PATH
//!    change — and otherwise on `PATH` when the child is spawned.
//!
//! Every error names its file and field.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::adapter::{Adapter, RawAdapter};
use crate::policy::{Policy, RawPolicy};

pub mod init;
pub mod limits;
pub mod telemetry;

pub use limits::{Limits, RateLimit, RawLimits};
pub use telemetry::RawTelemetry;

#[derive(Debug, thiserror::Error)]
#[error("{}: {message}", file.display())]
pub struct ConfigError {
    pub file: PathBuf,
    pub message: String,
    /// What kind of problem (`leasegate check-config`'s exit code).
    pub problem: Problem,
}

/// What is wrong with a configuration, each with its own `leasegate
/// check-config` exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Problem {
    /// The file cannot be read or parsed, or a field has a bad value (exit 1).
    Invalid,
    /// A stdio upstream's command is not found or not executable (exit 12).
    Command,
    /// `database_url` is not a PostgreSQL URL (exit 13).
    DatabaseUrl,
    /// Timeouts out of order: a claim shorter than the call it covers
    /// (exit 14).
    Timeouts,
}

impl Problem {
    /// `leasegate check-config`'s exit code for it (docs/operating.md).
    pub fn exit_code(self) -> u8 {
        match self {
            Problem::Invalid => 1,
            Problem::Command => 12,
            Problem::DatabaseUrl => 13,
            Problem::Timeouts => 14,
        }
    }
}

impl ConfigError {
    fn new(file: &Path, message: impl Into<String>) -> Self {
        Self {
            file: file.to_owned(),
            message: message.into(),
            problem: Problem::Invalid,
        }
    }

    fn of(problem: Problem, file: &Path, message: impl Into<String>) -> Self {
        Self {
            problem,
            ..Self::new(file, message)
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    pub database_url: Option<String>,
    /// Ledger connections of this process (default 20).
    pub database_max_connections: Option<u32>,
    /// Longest a ledger statement may run, lock waits included (default
    /// "10s"); a settle that hits it answers the agent "unknown".
    pub database_statement_timeout: Option<String>,
    /// How long `serve`/`stdio` wait at start for the database to answer
    /// (default "15s"): a server that never answers is reported and the
    /// process exits 6 instead of hanging.
    pub database_connect_timeout: Option<String>,
    /// Group commit of gated calls (default false; `LEASEGATE_GROUP_COMMIT`
    /// overrides): concurrent register-claims, and settles, of different
    /// runs share one statement and commit (docs/operating.md).
    pub group_commit: Option<bool>,
    /// How long a batch waits for more calls once its first arrived
    /// while another is in flight (default "0": none; at most "50ms").
    pub group_commit_window: Option<String>,
    /// Most calls in one batch (default 64, 1 to 64).
    pub group_commit_max_batch: Option<u32>,
    /// Batches of one kind in flight at once (1–8, default 1).
    pub group_commit_in_flight: Option<u32>,
    /// Worker threads of the async runtime (default: half the cores this
    /// process may use, at least 1; 1 to 1024). Read when the process
    /// starts, ahead of the rest of the file ([`read_ahead_worker_threads`]).
    pub worker_threads: Option<u32>,
    /// The login the operator routes of the control API (resolve, retry,
    /// cancel, failover resolve) use, as the database role
    /// `leasegate_operator`. Default: `database_url`'s login, which must
    /// then be a member of both roles (docs/operating.md).
    pub database_operator_url: Option<String>,
    pub tenant: Option<String>,
    pub listen: Option<String>,
    /// Control HTTP API address ("off" to disable).
    pub control_listen: Option<String>,
    pub adapters: Option<String>,
    pub policy: Option<String>,
    pub namespace_separator: Option<String>,
    /// Upstreams whose tools keep their own names (no `<upstream><sep>` prefix).
    #[serde(default)]
    pub unprefixed: Vec<String>,
    /// Tools per `tools/list` page served to agents (default 50).
    pub tools_page_size: Option<usize>,
    /// Apply the ledger migrations at start (default true).
    pub migrate: Option<bool>,
    /// MCP sessions over HTTP (`Mcp-Session-Id`). Off by default: every
    /// request stands alone, so several leasegate processes can serve one
    /// agent without sticky sessions.
    pub http_sessions: Option<bool>,
    /// How a side-effecting call without a lease gets one: "explicit"
    /// (default: the agent sends run, owner and epoch), "session"
    /// (leasegate holds a lease per task key; `[session]`) or "key" (a
    /// per-call idempotency key; `[idempotency]`).
    pub lease_mode: Option<String>,
    /// `Host` values both listeners serve (default: localhost, 127.0.0.1,
    /// ::1, and a listen address that is neither loopback nor unspecified).
    pub allowed_hosts: Option<Vec<String>>,
    /// `Origin` values a browser page may call from (default: http on
    /// localhost, 127.0.0.1, [::1], any port). Requests without `Origin` pass.
    pub allowed_origins: Option<Vec<String>>,
    pub session: Option<RawSession>,
    pub idempotency: Option<RawIdempotency>,
    pub auth: Option<RawAuth>,
    /// `[limits]`: timeouts, connections, sessions, rate limits, log
    /// field size (`config::limits`).
    pub limits: Option<RawLimits>,
    /// `[telemetry]`: OpenTelemetry traces over OTLP (`config::telemetry`),
    /// off by default.
    pub telemetry: Option<RawTelemetry>,
    #[serde(default)]
    pub upstreams: BTreeMap<String, RawUpstream>,
}

/// `[auth]`: bearer tokens on both listeners (`crate::auth`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAuth {
    /// "auto" (default: required as soon as a listener is not loopback),
    /// "required" or "off" (refused with a listener that is not loopback).
    pub mode: Option<String>,
    /// The URL agents reach the MCP front at, as the protected-resource
    /// metadata names it (default: `http://<Host of the request>/mcp`);
    /// set it behind a TLS-terminating proxy.
    pub resource_url: Option<String>,
    /// JWTs from an identity provider, besides leasegate's own tokens.
    pub jwt: Option<RawJwt>,
    /// How long a positive verification of a leasegate token may be reused
    /// without asking the ledger ("0s", the default: never; every request
    /// reads the ledger). Also the longest a revocation may take to reach
    /// this process.
    pub token_cache_ttl: Option<String>,
}

/// `[auth.jwt]`: JWT validation (issuer, audience, keys from a JWKS file).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawJwt {
    /// The `iss` a token must carry.
    pub issuer: String,
    /// The `aud` a token must carry (this leasegate's resource identifier).
    pub audience: String,
    /// The issuer's public keys (JWKS JSON), relative to this file.
    pub jwks_file: String,
    /// The claim naming the tenant (default "tenant").
    pub tenant_claim: Option<String>,
    /// The claim holding the scopes (default "scope": space-separated, or an
    /// array); the highest of agent, operator, admin counts.
    pub scope_claim: Option<String>,
}

/// `[auth.jwt]`, validated, with its key set read.
#[derive(Debug, Clone)]
pub struct JwtConfig {
    pub issuer: String,
    pub audience: String,
    pub jwks_file: PathBuf,
    /// The JWKS document as read at load.
    pub jwks: String,
    pub tenant_claim: String,
    pub scope_claim: String,
}

/// `[auth] mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthMode {
    /// Required whenever a listener is not loopback-only.
    Auto,
    Required,
    Off,
}

/// `[session]`: the session lease mode's settings.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSession {
    /// The task key when neither `leasegate stdio --task` nor
    /// `LEASEGATE_TASK` gives one.
    pub task: Option<String>,
    /// The session lease's ttl (default "30s"), renewed every third of it.
    pub ttl: Option<String>,
}

/// `[idempotency]`: the key lease mode's settings.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawIdempotency {
    /// How long a key stands for its first request (default "24h"); after
    /// that the same key is a new request.
    pub retention: Option<String>,
}

/// How a side-effecting call without a lease of its own gets one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseMode {
    /// The agent sends run, owner and epoch with every call.
    Explicit,
    /// leasegate holds the lease of a task's run for the life of the
    /// session (`worker::session`).
    Session,
    /// A per-call idempotency key stands for the call
    /// (`worker::session::key_lease`).
    Key,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(tag = "transport", rename_all = "snake_case", deny_unknown_fields)]
pub enum RawUpstream {
    Stdio {
        command: String,
        #[serde(default)]
        args: Vec<String>,
        #[serde(default)]
        env: BTreeMap<String, String>,
    },
    StreamableHttp {
        url: String,
    },
}

/// How to reach one upstream tool server.
#[derive(Debug, Clone, PartialEq)]
pub enum UpstreamTransport {
    Stdio {
        command: PathBuf,
        args: Vec<String>,
        env: BTreeMap<String, String>,
    },
    StreamableHttp {
        url: String,
    },
}

/// A validated configuration with its adapters and policy loaded.
#[derive(Debug, Clone)]
pub struct Config {
    /// Resolved with [`DatabaseUrl::resolve`]: as loaded, the file's value
    /// or the default; [`Config::resolve_database_url`] applies the flag and
    /// the environment.
    pub database_url: String,
    pub database_url_source: DatabaseUrlSource,
    /// `None`: not set in the file; [`Config::database_connections`] says
    /// how many then.
    pub database_max_connections: Option<u32>,
    pub database_statement_timeout: std::time::Duration,
    /// How long start-up waits for the database to answer.
    pub database_connect_timeout: std::time::Duration,
    /// `group_commit` (after `LEASEGATE_GROUP_COMMIT`) with its window and
    /// batch size; `None`: each gated call is its own statements.
    pub group_commit: Option<crate::ledger::GroupCommitSettings>,
    /// `database_operator_url`: the operator routes' login (`None`: the
    /// ledger's URL, `SET ROLE leasegate_operator`).
    pub database_operator_url: Option<String>,
    pub tenant: String,
    pub listen: SocketAddr,
    /// `None`: the control API is off.
    pub control_listen: Option<SocketAddr>,
    pub namespace_separator: String,
    pub unprefixed: Vec<String>,
    pub tools_page_size: usize,
    pub migrate: bool,
    pub http_sessions: bool,
    pub lease_mode: LeaseMode,
    /// `Host` values both listeners serve (`control::guard`).
    pub allowed_hosts: Vec<String>,
    /// `Origin` values allowed on both listeners (`control::guard`).
    pub allowed_origins: Vec<String>,
    /// Session mode: the configured task key (the CLI flag and the
    /// environment override it).
    pub session_task: Option<String>,
    /// Session mode: the lease ttl, renewed every third of it.
    pub session_ttl: std::time::Duration,
    /// Key mode: how long a key stands for its first request.
    pub key_retention: std::time::Duration,
    /// `[auth] mode`; [`Config::auth_required`] resolves `auto`.
    pub auth_mode: AuthMode,
    /// `[auth] resource_url`.
    pub auth_resource_url: Option<String>,
    /// `[auth] token_cache_ttl`: zero turns the verification cache off.
    pub auth_token_cache_ttl: std::time::Duration,
    /// `[auth.jwt]`.
    pub auth_jwt: Option<JwtConfig>,
    /// `[limits]`: what one client may hold of this process.
    pub limits: Limits,
    /// `[telemetry]`: where spans are exported, if anywhere.
    pub telemetry: crate::telemetry::Settings,
    pub policy: Policy,
    /// By upstream name.
    pub adapters: BTreeMap<String, Adapter>,
    pub upstreams: BTreeMap<String, UpstreamTransport>,
}

pub const DEFAULT_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/leasegate";
/// The environment variable of the ledger's URL. `DATABASE_URL` is never
/// read: it belongs to the test suite (`.cargo/config.toml`) and to sqlx's
/// tools, and would silently point the CLI at another database.
pub const DATABASE_URL_ENV: &str = "LEASEGATE_DATABASE_URL";
/// Replaces [`DEFAULT_DATABASE_URL`] as the default (the URL's source stays
/// "the default"): for packagers whose PostgreSQL listens elsewhere, and for
/// tests that need a default where nothing answers (the embedded default).
pub const DEFAULT_DATABASE_URL_ENV: &str = "LEASEGATE_DEFAULT_DATABASE_URL";
/// What `--help` says about `--database-url`.
pub const DATABASE_URL_HELP: &str = "PostgreSQL URL of the ledger. Found in this order: \
--database-url, then $LEASEGATE_DATABASE_URL, then database_url in the --config file, then \
postgres://postgres@127.0.0.1:5432/leasegate ($DATABASE_URL is not read)";

/// Where the ledger's URL came from, for messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DatabaseUrlSource {
    Flag,
    Env,
    ConfigFile(PathBuf),
    Default,
    /// The private PostgreSQL cluster leasegate started in this directory
    /// (the embedded default: nothing configured, nothing answering at the
    /// default).
    Private(PathBuf),
}

impl std::fmt::Display for DatabaseUrlSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DatabaseUrlSource::Flag => f.write_str("--database-url"),
            DatabaseUrlSource::Env => f.write_str(DATABASE_URL_ENV),
            DatabaseUrlSource::ConfigFile(path) => {
                write!(f, "database_url in {}", path.display())
            }
            DatabaseUrlSource::Default => f.write_str("the default"),
            DatabaseUrlSource::Private(dir) => {
                write!(f, "the private PostgreSQL at {}", dir.display())
            }
        }
    }
}

/// The ledger's URL and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DatabaseUrl {
    pub url: String,
    pub source: DatabaseUrlSource,
}

impl DatabaseUrl {
    /// The one order every command resolves the ledger's URL in: the
    /// `--database-url` flag, then [`DATABASE_URL_ENV`], then `database_url`
    /// of the config file (`file`: its path and value), then
    /// [`DEFAULT_DATABASE_URL`]. Empty values count as absent.
    pub fn resolve(
        flag: Option<&str>,
        env: Option<&str>,
        file: Option<(&Path, Option<&str>)>,
    ) -> DatabaseUrl {
        let given = |value: Option<&str>| value.filter(|v| !v.trim().is_empty()).map(str::to_owned);
        if let Some(url) = given(flag) {
            return DatabaseUrl {
                url,
                source: DatabaseUrlSource::Flag,
            };
        }
        if let Some(url) = given(env) {
            return DatabaseUrl {
                url,
                source: DatabaseUrlSource::Env,
            };
        }
        if let Some((path, value)) = file
            && let Some(url) = given(value)
        {
            return DatabaseUrl {
                url,
                source: DatabaseUrlSource::ConfigFile(path.to_owned()),
            };
        }
        DatabaseUrl {
            url: DEFAULT_DATABASE_URL.to_owned(),
            source: DatabaseUrlSource::Default,
        }
    }

    /// [`DatabaseUrl::resolve`] with this process's environment, the
    /// default replaced by [`DEFAULT_DATABASE_URL_ENV`] when that is set.
    pub fn from_environment(
        flag: Option<&str>,
        file: Option<(&Path, Option<&str>)>,
    ) -> DatabaseUrl {
        let env = std::env::var(DATABASE_URL_ENV).ok();
        let mut resolved = Self::resolve(flag, env.as_deref(), file);
        if resolved.source == DatabaseUrlSource::Default
            && let Ok(default) = std::env::var(DEFAULT_DATABASE_URL_ENV)
            && !default.trim().is_empty()
        {
            resolved.url = default;
        }
        resolved
    }
}
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8640";
/// Default `database_connect_timeout`.
pub const DEFAULT_DATABASE_CONNECT_TIMEOUT: std::time::Duration =
    std::time::Duration::from_secs(15);
/// What a claim must leave after its call's timeout, for the answer to be
/// settled before the claim lapses (`claim_ttl` and `reconcile_claim_ttl`
/// are at least every side-effecting tool's timeout plus this).
pub const CLAIM_MARGIN: std::time::Duration = std::time::Duration::from_secs(1);
pub const DEFAULT_CONTROL_LISTEN: &str = "127.0.0.1:8641";

fn read(path: &Path) -> Result<String, ConfigError> {
    std::fs::read_to_string(path).map_err(|e| ConfigError::new(path, format!("cannot read: {e}")))
}

fn parse<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, ConfigError> {
    toml::from_str(&read(path)?)
        .map_err(|e| ConfigError::new(path, e.to_string().trim_end().to_owned()))
}

/// Loads and validates one policy file.
/// Its encryption keys are read too: a missing or malformed key is an
/// error here, at startup, never a body stored in plaintext later.
pub fn load_policy(path: &Path) -> Result<Policy, ConfigError> {
    let mut policy = parse::<RawPolicy>(path)?
        .validate()
        .map_err(|e| ConfigError::new(path, e.to_string()))?;
    policy
        .load_keys(path.parent().unwrap_or(Path::new(".")))
        .map_err(|e| ConfigError::new(path, e.to_string()))?;
    Ok(policy)
}

/// Loads and validates one adapter file.
pub fn load_adapter(path: &Path) -> Result<Adapter, ConfigError> {
    parse::<RawAdapter>(path)?
        .validate()
        .map_err(|e| ConfigError::new(path, e.to_string()))
}

/// Every `*.toml` of a directory, sorted by name.
fn toml_files(dir: &Path) -> Result<Vec<PathBuf>, ConfigError> {
    let entries = std::fs::read_dir(dir)
        .map_err(|e| ConfigError::new(dir, format!("cannot read directory: {e}")))?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "toml"))
        .collect();
    files.sort();
    Ok(files)
}

/// `name` in the directory of the running executable, if a file is there.
fn beside_executable(name: &str) -> Option<PathBuf> {
    let candidate = std::env::current_exe().ok()?.parent()?.join(name);
    candidate.is_file().then_some(candidate)
}

/// Where a stdio upstream's `command` is run from (see "Stdio commands" in
/// the module docs): a path (with a `/`) relative to `base`, the directory
/// of the configuration file; a bare name beside the running executable if
/// it is there, else as it is (found on `PATH` when spawned).
pub fn resolve_command(base: &Path, command: &str) -> PathBuf {
    if command.contains('/') {
        base.join(command)
    } else {
        beside_executable(command).unwrap_or_else(|| PathBuf::from(command))
    }
}

impl Config {
    /// Loads `path` and the files it names (relative to its directory).
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let raw: RawConfig = parse(path)?;
        let base = path.parent().unwrap_or(Path::new("."));
        let err = |message: String| ConfigError::new(path, message);

        let listen = raw.listen.as_deref().unwrap_or(DEFAULT_LISTEN);
        let listen: SocketAddr = listen.parse().map_err(|_| {
            err(format!(
                "listen: {listen:?} is not an address like \"127.0.0.1:8640\""
            ))
        })?;
        let control_listen = match raw.control_listen.as_deref().unwrap_or(DEFAULT_CONTROL_LISTEN) {
            "off" => None,
            text => Some(text.parse::<SocketAddr>().map_err(|_| {
                err(format!("control_listen: {text:?} is not an address like \"127.0.0.1:8641\" (or \"off\")"))
            })?),
        };
        let tenant = raw.tenant.clone().unwrap_or_else(|| "default".to_owned());
        crate::ids::check_identifier("tenant", &tenant, crate::ids::MAX_TENANT_LEN)
            .map_err(|e| err(e.to_string()))?;
        let namespace_separator = raw
            .namespace_separator
            .clone()
            .unwrap_or_else(|| "__".to_owned());
        if namespace_separator.is_empty() {
            return Err(err("namespace_separator: must not be empty".into()));
        }
        if raw.upstreams.is_empty() {
            return Err(err("upstreams: at least one upstream is needed".into()));
        }
        let mut upstreams = BTreeMap::new();
        for (name, upstream) in &raw.upstreams {
            if name.is_empty() || name.contains(&namespace_separator) {
                return Err(err(format!(
                    "upstreams.{name}: an upstream name must be non-empty and free of the separator {namespace_separator:?}"
                )));
            }
            let transport = match upstream {
                RawUpstream::Stdio { command, args, env } => {
                    if command.is_empty() {
                        return Err(err(format!("upstreams.{name}.command: must not be empty")));
                    }
                    let command = resolve_command(base, command);
                    UpstreamTransport::Stdio {
                        command,
                        args: args.clone(),
                        env: env.clone(),
                    }
                }
                RawUpstream::StreamableHttp { url } => {
                    if !(url.starts_with("http://") || url.starts_with("https://")) {
                        return Err(err(format!(
                            "upstreams.{name}.url: {url:?} is not an http(s) URL"
                        )));
                    }
                    UpstreamTransport::StreamableHttp { url: url.clone() }
                }
            };
            upstreams.insert(name.clone(), transport);
        }

        if let Some(unknown) = raw
            .unprefixed
            .iter()
            .find(|name| !upstreams.contains_key(*name))
        {
            return Err(err(format!("unprefixed: {unknown:?} is not an upstream")));
        }
        let tools_page_size = raw.tools_page_size.unwrap_or(50);
        if !(1..=1000).contains(&tools_page_size) {
            return Err(err("tools_page_size: must be 1 to 1000".into()));
        }
        let policy_file = raw.policy.as_ref().map(|file| base.join(file));
        let policy = match &policy_file {
            Some(file) => load_policy(file)?,
            None => Policy::default(),
        };
        let mut adapters = BTreeMap::new();
        let mut adapter_files = BTreeMap::new();
        if let Some(dir) = &raw.adapters {
            for file in toml_files(&base.join(dir))? {
                let adapter = load_adapter(&file)?;
                if !upstreams.contains_key(&adapter.upstream) {
                    return Err(ConfigError::new(
                        &file,
                        format!(
                            "upstream: {:?} is not an upstream of {}",
                            adapter.upstream,
                            path.display()
                        ),
                    ));
                }
                if adapters.contains_key(&adapter.upstream) {
                    return Err(ConfigError::new(
                        &file,
                        format!(
                            "upstream: another adapter file already covers {:?}",
                            adapter.upstream
                        ),
                    ));
                }
                // A send may start until its claim lapses: only after that
                // can "not found" mean the request will never arrive.
                if let Some((tool, _)) = adapter.tools.iter().find(|(_, t)| {
                    t.query
                        .as_ref()
                        .and_then(|q| q.resend_after_not_found)
                        .is_some_and(|delay| delay < policy.claim_ttl)
                }) {
                    return Err(ConfigError::new(
                        &file,
                        format!(
                            "tools.{tool}.resend_after_not_found: must be at least the policy's claim_ttl ({:?}): until the claim lapses a first request may still be sent",
                            policy.claim_ttl
                        ),
                    ));
                }
                let stdio = matches!(
                    upstreams.get(&adapter.upstream),
                    Some(UpstreamTransport::Stdio { .. })
                );
                if let Some((tool, _)) = adapter.tools.iter().find(|(_, t)| {
                    stdio && matches!(t.placement, crate::adapter::OperationIdPlacement::Header(_))
                }) {
                    return Err(ConfigError::new(
                        &file,
                        format!(
                            "tools.{tool}.operation_id_header: upstream {:?} runs over stdio, which has no HTTP headers; use operation_id_argument or operation_id_meta",
                            adapter.upstream
                        ),
                    ));
                }
                adapter_files.insert(adapter.upstream.clone(), file.clone());
                adapters.insert(adapter.upstream.clone(), adapter);
            }
        }
        let database_max_connections = raw.database_max_connections;
        if database_max_connections.is_some_and(|n| !(2..=500).contains(&n)) {
            return Err(err("database_max_connections: must be 2 to 500".into()));
        }
        let database_statement_timeout = match &raw.database_statement_timeout {
            Some(text) => crate::policy::parse_duration("database_statement_timeout", text)
                .map_err(|e| err(e.to_string()))?,
            None => std::time::Duration::from_secs(10),
        };
        if database_statement_timeout < std::time::Duration::from_millis(100) {
            return Err(err(
                "database_statement_timeout: must be at least 100ms".into()
            ));
        }
        let group_commit = group_commit_settings(&raw).map_err(err)?;
        // Only checked here: the runtime was built from the read-ahead value.
        worker_threads(raw.worker_threads).map_err(err)?;
        let database_connect_timeout = match &raw.database_connect_timeout {
            Some(text) => crate::policy::parse_duration("database_connect_timeout", text)
                .map_err(|e| err(e.to_string()))?,
            None => DEFAULT_DATABASE_CONNECT_TIMEOUT,
        };
        if !(std::time::Duration::from_secs(1)..=std::time::Duration::from_secs(600))
            .contains(&database_connect_timeout)
        {
            return Err(err("database_connect_timeout: must be 1s to 10m".into()));
        }
        let lease_mode = match raw.lease_mode.as_deref() {
            None | Some("explicit") => LeaseMode::Explicit,
            Some("session") => LeaseMode::Session,
            Some("key") => LeaseMode::Key,
            Some(other) => {
                return Err(err(format!(
                    "lease_mode: {other:?} is not one of \"explicit\", \"session\", \"key\""
                )));
            }
        };
        let timings = Timings {
            config: path,
            policy: &policy,
            policy_file: policy_file.as_deref(),
            lease_mode,
        };
        timings.check(&upstreams, &adapters, &adapter_files)?;
        let key_retention = match raw.idempotency.as_ref().and_then(|i| i.retention.as_ref()) {
            Some(text) => crate::policy::parse_duration("idempotency.retention", text)
                .map_err(|e| err(e.to_string()))?,
            None => std::time::Duration::from_secs(24 * 3600),
        };
        if key_retention < std::time::Duration::from_secs(1) {
            return Err(err("idempotency.retention: must be at least 1s".into()));
        }
        let session = raw.session.clone().unwrap_or_default();
        let session_ttl = match &session.ttl {
            Some(text) => crate::policy::parse_duration("session.ttl", text)
                .map_err(|e| err(e.to_string()))?,
            None => std::time::Duration::from_secs(30),
        };
        if session_ttl < std::time::Duration::from_secs(3) || session_ttl > policy.lease_ttl_ceiling
        {
            return Err(err(format!(
                "session.ttl: must be 3s to the policy's lease_ttl_ceiling ({:?})",
                policy.lease_ttl_ceiling
            )));
        }
        if let Some(task) = &session.task {
            crate::ids::check_identifier("session.task", task, crate::ids::MAX_TASK_LEN)
                .map_err(|e| err(e.to_string()))?;
        }
        if let Some(url) = raw.database_url.as_deref().filter(|u| !u.trim().is_empty())
            && let Some(why) = crate::ledger::url_problem(url)
        {
            return Err(ConfigError::of(
                Problem::DatabaseUrl,
                path,
                format!("database_url: {:?} {why}", crate::ledger::redacted_url(url)),
            ));
        }
        if let Some(url) = &raw.database_operator_url
            && let Some(why) = crate::ledger::url_problem(url)
        {
            return Err(ConfigError::of(
                Problem::DatabaseUrl,
                path,
                format!(
                    "database_operator_url: {:?} {why}",
                    crate::ledger::redacted_url(url)
                ),
            ));
        }
        let database_url =
            DatabaseUrl::resolve(None, None, Some((path, raw.database_url.as_deref())));
        let allowed_hosts = match &raw.allowed_hosts {
            Some(hosts) => hosts.clone(),
            None => {
                let mut hosts: Vec<String> =
                    ["localhost", "127.0.0.1", "::1"].map(String::from).to_vec();
                for address in [Some(listen), control_listen].into_iter().flatten() {
                    let ip = address.ip();
                    if !ip.is_loopback() && !ip.is_unspecified() {
                        hosts.push(ip.to_string());
                    }
                }
                hosts
            }
        };
        if allowed_hosts.iter().any(|h| h.trim().is_empty()) {
            return Err(err("allowed_hosts: entries must not be empty".into()));
        }
        let allowed_origins = match &raw.allowed_origins {
            Some(origins) => origins.clone(),
            None => ["http://localhost:*", "http://127.0.0.1:*", "http://[::1]:*"]
                .map(String::from)
                .to_vec(),
        };
        if let Some(bad) = allowed_origins
            .iter()
            .find(|o| !o.eq_ignore_ascii_case("null") && !o.contains("://"))
        {
            return Err(err(format!(
                "allowed_origins: {bad:?} is not an origin like \"https://console.example.com\""
            )));
        }
        let limits = raw
            .limits
            .clone()
            .unwrap_or_default()
            .validate()
            .map_err(err)?;
        let telemetry = raw
            .telemetry
            .clone()
            .unwrap_or_default()
            .validate()
            .map_err(err)?;
        // A session's idle timer runs while a call is in flight without
        // messages: it must outlast the longest call.
        if let Some(longest) = adapters
            .values()
            .flat_map(|a| std::iter::once(a.timeout).chain(a.tools.values().map(|t| t.timeout)))
            // An upstream without an adapter file calls with the default.
            .chain((upstreams.len() > adapters.len()).then_some(crate::adapter::DEFAULT_TIMEOUT))
            .max()
            && raw.http_sessions == Some(true)
            && limits.session_idle_timeout <= longest
        {
            return Err(err(format!(
                "limits.session_idle_timeout: must exceed the longest tool timeout ({longest:?}): \
                 a session is ended after this long without a message, even during a call"
            )));
        }
        let raw_auth = raw.auth.clone().unwrap_or_default();
        let auth_mode = match raw_auth.mode.as_deref() {
            None | Some("auto") => AuthMode::Auto,
            Some("required") => AuthMode::Required,
            Some("off") => AuthMode::Off,
            Some(other) => {
                return Err(err(format!(
                    "auth.mode: {other:?} is not one of \"auto\", \"required\", \"off\""
                )));
            }
        };
        if let Some(url) = &raw_auth.resource_url
            && !(url.starts_with("http://") || url.starts_with("https://"))
        {
            return Err(err(format!(
                "auth.resource_url: {url:?} is not an http(s) URL"
            )));
        }
        let auth_token_cache_ttl = match &raw_auth.token_cache_ttl {
            None => std::time::Duration::ZERO,
            Some(text) if matches!(text.trim(), "0" | "0s") => std::time::Duration::ZERO,
            Some(text) => crate::policy::parse_duration("auth.token_cache_ttl", text)
                .map_err(|e| err(e.to_string()))?,
        };
        if auth_token_cache_ttl > std::time::Duration::from_secs(60) {
            return Err(err(format!(
                "auth.token_cache_ttl: {} s is above the 60 s bound (it is how long a revoked \
                 token may still be accepted)",
                auth_token_cache_ttl.as_secs()
            )));
        }
        let auth_jwt = match &raw_auth.jwt {
            None => None,
            Some(jwt) => {
                if jwt.issuer.trim().is_empty() || jwt.audience.trim().is_empty() {
                    return Err(err("auth.jwt: issuer and audience must not be empty".into()));
                }
                let jwks_file = base.join(&jwt.jwks_file);
                let jwks = std::fs::read_to_string(&jwks_file).map_err(|e| {
                    err(format!(
                        "auth.jwt.jwks_file: cannot read {}: {e}",
                        jwks_file.display()
                    ))
                })?;
                check_jwks(&jwks).map_err(|e| {
                    err(format!("auth.jwt.jwks_file: {}: {e}", jwks_file.display()))
                })?;
                Some(JwtConfig {
                    issuer: jwt.issuer.clone(),
                    audience: jwt.audience.clone(),
                    jwks_file,
                    jwks,
                    tenant_claim: jwt.tenant_claim.clone().unwrap_or_else(|| "tenant".into()),
                    scope_claim: jwt.scope_claim.clone().unwrap_or_else(|| "scope".into()),
                })
            }
        };
        let config = Config {
            auth_jwt,
            auth_mode,
            auth_resource_url: raw_auth.resource_url.clone(),
            auth_token_cache_ttl,
            limits,
            telemetry,
            lease_mode,
            allowed_hosts,
            allowed_origins,
            session_task: session.task.clone(),
            session_ttl,
            key_retention,
            database_max_connections,
            database_statement_timeout,
            database_connect_timeout,
            group_commit,
            database_operator_url: raw.database_operator_url.clone(),
            database_url: database_url.url,
            database_url_source: database_url.source,
            tenant,
            listen,
            control_listen,
            namespace_separator,
            unprefixed: raw.unprefixed.clone(),
            tools_page_size,
            migrate: raw.migrate.unwrap_or(true),
            http_sessions: raw.http_sessions.unwrap_or(false),
            policy,
            adapters,
            upstreams,
        };
        config.check_exposure().map_err(err)?;
        Ok(config)
    }

    /// Whether the listeners require a bearer token: `[auth] mode =
    /// "required"`, or `"auto"` with a listener that is not loopback.
    pub fn auth_required(&self) -> bool {
        match self.auth_mode {
            AuthMode::Required => true,
            AuthMode::Off => false,
            AuthMode::Auto => !self.loopback_only(),
        }
    }

    /// Whether every listener binds a loopback address.
    pub fn loopback_only(&self) -> bool {
        [Some(self.listen), self.control_listen]
            .into_iter()
            .flatten()
            .all(|address| address.ip().is_loopback())
    }

    /// Refuses a listener that is not loopback with authentication off
    /// (`0.0.0.0` without authentication is open to anyone). `leasegate serve`
    /// checks again after `--listen`.
    pub fn check_exposure(&self) -> Result<(), String> {
        if self.auth_mode != AuthMode::Off || self.loopback_only() {
            return Ok(());
        }
        let exposed: Vec<String> = [
            ("listen", Some(self.listen)),
            ("control_listen", self.control_listen),
        ]
        .into_iter()
        .filter_map(|(field, address)| address.map(|a| (field, a)))
        .filter(|(_, address)| !address.ip().is_loopback())
        .map(|(field, address)| format!("{field} = \"{address}\""))
        .collect();
        Err(format!(
            "auth.mode: \"off\" with a listener that is not loopback ({}): anyone who reaches it \
             could call tools and drive the control API. Remove `mode = \"off\"` (tokens are then \
             required: `leasegate tokens create`), or listen on 127.0.0.1 only",
            exposed.join(", ")
        ))
    }

    /// Ledger connections of this process: the file's
    /// `database_max_connections`, else 20 for `serve` and 4 for `stdio`
    /// (one agent's process, of which an agent framework may start one per
    /// tool call).
    pub fn database_connections(&self, stdio: bool) -> u32 {
        self.database_max_connections
            .unwrap_or(if stdio { 4 } else { 20 })
    }

    /// Applies the `--database-url` flag and [`DATABASE_URL_ENV`] over the
    /// file's `database_url` (see [`DatabaseUrl::resolve`]).
    pub fn resolve_database_url(&mut self, flag: Option<&str>) {
        let from_file = match &self.database_url_source {
            DatabaseUrlSource::ConfigFile(path) => Some((path.clone(), self.database_url.clone())),
            _ => None,
        };
        let resolved = DatabaseUrl::from_environment(
            flag,
            from_file
                .as_ref()
                .map(|(path, url)| (path.as_path(), Some(url.as_str()))),
        );
        self.database_url = resolved.url;
        self.database_url_source = resolved.source;
    }

    /// The ledger's URL and where it came from.
    pub fn database(&self) -> DatabaseUrl {
        DatabaseUrl {
            url: self.database_url.clone(),
            source: self.database_url_source.clone(),
        }
    }

    /// The adapter of `upstream`, or the no-promises default.
    pub fn adapter(&self, upstream: &str) -> Adapter {
        self.adapters
            .get(upstream)
            .cloned()
            .unwrap_or_else(|| Adapter {
                upstream: upstream.to_owned(),
                trust_annotations: false,
                timeout: crate::adapter::DEFAULT_TIMEOUT,
                tools: BTreeMap::new(),
            })
    }
}

/// The ordering of timeouts a configuration must keep (checked by
/// [`Config::load`], so `serve` refuses what `check-config` refuses).
struct Timings<'a> {
    config: &'a Path,
    policy: &'a Policy,
    policy_file: Option<&'a Path>,
    lease_mode: LeaseMode,
}

impl Timings<'_> {
    fn policy_field(&self, field: &str, value: std::time::Duration) -> String {
        match self.policy_file {
            Some(file) => format!("the policy's {field} ({value:?}, in {})", file.display()),
            None => format!("the default policy's {field} ({value:?})"),
        }
    }

    /// Every claim outlives the call it covers, with [`CLAIM_MARGIN`] to
    /// settle the answer: the dispatcher's (`claim_ttl`) and the
    /// reconciler's (`reconcile_claim_ttl`, under which it queries or
    /// retries with the tool's timeout). A claim that lapses first turns a
    /// call still running `unknown`, and lets another process send it
    /// again. Upstreams without an adapter file count with the default
    /// timeout. In lease mode `key` the key's lease lasts `claim_ttl`, so
    /// that must be within `lease_ttl_ceiling`.
    fn check(
        &self,
        upstreams: &BTreeMap<String, UpstreamTransport>,
        adapters: &BTreeMap<String, Adapter>,
        adapter_files: &BTreeMap<String, PathBuf>,
    ) -> Result<(), ConfigError> {
        let claims = [
            ("claim_ttl", self.policy.claim_ttl),
            ("reconcile_claim_ttl", self.policy.reconcile_claim_ttl),
        ];
        for name in upstreams.keys() {
            // (file, field, timeout) of every side-effecting call.
            let mut calls: Vec<(&Path, String, std::time::Duration)> = Vec::new();
            match (adapters.get(name), adapter_files.get(name)) {
                (Some(adapter), Some(file)) => {
                    calls.push((file, "timeout".to_owned(), adapter.timeout));
                    for (tool, spec) in &adapter.tools {
                        if !spec.read_only {
                            calls.push((file, format!("tools.{tool}.timeout"), spec.timeout));
                        }
                    }
                }
                _ => calls.push((
                    self.config,
                    format!("upstreams.{name} (no adapter file: the default tool timeout)"),
                    crate::adapter::DEFAULT_TIMEOUT,
                )),
            }
            for (file, field, timeout) in calls {
                for (claim, ttl) in claims {
                    if timeout + CLAIM_MARGIN > ttl {
                        return Err(ConfigError::of(
                            Problem::Timeouts,
                            file,
                            format!(
                                "{field}: {timeout:?} plus a margin of {CLAIM_MARGIN:?} does not \
                                 fit in {}: a claim must outlive the call it covers; raise \
                                 {claim} or lower the timeout",
                                self.policy_field(claim, ttl)
                            ),
                        ));
                    }
                }
            }
        }
        if self.lease_mode == LeaseMode::Key
            && self.policy.claim_ttl > self.policy.lease_ttl_ceiling
        {
            return Err(ConfigError::of(
                Problem::Timeouts,
                self.config,
                format!(
                    "lease_mode = \"key\": a key's lease lasts {}, which is above {}",
                    self.policy_field("claim_ttl", self.policy.claim_ttl),
                    self.policy_field("lease_ttl_ceiling", self.policy.lease_ttl_ceiling)
                ),
            ));
        }
        Ok(())
    }
}

/// Whether `path` is a file this process could execute.
fn executable(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    match std::fs::metadata(path) {
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            Err(format!("{} does not exist", path.display()))
        }
        Err(error) => Err(format!("{} cannot be read: {error}", path.display())),
        Ok(meta) if !meta.is_file() => Err(format!("{} is not a file", path.display())),
        Ok(meta) if meta.permissions().mode() & 0o111 == 0 => Err(format!(
            "{} is not executable (mode {:o})",
            path.display(),
            meta.permissions().mode() & 0o777
        )),
        Ok(_) => Ok(()),
    }
}

/// Every stdio upstream's command, resolved as `serve` resolves it (a path
/// relative to the config file; a bare name beside the running executable,
/// then on `PATH`), exists and is executable.
pub fn check_commands(config: &Config, file: &Path) -> Result<(), ConfigError> {
    for (name, transport) in &config.upstreams {
        let UpstreamTransport::Stdio { command, .. } = transport else {
            continue;
        };
        let field = format!("upstreams.{name}.command");
        let fail = |why: String| ConfigError::of(Problem::Command, file, format!("{field}: {why}"));
        if command.components().count() > 1 || command.is_absolute() {
            executable(command).map_err(fail)?;
            continue;
        }
        // A bare name: what `Command::new` would find on PATH.
        let path = std::env::var_os("PATH").unwrap_or_default();
        let found = std::env::split_paths(&path)
            .map(|dir| dir.join(command))
            .find(|candidate| candidate.is_file());
        match found {
            Some(candidate) => executable(&candidate).map_err(fail)?,
            None => {
                let beside = std::env::current_exe()
                    .ok()
                    .and_then(|exe| exe.parent().map(Path::to_path_buf))
                    .map_or_else(String::new, |dir| {
                        format!("beside leasegate ({}) nor ", dir.display())
                    });
                return Err(fail(format!(
                    "{:?} is found neither {beside}on PATH",
                    command.display().to_string()
                )));
            }
        }
    }
    Ok(())
}

/// Whether `text` is a JWKS whose every key can verify (what
/// `auth::jwt::JwtValidator` will load).
fn check_jwks(text: &str) -> Result<(), String> {
    let keys: jsonwebtoken::jwk::JwkSet =
        serde_json::from_str(text).map_err(|e| format!("not a JWKS document: {e}"))?;
    if keys.keys.is_empty() {
        return Err("the JWKS has no keys".into());
    }
    for (index, key) in keys.keys.iter().enumerate() {
        jsonwebtoken::DecodingKey::from_jwk(key)
            .map_err(|e| format!("key {index} cannot verify: {e}"))?;
    }
    Ok(())
}

/// What `leasegate check-config` checks for one path, judged by what the
/// file holds: a top-level `upstream` key makes an adapter file,
/// `upstreams` (or any key only the main configuration has) a main
/// configuration with everything it names, and a file of policy fields
/// alone a policy. A file under a directory named `adapters` or `policies`
/// is that kind when its contents do not say otherwise.
pub fn check_file(path: &Path) -> Result<&'static str, ConfigError> {
    let parent = path
        .parent()
        .and_then(Path::file_name)
        .and_then(|name| name.to_str())
        .unwrap_or("");
    let table = std::fs::read_to_string(path)
        .ok()
        .and_then(|text| text.parse::<toml::Table>().ok());
    let kind = match table {
        Some(table) if table.contains_key("upstream") => "adapter",
        Some(table) if table.contains_key("upstreams") => "config",
        Some(table)
            if !table.is_empty()
                && parent != "adapters"
                && toml::from_str::<RawPolicy>(&toml::to_string(&table).unwrap_or_default())
                    .is_ok() =>
        {
            "policy"
        }
        _ => match parent {
            "adapters" => "adapter",
            "policies" => "policy",
            _ => "config",
        },
    };
    match kind {
        "adapter" => load_adapter(path).map(|_| "adapter"),
        "policy" => load_policy(path).map(|_| "policy"),
        _ => Config::load(path).map(|_| "config"),
    }
}

/// What `leasegate check-config` checks beyond [`check_file`]: a main
/// configuration's stdio commands are there to run ([`check_commands`],
/// resolved beside the running executable as `serve` would resolve them).
/// Other kinds of file pass.
pub fn check_runnable(path: &Path, kind: &str) -> Result<(), ConfigError> {
    if kind != "config" {
        return Ok(());
    }
    check_commands(&Config::load(path)?, path)
}

/// Most worker threads `worker_threads` accepts.
pub const MAX_WORKER_THREADS: u32 = 1024;

/// The async runtime's worker threads when `worker_threads` is not set:
/// half the cores this process may use, at least one.
///
/// Not one per core, tokio's default: leasegate shares its host with its
/// stdio upstreams (its own child processes) and often with PostgreSQL,
/// and on a lightly loaded multi-threaded runtime a call's tasks hop
/// between idle workers, each hop a thread wake-up. Fewer workers cost
/// less CPU per call and a lone caller less latency, and cost some gated
/// throughput at many callers
/// (docs/performance.md).
pub fn default_worker_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |cores| (cores.get() / 2).max(1))
}

/// `worker_threads` checked (1 to [`MAX_WORKER_THREADS`]), or the default.
pub fn worker_threads(raw: Option<u32>) -> Result<usize, String> {
    match raw {
        None => Ok(default_worker_threads()),
        Some(threads @ 1..=MAX_WORKER_THREADS) => Ok(threads as usize),
        Some(threads) => Err(format!(
            "worker_threads: must be 1 to {MAX_WORKER_THREADS}, got {threads}"
        )),
    }
}

/// `worker_threads` of the config file at `path`, read ahead of
/// [`Config::load`]: the runtime is built before the file is loaded. The
/// default when the file does not read or parse or the value is out of
/// range; `Config::load` then reports why and the process exits.
pub fn read_ahead_worker_threads(path: &Path) -> usize {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|text| toml::from_str::<RawConfig>(&text).ok())
        .and_then(|raw| worker_threads(raw.worker_threads).ok())
        .unwrap_or_else(default_worker_threads)
}

/// `group_commit`, `group_commit_window`, `group_commit_max_batch` and
/// `group_commit_in_flight`, checked (also when group commit is off, so that turning it on later
/// cannot surface a typo), then `LEASEGATE_GROUP_COMMIT` over
/// `group_commit`.
fn group_commit_settings(
    raw: &RawConfig,
) -> Result<Option<crate::ledger::GroupCommitSettings>, String> {
    use crate::ledger::{
        GROUP_COMMIT_MAX_BATCH, GROUP_COMMIT_MAX_IN_FLIGHT, GROUP_COMMIT_MAX_WINDOW,
        GroupCommitSettings,
    };
    let mut settings = GroupCommitSettings::default();
    if let Some(text) = &raw.group_commit_window {
        // "0" (no window) is the default, so it is accepted here.
        let window = match humantime::parse_duration(text) {
            Ok(window) if window.is_zero() => window,
            _ => crate::policy::parse_duration("group_commit_window", text)
                .map_err(|e| e.to_string())?,
        };
        if window > GROUP_COMMIT_MAX_WINDOW {
            return Err(format!(
                "group_commit_window: must be at most 50ms (it delays every batched call), got {text:?}"
            ));
        }
        settings.window = window;
    }
    if let Some(max_batch) = raw.group_commit_max_batch {
        let max_batch = usize::try_from(max_batch).unwrap_or(usize::MAX);
        if !(1..=GROUP_COMMIT_MAX_BATCH).contains(&max_batch) {
            return Err(format!(
                "group_commit_max_batch: must be 1 to {GROUP_COMMIT_MAX_BATCH} (one subtransaction per call; \
                 PostgreSQL caches 64 per transaction), got {max_batch}"
            ));
        }
        settings.max_batch = max_batch;
    }
    if let Some(in_flight) = raw.group_commit_in_flight {
        let in_flight = usize::try_from(in_flight).unwrap_or(usize::MAX);
        if !(1..=GROUP_COMMIT_MAX_IN_FLIGHT).contains(&in_flight) {
            return Err(format!(
                "group_commit_in_flight: must be 1 to {GROUP_COMMIT_MAX_IN_FLIGHT} (batches of one kind \
                 sent at once), got {in_flight}"
            ));
        }
        settings.in_flight = in_flight;
    }
    let on =
        crate::ledger::group_commit_env_override().unwrap_or(raw.group_commit.unwrap_or(false));
    Ok(on.then_some(settings))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_database_url_is_found_flag_first_then_env_then_file_then_default() {
        let file = Path::new("/etc/leasegate.toml");
        let resolve = |flag, env, file_value| {
            let found = DatabaseUrl::resolve(flag, env, Some((file, file_value)));
            (found.url, found.source)
        };
        let (f, e, c) = (
            Some("postgres://flag"),
            Some("postgres://env"),
            Some("postgres://file"),
        );
        assert_eq!(
            resolve(f, e, c),
            ("postgres://flag".into(), DatabaseUrlSource::Flag)
        );
        assert_eq!(
            resolve(None, e, c),
            ("postgres://env".into(), DatabaseUrlSource::Env)
        );
        assert_eq!(
            resolve(None, None, c),
            (
                "postgres://file".into(),
                DatabaseUrlSource::ConfigFile(file.to_owned())
            )
        );
        assert_eq!(
            resolve(None, None, None),
            (DEFAULT_DATABASE_URL.into(), DatabaseUrlSource::Default)
        );
        // Empty values count as absent.
        assert_eq!(
            resolve(Some(""), Some(" "), c).1,
            DatabaseUrlSource::ConfigFile(file.to_owned())
        );
        // No config file at all.
        assert_eq!(
            DatabaseUrl::resolve(None, e, None).source,
            DatabaseUrlSource::Env
        );
        assert_eq!(
            DatabaseUrl::resolve(None, None, None).url,
            DEFAULT_DATABASE_URL
        );
        assert_eq!(
            DatabaseUrlSource::ConfigFile(file.to_owned()).to_string(),
            "database_url in /etc/leasegate.toml"
        );
    }
}
