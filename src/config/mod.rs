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
//!
//! # Layout
//!
//! [`Config`] is a composition of sections, each validating its own keys
//! into a typed struct and returning the [`ConfigError`] that names the key:
//!
//! - `raw`: [`RawConfig`], the file as written (one flat serde struct, as
//!   the file is flat; tables have their raw forms beside their sections);
//! - `database`: [`DatabaseConfig`], the ledger's URL (resolved in one order
//!   for every command, [`DatabaseUrl::resolve`]), connections, timeouts,
//!   migrations; `group_commit` its group commit keys;
//! - `http`: [`HttpConfig`], the listeners and the `Host`/`Origin` values
//!   they serve; `naming`: [`NamingConfig`] and the tenant;
//! - `upstreams`: the tool servers and their commands; `adapters` and
//!   `files`: the adapter and policy files the configuration names;
//! - `lease`: [`LeaseConfig`] (`lease_mode`, `[idempotency]`); `session`:
//!   [`SessionConfig`] (`[session]`); `auth`: [`AuthConfig`] (`[auth]`);
//!   `limits`, `telemetry`: `[limits]`, `[telemetry]`;
//! - `runtime`: `worker_threads` and `[telemetry]`, read ahead of the rest;
//! - `timings`: the orderings of timeouts across sections;
//! - `load`: [`Config`] and [`Config::load`], the composition;
//! - `check`: what `leasegate check-config` checks of one file;
//! - `init`: what `leasegate init` writes.

mod adapters;
mod auth;
mod check;
mod database;
mod error;
mod files;
mod group_commit;
mod http;
pub mod init;
mod lease;
pub mod limits;
mod load;
mod naming;
mod raw;
mod runtime;
mod session;
pub mod telemetry;
mod timings;
mod upstreams;

pub use auth::{AuthConfig, AuthMode, JwtConfig, RawAuth, RawJwt};
pub use check::{check_commands, check_file, check_runnable};
pub use database::{
    DATABASE_URL_ENV, DATABASE_URL_HELP, DEFAULT_DATABASE_CONNECT_TIMEOUT, DEFAULT_DATABASE_URL,
    DEFAULT_DATABASE_URL_ENV, DatabaseConfig, DatabaseUrl, DatabaseUrlSource, EMBEDDED_DATABASE,
};
pub use error::{ConfigError, Problem};
pub use files::{load_adapter, load_policy};
pub use http::{DEFAULT_CONTROL_LISTEN, DEFAULT_LISTEN, HttpConfig};
pub use lease::{LeaseConfig, LeaseMode, RawIdempotency};
pub use limits::{Limits, RateLimit, RawLimits};
pub use load::Config;
pub use naming::NamingConfig;
pub use raw::RawConfig;
pub use runtime::{
    MAX_WORKER_THREADS, default_worker_threads, read_ahead_telemetry, read_ahead_worker_threads,
    worker_threads,
};
pub use session::{RawSession, SessionConfig};
pub use telemetry::RawTelemetry;
pub use timings::CLAIM_MARGIN;
pub use upstreams::{EnvValue, RawUpstream, UpstreamTransport, resolve_command};
