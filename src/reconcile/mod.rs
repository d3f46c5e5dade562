//! Background loops of every `leasegate serve` process: the dispatcher of
//! planned intents, the expiry of lapsed claims, and the reconciler of
//! unknown outcomes. Correct with one process or many, without a leader:
//! every piece of work is claimed in the database first (SKIP LOCKED), and
//! every write is guarded by that claim.
//!
//! # Reconciler, by adapter capability
//!
//! - A late response kept as evidence (same request digest) converges the
//!   operation first, whatever the capability.
//! - `operation_query`: ask the tool's query operation by operation id;
//!   found → the remote fact; not found → stays unknown (the remote may not
//!   know yet).
//! - `resource_id`: query the deterministic resource, and converge only if
//!   the `match_fields` agree with the intent's request.
//! - `idempotency_key`: retry with the same key, only inside the provider's
//!   retention window (from the first dispatch, database clock) and within
//!   the retry budget; each attempt is counted before it leaves. Past the
//!   window it never retries: a reused key after pruning is a new request.
//! - `none`: stays unknown; logged and counted for an operator.
//!
//! # Crash points
//!
//! A reconciler that dies holding a reconcile claim leaves the operation
//! `unknown`; the claim lapses and another process takes it. A retry that
//! went out but was not converged is counted (`reconcile_attempts`) and its
//! answer is found again by the next same-key retry or query.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

use crate::adapter::{Capability, ResolvedTool, SharedDirectory, Upstream, UpstreamCall};
use crate::dispatch::{UpstreamTarget, execute_claim, inject_operation_id, remote_id_of};
use crate::ledger::{
    Converge, ConvergeEvidence, ConvergeOutcome, EvidenceKind, Ledger, LedgerError, MarkUnknown,
    ReconcileItem, RetryVerdict, Settlement, UnknownBy, UnknownCause,
};
use crate::policy::Policy;

/// Counters tests wait on (river's "test signals"): each pass completed.
#[derive(Debug, Default)]
pub struct Signals {
    pub dispatch_passes: AtomicU64,
    pub expiry_passes: AtomicU64,
    pub reconcile_passes: AtomicU64,
}

/// What the remote says happened, and how leasegate learned it.
struct RemoteFact {
    settlement: Settlement,
    remote_id: Option<String>,
    result: Value,
    kind: ConvergeEvidence,
    evidence: Value,
}

/// The background loops of one process.
pub struct Background<U> {
    ledger: Ledger,
    upstream: Arc<U>,
    directory: Arc<SharedDirectory>,
    policy: Policy,
    /// Unique per process: the dispatch and reconcile claims it takes.
    owner: String,
    pub signals: Arc<Signals>,
}

fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

impl<U: Upstream> Background<U> {
    pub fn new(
        ledger: Ledger,
        upstream: Arc<U>,
        directory: Arc<SharedDirectory>,
        policy: Policy,
    ) -> Self {
        let owner = format!(
            "leasegate-bg-{}-{}",
            std::process::id(),
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        );
        Self {
            ledger,
            upstream,
            directory,
            policy,
            owner,
            signals: Arc::default(),
        }
    }

