//! Which listener a request came in on and from which peer: the labels and
//! request extensions the server, the rate limits and the handlers share.

use std::net::SocketAddr;
use std::time::Instant;

/// Which listener: the `listener` label of the metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listener {
    Mcp,
    Control,
}

impl Listener {
    pub fn as_str(self) -> &'static str {
        match self {
            Listener::Mcp => "mcp",
            Listener::Control => "control",
        }
    }
}

/// The peer's address, in every request's extensions (the rate limit's
/// principal when there is no `Authorization`).
#[derive(Debug, Clone, Copy)]
pub struct Peer(pub SocketAddr);

/// When leasegate received a request (this host's monotonic clock): the
/// HTTP server puts it into each request's extensions. A request received
/// before its process learnt that its membership was lost is refused
/// rather than sent under a new one (it may be a paused process's).
#[derive(Debug, Clone, Copy)]
pub struct Arrived(pub Instant);
