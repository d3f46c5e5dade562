//! The tasks this process follows for its gated calls (`tasks`), by the
//! upstream and task id: the handle to replay to a repeat of the intent,
//! and where an agent's own `tasks/get` reading goes. In memory only: a
//! process that dies forgets them, and the reconciler follows each task
//! from its evidence (see `tasks`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio::sync::{mpsc, watch};

use crate::adapter::TaskPoll;
use crate::intent::OperationId;

/// How long an agent's `tasks/get` that read a terminal status waits for
/// the settle before it is answered anyway.
const SETTLE_WAIT: Duration = Duration::from_secs(10);

/// The tasks this process follows, by upstream task id.
#[derive(Debug)]
pub struct TaskFollowers {
    /// How far each extension moves the claim (the policy's `claim_ttl`).
    pub(super) claim_ttl: Duration,
    pub(super) followed: Mutex<HashMap<(String, String), Followed>>,
}

#[derive(Debug)]
pub(super) struct Followed {
    pub(super) operation_id: OperationId,
    pub(super) handle: Value,
    /// What agents' own `tasks/get` read, for the follower.
    pub(super) observed: mpsc::UnboundedSender<TaskPoll>,
    /// `true` once the follower is done (settled, or given up on).
    pub(super) done: watch::Receiver<bool>,
}

impl TaskFollowers {
    pub fn new(claim_ttl: Duration) -> Arc<Self> {
        Arc::new(Self {
            claim_ttl,
            followed: Mutex::new(HashMap::new()),
        })
    }

    /// The handle of the task this process follows for `operation_id`,
    /// for a repeat of the intent by an agent that follows tasks.
    pub fn handle_of(&self, operation_id: &OperationId) -> Option<Value> {
        let followed = self.followed.lock().ok()?;
        followed
            .values()
            .find(|f| &f.operation_id == operation_id)
            .map(|f| f.handle.clone())
    }

    /// Whether this process follows `task_id` of `upstream` for an operation.
    pub fn follows(&self, upstream: &str, task_id: &str) -> bool {
        self.followed
            .lock()
            .is_ok_and(|f| f.contains_key(&(upstream.to_owned(), task_id.to_owned())))
    }

    /// What an agent's own `tasks/get` read of a followed task. Returns
    /// once the follower has written a terminal status (invariant 2), or
    /// at once for a task still running or not followed here.
    pub async fn observe(&self, upstream: &str, task_id: &str, poll: TaskPoll) {
        let terminal = poll.state.is_terminal();
        let done = {
            let Ok(followed) = self.followed.lock() else {
                return;
            };
            let Some(entry) = followed.get(&(upstream.to_owned(), task_id.to_owned())) else {
                return;
            };
            let _ = entry.observed.send(poll);
            entry.done.clone()
        };
        if terminal {
            let mut done = done;
            let _ = tokio::time::timeout(SETTLE_WAIT, done.wait_for(|d| *d)).await;
        }
    }

    pub(super) fn forget(&self, upstream: &str, task_id: &str) {
        if let Ok(mut followed) = self.followed.lock() {
            followed.remove(&(upstream.to_owned(), task_id.to_owned()));
        }
    }
}
