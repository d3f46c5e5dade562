//! Which agent a message from an upstream belongs to: every call in flight
//! on a connection with its request id and progress token, so progress,
//! call-scoped notifications and requests to the client reach the call's
//! handler; a message no call owns goes to the front as an
//! [`super::UpstreamEvent`]. The transport wrapper [`Routed`] stamps each
//! inbound message with its origin. In memory only: a reconnect starts
//! with no calls in flight.
//!
//! # Invariants
//!
//! 1. A request from the upstream goes to an agent only when it can be
//!    told whose it is: the call whose response stream carried it
//!    (Streamable HTTP), or, when the transport does not say (stdio, an
//!    HTTP server's GET stream), the only call the upstream may still be
//!    working on. Otherwise it is refused, naming the candidates (method,
//!    tool and request id; never arguments).
//! 2. A call the upstream may still be working on is a candidate: in
//!    flight, or given up on (its caller stopped waiting) until the upstream
//!    has been told (`notifications/cancelled` handed to the transport).
//!    A call the upstream answered, or was told about, is no candidate: the
//!    upstream must not ask anything for it any more, so it blocks no other
//!    call's relay.
//! 3. Every call given up on is told upstream once ([`CallRoutes::tell`]),
//!    whether its caller cancelled, timed out (rmcp sends the cancel) or
//!    simply stopped waiting.

use super::{EARLY_KEEP, EARLY_MAX};
use crate::adapter::{AgentSink, Progress, ToAgent};
use rmcp::RoleClient;
use rmcp::model::{
    JsonRpcMessage, ProgressNotificationParam, ProgressToken, RequestId, ServerNotification,
};
use rmcp::service::{InboundStreamOrigin, RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The calls in flight on one upstream connection, and where what the
/// upstream sends about them goes.
#[derive(Clone, Default)]
pub(super) struct CallRoutes {
    pub(super) state: Arc<Mutex<RoutesState>>,
}

#[derive(Default)]
pub(super) struct RoutesState {
    pub(super) progress: HashMap<ProgressToken, AgentSink>,
    pub(super) early: VecDeque<(Instant, ProgressNotificationParam)>,
    pub(super) in_flight: HashMap<u64, InFlight>,
    pub(super) next_call: u64,
}

pub(super) struct InFlight {
    /// What the call is (method and tool), to name it in a refusal.
    pub(super) what: String,
    /// The upstream request id, once the request is handed to the transport.
    pub(super) request_id: Option<RequestId>,
    pub(super) agent: Option<AgentSink>,
    /// Set when the caller stopped waiting before the upstream answered:
    /// the entry stays a candidate (invariant 2) until the upstream is told,
    /// or, if it cannot be told (its session is failing), for
    /// [`ABANDONED_KEEP`].
    pub(super) abandoned: Option<Instant>,
    /// `notifications/cancelled` for it is being sent (once: invariant 3).
    pub(super) telling: bool,
}

/// How long a call given up on that the upstream could not be told about
/// still counts as in flight.
pub(super) const ABANDONED_KEEP: Duration = Duration::from_secs(60);

/// Where something the upstream sent came from.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Origin {
    /// The transport does not say (stdio).
    Unknown,
    /// A Streamable HTTP stream not tied to a request (the GET stream).
    Unassociated,
    /// The response stream of this upstream request.
    Request(RequestId),
}

/// Why something from the upstream has no call to go to.
#[derive(Debug, PartialEq)]
pub(super) enum NoOwner {
    /// The request id is not (yet) known: it may be registered in a moment.
    NotYet,
    /// The transport does not say, and no call is in flight: it belongs to
    /// no agent's call (a server asking at start).
    NoCall,
    Refused(String),
}

impl std::fmt::Display for NoOwner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NoOwner::NotYet => f.write_str(
                "carried on the stream of a request that is not (or no longer) in flight",
            ),
            NoOwner::NoCall => f.write_str("no call is in flight on this upstream"),
            NoOwner::Refused(why) => f.write_str(why),
        }
    }
}

