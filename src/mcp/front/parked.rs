//! Stateless-MCP calls waiting for the agent's input: a `tools/call`
//! whose upstream asks the agent something ends with an `input_required`
//! result naming the parked call; the agent's retry (with
//! `inputResponses`) feeds the answers to the waiting upstream request and
//! drives the call on. Parked calls live in this process's memory for
//! [`PARK_TTL`] and at most [`PARK_MAX`] at once; a crash loses them (their
//! gated operations are in the ledger and converge like any other).

use super::Front;
use super::call::{check_capability, refusal};
use super::cancel::CallWatch;
use super::request::invalid_params;
use crate::adapter::{PeerError, ToAgent};
use rmcp::model::{CallToolResponse, ProtocolVersion};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer};
use serde_json::{Value, json};
use std::collections::HashMap;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// How long a stateless-MCP call waits for the agent to answer an
/// `input_required` result before it is given up (the upstream's request
/// then gets an error; a gated call's outcome is recorded all the same).
pub(super) const PARK_TTL: std::time::Duration = std::time::Duration::from_secs(600);

/// At most this many calls wait for agents' input at once (per process).
pub(super) const PARK_MAX: usize = 10_000;

/// A tool call of a stateless-MCP agent, running in its own task so that
/// it can outlive the request that started it: when the upstream asks the
/// agent something, the request ends with `input_required` and the call
/// waits, parked under the `requestState` handle, for the agent's retry.
/// The handle is only known to this process (instance affinity).
pub struct PendingCall {
    pub(super) outcome: tokio::task::JoinHandle<Result<CallToolResponse, McpError>>,
    pub(super) from_upstream: mpsc::UnboundedReceiver<ToAgent>,
    /// Input key → where the agent's answer goes.
    pub(super) waiting: HashMap<String, tokio::sync::oneshot::Sender<Result<Value, PeerError>>>,
    /// Input key → what was asked (asked again if a retry leaves it out).
    pub(super) asked: HashMap<String, rmcp::model::InputRequest>,
    pub(super) next_input: u64,
    pub(super) parked_at: std::time::Instant,
    pub(super) watch: CallWatch,
    /// The exposed tool name (a retry must name the same tool).
    pub(super) tool: String,
}

impl Front {
    /// Turns an upstream request into an input request of this round, or
    /// answers it with an error.
    pub(super) fn add_input(
        &self,
        pending: &mut PendingCall,
        request: crate::adapter::AgentRequest,
        context: &RequestContext<RoleServer>,
        inputs: &mut rmcp::model::InputRequests,
    ) {
        let capabilities = context.client_capabilities().unwrap_or_default();
        if let Err(refused) = check_capability(&request.method, &request.params, &capabilities) {
            let _ = request.reply.send(Err(refused));
            return;
        }
        match serde_json::from_value::<rmcp::model::InputRequest>(
            json!({"method": request.method, "params": request.params}),
        ) {
            Ok(input) => {
                pending.next_input += 1;
                let key = format!("leasegate-{}", pending.next_input);
                pending.waiting.insert(key.clone(), request.reply);
                pending.asked.insert(key.clone(), input.clone());
                inputs.insert(key, input);
            }
            Err(error) => {
                let _ = request.reply.send(Err(refusal(format!(
                    "{} cannot be asked of an MCP {} agent: {error}",
                    request.method,
                    ProtocolVersion::V_2026_07_28.as_str()
                ))));
            }
        }
    }

    /// Runs a stateless-MCP call until it ends or needs the agent's input.
    pub(super) async fn drive_modern(
        &self,
        context: &RequestContext<RoleServer>,
        mut pending: PendingCall,
    ) -> Result<CallToolResponse, McpError> {
        loop {
            tokio::select! {
                biased;
                Some(item) = pending.from_upstream.recv() => {
                    let ToAgent::Request(request) = item else {
                        let _ = self.to_agent(item, context).await;
                        continue;
                    };
                    let mut inputs = rmcp::model::InputRequests::new();
                    self.add_input(&mut pending, request, context, &mut inputs);
                    while let Ok(item) = pending.from_upstream.try_recv() {
                        match item {
                            ToAgent::Request(request) => {
                                self.add_input(&mut pending, request, context, &mut inputs)
                            }
                            other => {
                                let _ = self.to_agent(other, context).await;
                            }
                        }
                    }
                    if inputs.is_empty() {
                        continue;
                    }
                    return Ok(self.park(pending, inputs));
                }
                outcome = &mut pending.outcome => {
                    while let Ok(item) = pending.from_upstream.try_recv() {
                        let _ = self.to_agent(item, context).await;
                    }
                    return outcome.map_err(|e| {
                        McpError::internal_error(format!("the call's task failed: {e}"), None)
                    })?;
                }
            }
        }
    }

