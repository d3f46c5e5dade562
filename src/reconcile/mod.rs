//! Background work of every `leasegate serve` process, as three services:
//! the outbox dispatcher of planned intents (`dispatch::Outbox`, whose
//! passes are scheduled here), the expiry of
//! lapsed claims ([`ClaimExpiry`]), and the reconciler of unknown outcomes
//! ([`Reconciler`]). Each runs on its own interval (policy
//! `dispatch_interval`, `claim_expiry_interval`, `reconcile_interval`) and
//! counts its passes in a [`Signal`] tests can await (River's maintenance
//! services and test signals). Correct with one process or many, without a
//! leader: every piece of work is claimed in the database first (SKIP
//! LOCKED), and every write is guarded by that claim.
//!
//! The reconciler plans and then executes: [`plan`] decides from the
//! operation, its adapter and the evidence on record what to do (a pure
//! function with the decision table in its docs, tested row by row), and
//! [`Reconciler`] carries the step out (a query, a same-key retry) and asks
//! [`plan::judge_query`] / [`plan::judge_retry`] what the answer proves.
//!
//! # An upstream that is away
//!
//! While an upstream does not accept calls (a stdio child restarting, a
//! Streamable HTTP server down: `Upstream::accepting_calls`), queries and
//! same-key retries against it are deferred: nothing is sent, nothing is
//! counted, and the reconcile claim is handed back for the next pass
//! (`reconcile_interval`). A same-key retry that still meets a failure
//! proven not sent (the upstream went away between the check and the send)
//! gives its attempt back. The upstream's supervisor (stdio) or probe
//! (Streamable HTTP) marks it up again without the reconciler's help, so
//! deferred work is tried on the first pass after it is back.
//!
//! # Crash points
//!
//! A reconciler that dies holding a reconcile claim leaves the operation
//! `unknown`; the claim lapses and another process takes it. A retry that
//! went out but was not converged is counted (`reconcile_attempts`) and its
//! answer is found again by the next same-key retry or query. The outbox
//! (`dispatch::outbox`) and the expiry hold no state of their own: a crash
//! between claim and send leaves a `dispatching` row whose claim expires
//! into `unknown`.

pub mod judge;
pub mod plan;

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value, json};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::adapter::{
    ResolvedTool, SharedDirectory, ToolReply, Upstream, UpstreamCall, UpstreamDelivery,
};
use crate::dispatch::{Outbox, inject_operation_id, is_original, recorded_tool};
use crate::durability::DurabilityGate;
use crate::ledger::{
    Converge, ConvergeOutcome, Ledger, LedgerError, MarkUnknown, MarkUnknownOutcome, ReconcileItem,
    ResendVerdict, RetryVerdict, UnknownBy, UnknownCause,
};
use crate::policy::Policy;
use judge::{Judgement, RemoteFact, judge_query, judge_retry};
use plan::Step;

/// How many passes a service has completed; tests await it instead of
/// sleeping.
#[derive(Debug)]
pub struct Signal {
    passes: watch::Sender<u64>,
}

impl Default for Signal {
    fn default() -> Self {
        Self {
            passes: watch::Sender::new(0),
        }
    }
}

impl Signal {
    pub fn passes(&self) -> u64 {
        *self.passes.borrow()
    }

    /// Waits until at least `count` passes have completed.
    pub async fn reached(&self, count: u64) {
        let mut passes = self.passes.subscribe();
        // The sender lives as long as `self`: the wait cannot fail.
        let _ = passes.wait_for(|done| *done >= count).await;
    }

    fn pass(&self) {
        self.passes.send_modify(|done| *done += 1);
    }
}

/// The three services' signals.
#[derive(Debug, Default)]
pub struct Signals {
    pub dispatch: Signal,
    pub expiry: Signal,
    pub reconcile: Signal,
}

fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// What the services share: the ledger, the upstreams, the tool directory,
/// the policy and the owner name their claims carry.
struct Shared<U> {
    ledger: Ledger,
    upstream: Arc<U>,
    directory: Arc<SharedDirectory>,
    policy: Policy,
    owner: String,
    /// The tenants this process serves: it touches no other tenant's
    /// operations (their runs are refused by its front too).
    tenants: Vec<String>,
    /// While it holds, the outbox and the reconciler claim nothing.
    gate: Arc<DurabilityGate>,
}

impl<U> Shared<U> {
    fn tenants(&self) -> Option<&[String]> {
        Some(&self.tenants)
    }

    /// The tool a recorded operation goes to (`dispatch::recorded_tool`).
    fn resolve(&self, operation: &crate::ledger::OperationRecord) -> Option<ResolvedTool> {
        recorded_tool(&self.directory, operation)
    }
}

/// Turns `dispatching` operations whose claim lapsed into `unknown`.
pub struct ClaimExpiry<U>(Arc<Shared<U>>);

/// Converges `unknown` operations from evidence, per adapter capability.
pub struct Reconciler<U>(Arc<Shared<U>>);

/// The three services of one process, started and stopped together.
pub struct Background<U> {
    pub outbox: Outbox<U>,
    pub expiry: ClaimExpiry<U>,
    pub reconciler: Reconciler<U>,
    pub signals: Arc<Signals>,
}

impl<U: Upstream> Background<U> {
    /// The services of a process serving `tenant`, whose claims carry
    /// `owner` (the process's identity, `dispatch::process_owner`).
    pub fn new(
        ledger: Ledger,
        upstream: Arc<U>,
        directory: Arc<SharedDirectory>,
        policy: Policy,
        tenant: &str,
        owner: String,
    ) -> Self {
        Self::gated(
            ledger,
            upstream,
            directory,
            policy,
            tenant,
            owner,
            Arc::new(DurabilityGate::unchecked()),
        )
    }

    /// [`Background::new`] under the process's durability gate: while it
    /// holds, the outbox and the reconciler do not claim (claim expiry still
    /// turns lapsed claims unknown, which sends nothing).
    pub fn gated(
        ledger: Ledger,
        upstream: Arc<U>,
        directory: Arc<SharedDirectory>,
        policy: Policy,
        tenant: &str,
        owner: String,
        gate: Arc<DurabilityGate>,
    ) -> Self {
        let outbox = Outbox::new(
            ledger.clone(),
            upstream.clone(),
            directory.clone(),
            policy.claim_ttl,
            tenant,
            owner.clone(),
        );
        let shared = Arc::new(Shared {
            ledger,
            upstream,
            directory,
            policy,
            owner,
            tenants: vec![tenant.to_owned()],
            gate,
        });
        Self {
            outbox,
            expiry: ClaimExpiry(shared.clone()),
            reconciler: Reconciler(shared),
            signals: Arc::default(),
        }
    }

