//! What a Rust worker links: a lease handle and its heartbeat.
//!
//! The heartbeat renews the lease: it
//! renews on a fixed interval, each renewal under its own timeout. A
//! rejected renewal cancels the worker's [`WorkerCancellation`] with the
//! cause and ends the heartbeat; so does one that failed or timed out once
//! the lease may have lapsed (invariant 2). It never re-acquires: a lost
//! lease is never resurrected.
//!
//! # Invariants
//!
//! 1. Cancellation only reduces work. It is not what keeps a stale worker
//!    out: every write is fenced in the database whatever this process
//!    believes (ledger invariant 1).
//! 2. A renewal that failed for a transient reason (a connection that
//!    broke, no connection, no answer in time:
//!    `LedgerError::is_transient`) is sent again with capped backoff while
//!    a retry can still land before the lease may have lapsed — the ttl
//!    counted from when the last confirmed renewal was sent (from the
//!    heartbeat's start before the first), less the renewal timeout. After
//!    that the renewal is unconfirmed and treated as lost: the database may
//!    have renewed while the answer was lost, but the conservative default
//!    is to stop and let the lease expire. A renewal is safe to repeat: it
//!    only moves the same lease's expiry.
//!
//! # Failure handling
//!
//! If the process freezes (SIGSTOP, VM pause) past the TTL, the first
//! renewal after it thaws is rejected as lease lost, or, if the freeze
//! happened mid-call, times out; either way the token is cancelled. Writes
//! attempted meanwhile are rejected by the database.
//!
//! A host holding many leases uses [`BatchHeartbeat`] (`worker::batch`):
//! one batch renewal per interval for all of them, each lease's loss
//! delivered to its own holder exactly as this heartbeat delivers it.

pub mod batch;

pub use batch::BatchHeartbeat;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use crate::ledger::{
    AcquireOutcome, Applied, Fenced, LeaseClaim, LeaseGrant, Ledger, LedgerError, Rejection, RunId,
    RunStatus,
};

/// Why a worker was told to stop.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StopCause {
    /// The database says this worker no longer holds the lease.
    #[error("{0}")]
    LeaseLost(Rejection),
    /// The run became terminal (e.g. an operator cancelled it).
    #[error("run is {0}: stopping")]
    RunTerminal(RunStatus),
    /// A renewal failed or timed out: ownership cannot be confirmed.
    #[error("lease renewal unconfirmed: {0}")]
    RenewalUnconfirmed(String),
    /// The worker stopped on its own (finished, shut down).
    #[error("worker stopped: {0}")]
    Stopped(String),
}

impl StopCause {
    pub(crate) fn from_rejection(rejection: Rejection) -> Self {
        match rejection {
            Rejection::Terminal { status } => StopCause::RunTerminal(status),
            other => StopCause::LeaseLost(other),
        }
    }
}

/// A cancellation token that remembers why it was cancelled (the first
/// cause wins). Clones share the token and the cause.
#[derive(Debug, Clone, Default)]
pub struct WorkerCancellation {
    token: CancellationToken,
    cause: Arc<OnceLock<StopCause>>,
}

impl WorkerCancellation {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn cancel_with(&self, cause: StopCause) {
        let _ = self.cause.set(cause);
        self.token.cancel();
    }

    pub fn is_cancelled(&self) -> bool {
        self.token.is_cancelled()
    }

    pub async fn cancelled(&self) {
        self.token.cancelled().await;
    }

    /// Why the token was cancelled, once it is.
    pub fn cause(&self) -> Option<&StopCause> {
        self.cause.get()
    }

    /// The underlying token, for `select!` with other futures.
    pub fn token(&self) -> &CancellationToken {
        &self.token
    }
}

/// Heartbeat timing. Interval and per-renewal timeout are separate settings;
/// the defaults are TTL 30 s, interval 5 s, timeout 2 s.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeartbeatConfig {
    pub ttl_ms: i64,
    pub interval: Duration,
    pub renew_timeout: Duration,
}

impl Default for HeartbeatConfig {
    fn default() -> Self {
        Self {
            ttl_ms: 30_000,
            interval: Duration::from_secs(5),
            renew_timeout: Duration::from_secs(2),
        }
    }
}

impl HeartbeatConfig {
    /// A renewal must be able to land before the lease it renews expires.
    pub fn validate(&self) -> Result<(), String> {
        let ttl = Duration::from_millis(u64::try_from(self.ttl_ms).unwrap_or(0));
        if ttl.is_zero() {
            return Err(format!("lease ttl must be > 0 ms, got {} ms", self.ttl_ms));
        }
        if self.interval.is_zero() || self.renew_timeout.is_zero() {
            return Err("heartbeat interval and renewal timeout must be > 0".to_owned());
        }
        if self.interval + self.renew_timeout >= ttl {
            return Err(format!(
                "heartbeat interval {:?} + renewal timeout {:?} must be below the ttl {:?}",
                self.interval, self.renew_timeout, ttl
            ));
        }
        Ok(())
    }
}

