//! Which listener a request came in on and from which peer: the labels and
//! request extensions the server, the rate limits and the handlers share.

use std::net::SocketAddr;

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