/// Ends a call's routes when the request future ends or is dropped. A
/// call dropped before it ended is told upstream (invariant 3) by the task
/// that `_ended` wakes.
pub(super) struct CallGuard<'a> {
    pub(super) routes: &'a CallRoutes,
    pub(super) call: u64,
    pub(super) token: Option<ProgressToken>,
    pub(super) answered: bool,
    /// Dropped after the routes are updated: wakes the call's cancel task.
    pub(super) _ended: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Drop for CallGuard<'_> {
    fn drop(&mut self) {
        self.routes
            .end(self.call, self.token.as_ref(), self.answered);
    }
}

pub(super) fn progress_of(params: ProgressNotificationParam) -> ToAgent {
    ToAgent::Progress(Progress {
        progress: params.progress,
        total: params.total,
        message: params.message,
    })
}

impl CallRoutes {
    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, RoutesState> {
        // A poisoned lock only means a panic elsewhere mid-update of plain
        // maps; the maps stay usable.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub(super) fn deliver_progress(&self, params: ProgressNotificationParam) {
        let mut state = self.lock();
        if let Some(route) = state.progress.get(&params.progress_token) {
            let _ = route.send(progress_of(params));
            return;
        }
        let now = Instant::now();
        state
            .early
            .retain(|(at, _)| now.duration_since(*at) < EARLY_KEEP);
        if state.early.len() >= EARLY_MAX {
            state.early.pop_front();
        }
        state.early.push_back((now, params));
    }

    pub(super) fn subscribe_progress(&self, token: ProgressToken, sink: AgentSink) {
        let mut state = self.lock();
        let (mine, others): (VecDeque<_>, VecDeque<_>) = std::mem::take(&mut state.early)
            .into_iter()
            .partition(|(_, p)| p.progress_token == token);
        state.early = others;
        for (_, params) in mine {
            let _ = sink.send(progress_of(params));
        }
        state.progress.insert(token, sink);
    }

    pub(super) fn begin(&self, agent: Option<AgentSink>, what: String) -> u64 {
        let mut state = self.lock();
        state
            .in_flight
            .retain(|_, f| f.abandoned.is_none_or(|at| at.elapsed() < ABANDONED_KEEP));
        state.next_call += 1;
        let call = state.next_call;
        state.in_flight.insert(
            call,
            InFlight {
                what,
                request_id: None,
                agent,
                abandoned: None,
                telling: false,
            },
        );
        call
    }

    /// The request id to send `notifications/cancelled` for, if the call
    /// is still a candidate and nobody is telling the upstream yet
    /// (invariant 3): the caller must send it, then call
    /// [`CallRoutes::told`].
    pub(super) fn tell(&self, call: u64) -> Option<RequestId> {
        let mut state = self.lock();
        let in_flight = state.in_flight.get_mut(&call)?;
        if in_flight.telling {
            return None;
        }
        let id = in_flight.request_id.clone()?;
        in_flight.telling = true;
        Some(id)
    }

    /// The upstream was told (`sent`) that the call is cancelled: it is no
    /// candidate any more (invariant 2). Not sent (its session is failing):
    /// it stays one until its session is replaced or [`ABANDONED_KEEP`].
    pub(super) fn told(&self, call: u64, sent: bool) {
        let mut state = self.lock();
        if sent {
            state.in_flight.remove(&call);
        } else if let Some(in_flight) = state.in_flight.get_mut(&call) {
            in_flight.telling = false;
        }
    }

    /// Sends `notifications/cancelled` for `call` unless it ended or was
    /// told already, and marks it told.
    pub(super) async fn cancel_upstream(
        &self,
        peer: &rmcp::service::Peer<RoleClient>,
        call: u64,
        reason: &str,
    ) {
        let Some(request_id) = self.tell(call) else {
            return;
        };
        let sent = peer
            .notify_cancelled(rmcp::model::CancelledNotificationParam::new(
                Some(request_id),
                Some(reason.to_owned()),
            ))
            .await
            .is_ok();
        self.told(call, sent);
    }

    pub(super) fn sent(&self, call: u64, request_id: RequestId, token: ProgressToken) {
        let mut state = self.lock();
        let agent = state.in_flight.get_mut(&call).and_then(|in_flight| {
            in_flight.request_id = Some(request_id);
            in_flight.agent.clone()
        });
        drop(state);
        if let Some(agent) = agent {
            self.subscribe_progress(token, agent);
        }
    }