/// The heartbeat of a session lease (`session`): renewals every third of
/// the ttl, each given a sixth to answer.
pub fn session_heartbeat(ttl: Duration) -> HeartbeatConfig {
    HeartbeatConfig {
        ttl_ms: i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX),
        interval: ttl / 3,
        renew_timeout: ttl / 6,
    }
}

/// Renews `claim` every `config.interval` until `cancel` fires or a renewal
/// is unconfirmed; then cancels `cancel` with the cause and returns it.
pub fn spawn_heartbeat(
    ledger: Ledger,
    claim: LeaseClaim,
    config: HeartbeatConfig,
    cancel: WorkerCancellation,
) -> JoinHandle<StopCause> {
    let renewed = claim.clone();
    spawn_renewals(claim, config, cancel, None, move || {
        let (ledger, claim) = (ledger.clone(), renewed.clone());
        async move { ledger.lease_renew(&claim, config.ttl_ms).await }
    })
}

/// The heartbeat's loop, whatever renews: `renew` every `config.interval`
/// (and at once when `probe` is notified), each under the renewal timeout,
/// until `cancel` fires or a renewal is unconfirmed; then cancels `cancel`
/// with the cause and returns it.
pub(crate) fn spawn_renewals<F, Fut>(
    claim: LeaseClaim,
    config: HeartbeatConfig,
    cancel: WorkerCancellation,
    probe: Option<Arc<tokio::sync::Notify>>,
    renew: F,
) -> JoinHandle<StopCause>
where
    F: Fn() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<Fenced<Applied>, LedgerError>> + Send,
{
    tokio::spawn(async move {
        let ttl = Duration::from_millis(u64::try_from(config.ttl_ms).unwrap_or(0));
        // Invariant 2: the lease was granted (or joined) just before.
        let mut confirmed_sent = Instant::now();
        let mut backoff = crate::ledger::Backoff::new(
            Duration::from_millis(50),
            (config.interval / 2).max(Duration::from_millis(50)),
        );
        // Set while a failed renewal waits for its retry.
        let mut retry_at: Option<Instant> = None;
        async fn retry_due(at: Option<Instant>) {
            match at {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        }
        let mut ticker =
            tokio::time::interval_at(Instant::now() + config.interval, config.interval);
        // After a freeze, renew once rather than in a burst of missed ticks.
        ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
        // A notification while renewing is kept as a permit: not lost.
        async fn probed(probe: &Option<Arc<tokio::sync::Notify>>) {
            match probe {
                Some(probe) => probe.notified().await,
                None => std::future::pending().await,
            }
        }
        loop {
            tokio::select! {
                _ = cancel.cancelled() => {
                    return cancel.cause().cloned().unwrap_or_else(|| StopCause::Stopped("cancelled".into()));
                }
                _ = ticker.tick() => {}
                () = probed(&probe) => {}
                () = retry_due(retry_at) => {}
            }
            let sent = Instant::now();
            let failure = match tokio::time::timeout(config.renew_timeout, renew()).await {
                Ok(Ok(Fenced::Applied(applied))) => {
                    tracing::debug!(run_id = %claim.run_id, owner = %crate::logfield::clip(&claim.owner), epoch = claim.epoch,
                        expires_at = %applied.lease_expires_at, "lease renewed");
                    confirmed_sent = sent;
                    retry_at = None;
                    backoff.reset();
                    continue;
                }
                Ok(Ok(Fenced::Rejected(rejection))) => Err(StopCause::from_rejection(rejection)),
                Ok(Err(error)) if error.is_transient() => Ok(error.to_string()),
                Ok(Err(error)) => Err(StopCause::RenewalUnconfirmed(error.to_string())),
                Err(_elapsed) => Ok(format!("no answer within {:?}", config.renew_timeout)),
            };
            let cause = match failure {
                Err(cause) => cause,
                Ok(transient) => {
                    // Invariant 2: again, while a retry can land in time.
                    let delay = backoff.next_delay();
                    if Instant::now() + delay + config.renew_timeout < confirmed_sent + ttl {
                        tracing::warn!(run_id = %claim.run_id, owner = %crate::logfield::clip(&claim.owner),
                            error = %transient, retry_in = ?delay, "lease renewal failed; trying again");
                        retry_at = Some(Instant::now() + delay);
                        continue;
                    }
                    StopCause::RenewalUnconfirmed(transient)
                }
            };
            tracing::warn!(run_id = %claim.run_id, owner = %crate::logfield::clip(&claim.owner), epoch = claim.epoch,
                cause = %cause, "heartbeat stopping the worker");
            cancel.cancel_with(cause.clone());
            return cause;
        }
    })
}

/// A held lease with its heartbeat running. Writes go through the ledger
/// (which fences them); a rejection that means the lease is gone also
/// cancels the worker, so the worker's loop stops at its next check.
#[derive(Debug)]
pub struct LeaseHandle {
    ledger: Ledger,
    grant: LeaseGrant,
    cancel: WorkerCancellation,
    heartbeat: JoinHandle<StopCause>,
}

/// Why [`LeaseHandle::acquire`] did not produce a handle.
#[derive(Debug, thiserror::Error)]
pub enum AcquireError {
    #[error("lease busy: held by {owner} until {expires_at}")]
    Busy {
        owner: String,
        expires_at: chrono::DateTime<chrono::Utc>,
    },
    #[error("run not found")]
    NotFound,
    #[error("run is {status}: terminal runs are never leased again")]
    Terminal { status: RunStatus },
    #[error("invalid heartbeat settings: {0}")]
    Config(String),
    #[error(transparent)]
    Ledger(#[from] LedgerError),
}

impl LeaseHandle {
    /// Acquires (or takes over) the lease on `run_id` and starts the heartbeat.
    pub async fn acquire(
        ledger: Ledger,
        run_id: RunId,
        owner: &str,
        config: HeartbeatConfig,
    ) -> Result<Self, AcquireError> {
        config.validate().map_err(AcquireError::Config)?;
        let grant = match ledger.lease_acquire(run_id, owner, config.ttl_ms).await? {
            AcquireOutcome::Acquired(grant) => grant,
            AcquireOutcome::Busy { owner, expires_at } => {
                return Err(AcquireError::Busy { owner, expires_at });
            }
            AcquireOutcome::NotFound => return Err(AcquireError::NotFound),
            AcquireOutcome::Terminal { status } => return Err(AcquireError::Terminal { status }),
        };
        let cancel = WorkerCancellation::new();
        let heartbeat =
            spawn_heartbeat(ledger.clone(), grant.claim.clone(), config, cancel.clone());
        Ok(Self {
            ledger,
            grant,
            cancel,
            heartbeat,
        })
    }

    pub fn claim(&self) -> &LeaseClaim {
        &self.grant.claim
    }

    /// The lease as granted: epoch, and the run's status and revision then.
    pub fn grant(&self) -> &LeaseGrant {
        &self.grant
    }

    pub fn cancellation(&self) -> &WorkerCancellation {
        &self.cancel
    }

    fn observe(&self, outcome: &Result<Fenced<Applied>, LedgerError>) {
        if let Ok(Fenced::Rejected(rejection)) = outcome
            && matches!(
                rejection,
                Rejection::LeaseLost { .. }
                    | Rejection::LeaseTokenInvalid { .. }
                    | Rejection::Terminal { .. }
                    | Rejection::NotFound
            )
        {
            self.cancel
                .cancel_with(StopCause::from_rejection(rejection.clone()));
        }
    }

    pub async fn start(&self, expected_revision: i64) -> Result<Fenced<Applied>, LedgerError> {
        let outcome = self.ledger.run_start(self.claim(), expected_revision).await;
        self.observe(&outcome);
        outcome
    }

    pub async fn checkpoint_save(
        &self,
        expected_revision: i64,
        checkpoint: &serde_json::Value,
    ) -> Result<Fenced<Applied>, LedgerError> {
        let outcome = self
            .ledger
            .checkpoint_save(self.claim(), expected_revision, checkpoint)
            .await;
        self.observe(&outcome);
        outcome
    }

    pub async fn complete(
        &self,
        expected_revision: i64,
        final_checkpoint: Option<&serde_json::Value>,
    ) -> Result<Fenced<Applied>, LedgerError> {
        let outcome = self
            .ledger
            .run_complete(self.claim(), expected_revision, final_checkpoint)
            .await;
        self.observe(&outcome);
        outcome
    }

    pub async fn fail(
        &self,
        expected_revision: i64,
        reason: &serde_json::Value,
    ) -> Result<Fenced<Applied>, LedgerError> {
        let outcome = self
            .ledger
            .run_fail(self.claim(), expected_revision, reason)
            .await;
        self.observe(&outcome);
        outcome
    }

    /// Stops the heartbeat and releases the lease (epoch kept).
    pub async fn release(self) -> Result<Fenced<Applied>, LedgerError> {
        self.cancel
            .cancel_with(StopCause::Stopped("lease released".into()));
        let _ = self.heartbeat.await;
        self.ledger.lease_release(&self.grant.claim).await
    }
}
