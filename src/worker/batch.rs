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
//!    all, or none): each of its holders is stopped with
//!    [`StopCause::RenewalUnconfirmed`], as the single heartbeat would stop
//!    one. Leases in other chunks of the same tick are judged on their own.
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

use tokio::task::JoinHandle;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use super::{HeartbeatConfig, StopCause, WorkerCancellation};
use crate::ledger::{Fenced, LeaseClaim, Ledger, MAX_RENEW_BATCH, RunId};

type Holders = Arc<Mutex<HashMap<RunId, (LeaseClaim, WorkerCancellation)>>>;

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
        self.lock().insert(claim.run_id, (claim, cancel));
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

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<RunId, (LeaseClaim, WorkerCancellation)>> {
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
        let batch: Vec<(LeaseClaim, WorkerCancellation)> = {
            let mut held = holders
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            held.retain(|_, (_, cancel)| !cancel.is_cancelled());
            held.values().cloned().collect()
        };
        for chunk in batch.chunks(MAX_RENEW_BATCH) {
            let claims: Vec<LeaseClaim> = chunk.iter().map(|(claim, _)| claim.clone()).collect();
            let renewal = tokio::time::timeout(
                config.renew_timeout,
                ledger.lease_renew_batch(&claims, config.ttl_ms, None),
            )
            .await;
            let causes: Vec<Option<StopCause>> = match renewal {
                Ok(Ok(answers)) => answers
                    .into_iter()
                    .map(|answer| match answer.outcome {
                        Fenced::Applied(_) => None,
                        Fenced::Rejected(rejection) => Some(StopCause::from_rejection(rejection)),
                    })
                    .collect(),
                // Invariant 2: the whole chunk is unconfirmed.
                Ok(Err(error)) => {
                    vec![Some(StopCause::RenewalUnconfirmed(error.to_string())); chunk.len()]
                }
                Err(_elapsed) => vec![
                    Some(StopCause::RenewalUnconfirmed(format!(
                        "no answer within {:?}",
                        config.renew_timeout
                    )));
                    chunk.len()
                ],
            };
            let mut stopped = 0usize;
            for ((claim, cancel), cause) in chunk.iter().zip(causes) {
                let Some(cause) = cause else { continue };
                stopped += 1;
                tracing::warn!(run_id = %claim.run_id, owner = %crate::logfield::clip(&claim.owner),
                    epoch = claim.epoch, cause = %cause, "batch heartbeat stopping the lease's holder");
                cancel.cancel_with(cause);
                let mut held = holders
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner());
                // Only this claim: a newer claim on the same run stays.
                if held
                    .get(&claim.run_id)
                    .is_some_and(|(c, _)| c.epoch == claim.epoch)
                {
                    held.remove(&claim.run_id);
                }
            }
            tracing::debug!(leases = chunk.len(), stopped, "batch heartbeat renewed");
        }
    }
}
