//! Calls an upstream made a task of (MCP Tasks extension): the operation
//! stays `dispatching` under its claim while the task runs, and settles
//! from the task's terminal status.
//!
//! ```text
//!  tools/call ──▶ CreateTaskResult ──▶ task evidence + claim extended (1 tx)
//!                     │                     │
//!                     ▼                     ▼
//!        the agent gets the handle    follower: tasks/get every poll interval
//!        (and polls tasks/get itself;  (or at once on what the agent's own
//!         what it reads is observed)   tasks/get read), claim extended
//!                                           │ terminal
//!                                           ▼
//!              completed → settle (succeeded | failed_final by isError)
//!              failed with -32600..-32602 → failed_final (nothing ran)
//!              failed otherwise, cancelled, lost → unknown (it may have acted)
//! ```
//!
//! # Invariants
//!
//! 1. Only the claim's holder follows a task and extends its claim, and
//!    only while the claim has not lapsed (`operation_follow_task`): a
//!    paused process cannot revive a claim another process may judge.
//! 2. The task's outcome is written before an agent's `tasks/get` that
//!    read it terminal is answered ([`TaskFollowers::observe`] waits for
//!    the settle), so the agent never learns an outcome the ledger lacks.
//! 3. A task handle is replayed only to an agent that follows tasks; any
//!    other repeat of the intent waits for the settle as usual.
//!
//! # Crash points
//!
//! - Before the task evidence commits: the row is `dispatching` with no
//!   task named; its claim expires into `unknown` and converges by the
//!   tool's capability like any unknown (the handle the agent got still
//!   works at the upstream).
//! - After it: the claim expires into `unknown` once this process stops
//!   extending it, and the reconciler follows the task from its evidence
//!   (`reconcile::plan`, `tasks/get`), whatever the capability.
//! - After the task ended, before the settle commits: the same; the
//!   upstream still answers the terminal status.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::sync::{mpsc, watch};
use tracing::Instrument;

use super::call::{CallReply, OperationNote};
use super::followers::{Followed, TaskFollowers};
use super::outcome::{record_failure, settle};
use crate::adapter::{TaskPoll, TaskStarted, TaskState, ToolAdapter, Upstream, UpstreamError};
use crate::ledger::{DispatchClaim, Ledger, OperationStatus};

/// The shortest and longest wait between two `tasks/get` of a follower
/// (the upstream's suggested interval, clamped).
const POLL_MIN: Duration = Duration::from_millis(100);
const POLL_MAX: Duration = Duration::from_secs(5);
/// Without a suggestion from the upstream.
const POLL_DEFAULT: Duration = Duration::from_secs(1);
/// After this many `tasks/get` in a row that got no answer, the task is
/// given up on: the operation is `unknown` and the reconciler follows it.
const POLL_FAILURES: u32 = 10;

/// The upstream made a task of the claimed call: records it under the
/// claim, starts this process's follower, and answers the agent with the
/// task's handle.
pub(super) async fn follow<U: Upstream>(follower: Follower<U>) -> CallReply {
    let Follower {
        followers,
        ledger,
        claim,
        upstream_name,
        started,
        ..
    } = &follower;
    let evidence = json!({
        "upstream": upstream_name,
        "task_id": started.task_id,
        "handle": started.handle,
    });
    // If we crash before this commits, the claim expires into unknown and
    // the tool's capability decides (crash points above).
    match ledger
        .operation_follow_task(claim, Some(&evidence), followers.claim_ttl)
        .await
    {
        Ok(true) => {}
        Ok(false) => tracing::warn!(task_id = %crate::logfield::clip(&started.task_id),
            "the upstream made a task of the call, but the claim had moved on: not recorded"),
        Err(error) => tracing::warn!(task_id = %crate::logfield::clip(&started.task_id),
            error = %crate::logfield::clip_display(&error),
            "the upstream made a task of the call; recording it failed (followed all the same)"),
    }
    metrics::counter!("tool_operation_tasks_total").increment(1);
    let (observed, observations) = mpsc::unbounded_channel();
    let (finished, done) = watch::channel(false);
    let key = (upstream_name.clone(), started.task_id.clone());
    if let Ok(mut followed) = followers.followed.lock() {
        followed.insert(
            key,
            Followed {
                operation_id: claim.operation_id.clone(),
                handle: started.handle.clone(),
                observed,
                done,
            },
        );
    }
    let reply = CallReply::Task {
        handle: started.handle.clone(),
        operation: OperationNote {
            operation_id: claim.operation_id.clone(),
            status: OperationStatus::Dispatching,
            replayed: false,
            waited: false,
            remarks: Default::default(),
        },
    };
    let span = tracing::info_span!("task.follow", operation_id = %follower.claim.operation_id,
        task_id = %crate::logfield::clip(&follower.started.task_id));
    tokio::spawn(
        async move {
            let (upstream_name, task_id) = (
                follower.upstream_name.clone(),
                follower.started.task_id.clone(),
            );
            let followers = follower.followers.clone();
            follower.run(observations).await;
            followers.forget(&upstream_name, &task_id);
            let _ = finished.send(true);
        }
        .instrument(span),
    );
    reply
}