    /// The agent's retry of a call that needed its input.
    pub(super) async fn resume_modern(
        &self,
        tool: &str,
        context: &RequestContext<RoleServer>,
        handle: &str,
        responses: rmcp::model::InputResponses,
    ) -> Result<CallToolResponse, McpError> {
        let pending = self.state.parked.lock().ok().and_then(|mut parked| {
            parked.retain(|_, p: &mut PendingCall| {
                let keep = p.parked_at.elapsed() < PARK_TTL;
                if !keep {
                    p.watch.cancel.cancel();
                }
                keep
            });
            // A handle is only good for the tool it was given for.
            match parked.get(handle) {
                Some(p) if p.tool == tool => parked.remove(handle),
                _ => None,
            }
        });
        let Some(mut pending) = pending else {
            return Err(invalid_params(format!(
                "requestState {handle:?} is unknown, expired or not for {tool:?}: leasegate keeps a call that waits for input for {} s, in the memory of the process that started it; call the tool again",
                PARK_TTL.as_secs()
            )));
        };
        self.watch_request(context, &pending.watch);
        for (key, answer) in responses {
            if let Some(reply) = pending.waiting.remove(&key) {
                pending.asked.remove(&key);
                let _ = reply.send(Ok(answer));
            }
        }
        if !pending.waiting.is_empty() {
            // Asked and not answered: ask again, or the upstream waits on.
            let inputs = pending.asked.clone().into_iter().collect();
            return Ok(self.park(pending, inputs));
        }
        self.drive_modern(context, pending).await
    }

    /// Ends this request with `input_required`; the call waits, parked
    /// under a new handle, for the agent's retry. Calls parked longer than
    /// `PARK_TTL`, and the oldest beyond `PARK_MAX`, are given up: their
    /// upstream request is cancelled.
    pub(super) fn park(
        &self,
        mut pending: PendingCall,
        inputs: rmcp::model::InputRequests,
    ) -> CallToolResponse {
        let handle = uuid::Uuid::new_v4().to_string();
        pending.parked_at = std::time::Instant::now();
        // This request ends here; the call goes on, watched by the request
        // that resumes it.
        pending.watch.detach.cancel();
        pending.watch.detach = CancellationToken::new();
        if let Ok(mut parked) = self.state.parked.lock() {
            parked.retain(|_, p: &mut PendingCall| {
                let keep = p.parked_at.elapsed() < PARK_TTL;
                if !keep {
                    p.watch.cancel.cancel();
                }
                keep
            });
            while parked.len() >= PARK_MAX {
                let oldest = parked
                    .iter()
                    .min_by_key(|(_, p)| p.parked_at)
                    .map(|(h, _)| h.clone());
                match oldest.and_then(|h| parked.remove(&h)) {
                    Some(given_up) => given_up.watch.cancel.cancel(),
                    None => break,
                }
            }
            parked.insert(handle.clone(), pending);
        }
        CallToolResponse::InputRequired(rmcp::model::InputRequiredResult::new(
            Some(inputs),
            Some(handle),
        ))
    }
}

impl PendingCall {
    pub(super) fn start(
        tool: String,
        call: super::ToolCall,
        from_upstream: mpsc::UnboundedReceiver<ToAgent>,
        watch: CallWatch,
    ) -> Self {
        Self {
            tool,
            outcome: tokio::spawn(call),
            from_upstream,
            waiting: HashMap::new(),
            asked: HashMap::new(),
            next_input: 0,
            parked_at: std::time::Instant::now(),
            watch,
        }
    }
}
