//! Session leases: leasegate holds a run's lease for an agent that knows
//! nothing of leases (lease mode `session`).
//!
//! A session is named by a task key. [`SessionLease::begin`] makes the
//! task's active run this session's: it creates the run (lease held at
//! epoch 1) when the task has no live run, or takes the live run's lease over at
//! once (`lease_takeover`: epoch + 1, even while the previous holder's lease
//! is unexpired) — a new session for the same task key is the agent
//! restarted, and it fences its predecessor. A pending run is started. The
//! lease is then renewed by the worker heartbeat until the session ends
//! ([`SessionLease::end`] releases it; the run stays running, so the next
//! session resumes it and its calls replay what this one recorded).
//!
//! # Guarantees
//!
//! * Calls through a session carry its lease; the ledger fences them like
//!   any worker's writes. After a takeover, the old session's writes are
//!   rejected (-32002), whatever the old process believes.
//! * The first renewal the heartbeat cannot confirm ends the session: every
//!   later side-effecting call is refused before anything is registered or
//!   sent ([`SessionLease::current`] answers the cause). It never
//!   re-acquires on its own: a lost session stays lost until the agent
//!   starts a new one.
//! * Identity is per run and step: calls of a resumed run with the same
//!   derived step (tool + request digest) are the same intents, so an agent
//!   that repeats its calls after a restart gets the recorded answers.
//!
//! # Crash points
//!
//! A process that dies holding a session leaves the lease to expire (its
//! ttl); the next session for the task takes it over at once anyway.
//!
//! # Lease tokens
//!
//! Every lease leasegate takes here comes with its secret token (issue 13);
//! leasegate keeps it in memory only, in the session's claim or, in key
//! mode, in the process's [`KeyLeases`], and presents it on every write. A
//! token is shown once, so a process never learns another process's token:
//! in key mode a process that holds no token for a key run's live lease
//! takes the lease over (epoch + 1, a new token) instead of sharing it. A
//! call of another process with the same key whose registration had not yet
//! committed is then refused -32002 (`lease_lost`) and nothing of it is
//! sent; its retry with the same key replays. A call already registered
//! and claimed is not affected: settling is fenced by the dispatch claim,
//! not the lease, so the takeover never causes a second send.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::Mutex;
use tokio::task::JoinHandle;

use super::{HeartbeatConfig, StopCause, WorkerCancellation, spawn_heartbeat};
use crate::ledger::{
    AcquireOutcome, Fenced, InitialLease, LeaseClaim, Ledger, LedgerError, Rejection,
    RunCreateOutcome, RunId, RunStatus,
};

/// Why a session could not begin.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("invalid session lease settings: {0}")]
    Config(String),
    #[error("task {task:?}: {detail}")]
    Refused { task: String, detail: String },
    #[error(transparent)]
    Ledger(#[from] LedgerError),
}

/// A task's lease held by leasegate for the life of an MCP session or a
/// stdio process.
#[derive(Debug)]
pub struct SessionLease {
    ledger: Ledger,
    task: String,
    claim: LeaseClaim,
    took_over: bool,
    cancel: WorkerCancellation,
    heartbeat: Mutex<Option<JoinHandle<StopCause>>>,
}

impl SessionLease {
    /// Makes the task's active run this session's (see the module docs)
    /// and starts renewing its lease.
    pub async fn begin(
        ledger: Ledger,
        tenant: &str,
        task: &str,
        owner: &str,
        config: HeartbeatConfig,
    ) -> Result<Self, SessionError> {
        config.validate().map_err(SessionError::Config)?;
        let (claim, took_over) =
            take_task_run(&ledger, tenant, task, owner, config.ttl_ms, None).await?;
        // The token is not a log field.
        let cancel = WorkerCancellation::new();
        let heartbeat = spawn_heartbeat(ledger.clone(), claim.clone(), config, cancel.clone());
        tracing::info!(task = %crate::logfield::clip(task), run_id = %claim.run_id, owner = %crate::logfield::clip(&claim.owner), epoch = claim.epoch,
            took_over, "session lease held");
        Ok(Self {
            ledger,
            task: task.to_owned(),
            claim,
            took_over,
            cancel,
            heartbeat: Mutex::new(Some(heartbeat)),
        })
    }

    /// The lease to send calls under while the session holds it; once it
    /// does not, why (the heartbeat's stop cause).
    pub fn current(&self) -> Result<&LeaseClaim, String> {
        match self.cancel.cause() {
            Some(cause) => Err(cause.to_string()),
            None if self.cancel.is_cancelled() => Err("session ended".into()),
            None => Ok(&self.claim),
        }
    }

