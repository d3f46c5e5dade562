//! `leasegate.toml` as written: [`RawConfig`], the one serde form of the
//! whole file. Its top-level keys stay in this one flat struct, each
//! marked with the section that validates it (`database`, `http`,
//! `naming`, `lease`, `upstreams`, `runtime`, the policy and adapter
//! files); the tables (`[session]`, `[idempotency]`, `[auth]`, `[limits]`,
//! `[telemetry]`) have their raw forms beside their sections. Flat because
//! the file is: serde refuses unknown fields only in a struct that
//! flattens nothing, and that refusal, naming every accepted key, is what
//! a typo gets back (and what `docs/configuration.md` is checked against).

use std::collections::BTreeMap;

use serde::Deserialize;

use super::auth::RawAuth;
use super::lease::RawIdempotency;
use super::limits::RawLimits;
use super::session::RawSession;
use super::telemetry::RawTelemetry;
use super::upstreams::RawUpstream;

/// The main configuration file as written; `Config::load` hands each
/// section the keys it validates.
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
    /// Group commit of gated calls (default true; `LEASEGATE_GROUP_COMMIT`
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
    /// starts, ahead of the rest of the file (`runtime::read_ahead_worker_threads`).
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