    /// Runs the loops until `stop` fires.
    pub fn spawn(self: Arc<Self>, stop: CancellationToken) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            let mut dispatch = tokio::time::interval(self.policy.dispatch_interval);
            let mut reconcile = tokio::time::interval(self.policy.reconcile_interval);
            dispatch.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            reconcile.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = dispatch.tick() => {
                        if let Err(error) = self.dispatch_once().await {
                            tracing::warn!(%error, "dispatcher pass failed");
                        }
                    }
                    _ = reconcile.tick() => {
                        if let Err(error) = self.expire_once().await {
                            tracing::warn!(%error, "claim expiry pass failed");
                        }
                        if let Err(error) = self.reconcile_once().await {
                            tracing::warn!(%error, "reconciler pass failed");
                        }
                    }
                }
            }
        })
    }

    fn resolve(&self, tool: &str) -> Option<ResolvedTool> {
        self.directory.get(tool)
    }

    /// Claims planned (prepared) intents of live runs and sends them, each
    /// exactly like the inline path. Returns how many were claimed.
    pub async fn dispatch_once(&self) -> Result<usize, LedgerError> {
        let claim_ttl = millis(self.policy.claim_ttl);
        let claimed = self
            .ledger
            .operation_claim(&self.owner, claim_ttl, 16)
            .await?;
        let count = claimed.len();
        let mut sends = Vec::with_capacity(count);
        for item in claimed {
            let operation_id = item.operation.operation_id.clone();
            let Some(resolved) = self.resolve(&item.operation.tool_name) else {
                // Claimed but not sendable: the claim lapses into unknown and
                // an operator sees why.
                tracing::error!(operation_id = %operation_id, tool = %item.operation.tool_name,
                    "planned intent names a tool no upstream offers; it will turn unknown");
                metrics::counter!("dispatch_total", "outcome" => "unknown_tool").increment(1);
                continue;
            };
            let Value::Object(arguments) = item.request_body else {
                tracing::error!(operation_id = %operation_id,
                    "planned intent has no stored arguments (data policy); it will turn unknown");
                metrics::counter!("dispatch_total", "outcome" => "no_arguments").increment(1);
                continue;
            };
            let target = UpstreamTarget {
                upstream: resolved.upstream,
                tool: resolved.tool,
                arguments,
                adapter: resolved.adapter,
                meta: Map::new(),
                agent: None,
                cancel: CancellationToken::new(),
            };
            sends.push(tokio::spawn(execute_claim(
                self.ledger.clone(),
                self.upstream.clone(),
                self.owner.clone(),
                item.claim,
                target,
            )));
        }
        for send in sends {
            let outcome = match send.await {
                Ok(Ok(crate::dispatch::CallReply::Answer { .. })) => "settled",
                Ok(Ok(crate::dispatch::CallReply::Unknown { .. })) => "unknown",
                Ok(Err(_)) | Err(_) => "error",
            };
            metrics::counter!("dispatch_total", "outcome" => outcome).increment(1);
        }
        self.signals.dispatch_passes.fetch_add(1, Ordering::SeqCst);
        Ok(count)
    }

    /// Turns `dispatching` operations whose claim lapsed into `unknown`.
    pub async fn expire_once(&self) -> Result<usize, LedgerError> {
        let expired = self.ledger.operations_expired_claims(100).await?;
        let mut marked = 0;
        for claim in expired {
            let outcome = self
                .ledger
                .operation_mark_unknown(MarkUnknown {
                    claim: &claim,
                    by: UnknownBy::Reconciler,
                    actor: &self.owner,
                    cause: UnknownCause::TimedOut,
                    evidence: &json!({"reason": "claim expired"}),
                })
                .await?;
            if matches!(
                outcome,
                crate::ledger::MarkUnknownOutcome::MarkedUnknown { .. }
            ) {
                tracing::warn!(operation_id = %claim.operation_id, dispatch_owner = %claim.dispatch_owner,
                    "claim expired without an answer: operation is unknown");
                metrics::counter!("tool_operation_unknown_total", "cause" => "claim_expired")
                    .increment(1);
                marked += 1;
            }
        }
        self.signals.expiry_passes.fetch_add(1, Ordering::SeqCst);
        Ok(marked)
    }

    /// One reconciler pass over the unknown operations it can claim.
    /// Returns how many converged.
    pub async fn reconcile_once(&self) -> Result<usize, LedgerError> {
        let claim_ttl = millis(self.policy.reconcile_claim_ttl);
        let items = self
            .ledger
            .operation_reconcile_claim(&self.owner, claim_ttl, 16)
            .await?;
        let mut converged = 0;
        for item in items {
            let outcome = self.reconcile(item).await?;
            metrics::counter!("reconcile_total", "outcome" => outcome).increment(1);
            if outcome == "converged" {
                converged += 1;
            }
        }
        if let Ok(summary) = self.ledger.operations_unknown_summary().await {
            metrics::gauge!("tool_operation_unknown_count").set(summary.count as f64);
            metrics::gauge!("tool_operation_unknown_oldest_age_seconds")
                .set(summary.oldest_age_seconds.unwrap_or(0.0));
        }
        self.signals.reconcile_passes.fetch_add(1, Ordering::SeqCst);
        Ok(converged)
    }

    async fn converge(
        &self,
        item: &ReconcileItem,
        revision: i64,
        fact: RemoteFact,
    ) -> Result<&'static str, LedgerError> {
        let outcome = self
            .ledger
            .operation_converge(Converge {
                operation_id: &item.operation.operation_id,
                expected_revision: revision,
                settlement: fact.settlement,
                remote_id: fact.remote_id.as_deref(),
                result: Some(&fact.result),
                kind: fact.kind,
                actor: &self.owner,
                note: None,
                evidence: &fact.evidence,
            })
            .await?;
        Ok(match outcome {
            ConvergeOutcome::Converged { .. } => {
                tracing::info!(operation_id = %item.operation.operation_id, kind = fact.kind.as_str(),
                    settlement = fact.settlement.as_str(), "unknown operation converged");
                "converged"
            }
            _ => "lost_claim",
        })
    }

    async fn reconcile(&self, item: ReconcileItem) -> Result<&'static str, LedgerError> {
        let operation = &item.operation;
        // A late answer to the very request counts as evidence.
        if let Some(view) = self.ledger.operation_get(&operation.operation_id).await? {
            let late = view.evidence.iter().rev().find(|e| {
                e.kind == EvidenceKind::LateResponse
                    && matches!(e.outcome.as_deref(), Some("succeeded" | "failed_final"))
                    && e.body.get("request_digest").and_then(Value::as_str)
                        == Some(operation.request_digest.as_str())
            });
            if let Some(late) = late {
                let result = late.body.get("result").cloned().unwrap_or(Value::Null);
                let fact = RemoteFact {
                    settlement: if late.outcome.as_deref() == Some("succeeded") {
                        Settlement::Succeeded
                    } else {
                        Settlement::FailedFinal
                    },
                    remote_id: late.remote_id.clone(),
                    result,
                    kind: ConvergeEvidence::LateResponse,
                    evidence: json!({"late_evidence_id": late.evidence_id}),
                };
                return self.converge(&item, operation.revision, fact).await;
            }
        }
        let Some(resolved) = self.resolve(&operation.tool_name) else {
            tracing::error!(operation_id = %operation.operation_id, tool = %operation.tool_name,
                "unknown operation of a tool no upstream offers: needs an operator");
            return Ok("needs_operator");
        };
        match resolved.adapter.capability {
            Capability::None => {
                tracing::warn!(operation_id = %operation.operation_id, tool = %operation.tool_name,
                    "unknown outcome of a tool that promises nothing: an operator must resolve it \
                     (leasegate ops resolve)");
                metrics::counter!("tool_operation_needs_operator_total").increment(1);
                Ok("needs_operator")
            }
            Capability::OperationQuery | Capability::ResourceId => {
                self.query(&item, &resolved).await
            }
            Capability::IdempotencyKey => self.retry_same_key(&item, &resolved).await,
        }
    }

    async fn query(
        &self,
        item: &ReconcileItem,
        resolved: &ResolvedTool,
    ) -> Result<&'static str, LedgerError> {
        let Some(query) = resolved.adapter.query.clone() else {
            return Ok("needs_operator");
        };
        let mut arguments = Map::new();
        arguments.insert(
            query.argument.clone(),
            json!(item.operation.operation_id.as_str()),
        );
        let call = UpstreamCall {
            upstream: resolved.upstream.clone(),
            tool: query.tool.clone(),
            arguments,
            meta: Map::new(),
            timeout: resolved.adapter.timeout,
            agent: None,
            cancel: CancellationToken::new(),
        };
        let answer = match self.upstream.call(call).await {
            Ok(answer) if !answer.is_error => answer,
            Ok(_) | Err(_) => return Ok("query_failed"),
        };
        let structured = answer
            .result
            .get("structuredContent")
            .cloned()
            .unwrap_or(Value::Null);
        if structured.pointer(&query.found_pointer) != Some(&Value::Bool(true)) {
            return Ok("not_known_remotely");
        }
        let resource = match &query.resource_pointer {
            Some(pointer) => structured.pointer(pointer).cloned().unwrap_or(Value::Null),
            None => structured.clone(),
        };
        if resolved.adapter.capability == Capability::ResourceId {
            let mismatched: Vec<&String> = query
                .match_fields
                .iter()
                .filter(|field| {
                    resource.get(field.as_str()) != item.request_body.get(field.as_str())
                })
                .collect();
            if !mismatched.is_empty() {
                tracing::error!(operation_id = %item.operation.operation_id, fields = ?mismatched,
                    "the resource found does not match the intent: not converged");
                return Ok("resource_mismatch");
            }
        }
        let remote_id = query
            .remote_id_pointer
            .as_deref()
            .and_then(|pointer| structured.pointer(pointer))
            .map(|v| {
                v.as_str()
                    .map(str::to_owned)
                    .unwrap_or_else(|| v.to_string())
            });
        let fact = RemoteFact {
            settlement: Settlement::Succeeded,
            remote_id,
            result: json!({"structuredContent": resource, "content": answer.result.get("content"), "isError": false}),
            kind: ConvergeEvidence::QueryResult,
            evidence: json!({"query_tool": query.tool}),
        };
        self.converge(item, item.operation.revision, fact).await
    }

    async fn retry_same_key(
        &self,
        item: &ReconcileItem,
        resolved: &ResolvedTool,
    ) -> Result<&'static str, LedgerError> {
        let retention = resolved.adapter.key_retention.unwrap_or_default();
        let verdict = self
            .ledger
            .operation_reconcile_attempt(
                &item.operation,
                &self.owner,
                millis(retention),
                self.policy.reconcile_retries,
            )
            .await?;
        let revision = match verdict {
            RetryVerdict::Attempt { revision } => revision,
            RetryVerdict::WindowPassed => {
                tracing::warn!(operation_id = %item.operation.operation_id,
                    "past the provider's key retention window: never retried (a reused key would be a new request)");
                return Ok("window_passed");
            }
            RetryVerdict::BudgetSpent => return Ok("budget_spent"),
            RetryVerdict::StaleClaim => return Ok("lost_claim"),
        };
        let Value::Object(mut arguments) = item.request_body.clone() else {
            tracing::error!(operation_id = %item.operation.operation_id, "no stored arguments to retry with");
            return Ok("no_arguments");
        };
        let mut meta = Map::new();
        inject_operation_id(
            &item.operation.operation_id,
            &resolved.adapter.placement,
            &mut arguments,
            &mut meta,
        );
        let call = UpstreamCall {
            upstream: resolved.upstream.clone(),
            tool: resolved.tool.clone(),
            arguments,
            meta,
            timeout: resolved.adapter.timeout,
            agent: None,
            cancel: CancellationToken::new(),
        };
        // If we crash here the attempt is counted and the key is the same:
        // the next retry finds the provider's record.
        let answer = match self.upstream.call(call).await {
            Ok(answer) => answer,
            Err(error) => {
                tracing::warn!(operation_id = %item.operation.operation_id, %error, "same-key retry got no answer");
                return Ok("retry_failed");
            }
        };
        let fact = RemoteFact {
            settlement: if answer.is_error {
                Settlement::FailedFinal
            } else {
                Settlement::Succeeded
            },
            remote_id: remote_id_of(
                resolved.adapter.remote_id_pointer.as_deref(),
                &answer.result,
            ),
            result: answer.result,
            kind: ConvergeEvidence::RetryResult,
            evidence: json!({"attempt": item.reconcile_attempts + 1}),
        };
        self.converge(item, revision, fact).await
    }
}