    /// The lease as granted, whatever happened since.
    pub fn claim(&self) -> &LeaseClaim {
        &self.claim
    }

    pub fn task(&self) -> &str {
        &self.task
    }

    /// Whether this session took a live run over from another holder.
    pub fn took_over(&self) -> bool {
        self.took_over
    }

    /// Stops renewing and releases the lease if this session still holds
    /// it (the run stays as it is, for the next session to resume).
    pub async fn end(&self) {
        let held = self.current().is_ok();
        self.cancel
            .cancel_with(StopCause::Stopped("session ended".into()));
        if let Some(heartbeat) = self.heartbeat.lock().await.take() {
            let _ = heartbeat.await;
        }
        if held {
            match self.ledger.lease_release(&self.claim).await {
                Ok(Fenced::Applied(_)) => {
                    tracing::info!(task = %crate::logfield::clip(&self.task), run_id = %self.claim.run_id, "session lease released")
                }
                Ok(Fenced::Rejected(rejection)) => {
                    tracing::info!(task = %crate::logfield::clip(&self.task), rejection = %crate::logfield::clip_display(&rejection), "session lease was no longer ours")
                }
                Err(error) => {
                    tracing::warn!(task = %crate::logfield::clip(&self.task), error = %crate::logfield::clip_display(&error), "releasing the session lease failed; it expires on its own")
                }
            }
        }
    }
}

/// Lease mode `key`: the owner of every key run's lease, whichever
/// leasegate process serves the call.
pub const KEY_OWNER: &str = "leasegate:idempotency-key";

/// The longest idempotency key accepted (lease mode `key`).
pub use crate::ids::MAX_IDEMPOTENCY_KEY_LEN;

/// Lease mode `key`: the key runs' leases this process took, with their
/// secret tokens, by task. One per process (the MCP front's state); calls
/// with one key in this process take turns on the key's slot while they
/// take its lease, so they share one lease instead of fencing each other.
#[derive(Debug, Default)]
pub struct KeyLeases {
    slots: std::sync::Mutex<HashMap<String, Arc<Mutex<Option<HeldKeyLease>>>>>,
}

#[derive(Debug)]
struct HeldKeyLease {
    claim: LeaseClaim,
    /// This host's estimate of the lease's end; only for forgetting it.
    until: Instant,
}

impl KeyLeases {
    pub fn new() -> Self {
        Self::default()
    }

    /// The task's slot; forgets slots nobody uses whose lease has ended.
    fn slot(&self, task: &str) -> Arc<Mutex<Option<HeldKeyLease>>> {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        slots.retain(|name, slot| {
            name == task
                || Arc::strong_count(slot) > 1
                || slot
                    .try_lock()
                    .map(|held| held.as_ref().is_some_and(|held| held.until > now))
                    .unwrap_or(true)
        });
        slots.entry(task.to_owned()).or_default().clone()
    }
}

/// Key mode's part of [`take_task_run`].
struct KeyMode<'a> {
    /// A live run created longer ago than this is cancelled and replaced.
    retention: std::time::Duration,
    /// The lease this process holds for the task, token included.
    held: Option<&'a LeaseClaim>,
}

