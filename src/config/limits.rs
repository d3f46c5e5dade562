//! `[limits]`: what one client may hold of the process — connection time,
//! connections, MCP sessions, request rate, log bytes. Parsed here,
//! enforced by `crate::http_server` (serving) and `crate::mcp` (sessions).

use std::time::Duration;

use serde::Deserialize;

/// `[limits]` as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLimits {
    /// From the first byte of a request (or of a connection) until its
    /// whole head has arrived (default "10s"): bounds half-sent headers.
    pub header_read_timeout: Option<String>,
    /// From a request's head until its whole body has arrived (default
    /// "30s"): bounds half-sent bodies, however slowly they trickle.
    pub body_read_timeout: Option<String>,
    /// How long a connection may stay open with no request in progress
    /// (default "75s", above the common 60 s of load balancers so that they
    /// close first). Never cuts a response in progress (SSE, long calls).
    pub idle_timeout: Option<String>,
    /// Open connections per listener (default 1024); more are closed at
    /// once, counted.
    pub max_connections: Option<usize>,
    /// Open connections one peer address (IPv6: its /64) may hold per
    /// listener (default a quarter of `max_connections` where tokens are
    /// required, else no share of its own); more are closed at once,
    /// counted.
    pub max_connections_per_peer: Option<usize>,
    /// MCP sessions (`http_sessions = true`) held at once (default 1000);
    /// a new one evicts the least recently used idle session.
    pub max_sessions: Option<usize>,
    /// MCP sessions one authenticated principal may hold at once (default
    /// a quarter of `max_sessions`); its new one beyond it evicts its own
    /// least recently used idle session, never another principal's.
    pub max_sessions_per_principal: Option<usize>,
    /// Requests one principal may have in progress at once on the MCP
    /// front (default a quarter of `max_connections` where tokens are
    /// required, else no share of its own): each call holds a connection
    /// (HTTP/1.1) or a stream, so one principal's slow calls cannot take
    /// the room of every other principal's. More are refused at once (429).
    pub max_in_flight_per_principal: Option<usize>,
    /// An MCP session with no message for this long ends (default "5m").
    pub session_idle_timeout: Option<String>,
    /// Requests per second per principal and listener (default 50; 0: no
    /// rate limit).
    pub rate_limit: Option<u32>,
    /// Requests a principal may send at once above the rate (default 100).
    pub rate_limit_burst: Option<u32>,
    /// Longest request-controlled text in a log line, in bytes (default
    /// 256); longer text is cut and says by how much.
    pub log_field_max_bytes: Option<usize>,
}

/// `[limits]`, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    pub header_read_timeout: Duration,
    pub body_read_timeout: Duration,
    pub idle_timeout: Duration,
    pub max_connections: usize,
    /// `None`: every peer may use the whole `max_connections`.
    pub max_connections_per_peer: Option<usize>,
    /// `max_connections_per_peer` was not set: its default applies only
    /// where tokens are required ([`Limits::for_serving`]).
    pub max_connections_per_peer_defaulted: bool,
    pub max_sessions: usize,
    pub max_sessions_per_principal: usize,
    /// `None`: no principal has a share of its own.
    pub max_in_flight_per_principal: Option<usize>,
    /// `max_in_flight_per_principal` was not set: its default applies only
    /// where tokens are required ([`Limits::for_serving`]).
    pub max_in_flight_per_principal_defaulted: bool,
    pub session_idle_timeout: Duration,
    /// `None`: no rate limit.
    pub rate_limit: Option<RateLimit>,
    /// `rate_limit` was not set: the default applies only where tokens are
    /// required ([`Limits::for_serving`]).
    pub rate_limit_defaulted: bool,
    pub log_field_max_bytes: usize,
    /// Tokens are verified on the listeners (set by [`Limits::for_serving`]):
    /// a request's rate bucket is then its verified token's, taken after
    /// authentication (`limits::rate`), not a digest of what it presented.
    pub verified_principals: bool,
}

/// Requests per second and burst, per principal and listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimit {
    pub per_second: u32,
    pub burst: u32,
}

impl Default for Limits {
    fn default() -> Self {
        RawLimits::default()
            .validate()
            .expect("the defaults are valid")
    }
}