    pub(super) fn end(&self, call: u64, token: Option<&ProgressToken>, answered: bool) {
        let mut state = self.lock();
        if answered {
            state.in_flight.remove(&call);
        } else if let Some(in_flight) = state.in_flight.get_mut(&call) {
            in_flight.agent = None;
            in_flight.abandoned = Some(Instant::now());
        }
        if let Some(token) = token {
            state.progress.remove(token);
        }
    }

    /// Forgets the calls given up on: they belonged to a session that is
    /// gone, so nothing about them can arrive any more (and the next
    /// session reuses their request ids).
    pub(super) fn forget_abandoned(&self) {
        self.lock().in_flight.retain(|_, f| f.abandoned.is_none());
    }

    /// The agent of the call a request or notification from the upstream
    /// belongs to: the call whose response stream carried it (Streamable
    /// HTTP); when the transport cannot say (stdio, or an HTTP server's GET
    /// stream), the only candidate (`single_fallback`; invariants 1 and 2),
    /// so that nothing about a call given up on reaches another.
    pub(super) fn owner(
        &self,
        origin: &Origin,
        single_fallback: bool,
    ) -> Result<AgentSink, NoOwner> {
        let state = self.lock();
        let refused = |why: &str| Err(NoOwner::Refused(why.to_owned()));
        let agent_of = |in_flight: &InFlight| match (&in_flight.agent, in_flight.abandoned) {
            (_, Some(_)) => refused("the call it belongs to is over (cancelled or timed out)"),
            (None, None) => {
                refused("the call it belongs to has no agent attached (background work)")
            }
            (Some(agent), None) => Ok(agent.clone()),
        };
        match origin {
            Origin::Request(id) => match state
                .in_flight
                .values()
                .find(|f| f.request_id.as_ref() == Some(id))
            {
                Some(in_flight) => agent_of(in_flight),
                None => Err(NoOwner::NotYet),
            },
            // The GET stream (servers send requests there when they do not
            // tie them to a request), or stdio: the transport does not say.
            Origin::Unassociated | Origin::Unknown if !single_fallback => {
                refused("the transport does not say which call it belongs to")
            }
            Origin::Unassociated | Origin::Unknown => match state.in_flight.len() {
                0 => Err(NoOwner::NoCall),
                1 => agent_of(state.in_flight.values().next().expect("one entry")),
                n => {
                    let mut candidates: Vec<(u64, &InFlight)> =
                        state.in_flight.iter().map(|(call, f)| (*call, f)).collect();
                    candidates.sort_by_key(|(call, _)| *call);
                    let named: Vec<String> = candidates
                        .iter()
                        .take(CANDIDATES_NAMED)
                        .map(|(_, f)| candidate(f))
                        .collect();
                    let more = n.saturating_sub(CANDIDATES_NAMED);
                    let more = if more > 0 {
                        format!(" and {more} more")
                    } else {
                        String::new()
                    };
                    Err(NoOwner::Refused(format!(
                        "{n} calls are in flight on this upstream ({}{more}) and its transport does not say which one this belongs to",
                        named.join("; ")
                    )))
                }
            },
        }
    }

    /// [`CallRoutes::owner`], waiting briefly for a request id that is not
    /// registered yet (the upstream may answer on a stream before the
    /// sender has recorded the request it sent).
    pub(super) async fn owner_soon(
        &self,
        origin: &Origin,
        single_fallback: bool,
    ) -> Result<AgentSink, NoOwner> {
        for _ in 0..50 {
            match self.owner(origin, single_fallback) {
                Err(NoOwner::NotYet) => tokio::time::sleep(Duration::from_millis(10)).await,
                found => return found,
            }
        }
        Err(NoOwner::NotYet)
    }
}

/// How many candidates a refusal names.
const CANDIDATES_NAMED: usize = 8;

/// One candidate as a refusal names it: what it is, its request id, and
/// whether its caller gave up on it.
fn candidate(in_flight: &InFlight) -> String {
    let id = match &in_flight.request_id {
        Some(id) => format!("request {id}"),
        None => "not sent yet".to_owned(),
    };
    let state = match (in_flight.abandoned, in_flight.telling) {
        (Some(_), true) => ", given up on, being cancelled",
        (Some(_), false) => ", given up on",
        (None, _) if in_flight.agent.is_none() => ", leasegate's own",
        (None, _) => "",
    };
    format!("{}, {id}{state}", in_flight.what)
}