    /// Runs every service on its own interval until `stop` fires.
    pub fn spawn(self: Arc<Self>, stop: CancellationToken) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            let policy = &self.reconciler.0.policy;
            let services = [
                (policy.dispatch_interval, Service::Outbox),
                (policy.claim_expiry_interval, Service::Expiry),
                (policy.reconcile_interval, Service::Reconciler),
            ];
            let tasks: Vec<_> = services
                .into_iter()
                .map(|(every, service)| {
                    let background = self.clone();
                    let stop = stop.clone();
                    tokio::spawn(async move {
                        let mut tick = tokio::time::interval(every);
                        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                        loop {
                            tokio::select! {
                                _ = stop.cancelled() => return,
                                _ = tick.tick() => background.run_once(service).await,
                            }
                        }
                    })
                })
                .collect();
            for task in tasks {
                let _ = task.await;
            }
        })
    }

    async fn run_once(&self, service: Service) {
        if matches!(service, Service::Outbox | Service::Reconciler)
            && let Some(reason) = self
                .reconciler
                .0
                .gate
                .admit(&self.reconciler.0.ledger)
                .await
        {
            tracing::debug!(%reason, ?service, "dispatch held: not claiming");
            match service {
                Service::Outbox => self.signals.dispatch.pass(),
                _ => self.signals.reconcile.pass(),
            }
            return;
        }
        // One span per activation (`telemetry`): a root of its own trace.
        let span = tracing::info_span!(parent: None, "background.pass", loop = ?service, items = tracing::field::Empty);
        let (name, result, signal) = match service {
            Service::Outbox => (
                "dispatcher",
                self.outbox.once().instrument(span.clone()).await,
                &self.signals.dispatch,
            ),
            Service::Expiry => (
                "claim expiry",
                self.expiry.once().instrument(span.clone()).await,
                &self.signals.expiry,
            ),
            Service::Reconciler => (
                "reconciler",
                self.reconciler.once().instrument(span.clone()).await,
                &self.signals.reconcile,
            ),
        };
        if let Ok(items) = &result {
            span.record("items", *items as u64);
        }
        if let Err(error) = result {
            tracing::warn!(error = %crate::logfield::clip_display(&error), "{name} pass failed");
        }
        signal.pass();
    }
}

#[derive(Debug, Clone, Copy)]
enum Service {
    Outbox,
    Expiry,
    Reconciler,
}

impl<U: Upstream> ClaimExpiry<U> {
    /// One pass. Returns how many operations turned unknown.
    pub async fn once(&self) -> Result<usize, LedgerError> {
        let shared = &self.0;
        let expired = shared
            .ledger
            .operations_expired_claims(100, shared.tenants())
            .await?;
        let mut marked = 0;
        for claim in expired {
            let outcome = shared
                .ledger
                .operation_mark_unknown(MarkUnknown {
                    claim: &claim,
                    by: UnknownBy::Reconciler,
                    actor: &shared.owner,
                    cause: UnknownCause::TimedOut,
                    evidence: &json!({"reason": "claim expired"}),
                })
                .await?;
            if let MarkUnknownOutcome::MarkedUnknown { .. } = outcome {
                tracing::warn!(operation_id = %claim.operation_id, dispatch_owner = %crate::logfield::clip(&claim.dispatch_owner),
                    "claim expired without an answer: operation is unknown");
                metrics::counter!("tool_operation_unknown_total", "cause" => "claim_expired")
                    .increment(1);
                marked += 1;
            }
        }
        Ok(marked)
    }
}

/// How one reconcile of one operation ended (a metric label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReconcileOutcome {
    Converged,
    /// Another reconciler holds the operation now (or the claim lapsed).
    LostClaim,
    NeedsOperator(&'static str),
    /// Nothing proven yet; tried again on a later pass.
    StaysUnknown(&'static str),
    /// Past the provider's key retention window: never retried.
    WindowPassed,
    BudgetSpent,
    /// The tool did not know it: handed back to the dispatcher to be sent
    /// again under the same operation id.
    Resent,
}

impl ReconcileOutcome {
    pub fn label(self) -> &'static str {
        match self {
            ReconcileOutcome::Converged => "converged",
            ReconcileOutcome::LostClaim => "lost_claim",
            ReconcileOutcome::NeedsOperator(_) => "needs_operator",
            ReconcileOutcome::StaysUnknown(reason) => reason,
            ReconcileOutcome::WindowPassed => "window_passed",
            ReconcileOutcome::BudgetSpent => "budget_spent",
            ReconcileOutcome::Resent => "resent",
        }
    }
}

