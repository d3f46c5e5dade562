//! The listeners: the MCP front's address (`listen`), the control API's
//! (`control_listen`, or "off"), the `Host` and `Origin` values both serve,
//! and whether the front keeps MCP sessions (`http_sessions`).

use std::net::SocketAddr;
use std::path::Path;

use super::error::ConfigError;
use super::raw::RawConfig;

pub const DEFAULT_LISTEN: &str = "127.0.0.1:8640";
pub const DEFAULT_CONTROL_LISTEN: &str = "127.0.0.1:8641";

/// The listener keys, validated.
#[derive(Debug, Clone)]
pub struct HttpConfig {
    /// The MCP front: `http://<listen>/mcp`.
    pub listen: SocketAddr,
    /// `None`: the control API is off.
    pub control_listen: Option<SocketAddr>,
    /// `Host` values both listeners serve (`control::guard`).
    pub allowed_hosts: Vec<String>,
    /// `Origin` values allowed on both listeners (`control::guard`).
    pub allowed_origins: Vec<String>,
    /// `http_sessions`: MCP sessions over HTTP (`Mcp-Session-Id`).
    pub sessions: bool,
}

impl HttpConfig {
    /// The listener keys of `raw`; errors name `file` and the key.
    pub(super) fn from_raw(raw: &RawConfig, file: &Path) -> Result<Self, ConfigError> {
        let err = |message: String| ConfigError::new(file, message);
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
        let allowed_hosts = match &raw.allowed_hosts {
            Some(hosts) => hosts.clone(),
            None => default_hosts(listen, control_listen),
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
        Ok(Self {
            listen,
            control_listen,
            allowed_hosts,
            allowed_origins,
            sessions: raw.http_sessions.unwrap_or(false),
        })
    }

    /// Whether every listener binds a loopback address.
    pub fn loopback_only(&self) -> bool {
        [Some(self.listen), self.control_listen]
            .into_iter()
            .flatten()
            .all(|address| address.ip().is_loopback())
    }
}

/// `allowed_hosts` when not set: localhost, 127.0.0.1, ::1, and a listen
/// address that is neither loopback nor unspecified.
fn default_hosts(listen: SocketAddr, control_listen: Option<SocketAddr>) -> Vec<String> {
    let mut hosts: Vec<String> = ["localhost", "127.0.0.1", "::1"].map(String::from).to_vec();
    for address in [Some(listen), control_listen].into_iter().flatten() {
        let ip = address.ip();
        if !ip.is_loopback() && !ip.is_unspecified() {
            hosts.push(ip.to_string());
        }
    }
    hosts
}