/// What a request is, as a refusal names it: the method, and the tool of a
/// `tools/call` (clipped).
pub(super) fn describe(request: &rmcp::model::ClientRequest) -> String {
    match request {
        rmcp::model::ClientRequest::CallToolRequest(call) => format!(
            "tools/call {}",
            crate::logfield::clip(call.params.name.as_ref())
        ),
        other => other.method().to_owned(),
    }
}

/// The client's transport, with progress routed as it is read: a progress
/// notification reaches its call's channel before the transport yields the
/// next message, so every notification the upstream sent before its result
/// is queued for the agent before the result is (rmcp would otherwise hand
/// notifications to concurrently running handler tasks).
pub(super) struct Routed<T> {
    pub(super) inner: T,
    pub(super) routes: CallRoutes,
}

impl<T: Transport<RoleClient>> Transport<RoleClient> for Routed<T> {
    type Error = T::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleClient>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        self.inner.send(item)
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleClient>> {
        loop {
            let message = self.inner.receive().await?;
            if let JsonRpcMessage::Notification(notification) = &message
                && let ServerNotification::ProgressNotification(progress) =
                    &notification.notification
            {
                self.routes.deliver_progress(progress.params.clone());
                continue;
            }
            return Some(message);
        }
    }

    fn close(&mut self) -> impl Future<Output = Result<(), Self::Error>> + Send {
        self.inner.close()
    }
}

pub(super) fn origin_of(extensions: &rmcp::model::Extensions) -> Origin {
    match extensions.get::<InboundStreamOrigin>() {
        Some(InboundStreamOrigin::OutboundRequest(id)) => Origin::Request(id.clone()),
        Some(InboundStreamOrigin::Unassociated) => Origin::Unassociated,
        None => Origin::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::NumberOrString;

    fn in_flight<'a>(routes: &'a CallRoutes, tool: &str, id: i64) -> (u64, CallGuard<'a>) {
        let (agent, _) = tokio::sync::mpsc::unbounded_channel();
        let call = routes.begin(Some(agent), format!("tools/call {tool}"));
        routes.sent(
            call,
            NumberOrString::Number(id),
            ProgressToken(NumberOrString::Number(id)),
        );
        let guard = CallGuard {
            routes,
            call,
            token: Some(ProgressToken(NumberOrString::Number(id))),
            answered: false,
            _ended: None,
        };
        (call, guard)
    }

    /// Invariants 1 to 3: a call given up on stays a candidate until the
    /// upstream is told (once), then blocks nobody; several candidates are
    /// refused by name.
    #[test]
    fn a_call_given_up_on_counts_until_the_upstream_is_told() {
        let routes = CallRoutes::default();
        let (slow, guard) = in_flight(&routes, "slow", 4);
        // The caller stops waiting: not told yet, so still a candidate.
        drop(guard);
        let (_, _sampling) = in_flight(&routes, "trigger-sampling-request", 5);
        let Err(NoOwner::Refused(why)) = routes.owner(&Origin::Unknown, true) else {
            panic!("two candidates are refused");
        };
        for named in [
            "2 calls are in flight",
            "tools/call slow, request 4, given up on",
            "tools/call trigger-sampling-request, request 5",
        ] {
            assert!(why.contains(named), "{named} in {why}");
        }
        // Told once: a second teller gets nothing to send.
        assert_eq!(routes.tell(slow), Some(NumberOrString::Number(4)));
        assert_eq!(routes.tell(slow), None);
        routes.told(slow, true);
        assert!(
            routes.owner(&Origin::Unknown, true).is_ok(),
            "one candidate"
        );
        // A request on the stream of the told call finds no owner.
        assert!(matches!(
            routes.owner(&Origin::Request(NumberOrString::Number(4)), true),
            Err(NoOwner::NotYet)
        ));
    }

    /// Not told (the session failing): it stays a candidate, and may be
    /// told again later.
    #[test]
    fn a_call_that_could_not_be_told_stays_a_candidate() {
        let routes = CallRoutes::default();
        let (slow, guard) = in_flight(&routes, "slow", 1);
        drop(guard);
        assert!(routes.tell(slow).is_some());
        routes.told(slow, false);
        let (_, _other) = in_flight(&routes, "other", 2);
        assert!(routes.owner(&Origin::Unknown, true).is_err());
        assert_eq!(routes.tell(slow), Some(NumberOrString::Number(1)));
    }
}
