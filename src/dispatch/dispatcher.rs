//! [`Dispatcher`]: the inline path of one side-effecting call — refused
//! before anything is registered when the policy or the durability gate
//! says so, registered and claimed in one statement, executed in a task
//! leasegate owns (`execute`), or answered from the operation already on
//! record (replayed, waited for, or turned unknown once its claim lapsed).
//!
//! Crash points are those of the module above.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value, json};
use tracing::Instrument;

use super::call::{CallError, CallReply, CallRequest, OperationNote, Rephrased, ShownCall};
use super::execute::{Claimed, execute_claim_acknowledged};
use super::undelivered::{AbandonGuard, CallPlace, Delivery, Undelivered};
use crate::adapter::AfterUndelivered;
use crate::adapter::Upstream;
use crate::durability::{DurabilityGate, Hold};
use crate::intent::Intent;
use crate::ledger::{
    Fenced, InlineClaim, LeaseClaim, Ledger, LedgerError, MarkUnknown, MarkUnknownOutcome,
    OperationRecord, OperationStatus, Rejection, ToolRoute, UnknownBy, UnknownCause, WalPosition,
};
use crate::policy::{Policy, StepIdentity};

/// Runs side-effecting calls through the ledger.
pub struct Dispatcher<U> {
    ledger: Ledger,
    upstream: Arc<U>,
    policy: Policy,
    /// The tenant this proxy serves; runs of other tenants are not found.
    tenant: String,
    /// Unique per process: the claims this process takes.
    dispatch_owner: String,
    /// Asked before anything is registered; told what was acknowledged.
    gate: Arc<DurabilityGate>,
    /// The tasks upstreams made of this process's calls, followed here.
    tasks: Arc<super::followers::TaskFollowers>,
    /// The calls whose dispatch task runs now, for a shutdown to wait on.
    running: Arc<Running>,
    /// Outcomes this process's agents never received (`undelivered`).
    undelivered: Arc<Undelivered>,
}

/// A count of running dispatch tasks, and a wake-up when it changes.
#[derive(Default)]
struct Running {
    count: std::sync::atomic::AtomicUsize,
    changed: tokio::sync::Notify,
}

/// One running dispatch task; counted down when it ends, however it ends.
struct RunningCall(Arc<Running>);

impl RunningCall {
    fn start(running: &Arc<Running>) -> Self {
        running
            .count
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Self(running.clone())
    }
}

impl Drop for RunningCall {
    fn drop(&mut self) {
        self.0
            .count
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        self.0.changed.notify_waiters();
    }
}

impl<U> Dispatcher<U> {
    /// The ledger this dispatcher writes to.
    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    /// This process's identity on the claims it takes.
    pub fn owner(&self) -> &str {
        &self.dispatch_owner
    }

    /// Waits until every call's dispatch task has ended (its outcome
    /// recorded), at most `grace`; how many still run then. A shutdown asks
    /// this once no new calls arrive.
    pub async fn settled(&self, grace: Duration) -> usize {
        let deadline = tokio::time::Instant::now() + grace;
        loop {
            let changed = self.running.changed.notified();
            let left = self.running.count.load(std::sync::atomic::Ordering::SeqCst);
            if left == 0 {
                return 0;
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return self.running.count.load(std::sync::atomic::Ordering::SeqCst);
            }
        }
    }

    /// The tasks this process follows (for an agent that follows tasks:
    /// `CallContext::tasks`).
    pub fn tasks(&self) -> &Arc<super::followers::TaskFollowers> {
        &self.tasks
    }
}

impl<U: Upstream> Dispatcher<U> {
    /// A dispatcher whose claims carry `dispatch_owner` (the process's
    /// identity, see [`process_owner`]).
    pub fn new(
        ledger: Ledger,
        upstream: Arc<U>,
        policy: Policy,
        tenant: String,
        dispatch_owner: String,
    ) -> Self {
        Self {
            tasks: super::followers::TaskFollowers::new(policy.claim_ttl),
            running: Arc::default(),
            undelivered: Arc::default(),
            ledger,
            upstream,
            policy,
            tenant,
            dispatch_owner,
            gate: Arc::new(DurabilityGate::unchecked()),
        }
    }

    /// Dispatch under `gate` (the process's durability gate).
    pub fn with_gate(mut self, gate: Arc<DurabilityGate>) -> Self {
        self.gate = gate;
        self
    }

