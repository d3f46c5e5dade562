//! The heartbeat of a worker host that holds many leases: one batch
//! renewal per interval for all of them (`Ledger::lease_renew_batch`, one
//! round trip per 10,000 leases), instead of one renewal per lease.
//!
//! Each lease keeps the single heartbeat's contract (see the parent
//! module): the first renewal it cannot confirm cancels its holder's
//! [`WorkerCancellation`] with the cause and drops the lease from the set.
//! A lease the batch answers lost (lease lost, token invalid, not found)
//! stops its holder with [`StopCause::LeaseLost`]; a terminal run with
//! [`StopCause::RunTerminal`]; the others of the batch keep running.
//!
//! # Invariants
//!
//! 1. A lease is renewed only while its holder's cancellation is not
//!    cancelled: a holder that stopped is dropped before the next batch.
//! 2. A batch that fails or does not answer within `renew_timeout` is
//!    unconfirmed for every lease in it (the database may have renewed them
//!    all, or none). A transient failure (a connection that broke, no
//!    answer in time) is sent again with capped backoff for the leases a
//!    retry can still renew before they may lapse (the ttl from when each
//!    lease's last confirmed renewal was sent, or from when it was added);
//!    the others, and every lease of a batch that failed otherwise, are
//!    stopped with [`StopCause::RenewalUnconfirmed`], as the single
//!    heartbeat would stop one. Leases in other chunks of the same tick are
//!    judged on their own.
//! 3. It never re-acquires: a lost lease is never resurrected.
//!
//! # Failure handling
//!
//! If the host freezes past the ttl, the first batch after it thaws answers
//! every lease lost (or times out): every holder is stopped. If the process
//! dies, its leases expire on the database clock and another worker takes
//! them over; the writes of this one are fenced whatever it believes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use super::{HeartbeatConfig, StopCause, WorkerCancellation};
use crate::ledger::{Backoff, Fenced, LeaseClaim, Ledger, MAX_RENEW_BATCH, RunId};

type Holders = Arc<Mutex<HashMap<RunId, Held>>>;

/// A lease the batch renews.
#[derive(Debug, Clone)]
struct Held {
    claim: LeaseClaim,
    cancel: WorkerCancellation,
    /// When its last confirmed renewal was sent (or it was added): its
    /// lease lives at least the ttl from then (invariant 2).
    confirmed_sent: Instant,
}

/// Renews every lease added to it, in one batch per `config.interval`.
/// Dropping it without [`BatchHeartbeat::stop`] stops the renewals too.
#[derive(Debug)]
pub struct BatchHeartbeat {
    holders: Holders,
    stop: CancellationToken,
    task: Option<JoinHandle<()>>,
}

impl BatchHeartbeat {
    /// Starts the heartbeat (the first batch one interval from now).
    /// `config` is checked as the single heartbeat's is.
    pub fn spawn(ledger: Ledger, config: HeartbeatConfig) -> Result<Self, String> {
        config.validate()?;
        let holders: Holders = Arc::default();
        let stop = CancellationToken::new();
        let task = tokio::spawn(run(ledger, config, holders.clone(), stop.clone()));
        Ok(Self {
            holders,
            stop,
            task: Some(task),
        })
    }

    /// Renews `claim` from the next batch on, stopping `cancel` when the
    /// lease cannot be confirmed. A second claim on the same run replaces
    /// the first.
    pub fn add(&self, claim: LeaseClaim, cancel: WorkerCancellation) {
        let held = Held {
            claim,
            cancel,
            confirmed_sent: Instant::now(),
        };
        self.lock().insert(held.claim.run_id, held);
    }

    /// Stops renewing `run` (its holder is not cancelled: release the lease
    /// or let it expire). Whether it was renewed.
    pub fn remove(&self, run: RunId) -> bool {
        self.lock().remove(&run).is_some()
    }

