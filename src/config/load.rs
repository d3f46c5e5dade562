//! [`Config`]: a validated configuration, composed of its sections, with
//! its policy and adapters loaded. [`Config::load`] reads the file, has
//! each section validate its own keys, loads the policy and adapter files
//! it names, and checks what spans sections (the timings, the exposure of
//! a listener without authentication). Nothing is written anywhere.

use std::collections::BTreeMap;
use std::path::Path;

use super::adapters;
use super::auth::{AuthConfig, AuthMode};
use super::database::DatabaseConfig;
use super::error::ConfigError;
use super::files::{load_policy, parse};
use super::http::HttpConfig;
use super::lease::LeaseConfig;
use super::limits::Limits;
use super::naming::{NamingConfig, tenant_from_raw};
use super::raw::RawConfig;
use super::runtime::worker_threads;
use super::session::SessionConfig;
use super::timings::{Timings, check_session_idle};
use super::upstreams::{self, UpstreamTransport};
use crate::adapter::Adapter;
use crate::policy::Policy;

/// A validated configuration with its adapters and policy loaded.
#[derive(Debug, Clone)]
pub struct Config {
    /// The tenant this process serves.
    pub tenant: String,
    /// The ledger: URL, connections, timeouts, group commit, migrations.
    pub database: DatabaseConfig,
    /// The listeners, the `Host`/`Origin` values they serve, MCP sessions.
    pub http: HttpConfig,
    /// How tools are named and listed to agents.
    pub naming: NamingConfig,
    /// `lease_mode` and the key mode's retention.
    pub lease: LeaseConfig,
    /// `[session]`: the session lease mode's task and ttl.
    pub session: SessionConfig,
    /// `[auth]`: bearer tokens on both listeners.
    pub auth: AuthConfig,
    /// `[limits]`: what one client may hold of this process.
    pub limits: Limits,
    /// `[telemetry]`: where spans are exported, if anywhere.
    pub telemetry: crate::telemetry::Settings,
    pub policy: Policy,
    /// By upstream name.
    pub adapters: BTreeMap<String, Adapter>,
    pub upstreams: BTreeMap<String, UpstreamTransport>,
}

impl Config {
    /// Loads `path` and the files it names (relative to its directory).
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let raw: RawConfig = parse(path)?;
        let base = path.parent().unwrap_or(Path::new("."));
        let err = |message: String| ConfigError::new(path, message);

        let http = HttpConfig::from_raw(&raw, path)?;
        let tenant = tenant_from_raw(&raw, path)?;
        let naming = NamingConfig::from_raw(&raw, path)?;
        let upstreams = upstreams::from_raw(
            &raw.upstreams,
            path,
            base,
            &naming.separator,
            &naming.unprefixed,
        )?;
        let policy_file = raw.policy.as_ref().map(|file| base.join(file));
        let policy = match &policy_file {
            Some(file) => load_policy(file)?,
            None => Policy::default(),
        };
        let adapter_dir = raw.adapters.as_ref().map(|dir| base.join(dir));
        let loaded = adapters::load(adapter_dir.as_deref(), path, &upstreams, &policy)?;
        let database = DatabaseConfig::from_raw(&raw, path)?;
        // Only checked here: the runtime was built from the read-ahead value.
        worker_threads(raw.worker_threads).map_err(err)?;
        let lease =
            LeaseConfig::from_raw(raw.lease_mode.as_deref(), raw.idempotency.as_ref(), path)?;
        let timings = Timings {
            config: path,
            policy: &policy,
            policy_file: policy_file.as_deref(),
            lease_mode: lease.mode,
        };
        timings.check(&upstreams, &loaded.adapters, &loaded.files)?;
        let session = SessionConfig::from_raw(raw.session.as_ref(), path, &policy)?;
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
        check_session_idle(path, http.sessions, &limits, &upstreams, &loaded.adapters)?;
        let auth = AuthConfig::from_raw(raw.auth.as_ref(), path, base)?;
        let config = Config {
            tenant,
            database,
            http,
            naming,
            lease,
            session,
            auth,
            limits,
            telemetry,
            policy,
            adapters: loaded.adapters,
            upstreams,
        };
        config.check_exposure().map_err(err)?;
        Ok(config)
    }

    /// Whether the listeners require a bearer token: `[auth] mode =
    /// "required"`, or `"auto"` with a listener that is not loopback.
    pub fn auth_required(&self) -> bool {
        match self.auth.mode {
            AuthMode::Required => true,
            AuthMode::Off => false,
            AuthMode::Auto => !self.http.loopback_only(),
        }
    }

    /// Refuses a listener that is not loopback with authentication off
    /// (`0.0.0.0` without authentication is open to anyone). `leasegate serve`
    /// checks again after `--listen`.
    pub fn check_exposure(&self) -> Result<(), String> {
        if self.auth.mode != AuthMode::Off || self.http.loopback_only() {
            return Ok(());
        }
        let exposed: Vec<String> = [
            ("listen", Some(self.http.listen)),
            ("control_listen", self.http.control_listen),
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

    /// The adapter of `upstream`, or the no-promises default.
    pub fn adapter(&self, upstream: &str) -> Adapter {
        self.adapters
            .get(upstream)
            .cloned()
            .unwrap_or_else(|| Adapter {
                upstream: upstream.to_owned(),
                trust_annotations: false,
                timeout: crate::adapter::DEFAULT_TIMEOUT,
                on_disconnect: crate::adapter::OnDisconnect::default(),
                roots_outside_calls: crate::adapter::RootsOutsideCalls::default(),
                tools: BTreeMap::new(),
            })
    }
}