/// One task followed until it is terminal: the claim it runs under, and
/// what settles it.
pub(super) struct Follower<U> {
    pub followers: Arc<TaskFollowers>,
    pub ledger: Ledger,
    pub upstream: Arc<U>,
    pub dispatch_owner: String,
    pub claim: DispatchClaim,
    pub adapter: ToolAdapter,
    pub upstream_name: String,
    pub started: TaskStarted,
}

impl<U: Upstream> Follower<U> {
    async fn run(self, mut observations: mpsc::UnboundedReceiver<TaskPoll>) {
        let claim_ttl = self.followers.claim_ttl;
        let mut interval = clamp(self.started.poll_interval);
        let mut extended_at = tokio::time::Instant::now();
        let mut failures = 0;
        let end = loop {
            let polled = tokio::select! {
                Some(seen) = observations.recv() => Ok(seen),
                _ = tokio::time::sleep(interval) => self
                    .upstream
                    .task_state(&self.upstream_name, &self.started.task_id, self.adapter.timeout)
                    .await,
            };
            match polled {
                Ok(poll) if poll.state.is_terminal() => break Ok(poll.state),
                Ok(poll) => {
                    failures = 0;
                    if let Some(suggested) = poll.poll_interval {
                        interval = clamp(Some(suggested));
                    }
                }
                Err(error) => {
                    failures += 1;
                    tracing::warn!(task_id = %crate::logfield::clip(&self.started.task_id), failures,
                        error = %crate::logfield::clip_display(&error), "tasks/get got no answer");
                    if failures >= POLL_FAILURES {
                        break Err(error);
                    }
                }
            }
            // Extended at half its length, so a claim never lapses while
            // this process follows the task (invariant 1).
            if extended_at.elapsed() >= claim_ttl / 2 {
                match self
                    .ledger
                    .operation_follow_task(&self.claim, None, claim_ttl)
                    .await
                {
                    Ok(true) => extended_at = tokio::time::Instant::now(),
                    Ok(false) => {
                        // Lapsed or taken: whoever holds the operation now
                        // follows the task from its evidence.
                        tracing::warn!(task_id = %crate::logfield::clip(&self.started.task_id),
                            "the claim of a followed task moved on: no longer followed here");
                        return;
                    }
                    Err(error) => tracing::warn!(error = %crate::logfield::clip_display(&error),
                        "extending the claim of a followed task failed"),
                }
            }
        };
        let failure = match end {
            Ok(TaskState::Completed(answer)) => {
                let _ = settle(&self.ledger, &self.claim, &self.adapter, answer).await;
                return;
            }
            Ok(TaskState::Failed(error)) if (-32602..=-32600).contains(&error.code) => {
                // By protocol nothing executed: a final failure.
                let answer = crate::adapter::ToolAnswer::refused(
                    "the task failed",
                    error.code,
                    &error.message,
                );
                let _ = settle(&self.ledger, &self.claim, &self.adapter, answer).await;
                return;
            }
            Ok(TaskState::Failed(error)) => UpstreamError::MaybeSent(format!(
                "task {} failed: {} (code {})",
                self.started.task_id, error.message, error.code
            )),
            Ok(_) => UpstreamError::MaybeSent(format!(
                "task {} was cancelled; it may have acted before",
                self.started.task_id
            )),
            Err(error) => UpstreamError::MaybeSent(format!(
                "task {} could not be followed: {error}",
                self.started.task_id
            )),
        };
        let _ = record_failure(&self.ledger, &self.dispatch_owner, self.claim, failure, 1).await;
    }
}

fn clamp(suggested: Option<Duration>) -> Duration {
    suggested.unwrap_or(POLL_DEFAULT).clamp(POLL_MIN, POLL_MAX)
}
