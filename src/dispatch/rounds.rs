//! The rounds of a side-effecting call that asks its agent something
//! before it answers (sampling, elicitation, roots — over a session as
//! requests, to an MCP `V_2026_07_28` agent as an `input_required` result and
//! the agent's retry): each round is recorded on the operation as
//! `input_round` evidence under the call's dispatch claim, so the history
//! of one operation shows every round trip that led to its outcome.
//!
//! What is recorded is the method, the round's number, SHA-256 digests of
//! the canonical JSON of what was asked and of the answer, and how it
//! ended (`answered`, or the error code) — never the content, which may be
//! a user's reply. The row is written before the answer is handed to the
//! upstream, so a round's evidence always precedes the outcome it led to.
//!
//! Recording is best effort and never changes what happens: a round whose
//! row cannot be written (the ledger is unavailable, the claim is no
//! longer the operation's) is logged, and the answer goes on to the
//! upstream all the same. A crash loses nothing durable here: the call's
//! claim lapses into `unknown` as any other.

use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::sync::{mpsc, oneshot};

use crate::adapter::{AgentRequest, AgentSink, PeerError, ToAgent};
use crate::ledger::{DispatchClaim, Ledger};

/// JSON-RPC 2.0's internal error: the agent's side ended unanswered.
const INTERNAL_ERROR: i32 = -32603;

/// Hands what a relay has queued to the agent (see [`recorded`]).
pub(super) struct Flush(mpsc::UnboundedSender<oneshot::Sender<()>>);

impl Flush {
    /// Returns once everything the upstream sent before now has been
    /// handed on to the agent's side, so that nothing the upstream sent
    /// before its answer arrives after it.
    pub(super) async fn flush(&self) {
        let (done, flushed) = oneshot::channel();
        if self.0.send(done).is_ok() {
            let _ = flushed.await;
        }
    }
}

/// A sink that forwards everything to `agent`, recording each request's
/// round on the claim's operation on its way back.
pub(super) fn recorded(
    ledger: Ledger,
    claim: DispatchClaim,
    agent: AgentSink,
) -> (AgentSink, Flush) {
    let (sink, mut from_upstream) = mpsc::unbounded_channel::<ToAgent>();
    let (flush, mut flushes) = mpsc::unbounded_channel::<oneshot::Sender<()>>();
    tokio::spawn(async move {
        let mut round = 0u32;
        loop {
            let item = tokio::select! {
                biased;
                item = from_upstream.recv() => match item {
                    Some(item) => item,
                    None => break,
                },
                Some(done) = flushes.recv() => {
                    // What is queued now was sent before the flush was asked.
                    while let Ok(item) = from_upstream.try_recv() {
                        forward(&ledger, &claim, &agent, item, &mut round);
                    }
                    let _ = done.send(());
                    continue;
                }
            };
            forward(&ledger, &claim, &agent, item, &mut round);
        }
    });
    (sink, Flush(flush))
}

/// Forwards one item in the upstream's order; a request's answer is
/// awaited apart, so what follows it is not held up.
fn forward(
    ledger: &Ledger,
    claim: &DispatchClaim,
    agent: &AgentSink,
    item: ToAgent,
    round: &mut u32,
) {
    let ToAgent::Request(request) = item else {
        let _ = agent.send(item);
        return;
    };
    *round += 1;
    let round = *round;
    let (reply, answer) = oneshot::channel();
    let asked = digest(&request.params);
    let AgentRequest {
        method,
        params,
        reply: to_upstream,
    } = request;
    let forwarded = ToAgent::Request(AgentRequest {
        method: method.clone(),
        params,
        reply,
    });
    if agent.send(forwarded).is_err() {
        // Nobody listens any more: the upstream's request is dropped
        // unanswered, as without a sink.
        return;
    }
    let (ledger, claim) = (ledger.clone(), claim.clone());
    tokio::spawn(async move {
        let answer = answer.await.unwrap_or_else(|_| {
            Err(PeerError {
                code: INTERNAL_ERROR,
                message: "the agent's side of the call ended before it answered".into(),
                data: None,
            })
        });
        let mut body = json!({"round": round, "method": method, "asked_sha256": asked});
        match &answer {
            Ok(value) => {
                body["answered"] = json!(true);
                body["answer_sha256"] = json!(digest(value));
            }
            Err(error) => {
                body["answered"] = json!(false);
                body["error_code"] = json!(error.code);
            }
        }
        match ledger.operation_note_round(&claim, &body).await {
            Ok(true) => {}
            Ok(false) => tracing::info!(operation_id = %claim.operation_id, round,
                "a round ended after the call's claim: not recorded"),
            Err(error) => tracing::warn!(operation_id = %claim.operation_id, round,
                error = %crate::logfield::clip_display(&error), "a round could not be recorded"),
        }
        let _ = to_upstream.send(answer);
    });
}

/// SHA-256 of the RFC 8785 form of `value`, hex.
fn digest(value: &Value) -> String {
    let bytes = serde_json_canonicalizer::to_vec(value).unwrap_or_default();
    hex::encode(Sha256::digest(bytes))
}
