//! The outbox: operations planned for later (`prepared`, of live runs,
//! including those released as provably unsent and those the reconciler
//! hands back to be sent again) are claimed here and sent exactly like the
//! inline path sends them ([`execute_claim`]). One pass claims a batch; the
//! background service of `crate::reconcile` runs a pass every
//! `dispatch_interval` while the durability gate lets it.
//!
//! # Invariants
//!
//! - Nothing is sent without a claim committed first (SKIP LOCKED: correct
//!   with one process or many, without a leader).
//! - Only the request itself is sent, never a masked placeholder
//!   ([`is_original`]): a stored body that is not the request is left to
//!   turn unknown, and an operator sees why.
//!
//! # Crash points
//!
//! The outbox holds no state of its own: a crash between claim and send
//! leaves a `dispatching` row whose claim expires into `unknown`.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tracing::Instrument;

use super::call::{CallContext, CallReply};
use super::execute::{Claimed, execute_claim};
use crate::adapter::{ResolvedTool, SharedDirectory, Upstream};
use crate::intent::{IntegerPolicy, request_digest};
use crate::ledger::{Ledger, LedgerError, OperationRecord};

/// Most planned operations one pass claims.
const BATCH: u16 = 16;

/// Claims planned (`prepared`) intents of live runs and sends them, each
/// exactly like the inline path ([`execute_claim`]).
pub struct Outbox<U> {
    ledger: Ledger,
    upstream: Arc<U>,
    directory: Arc<SharedDirectory>,
    /// How long a claim taken here lasts (the policy's `claim_ttl`).
    claim_ttl: Duration,
    /// This process's identity on the claims it takes.
    owner: String,
    /// The tenants this process serves: it touches no other tenant's
    /// operations (their runs are refused by its front too).
    tenants: Vec<String>,
    /// The upstreams that took no calls at the last pass: one that is back
    /// wakes what waited for it.
    unavailable: std::sync::Mutex<Vec<String>>,
}

impl<U: Upstream> Outbox<U> {
    /// The outbox of a process serving `tenant`, whose claims carry `owner`
    /// (the process's identity, [`super::process_owner`]) and last
    /// `claim_ttl`.
    pub fn new(
        ledger: Ledger,
        upstream: Arc<U>,
        directory: Arc<SharedDirectory>,
        claim_ttl: Duration,
        tenant: &str,
        owner: String,
    ) -> Self {
        Self {
            ledger,
            upstream,
            directory,
            claim_ttl,
            owner,
            tenants: vec![tenant.to_owned()],
            unavailable: Default::default(),
        }
    }

    /// One pass. Returns how many intents were claimed.
    ///
    /// Operations routed to an upstream that takes no calls now (a stdio
    /// child restarting, an HTTP server refusing connections) are not
    /// claimed: nothing could reach it, and a send would only add "not
    /// sent" backoff. When such an upstream is back, its prepared
    /// operations are woken from that backoff first.
    pub async fn once(&self) -> Result<usize, LedgerError> {
        let claim_ttl_ms = i64::try_from(self.claim_ttl.as_millis()).unwrap_or(i64::MAX);
        let unavailable = self.upstream.unavailable();
        let back: Vec<String> = {
            let mut last = self.unavailable.lock().unwrap_or_else(|e| e.into_inner());
            let back = last
                .iter()
                .filter(|name| !unavailable.contains(name))
                .cloned()
                .collect();
            *last = unavailable.clone();
            back
        };
        for upstream in back {
            match self
                .ledger
                .operation_wake_prepared(&upstream, Some(self.tenants.as_slice()))
                .await
            {
                Ok(woken) => {
                    tracing::info!(upstream = %crate::logfield::clip(&upstream), woken, "upstream back: its waiting calls go now");
                }
                Err(error) => {
                    // Their backoff still ends on its own.
                    tracing::warn!(upstream = %crate::logfield::clip(&upstream), error = %crate::logfield::clip_display(&error), "could not wake the calls waiting for an upstream");
                    self.unavailable
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(upstream);
                }
            }
        }
        let claimed = self
            .ledger
            .operation_claim(
                &self.owner,
                claim_ttl_ms,
                BATCH,
                Some(self.tenants.as_slice()),
                &unavailable,
            )
            .await?;
        let count = claimed.len();
        let mut sends = Vec::with_capacity(count);
        for item in claimed {
            let operation_id = item.operation.operation_id.clone();
            let Some(tool) = recorded_tool(&self.directory, &item.operation) else {
                // Claimed but not sendable: the claim lapses into unknown and
                // an operator sees why.
                tracing::error!(operation_id = %operation_id, tool = %crate::logfield::clip(&item.operation.tool_name),
                    "planned intent names a tool no upstream offers; it will turn unknown");
                metrics::counter!("dispatch_total", "outcome" => "unknown_tool").increment(1);
                continue;
            };
            // Only the request itself is sent (invariant: never a masked
            // placeholder); planned intents under a policy that keeps less
            // are refused when registered.
            let Value::Object(arguments) = item.request_body.clone() else {
                tracing::error!(operation_id = %operation_id,
                    "planned intent has no stored arguments (data policy); it will turn unknown");
                metrics::counter!("dispatch_total", "outcome" => "no_arguments").increment(1);
                continue;
            };
            if !is_original(&item.operation, &item.request_body) {
                tracing::error!(operation_id = %operation_id,
                    "planned intent's stored arguments are not the request (masked); nothing sent, it will turn unknown");
                metrics::counter!("dispatch_total", "outcome" => "arguments_masked").increment(1);
                continue;
            }
            let span = tracing::info_span!("outbox.send", run_id = %item.operation.run_id);
            sends.push(tokio::spawn(
                execute_claim(
                    self.ledger.clone(),
                    self.upstream.clone(),
                    self.owner.clone(),
                    item.claim,
                    Claimed {
                        tool,
                        arguments,
                        context: CallContext::default(),
                    },
                )
                .instrument(span),
            ));
        }
        for send in sends {
            let outcome = match send.await {
                Ok(Ok(CallReply::Answer { .. })) => "settled",
                Ok(Ok(CallReply::Unknown { .. })) => "unknown",
                // The outbox offers no tasks and shows nothing; listed for
                // completeness.
                Ok(Ok(CallReply::Task { .. })) => "task",
                Ok(Ok(CallReply::Shown { .. })) => "shown",
                Ok(Err(_)) | Err(_) => "error",
            };
            metrics::counter!("dispatch_total", "outcome" => outcome).increment(1);
        }
        Ok(count)
    }
}

/// The tool a recorded operation goes to: its recorded route when the
/// directory still has it, else by its exposed name (see
/// `SharedDirectory::resolve`). `None`: no upstream offers it now.
pub fn recorded_tool(
    directory: &SharedDirectory,
    operation: &OperationRecord,
) -> Option<ResolvedTool> {
    directory.resolve(
        &operation.tool_name,
        operation
            .route
            .as_ref()
            .map(|route| (route.upstream.as_str(), route.tool.as_str())),
    )
}

/// Whether `body` is the request the operation was registered with: its
/// digest is the intent's. Only such a body is ever sent again — by the
/// outbox here, and by the reconciler's same-key retry and resend — so a
/// masked copy never reaches a tool.
pub fn is_original(operation: &OperationRecord, body: &Value) -> bool {
    body.is_object()
        && request_digest(&operation.tool_name, body, IntegerPolicy::AsDouble)
            .is_ok_and(|digest| digest == operation.request_digest)
}