    /// How many leases it renews now.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Stops the renewals (holders are not cancelled) and waits for a batch
    /// in flight to finish.
    pub async fn stop(mut self) {
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<RunId, Held>> {
        self.holders
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Drop for BatchHeartbeat {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn run(ledger: Ledger, config: HeartbeatConfig, holders: Holders, stop: CancellationToken) {
    let mut ticker = tokio::time::interval_at(Instant::now() + config.interval, config.interval);
    // After a freeze, renew once rather than in a burst of missed ticks.
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = ticker.tick() => {}
        }
        // Invariant 1: holders that stopped are dropped first.
        let batch: Vec<Held> = {
            let mut held = holders
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            held.retain(|_, held| !held.cancel.is_cancelled());
            held.values().cloned().collect()
        };
        for chunk in batch.chunks(MAX_RENEW_BATCH) {
            if !renew_chunk(&ledger, &config, &holders, chunk.to_vec(), &stop).await {
                return;
            }
        }
    }
}

/// Renews one chunk, again after a transient failure while a retry can
/// land in time (invariant 2); stops the holders whose lease is lost or
/// unconfirmed. False when `stop` fired meanwhile.
async fn renew_chunk(
    ledger: &Ledger,
    config: &HeartbeatConfig,
    holders: &Holders,
    mut pending: Vec<Held>,
    stop: &CancellationToken,
) -> bool {
    let ttl = Duration::from_millis(u64::try_from(config.ttl_ms).unwrap_or(0));
    let mut backoff = Backoff::new(
        Duration::from_millis(50),
        (config.interval / 2).max(Duration::from_millis(50)),
    );
    loop {
        let claims: Vec<LeaseClaim> = pending.iter().map(|held| held.claim.clone()).collect();
        let sent = Instant::now();
        let renewal = tokio::time::timeout(
            config.renew_timeout,
            ledger.lease_renew_batch(&claims, config.ttl_ms, None),
        )
        .await;
        let transient = match renewal {
            Ok(Ok(answers)) => {
                let mut stopped = 0usize;
                for (held, answer) in pending.iter().zip(answers) {
                    match answer.outcome {
                        Fenced::Applied(_) => confirmed(holders, &held.claim, sent),
                        Fenced::Rejected(rejection) => {
                            stopped += 1;
                            stop_holder(holders, held, StopCause::from_rejection(rejection));
                        }
                    }
                }
                tracing::debug!(leases = pending.len(), stopped, "batch heartbeat renewed");
                return true;
            }
            Ok(Err(error)) if error.is_transient() => error.to_string(),
            Ok(Err(error)) => {
                for held in &pending {
                    stop_holder(
                        holders,
                        held,
                        StopCause::RenewalUnconfirmed(error.to_string()),
                    );
                }
                return true;
            }
            Err(_elapsed) => format!("no answer within {:?}", config.renew_timeout),
        };
        let delay = backoff.next_delay();
        let retry_by = Instant::now() + delay + config.renew_timeout;
        let (retry, lapsing): (Vec<Held>, Vec<Held>) = pending
            .into_iter()
            .filter(|held| !held.cancel.is_cancelled())
            .partition(|held| retry_by < held.confirmed_sent + ttl);
        for held in &lapsing {
            stop_holder(
                holders,
                held,
                StopCause::RenewalUnconfirmed(transient.clone()),
            );
        }
        if retry.is_empty() {
            return true;
        }
        tracing::warn!(leases = retry.len(), error = %transient, retry_in = ?delay,
            "batch renewal failed; trying again");
        tokio::select! {
            _ = stop.cancelled() => return false,
            _ = tokio::time::sleep(delay) => {}
        }
        pending = retry;
    }
}

/// Records a confirmed renewal of `claim` sent at `sent` (only for this
/// claim: a newer claim on the same run keeps its own).
fn confirmed(holders: &Holders, claim: &LeaseClaim, sent: Instant) {
    let mut held = holders
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(entry) = held.get_mut(&claim.run_id)
        && entry.claim.epoch == claim.epoch
    {
        entry.confirmed_sent = sent;
    }
}

/// Stops `held`'s holder with `cause` and drops its lease from the set.
fn stop_holder(holders: &Holders, held: &Held, cause: StopCause) {
    let claim = &held.claim;
    tracing::warn!(run_id = %claim.run_id, owner = %crate::logfield::clip(&claim.owner),
        epoch = claim.epoch, cause = %cause, "batch heartbeat stopping the lease's holder");
    held.cancel.cancel_with(cause);
    let mut set = holders
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    // Only this claim: a newer claim on the same run stays.
    if set
        .get(&claim.run_id)
        .is_some_and(|entry| entry.claim.epoch == claim.epoch)
    {
        set.remove(&claim.run_id);
    }
}
