//! Host and Origin checks of the control listener (DNS rebinding): a
//! request whose `Host` is not one of `allowed_hosts`, or that carries an
//! `Origin` not in `allowed_origins`, is refused with 403 before any
//! handler runs. Requests without `Origin` (curl, SDKs, the CLI) pass the
//! Origin check. The MCP listener applies the same lists through rmcp's own
//! checks (`mcp::serve_http`), with the same matching rules:
//!
//! * a host entry `name` matches that host on any port, `name:port` only
//!   that port (IPv6 in brackets: `[::1]`);
//! * an origin entry is `scheme://host[:port|:*]`; `:*` matches any port, a
//!   missing port matches any port, an origin without a port has its
//!   scheme's default port; `"null"` matches `Origin: null`.

use std::sync::Arc;

use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// The lists a listener accepts.
#[derive(Debug, Clone, Default)]
pub struct Allowed {
    pub hosts: Vec<String>,
    pub origins: Vec<String>,
    /// Guards the MCP listener (refusals are counted under `mcp`); else the
    /// control listener.
    pub mcp: bool,
}

impl Allowed {
    fn listener(&self) -> crate::http_server::Listener {
        if self.mcp {
            crate::http_server::Listener::Mcp
        } else {
            crate::http_server::Listener::Control
        }
    }
}

fn split_authority(authority: &str) -> (String, Option<u16>) {
    let authority = authority.trim();
    let (host, port) = match authority.rsplit_once(':') {
        // "[::1]:8641", "localhost:8641"; a bare IPv6 has more colons.
        Some((host, port))
            if !host.is_empty()
                && port.chars().all(|c| c.is_ascii_digit())
                && (host.ends_with(']') || !host.contains(':')) =>
        {
            (host, port.parse().ok())
        }
        _ => (authority, None),
    };
    (host.trim_matches(['[', ']']).to_ascii_lowercase(), port)
}

/// Whether a `Host` header value is allowed.
pub fn host_allowed(allowed: &[String], host: &str) -> bool {
    let (host, port) = split_authority(host);
    allowed.iter().any(|entry| {
        let (allowed_host, allowed_port) = split_authority(entry);
        allowed_host == host && allowed_port.is_none_or(|p| Some(p) == port)
    })
}

/// Whether an `Origin` header value is allowed.
pub fn origin_allowed(allowed: &[String], origin: &str) -> bool {
    let origin = origin.trim();
    if origin.eq_ignore_ascii_case("null") {
        return allowed
            .iter()
            .any(|a| a.trim().eq_ignore_ascii_case("null"));
    }
    let Some((scheme, rest)) = origin.split_once("://") else {
        return false;
    };
    let scheme = scheme.to_ascii_lowercase();
    let default_port = match scheme.as_str() {
        "http" => Some(80),
        "https" => Some(443),
        _ => None,
    };
    let (host, port) = split_authority(rest.trim_end_matches('/'));
    let port = port.or(default_port);
    allowed.iter().any(|entry| {
        let Some((entry_scheme, entry_rest)) = entry.trim().split_once("://") else {
            return false;
        };
        if !entry_scheme.eq_ignore_ascii_case(&scheme) {
            return false;
        }
        let entry_rest = entry_rest.trim_end_matches('/');
        let (entry_authority, any_port) = match entry_rest.strip_suffix(":*") {
            Some(authority) => (authority, true),
            None => (entry_rest, false),
        };
        let (entry_host, entry_port) = split_authority(entry_authority);
        entry_host == host && (any_port || entry_port.is_none() || entry_port == port)
    })
}

/// The middleware: 403 for a foreign Host or Origin, 400 for a URL that
/// holds a NUL byte.
pub async fn check(allowed: Arc<Allowed>, request: Request, next: Next) -> Response {
    let (host, origin) = {
        let header = |name: &str| {
            request
                .headers()
                .get(name)
                .map(|v| v.to_str().unwrap_or("\u{fffd}").to_owned())
        };
        (header("host").unwrap_or_default(), header("origin"))
    };
    if !host_allowed(&allowed.hosts, &host) {
        crate::http_server::refused(allowed.listener(), crate::http_server::Refusal::Host);
        return (
            StatusCode::FORBIDDEN,
            axum::Json(serde_json::json!({
                "code": "forbidden_host",
                "message": format!("Host {host:?} is not one this listener serves (allowed_hosts in leasegate.toml)"),
            })),
        )
            .into_response();
    }
    if let Some(origin) = origin
        && !origin_allowed(&allowed.origins, &origin)
    {
        crate::http_server::refused(allowed.listener(), crate::http_server::Refusal::Origin);
        return (
            StatusCode::FORBIDDEN,
            axum::Json(serde_json::json!({
                "code": "forbidden_origin",
                "message": format!("Origin {origin:?} may not call this API (allowed_origins in leasegate.toml)"),
            })),
        )
            .into_response();
    }
    // PostgreSQL text holds no NUL byte, so no id or filter can contain
    // one: refused as bad input before any lookup (not a ledger failure).
    let uri = request.uri();
    if uri.path().contains("%00") || uri.query().is_some_and(|query| query.contains("%00")) {
        return (
            StatusCode::BAD_REQUEST,
            axum::Json(serde_json::json!({
                "code": "invalid_input",
                "message": "the URL holds a NUL byte (%00), which no identifier or filter can contain",
            })),
        )
            .into_response();
    }
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn hosts_match_by_name_and_by_port_when_the_entry_has_one() {
        let allowed = list(&["localhost", "127.0.0.1", "::1", "api.internal:8641"]);
        for ok in [
            "localhost",
            "localhost:8641",
            "LOCALHOST:1",
            "127.0.0.1:8641",
            "[::1]:8641",
            "api.internal:8641",
        ] {
            assert!(host_allowed(&allowed, ok), "{ok}");
        }
        for refused in [
            "attacker.example",
            "attacker.example:8641",
            "api.internal:9999",
            "",
            "127.0.0.2",
        ] {
            assert!(!host_allowed(&allowed, refused), "{refused}");
        }
    }

    #[test]
    fn origins_match_scheme_host_and_port() {
        let allowed = list(&[
            "http://localhost:*",
            "http://127.0.0.1:*",
            "https://console.internal",
        ]);
        for ok in [
            "http://localhost:3000",
            "http://127.0.0.1",
            "https://console.internal",
            "https://console.internal:8443",
        ] {
            assert!(origin_allowed(&allowed, ok), "{ok}");
        }
        for refused in [
            "http://attacker.example",
            "https://localhost:3000",
            "http://console.internal",
            "null",
            "garbage",
        ] {
            assert!(!origin_allowed(&allowed, refused), "{refused}");
        }
    }
}