impl RawLimits {
    /// Checks ranges; errors name the field (`limits.<field>`).
    pub fn validate(&self) -> Result<Limits, String> {
        let duration = |field: &str, value: &Option<String>, default: Duration| match value {
            Some(text) => crate::policy::parse_duration(&format!("limits.{field}"), text)
                .map_err(|e| e.to_string()),
            None => Ok(default),
        };
        let header_read_timeout = duration(
            "header_read_timeout",
            &self.header_read_timeout,
            Duration::from_secs(10),
        )?;
        let body_read_timeout = duration(
            "body_read_timeout",
            &self.body_read_timeout,
            Duration::from_secs(30),
        )?;
        let idle_timeout = duration("idle_timeout", &self.idle_timeout, Duration::from_secs(75))?;
        let session_idle_timeout = duration(
            "session_idle_timeout",
            &self.session_idle_timeout,
            Duration::from_secs(300),
        )?;
        for (field, value) in [
            ("header_read_timeout", header_read_timeout),
            ("body_read_timeout", body_read_timeout),
            ("idle_timeout", idle_timeout),
        ] {
            if value < Duration::from_millis(100) {
                return Err(format!("limits.{field}: must be at least 100ms"));
            }
        }
        let max_connections = self.max_connections.unwrap_or(1024);
        if !(1..=1_000_000).contains(&max_connections) {
            return Err("limits.max_connections: must be 1 to 1000000".into());
        }
        let max_connections_per_peer = self
            .max_connections_per_peer
            .unwrap_or((max_connections / 4).max(1));
        if !(1..=max_connections).contains(&max_connections_per_peer) {
            return Err(format!(
                "limits.max_connections_per_peer: must be 1 to max_connections ({max_connections})"
            ));
        }
        let max_sessions = self.max_sessions.unwrap_or(1000);
        if !(1..=1_000_000).contains(&max_sessions) {
            return Err("limits.max_sessions: must be 1 to 1000000".into());
        }
        let max_sessions_per_principal = self
            .max_sessions_per_principal
            .unwrap_or((max_sessions / 4).max(1));
        if !(1..=max_sessions).contains(&max_sessions_per_principal) {
            return Err(format!(
                "limits.max_sessions_per_principal: must be 1 to max_sessions ({max_sessions})"
            ));
        }
        let max_in_flight_per_principal = self
            .max_in_flight_per_principal
            .unwrap_or((max_connections / 4).max(1));
        if !(1..=1_000_000).contains(&max_in_flight_per_principal) {
            return Err("limits.max_in_flight_per_principal: must be 1 to 1000000".into());
        }
        let per_second = self.rate_limit.unwrap_or(50);
        let burst = self
            .rate_limit_burst
            .unwrap_or(per_second.saturating_mul(2).max(1));
        if per_second > 0 && burst == 0 {
            return Err("limits.rate_limit_burst: must be at least 1".into());
        }
        let log_field_max_bytes = self.log_field_max_bytes.unwrap_or(256);
        if !(16..=1024 * 1024).contains(&log_field_max_bytes) {
            return Err("limits.log_field_max_bytes: must be 16 to 1048576".into());
        }
        Ok(Limits {
            header_read_timeout,
            body_read_timeout,
            idle_timeout,
            max_connections,
            max_connections_per_peer: Some(max_connections_per_peer),
            max_connections_per_peer_defaulted: self.max_connections_per_peer.is_none(),
            max_sessions,
            max_sessions_per_principal,
            max_in_flight_per_principal: Some(max_in_flight_per_principal),
            max_in_flight_per_principal_defaulted: self.max_in_flight_per_principal.is_none(),
            session_idle_timeout,
            rate_limit: (per_second > 0).then_some(RateLimit { per_second, burst }),
            rate_limit_defaulted: self.rate_limit.is_none(),
            log_field_max_bytes,
            verified_principals: false,
        })
    }
}

impl Limits {
    /// The limits a listener serves with. The default rate limit (50/s per
    /// principal) applies only where tokens are required: on loopback
    /// without tokens every caller is a local process sharing one address
    /// (one bucket), and a benchmark or a busy agent host would be throttled
    /// for nothing. A `rate_limit` set in the config always applies. The
    /// default per-peer share of connections and the default per-principal
    /// share of requests in flight follow the same rule.
    pub fn for_serving(&self, auth_required: bool) -> Limits {
        let mut limits = self.clone();
        if limits.rate_limit_defaulted && !auth_required {
            limits.rate_limit = None;
        }
        // The same for the per-peer share of connections: on loopback
        // without tokens every caller is one local address.
        if limits.max_connections_per_peer_defaulted && !auth_required {
            limits.max_connections_per_peer = None;
        }
        if limits.max_in_flight_per_principal_defaulted && !auth_required {
            limits.max_in_flight_per_principal = None;
        }
        limits.verified_principals = auth_required;
        limits
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_refusals() {
        let limits = Limits::default();
        assert_eq!(limits.header_read_timeout, Duration::from_secs(10));
        assert_eq!(limits.max_connections, 1024);
        assert_eq!(
            limits.rate_limit,
            Some(RateLimit {
                per_second: 50,
                burst: 100
            })
        );
        let off = RawLimits {
            rate_limit: Some(0),
            ..RawLimits::default()
        };
        assert_eq!(off.validate().unwrap().rate_limit, None);
        let bad = RawLimits {
            header_read_timeout: Some("1ms".into()),
            ..RawLimits::default()
        };
        assert!(
            bad.validate()
                .unwrap_err()
                .contains("limits.header_read_timeout")
        );
        let bad = RawLimits {
            max_connections: Some(0),
            ..RawLimits::default()
        };
        assert!(bad.validate().unwrap_err().contains("max_connections"));
        // The in-flight share: a quarter of the connections where tokens
        // are required, none of its own on loopback without tokens unless
        // set.
        assert_eq!(
            limits.for_serving(true).max_in_flight_per_principal,
            Some(256)
        );
        assert_eq!(limits.for_serving(false).max_in_flight_per_principal, None);
        let set = RawLimits {
            max_in_flight_per_principal: Some(3),
            ..RawLimits::default()
        };
        assert_eq!(
            set.validate()
                .unwrap()
                .for_serving(false)
                .max_in_flight_per_principal,
            Some(3)
        );
        let bad = RawLimits {
            max_in_flight_per_principal: Some(0),
            ..RawLimits::default()
        };
        assert!(
            bad.validate()
                .unwrap_err()
                .contains("limits.max_in_flight_per_principal")
        );
    }
}