impl<U: Upstream> Reconciler<U> {
    /// One pass over the unknown operations it can claim. Returns how many
    /// converged.
    pub async fn once(&self) -> Result<usize, LedgerError> {
        let shared = &self.0;
        let items = shared
            .ledger
            .operation_reconcile_claim(
                &shared.owner,
                millis(shared.policy.reconcile_claim_ttl),
                16,
                shared.tenants(),
            )
            .await?;
        let mut converged = 0;
        for item in items {
            let span = tracing::info_span!("reconcile.operation", operation_id = %item.operation.operation_id,
                run_id = %item.operation.run_id, tool = %crate::logfield::clip(&item.operation.tool_name),
                outcome = tracing::field::Empty);
            let reconciled = self.reconcile(&item).instrument(span.clone()).await;
            if let Ok(outcome) = &reconciled {
                span.record("outcome", outcome.label());
            }
            let outcome = match reconciled {
                Ok(outcome) => outcome,
                // One row this process cannot open (its key is missing)
                // does not stop the others; it is reported each pass.
                Err(error @ LedgerError::Sealed { .. }) => {
                    tracing::error!(operation_id = %item.operation.operation_id, %error,
                        "unknown operation left alone: its stored evidence cannot be opened");
                    continue;
                }
                Err(error) => return Err(error),
            };
            metrics::counter!("reconcile_total", "outcome" => outcome.label()).increment(1);
            match outcome {
                ReconcileOutcome::Converged => converged += 1,
                // Nothing proven this time: look again on a later pass, not
                // only after the whole claim ttl.
                ReconcileOutcome::StaysUnknown(_) => {
                    shared
                        .ledger
                        .operation_reconcile_release(
                            &item.operation.operation_id,
                            &shared.owner,
                            millis(shared.policy.reconcile_interval),
                        )
                        .await?;
                }
                _ => {}
            }
        }
        if let Ok(summary) = shared.ledger.operations_unknown_summary().await {
            metrics::gauge!("tool_operation_unknown_count").set(summary.count as f64);
            metrics::gauge!("tool_operation_unknown_oldest_age_seconds")
                .set(summary.oldest_age_seconds.unwrap_or(0.0));
        }
        Ok(converged)
    }

    /// Plans the next step from what is on record, then executes it.
    async fn reconcile(&self, item: &ReconcileItem) -> Result<ReconcileOutcome, LedgerError> {
        let shared = &self.0;
        let operation = &item.operation;
        let evidence = shared
            .ledger
            .operation_evidence(&operation.operation_id)
            .await?;
        let tool = shared.resolve(operation);
        let mut step = plan::plan(
            operation,
            tool.as_ref().map(|t| &t.adapter),
            &evidence,
            &item.request_body,
        );
        if let Step::FollowTask { upstream, task_id } = &step {
            if !shared.upstream.accepting_calls(upstream) {
                return Ok(ReconcileOutcome::StaysUnknown("upstream_unavailable"));
            }
            let timeout = tool
                .as_ref()
                .map_or(crate::adapter::DEFAULT_TIMEOUT, |t| t.adapter.timeout);
            let state = match shared.upstream.task_state(upstream, task_id, timeout).await {
                Ok(poll) => Some(poll.state),
                Err(error) => {
                    tracing::info!(operation_id = %operation.operation_id, task_id = %crate::logfield::clip(task_id),
                        error = %crate::logfield::clip_display(&error), "the task's upstream could not say where it stands");
                    None
                }
            };
            match plan::judge_task(tool.as_ref().map(|t| &t.adapter), task_id, state.as_ref()) {
                Some(judgement) => return self.judged(item, operation.revision, judgement).await,
                None => {
                    step = plan::plan_by_capability(
                        operation,
                        tool.as_ref().map(|t| &t.adapter),
                        &item.request_body,
                    )
                }
            }
        }
        match step {
            // Replaced above by the task's judgement or the capability's plan.
            Step::FollowTask { .. } => Ok(ReconcileOutcome::StaysUnknown("task_working")),
            Step::Converge(fact) => self.converge(item, operation.revision, fact).await,
            Step::NeedsOperator(reason) => {
                tracing::warn!(operation_id = %operation.operation_id, tool = %crate::logfield::clip(&operation.tool_name), reason,
                    "unknown outcome leasegate cannot settle: an operator must resolve it (leasegate ops resolve)");
                metrics::counter!("tool_operation_needs_operator_total").increment(1);
                Ok(ReconcileOutcome::NeedsOperator(reason))
            }
            Step::Query { .. } | Step::RetrySameKey
                if tool
                    .as_ref()
                    .is_some_and(|t| !shared.upstream.accepting_calls(&t.upstream)) =>
            {
                // Deferred, not counted: a stdio child restarting or a
                // Streamable HTTP server down; its probe marks it up again,
                // and the claim is handed back for the next pass.
                Ok(ReconcileOutcome::StaysUnknown("upstream_unavailable"))
            }
            Step::Query { spec, by } => {
                let tool = tool.expect("planned from an adapter");
                self.query(item, &tool, &spec, by).await
            }
            Step::RetrySameKey => {
                let tool = tool.expect("planned from an adapter");
                self.retry_same_key(item, &tool).await
            }
        }
    }

