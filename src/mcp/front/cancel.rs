//! An agent's cancel: each request's token, fired by
//! `notifications/cancelled` (per-session registry), by the stateless
//! front's registry, or by the agent going away (see [`CallWatch`]). The
//! agent is answered `-32800` at once and never with a late result; a
//! gated call's dispatch runs on in its own task and records what
//! happened.

use super::Front;
use super::request::{is_modern, request_key};
use crate::mcp::convert::codes;
use rmcp::model::ErrorCode;
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer};
use tokio_util::sync::CancellationToken;

impl Front {
    /// A token fired when the agent cancels the request, or goes away
    /// (see [`Front::watch_request`]).
    pub(super) fn cancel_token(
        &self,
        context: &RequestContext<RoleServer>,
        explicit_only: bool,
    ) -> CancellationToken {
        let watch = CallWatch {
            explicit_only,
            ..CallWatch::default()
        };
        self.watch_request(context, &watch);
        watch.cancel
    }

    /// Fires the watch's `cancel` when the agent cancels this request, and,
    /// unless `explicit_only`, when it merely goes away (its connection or
    /// response stream closed) — which always fires `gone` —, until the
    /// call ends (`cancel` fires) or `detach` fires: a stateless-MCP call
    /// that waits for the agent's input outlives the request that started
    /// it and is watched through the request that resumes it.
    /// Side-effecting calls pass [`CallWatch::explicit_only`]: the
    /// adapter's `on_disconnect`.
    pub(super) fn watch_request(&self, context: &RequestContext<RoleServer>, watch: &CallWatch) {
        let CallWatch {
            cancel: token,
            detach,
            explicit_only,
            gone,
        } = watch.clone();
        let key = request_key(&context.id);
        // The agent's notifications/cancelled finds the token here (sessions,
        // stdio) ...
        let watch_id = self
            .session
            .next_watch
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if let Ok(mut cancels) = self.session.cancels.lock() {
            cancels.insert(key.clone(), (watch_id, token.clone()));
        }
        // ... or, from a stateless HTTP agent, arrives as its own POST: the
        // in-flight registry finds this request by client and id.
        let registration = context
            .extensions
            .get::<http::request::Parts>()
            .filter(|parts| !parts.headers.contains_key("mcp-session-id"))
            .map(|parts| {
                self.state
                    .in_flight
                    .register(&parts.headers, &context.id, token.clone())
            });
        let (watched, fire, done, session) = (
            context.ct.clone(),
            token.clone(),
            token.clone(),
            self.session.clone(),
        );
        tokio::spawn(async move {
            tokio::select! {
                // A detached watch never fires (the request that ended with
                // input_required closes its stream right after).
                biased;
                _ = detach.cancelled() => {}
                _ = done.cancelled() => {}
                // The request's own token also fires when the agent merely
                // goes away (session closed, connection dropped).
                _ = watched.cancelled() => {
                    gone.cancel();
                    if !explicit_only {
                        fire.cancel();
                    }
                    tokio::select! {
                        _ = done.cancelled() => {}
                        _ = detach.cancelled() => {}
                    }
                }
            }
            if let Ok(mut cancels) = session.cancels.lock()
                && cancels.get(&key).is_some_and(|(w, _)| *w == watch_id)
            {
                cancels.remove(&key);
            }
            drop(registration);
        });
    }
}

/// The answer to a request the agent cancelled.
pub(super) fn cancelled_by_the_agent() -> McpError {
    McpError::new(
        ErrorCode(codes::REQUEST_CANCELLED),
        "cancelled by the agent",
        None,
    )
}

/// How a tool call is cancelled: `cancel` reaches the upstream; `detach`
/// ends the watch of the request currently carrying the call;
/// `explicit_only`: only the agent's explicit cancel fires `cancel`, not
/// its going away; `gone` fires when the agent goes away, cancel or not
/// (its outcome will not reach it: `dispatch::CallContext::gone`).
#[derive(Clone, Default)]
pub(super) struct CallWatch {
    pub(super) cancel: CancellationToken,
    pub(super) detach: CancellationToken,
    pub(super) explicit_only: bool,
    pub(super) gone: CancellationToken,
}

impl CallWatch {
    /// The watch of a side-effecting call. Before MCP `V_2026_07_28` a
    /// disconnect is not a cancel (the call finishes and is recorded); from
    /// `V_2026_07_28` on, closing the response stream is the agent's only way
    /// to cancel and also what a broken stream looks like, and the tool's
    /// `on_disconnect` decides.
    pub(super) fn side_effecting(
        context: &RequestContext<RoleServer>,
        on_disconnect: crate::adapter::OnDisconnect,
    ) -> Self {
        Self {
            explicit_only: !is_modern(context)
                || on_disconnect == crate::adapter::OnDisconnect::Finish,
            ..Self::default()
        }
    }
}