    /// Registers, claims, calls and settles one side-effecting call.
    ///
    /// Refused before anything is registered while the durability gate
    /// holds. An answer is sampled into the gate's acknowledged high-water
    /// before the agent hears it — from the settle's (or the replay's) own
    /// statement when it carries the position, so a gated call costs two
    /// round trips and a replay one; a ledger error makes the gate re-check.
    ///
    /// The call runs in a task of its own, the one task a call spawns: from
    /// the first ledger write on it belongs to leasegate, so dropping this
    /// future (the agent cancelled or went away) interrupts neither a
    /// ledger write nor a dispatch under a claim, and the task records the
    /// outcome.
    pub async fn call(self: &Arc<Self>, request: CallRequest) -> Result<CallReply, CallError>
    where
        U: 'static,
    {
        let dispatcher = self.clone();
        let running = RunningCall::start(&self.running);
        let delivery = Delivery::new(self.undelivered.clone(), self.policy.undelivered_hold);
        // Dropped with this future when the agent cancels or goes away.
        let abandon = AbandonGuard::new(delivery.clone());
        let watched = delivery.clone();
        let gone = request.context.gone.clone();
        let mut task = tokio::spawn(
            async move {
                let _running = running;
                dispatcher.call_in_place(request, &watched).await
            }
            .in_current_span(),
        );
        // An agent that went away without dropping this future (a call
        // that runs on for it) has not received the outcome either.
        let joined = tokio::select! {
            joined = &mut task => joined,
            _ = gone.cancelled() => {
                delivery.abandoned();
                task.await
            }
        };
        let reply = joined.map_err(|e| {
            CallError::Ledger(LedgerError::Protocol {
                call: "dispatch",
                detail: format!("dispatch task failed: {e}"),
            })
        })?;
        abandon.delivered();
        if let Ok(CallReply::Answer { .. }) = &reply {
            delivery.answered();
        }
        reply
    }

    async fn call_in_place(
        &self,
        request: CallRequest,
        delivery: &Delivery,
    ) -> Result<CallReply, CallError> {
        if self.policy.step_identity == StepIdentity::Explicit && request.step.is_none() {
            return Err(CallError::StepRequired);
        }
        let size = serialized_len(&request.arguments);
        if size > self.policy.max_arguments_bytes {
            return Err(CallError::ArgumentsTooLarge {
                size,
                limit: self.policy.max_arguments_bytes,
            });
        }
        if let Some(hold) = self.gate.admit(&self.ledger).await {
            return Err(held(hold));
        }
        // The high-water before this call's reading began (DurabilityGate::acknowledged_at).
        let baseline = self.gate.baseline();
        let reply = self.call_unchecked(request, delivery).await;
        match &reply {
            Ok((_, sampled)) => {
                self.gate
                    .acknowledged_at(&self.ledger, baseline, sampled.clone())
                    .await
            }
            // The connection broke: the next one may reach another server.
            Err(CallError::Ledger(
                error @ (LedgerError::Unavailable { .. } | LedgerError::OutcomeUnknown { .. }),
            )) => self.gate.suspect(&error.to_string()),
            Err(_) => {}
        }
        reply.map(|(reply, _)| reply)
    }