    async fn converge(
        &self,
        item: &ReconcileItem,
        revision: i64,
        fact: RemoteFact,
    ) -> Result<ReconcileOutcome, LedgerError> {
        let shared = &self.0;
        let outcome = shared
            .ledger
            .operation_converge(Converge {
                operation_id: &item.operation.operation_id,
                expected_revision: revision,
                settlement: fact.settlement,
                remote_id: fact.remote_id.as_deref(),
                result: Some(&fact.result),
                kind: fact.kind,
                actor: &shared.owner,
                note: None,
                evidence: &fact.evidence,
            })
            .await?;
        Ok(match outcome {
            ConvergeOutcome::Converged { .. } => {
                tracing::info!(operation_id = %item.operation.operation_id, kind = fact.kind.as_str(),
                    settlement = fact.settlement.as_str(), "unknown operation converged");
                ReconcileOutcome::Converged
            }
            _ => ReconcileOutcome::LostClaim,
        })
    }

    async fn judged(
        &self,
        item: &ReconcileItem,
        revision: i64,
        judgement: Judgement,
    ) -> Result<ReconcileOutcome, LedgerError> {
        match judgement {
            Judgement::Converge(fact) => self.converge(item, revision, fact).await,
            Judgement::StaysUnknown(reason) => {
                tracing::info!(operation_id = %item.operation.operation_id, reason,
                    "nothing proven yet: the operation stays unknown");
                Ok(ReconcileOutcome::StaysUnknown(reason))
            }
            Judgement::Resend { .. } if !is_original(&item.operation, &item.request_body) => {
                // The outbox would send what is stored: a masked copy.
                tracing::warn!(operation_id = %item.operation.operation_id,
                    "the tool does not know it, but the stored arguments are masked: an operator must resolve it (leasegate ops resolve)");
                metrics::counter!("tool_operation_needs_operator_total").increment(1);
                Ok(ReconcileOutcome::NeedsOperator("arguments_masked"))
            }
            Judgement::Resend { settle, evidence } => {
                let shared = &self.0;
                let verdict = shared
                    .ledger
                    .operation_reconcile_resend(
                        &item.operation,
                        &shared.owner,
                        millis(settle),
                        shared.policy.reconcile_retries,
                        &evidence,
                    )
                    .await?;
                Ok(match verdict {
                    ResendVerdict::Resent => {
                        tracing::info!(operation_id = %item.operation.operation_id,
                            "the tool does not know it: sent again under the same operation id");
                        ReconcileOutcome::Resent
                    }
                    ResendVerdict::Settling => ReconcileOutcome::StaysUnknown("not_found_settling"),
                    ResendVerdict::BudgetSpent => ReconcileOutcome::BudgetSpent,
                    ResendVerdict::StaleClaim => ReconcileOutcome::LostClaim,
                })
            }
        }
    }