/// The task's active run, with its lease now held by `owner`: created
/// (epoch 1) when the task has no live run, else taken over at once
/// (`lease_takeover`); a pending run is started. With `key` (key mode), a
/// live run created longer ago than its retention is cancelled first and a
/// new one created, and a live lease this process already holds (`held`:
/// same run and epoch, so its token is known) is shared rather than taken
/// over, so concurrent calls with one key in one process do not fence each
/// other. Returns the lease (with its token) and whether it was taken from
/// a holder.
async fn take_task_run(
    ledger: &Ledger,
    tenant: &str,
    task: &str,
    owner: &str,
    ttl_ms: i64,
    key: Option<KeyMode<'_>>,
) -> Result<(LeaseClaim, bool), SessionError> {
    let refused = |detail: String| SessionError::Refused {
        task: task.to_owned(),
        detail,
    };
    // A run finishing between two steps sends us round again; a third race
    // in a row is reported.
    for _ in 0..3 {
        let lease = InitialLease { owner, ttl_ms };
        let (claim, status, revision, took_over) = match ledger
            .run_create(RunId::generate(), tenant, task, Some(lease))
            .await?
        {
            RunCreateOutcome::Created(run) => (
                LeaseClaim {
                    run_id: run.run_id,
                    owner: owner.to_owned(),
                    epoch: run.lease_epoch,
                    token: run.lease_token,
                },
                run.status,
                0,
                false,
            ),
            RunCreateOutcome::ActiveRunLive(run) => {
                let mut shared = None;
                if let Some(key) = &key {
                    let created = ledger
                        .run_get(run.run_id)
                        .await?
                        .map(|view| view.created_at);
                    let age = created.and_then(|at| (chrono::Utc::now() - at).to_std().ok());
                    if age.is_some_and(|age| age >= key.retention) {
                        // Past retention: the key is a new request. The run
                        // is retired by its lease holder — this process,
                        // after taking the lease over — since cancelling
                        // without a lease is an operator's act that the
                        // application role cannot run (migrations/0007).
                        if let AcquireOutcome::Acquired(grant) =
                            ledger.lease_takeover(run.run_id, owner, ttl_ms).await?
                        {
                            let _ = ledger.run_retire(&grant.claim, "retention passed").await?;
                        }
                        continue;
                    }
                    // Key mode: a live lease this process holds (its token
                    // known) with half its ttl left is used as it is (the
                    // call registers before it lapses); otherwise it is
                    // taken over afresh.
                    let half = chrono::Duration::milliseconds(ttl_ms / 2);
                    if let Some(held) = key.held
                        && held.run_id == run.run_id
                        && held.epoch == run.lease_epoch
                        && run.lease_owner.as_deref() == Some(owner)
                        && run.lease_expires_at > chrono::Utc::now() + half
                    {
                        // A pending run has revision 0 until it starts.
                        shared = Some((held.clone(), run.status, 0, false));
                    }
                }
                match shared {
                    Some(shared) => shared,
                    None => match ledger.lease_takeover(run.run_id, owner, ttl_ms).await? {
                        AcquireOutcome::Acquired(grant) => (
                            grant.claim,
                            grant.run_status,
                            grant.revision,
                            grant.took_over,
                        ),
                        AcquireOutcome::Terminal { .. } | AcquireOutcome::NotFound => continue,
                        AcquireOutcome::Busy { .. } => unreachable!("a takeover is never busy"),
                    },
                }
            }
            RunCreateOutcome::Exists(_) | RunCreateOutcome::RunIdTaken => {
                return Err(refused("a fresh run id collided".into()));
            }
        };
        if status == RunStatus::Pending {
            match ledger.run_start(&claim, revision).await? {
                Fenced::Applied(_) => {}
                // Another taker started it (and may own it now: the next
                // fenced write tells).
                Fenced::Rejected(Rejection::Conflict { .. } | Rejection::WrongStatus { .. }) => {}
                Fenced::Rejected(Rejection::Terminal { .. } | Rejection::NotFound) => continue,
                Fenced::Rejected(rejection) => return Err(refused(rejection.to_string())),
            }
        }
        return Ok((claim, took_over));
    }
    Err(refused(
        "its runs kept finishing while leasegate took it; try again".into(),
    ))
}

/// Lease mode `key`: the lease of the run that stands for one idempotency
/// key of `principal` in `tenant` (task `idempotency-key:<principal>:<key>`),
/// with its token (this process's, kept in `leases`).
///
/// The first call with a key creates the run (lease held by `owner`); a
/// later call with the same key takes its lease over at once (there is no
/// worker to wait for: the lease only fences this call's registration) and
/// finds the key's intent — the same request replays, another request is an
/// intent conflict. Once `retention` has passed since the run was created,
/// the old run is cancelled and the key starts a new one: the same key is a
/// new request then, as at providers that prune keys.
#[allow(clippy::too_many_arguments)]
pub async fn key_lease(
    ledger: &Ledger,
    leases: &KeyLeases,
    tenant: &str,
    principal: &str,
    key: &str,
    owner: &str,
    ttl_ms: i64,
    retention: std::time::Duration,
) -> Result<LeaseClaim, SessionError> {
    let task = format!("idempotency-key:{principal}:{key}");
    if let Err(invalid) =
        crate::ids::check_identifier("idempotency key", key, MAX_IDEMPOTENCY_KEY_LEN)
    {
        return Err(SessionError::Refused {
            task: task.chars().take(80).collect(),
            detail: invalid.to_string(),
        });
    }
    let slot = leases.slot(&task);
    let mut held = slot.lock().await;
    let key_mode = KeyMode {
        retention,
        held: held.as_ref().map(|held| &held.claim),
    };
    let (claim, _) = take_task_run(ledger, tenant, &task, owner, ttl_ms, Some(key_mode)).await?;
    let ttl = std::time::Duration::from_millis(u64::try_from(ttl_ms).unwrap_or(0));
    *held = Some(HeldKeyLease {
        claim: claim.clone(),
        until: Instant::now() + ttl,
    });
    Ok(claim)
}