    /// The reply, and where the WAL stood after the write it reports, when
    /// the call's own statement read it.
    async fn call_unchecked(
        &self,
        request: CallRequest,
        delivery: &Delivery,
    ) -> Result<(CallReply, Option<WalPosition>), CallError> {
        let CallRequest {
            lease,
            lease_held_for_agent,
            step,
            exposed_name,
            tool,
            mut arguments,
            context,
        } = request;
        // The operation id argument is leasegate's to fill: a value the
        // agent sent there is neither part of the identity nor sent.
        let filled_argument = tool
            .adapter
            .filled_argument()
            .filter(|name| arguments.remove(*name).is_some())
            .map(str::to_owned);
        let filled_meta = match &tool.adapter.placement {
            crate::adapter::OperationIdPlacement::Meta(key) if context.meta.contains_key(key) => {
                Some(key.clone())
            }
            _ => None,
        };
        let arguments = Value::Object(arguments);
        let derived = step.is_none();
        // Explicit steps keep their own identity; a derived step hashes the
        // declared identity fields when the tool has them.
        let identity = match &step {
            None => tool.adapter.identity.as_deref(),
            Some(_) => None,
        };
        let mut intent = Intent::identify_by(
            &self.tenant,
            lease.run_id,
            step,
            &exposed_name,
            &arguments,
            self.policy.integers,
            identity,
        )?;
        // As sent: the ledger stores what the policy keeps of it (masked,
        // digest only, sealed; `LedgerOptions::bodies`).
        // Moved, not copied: it comes back out for the upstream once the
        // claim is written.
        intent.request_body = arguments;
        // An outcome this run's agent never received from this tool is shown
        // before a different call to it is sent, for an agent under a lease
        // leasegate holds for it. A caller with a lease of its own or that
        // names its steps, or a tool that declares its identity, says itself
        // which calls are the same effect: none is second-guessed.
        let shows = lease_held_for_agent
            && derived
            && identity.is_none()
            && tool.adapter.after_undelivered == AfterUndelivered::Show;
        let place = shows.then(|| CallPlace {
            run_id: lease.run_id,
            tool: exposed_name.clone(),
        });
        if let Some(place) = &place {
            let earlier = self.undelivered.take_others(
                place,
                &intent.operation_id,
                self.policy.undelivered_hold,
            );
            if let Some(shown) = self.shown(&exposed_name, earlier).await? {
                return Ok((shown, None));
            }
            delivery.identified(place.clone(), intent.operation_id.clone());
        }
        let claim_ttl_ms = i64::try_from(self.policy.claim_ttl.as_millis()).unwrap_or(i64::MAX);
        let route = ToolRoute {
            upstream: tool.upstream.clone(),
            tool: tool.tool.clone(),
        };
        // Taken by the claimed branch, which ends the loop.
        let (tasks, agent) = (context.tasks.clone(), context.agent.clone());
        let mut context = Some(context);
        // A rephrased call that sends the earlier call's recorded request.
        let mut sent_for = None;
        let (mut reply, sampled) = loop {
            // Runs of other tenants are not found (their existence is not this
            // tenant's business; operation ids derive from the run's tenant):
            // judged by the same statement.
            let registered = self
                .register_claim(&lease, &intent, &route, claim_ttl_ms)
                .await;
            let (outcome, sampled) = match registered {
                // The session broke under the statement (a terminated backend,
                // a dropped connection): nothing was sent upstream, and the
                // claim may or may not be committed. Sent once more, on a
                // fresh session, after the gate re-checked the server it now
                // reaches: a claim the first statement committed is answered
                // `exists` (in flight), never claimed twice, so this cannot
                // send the call twice. If we crash in between, a committed
                // claim lapses into `unknown` as any other.
                Err(error) if error.connection_lost() => {
                    self.gate.suspect(&error.to_string());
                    if let Some(hold) = self.gate.admit(&self.ledger).await {
                        return Err(held(hold));
                    }
                    self.register_claim(&lease, &intent, &route, claim_ttl_ms)
                        .await?
                }
                registered => registered?,
            };
            match outcome {
                // The declared identity matches a recorded intent of this
                // run whose request differs: a rephrased call.
                Fenced::Rejected(Rejection::IntentConflict {
                    operation_id,
                    found_step,
                    found_effect_version,
                    ..
                }) if identity.is_some() && found_step == intent.step_id => {
                    match self
                        .rephrased(
                            &operation_id,
                            &intent,
                            &tool,
                            tasks.as_deref(),
                            agent.as_ref(),
                        )
                        .await?
                    {
                        Rephrase::Answered(reply) => break (reply, None),
                        // The earlier call is registered but provably not
                        // sent: its request (the one on record) goes now.
                        Rephrase::SendRecorded {
                            arguments,
                            digest,
                            rephrased,
                        } => {
                            intent.request_body = arguments;
                            intent.request_digest = digest;
                            sent_for = Some(rephrased);
                            continue;
                        }
                        // The earlier call ended without an effect: this one
                        // is the corrected plan, the step's next version.
                        Rephrase::NextVersion => {
                            intent.effect_version = found_effect_version + 1;
                            intent.operation_id = crate::intent::operation_id(
                                &self.tenant,
                                lease.run_id,
                                &intent.step_id,
                                intent.effect_version,
                            );
                            if let Some(place) = &place {
                                delivery.identified(place.clone(), intent.operation_id.clone());
                            }
                            continue;
                        }
                    }
                }
                Fenced::Rejected(rejection) => return Err(refusal(rejection)),
                Fenced::Applied(InlineClaim::Existing(record)) => {
                    // The position covers the row as this statement read it: only
                    // an answer from that row (not one polled later) may use it.
                    let as_read = matches!(
                        record.status,
                        OperationStatus::Succeeded
                            | OperationStatus::FailedFinal
                            | OperationStatus::Unknown
                    );
                    let reply = self
                        .existing(record, tasks.as_deref(), agent.as_ref())
                        .await?;
                    break (reply, sampled.filter(|_| as_read));
                }
                Fenced::Applied(InlineClaim::Claimed { claim, .. }) => {
                    let Value::Object(arguments) = std::mem::take(&mut intent.request_body) else {
                        unreachable!("built from an object above")
                    };
                    break execute_claim_acknowledged(
                        self.ledger.clone(),
                        self.upstream.clone(),
                        self.dispatch_owner.clone(),
                        claim,
                        Claimed {
                            tool,
                            arguments,
                            context: context.take().unwrap_or_default(),
                        },
                    )
                    .await?;
                }
            }
        };
        remark(&mut reply, |remarks| {
            remarks.filled_argument = filled_argument;
            remarks.filled_meta = filled_meta;
            remarks.rephrased = remarks.rephrased.take().or(sent_for);
        });
        Ok((reply, sampled))
    }