    async fn query(
        &self,
        item: &ReconcileItem,
        tool: &ResolvedTool,
        query: &crate::adapter::QuerySpec,
        by: Value,
    ) -> Result<ReconcileOutcome, LedgerError> {
        let mut arguments = Map::new();
        arguments.insert(query.argument.clone(), by);
        let call = UpstreamCall {
            upstream: tool.upstream.clone(),
            tool: query.tool.clone(),
            arguments,
            meta: Map::new(),
            timeout: tool.adapter.timeout,
            agent: None,
            cancel: CancellationToken::new(),
            tasks: false,
        };
        let answer = self
            .0
            .upstream
            .call(call)
            .await
            .and_then(ToolReply::into_answer)
            .ok();
        let judgement = judge_query(
            tool.adapter.capability,
            query,
            answer.as_ref(),
            &item.request_body,
        );
        self.judged(item, item.operation.revision, judgement).await
    }

    async fn retry_same_key(
        &self,
        item: &ReconcileItem,
        tool: &ResolvedTool,
    ) -> Result<ReconcileOutcome, LedgerError> {
        let shared = &self.0;
        let retention = tool.adapter.key_retention.unwrap_or_default();
        let verdict = shared
            .ledger
            .operation_reconcile_attempt(
                &item.operation,
                &shared.owner,
                millis(retention),
                shared.policy.reconcile_retries,
            )
            .await?;
        let revision = match verdict {
            RetryVerdict::Attempt { revision } => revision,
            RetryVerdict::WindowPassed => {
                tracing::warn!(operation_id = %item.operation.operation_id,
                    "past the provider's key retention window: never retried (a reused key would be a new request)");
                return Ok(ReconcileOutcome::WindowPassed);
            }
            RetryVerdict::BudgetSpent => return Ok(ReconcileOutcome::BudgetSpent),
            RetryVerdict::StaleClaim => return Ok(ReconcileOutcome::LostClaim),
        };
        let Value::Object(mut arguments) = item.request_body.clone() else {
            tracing::error!(operation_id = %item.operation.operation_id, "no stored arguments to retry with");
            return Ok(ReconcileOutcome::NeedsOperator("no_arguments"));
        };
        if !is_original(&item.operation, &item.request_body) {
            // Never a masked placeholder to the provider (plan checks this
            // first; this is the last line before the send).
            tracing::error!(operation_id = %item.operation.operation_id,
                "stored arguments are not the request (masked): not retried");
            return Ok(ReconcileOutcome::NeedsOperator("arguments_masked"));
        }
        let mut meta = Map::new();
        inject_operation_id(
            &item.operation.operation_id,
            &tool.adapter.placement,
            &mut arguments,
            &mut meta,
        );
        let call = UpstreamCall {
            upstream: tool.upstream.clone(),
            tool: tool.tool.clone(),
            arguments,
            meta,
            timeout: tool.adapter.timeout,
            agent: None,
            cancel: CancellationToken::new(),
            tasks: false,
        };
        // If we crash here the attempt is counted and the key is the same:
        // the next retry finds the provider's record.
        let answer = match shared
            .upstream
            .call(call)
            .await
            .and_then(ToolReply::into_answer)
        {
            Ok(answer) => Some(answer),
            Err(error) if error.delivery() == UpstreamDelivery::NotSent => {
                // Given back rather than never taken: the ledger counts an
                // attempt before it leaves, so a crash cannot hide one.
                tracing::warn!(operation_id = %item.operation.operation_id, error = %crate::logfield::clip_display(&error),
                    "same-key retry not sent (upstream down); the attempt is given back");
                shared
                    .ledger
                    .operation_reconcile_refund(
                        &item.operation.operation_id,
                        &shared.owner,
                        revision,
                    )
                    .await?;
                return Ok(ReconcileOutcome::StaysUnknown("retry_not_sent"));
            }
            Err(error) => {
                tracing::warn!(operation_id = %item.operation.operation_id, error = %crate::logfield::clip_display(&error), "same-key retry got no answer");
                None
            }
        };
        let judgement = judge_retry(&tool.adapter, answer, item.reconcile_attempts + 1);
        self.judged(item, revision, judgement).await
    }
}