    /// The answer to a call that is not sent because the earlier calls
    /// `earlier` of its tool in its run have outcomes their agent never
    /// received: those calls, as recorded. `None` when none of them is on
    /// record any more (archived): the call goes on.
    async fn shown(
        &self,
        tool: &str,
        earlier: Vec<crate::intent::OperationId>,
    ) -> Result<Option<CallReply>, CallError> {
        let mut calls = Vec::with_capacity(earlier.len());
        for operation_id in earlier {
            if let Some((record, arguments)) = self
                .ledger
                .operation_record_with_request(&operation_id)
                .await?
            {
                calls.push(ShownCall {
                    operation_id: record.operation_id,
                    status: record.status,
                    arguments,
                    result: record.result,
                });
            }
        }
        if calls.is_empty() {
            return Ok(None);
        }
        metrics::counter!("leasegate_undelivered_shown_total").increment(1);
        Ok(Some(CallReply::Shown {
            tool: tool.to_owned(),
            calls,
        }))
    }

    /// A call whose declared identity matches the recorded operation
    /// `operation_id` but whose request differs: answered from it by the
    /// tool's `on_rephrase`, or, when the earlier call ended without an
    /// effect (failed, cancelled), sent as the step's next version.
    async fn rephrased(
        &self,
        operation_id: &crate::intent::OperationId,
        intent: &Intent,
        tool: &crate::adapter::ResolvedTool,
        tasks: Option<&super::followers::TaskFollowers>,
        agent: Option<&crate::adapter::AgentSink>,
    ) -> Result<Rephrase, CallError> {
        let Some((record, recorded)) = self
            .ledger
            .operation_record_with_request(operation_id)
            .await?
        else {
            // Archived since (retention): nothing to answer from.
            return Err(CallError::InProgress {
                operation_id: operation_id.clone(),
            });
        };
        if matches!(
            record.status,
            OperationStatus::FailedFinal | OperationStatus::Cancelled
        ) {
            return Ok(Rephrase::NextVersion);
        }
        let original = super::outbox::is_original(&record, &recorded);
        let rephrased = Rephrased {
            identity: tool.adapter.identity.clone().unwrap_or_default(),
            // Only a request kept in full says which fields differ.
            differs: original
                .then(|| crate::intent::differing_fields(&recorded, &intent.request_body)),
        };
        // Registered, provably never sent (its send was refused): the same
        // effect is due, as the earlier call asked for it. Only a request
        // kept in full can be sent again.
        if record.status == OperationStatus::Prepared
            && original
            && tool.adapter.on_rephrase == crate::adapter::OnRephrase::Replay
        {
            return Ok(Rephrase::SendRecorded {
                arguments: recorded,
                digest: record.request_digest,
                rephrased,
            });
        }
        metrics::counter!("leasegate_rephrased_calls_total", "policy" => match tool.adapter.on_rephrase {
            crate::adapter::OnRephrase::Replay => "replay",
            crate::adapter::OnRephrase::Conflict => "conflict",
        })
        .increment(1);
        match tool.adapter.on_rephrase {
            crate::adapter::OnRephrase::Conflict => Err(CallError::Rephrased {
                operation_id: record.operation_id,
                status: record.status,
                rephrased,
            }),
            crate::adapter::OnRephrase::Replay => {
                let mut reply = self.existing(record, tasks, agent).await?;
                if let CallReply::Unknown { reason, .. } = &mut reply {
                    *reason = format!("{}; {reason}", rephrased.said());
                }
                remark(&mut reply, |remarks| remarks.rephrased = Some(rephrased));
                Ok(Rephrase::Answered(reply))
            }
        }
    }

    /// One register-and-claim statement of `intent` under `lease`.
    async fn register_claim(
        &self,
        lease: &LeaseClaim,
        intent: &Intent,
        route: &ToolRoute,
        claim_ttl_ms: i64,
    ) -> Result<(Fenced<InlineClaim>, Option<WalPosition>), LedgerError> {
        self.ledger
            .operation_register_claim_in(
                Some(&self.tenant),
                lease,
                intent,
                Some(route),
                &self.dispatch_owner,
                claim_ttl_ms,
            )
            .instrument(tracing::info_span!("ledger.operation_register_claim"))
            .await
    }

    /// The intent exists: replay, wait for it, or report it. An agent that
    /// follows tasks gets the handle of the task this process follows for
    /// it (`tasks`), rather than waiting for the task to end.
    ///
    /// While it waits for a call in flight, the agent hears progress
    /// (when its request carries a progress token): a client whose own
    /// timeout resets on progress keeps waiting, and one that shows it
    /// tells its user why.
    async fn existing(
        &self,
        mut record: OperationRecord,
        tasks: Option<&super::followers::TaskFollowers>,
        agent: Option<&crate::adapter::AgentSink>,
    ) -> Result<CallReply, CallError> {
        let started = tokio::time::Instant::now();
        let deadline = started + self.policy.in_flight_wait;
        let mut told = None::<tokio::time::Instant>;
        let mut pause = Duration::from_millis(25);
        // Whether the intent was still in flight when this call found it.
        let mut waited = false;
        loop {
            match record.status {
                OperationStatus::Succeeded | OperationStatus::FailedFinal => {
                    let recorded = record.result.clone().unwrap_or(Value::Null);
                    let result = if is_tool_result(&recorded) {
                        recorded
                    } else {
                        self.resolution_answer(&record, recorded).await
                    };
                    return Ok(CallReply::Answer {
                        is_error: record.status == OperationStatus::FailedFinal,
                        result,
                        operation: OperationNote {
                            operation_id: record.operation_id.clone(),
                            status: record.status,
                            replayed: true,
                            waited,
                            remarks: Default::default(),
                        },
                    });
                }
                OperationStatus::Unknown => {
                    return Ok(CallReply::Unknown {
                        operation_id: record.operation_id,
                        reason:
                            "the outcome of an earlier attempt is unknown; it is being reconciled"
                                .into(),
                    });
                }
                OperationStatus::Cancelled => {
                    return Err(CallError::Cancelled {
                        operation_id: record.operation_id,
                    });
                }
                OperationStatus::Dispatching => {
                    if let Some(handle) = tasks.and_then(|t| t.handle_of(&record.operation_id)) {
                        return Ok(CallReply::Task {
                            handle,
                            operation: OperationNote {
                                operation_id: record.operation_id,
                                status: record.status,
                                replayed: true,
                                waited,
                                remarks: Default::default(),
                            },
                        });
                    }
                }
                OperationStatus::Prepared => {}
            }
            // A claim whose deadline passed, or whose holder is provably
            // gone, will never be settled by its holder: turn it unknown
            // (the database judges both).
            let claim = record.claim();
            let lapsed = match &claim {
                Some(claim) if claim.until <= chrono::Utc::now() => true,
                Some(claim) => self.ledger.process_gone(&claim.dispatch_owner).await?,
                None => false,
            };
            if let Some(claim) = claim
                && lapsed
                && let MarkUnknownOutcome::MarkedUnknown { operation, .. } = self
                    .ledger
                    .operation_mark_unknown(MarkUnknown {
                        claim: &claim,
                        by: UnknownBy::Reconciler,
                        actor: &self.dispatch_owner,
                        cause: UnknownCause::TimedOut,
                        evidence: &json!({"reason": "claim expired or its holder is gone; found by a later call"}),
                    })
                    .await?
            {
                record = operation;
                continue;
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(CallError::InProgress {
                    operation_id: record.operation_id,
                });
            }
            waited = true;
            if let Some(agent) = agent
                && told.is_none_or(|at| at.elapsed() >= PROGRESS_EVERY)
            {
                told = Some(tokio::time::Instant::now());
                let _ = agent.send(crate::adapter::ToAgent::Progress(crate::adapter::Progress {
                    progress: started.elapsed().as_millis() as f64,
                    total: Some(self.policy.in_flight_wait.as_millis() as f64),
                    message: Some(format!(
                        "leasegate: an earlier call of this intent (operation {}) is in flight; \
                         waiting for its answer instead of sending it again",
                        record.operation_id
                    )),
                }));
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(250));
            record = match self.ledger.operation_record(&record.operation_id).await? {
                Some(found) => found,
                None => {
                    return Err(CallError::InProgress {
                        operation_id: record.operation_id,
                    });
                }
            };
        }
    }
}

/// How often a call waiting for the same intent in flight tells its agent.
const PROGRESS_EVERY: Duration = Duration::from_millis(250);

/// What a rephrased call gets (`Dispatcher::rephrased`).
enum Rephrase {
    Answered(CallReply),
    NextVersion,
    SendRecorded {
        arguments: Value,
        digest: crate::intent::RequestDigest,
        rephrased: Rephrased,
    },
}

/// Adds to the remarks of `reply`'s operation (an answer or a task handle).
fn remark(reply: &mut CallReply, add: impl FnOnce(&mut super::call::Remarks)) {
    if let CallReply::Answer { operation, .. } | CallReply::Task { operation, .. } = reply {
        add(&mut operation.remarks);
    }
}

/// Whether `value` is a tool result as a tool answers one (what the
/// dispatcher records); an operator's resolution records what the operator
/// gave, or nothing.
fn is_tool_result(value: &Value) -> bool {
    value.get("content").is_some_and(Value::is_array)
}

impl<U: Upstream> Dispatcher<U> {
    /// The answer a repeat of a settled intent gets when no tool answer is on
    /// record (an operator resolved it): the resolution itself — status, who,
    /// their note, the remote id, and what the operator recorded as the
    /// result — as a tool result, so the agent reads why.
    async fn resolution_answer(&self, record: &OperationRecord, recorded: Value) -> Value {
        let evidence = self
            .ledger
            .operation_evidence(&record.operation_id)
            .await
            .unwrap_or_default();
        let resolution = evidence
            .iter()
            .rev()
            .find(|e| e.kind == crate::ledger::EvidenceKind::Operator);
        let by = resolution.map(|e| e.source.clone());
        let note = resolution
            .and_then(|e| e.body.get("note"))
            .and_then(Value::as_str)
            .map(str::to_owned);
        let status = record.status.as_str();
        let mut text = match (&by, &note) {
            (Some(by), Some(note)) => {
                format!(
                    "operator {by} resolved operation {} as {status}: {note}",
                    record.operation_id
                )
            }
            _ => format!(
                "operation {} is {status} (no tool answer on record)",
                record.operation_id
            ),
        };
        if let Some(remote_id) = &record.remote_id {
            text.push_str(&format!(" (remote id {remote_id})"));
        }
        json!({
            "content": [{"type": "text", "text": text}],
            "isError": record.status == OperationStatus::FailedFinal,
            "structuredContent": {"resolution": {
                "status": status,
                "by": by,
                "note": note,
                "remote_id": record.remote_id,
                "at": resolution.map(|e| e.at),
                "result": recorded,
            }},
        })
    }
}

/// The length of `value` as compact JSON, without building the text.
fn serialized_len(value: &Map<String, Value>) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0 += bytes.len();
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    match serde_json::to_writer(&mut count, value) {
        Ok(()) => count.0,
        Err(_) => usize::MAX,
    }
}

/// Why the gate holds dispatch, as the caller is told: "durability hold"
/// only when the contract failed, "ledger unavailable" otherwise.
fn held(hold: Hold) -> CallError {
    match hold {
        Hold::Durability(reason) => CallError::Held { reason },
        Hold::LedgerUnavailable(reason) => CallError::LedgerUnreachable { reason },
    }
}

fn refusal(rejection: Rejection) -> CallError {
    match rejection {
        Rejection::LeaseLost { .. } => CallError::LeaseLost(Box::new(rejection)),
        Rejection::LeaseTokenInvalid { .. } => CallError::LeaseTokenInvalid(Box::new(rejection)),
        Rejection::Terminal { .. } | Rejection::WrongStatus { .. } | Rejection::Conflict { .. } => {
            CallError::RunTerminal(Box::new(rejection))
        }
        Rejection::NotFound => CallError::RunNotFound,
        Rejection::IntentConflict { .. } => CallError::IntentConflict(Box::new(rejection)),
    }
}
