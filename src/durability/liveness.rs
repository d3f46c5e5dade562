//! This process's liveness row (`sql/process.sql`): renewed every third of
//! [`LIVENESS_TTL`] while the process runs, a failed renewal retried with
//! capped backoff instead of waiting for the next tick, and every success
//! reported to the gate ([`DurabilityGate::liveness_renewed`]), which
//! refuses new claims once the row may have lapsed (the parent module's
//! "Liveness of this process"). The durability check rides along.
//!
//! # Failure handling
//!
//! No ledger error ends the loop or the process: the renewal is an upsert
//! of the process's own row, safe to repeat after any failure, an
//! unknown outcome included. If the process dies, the row lapses after
//! the ttl and its claims are judged as those of a gone holder.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::DurabilityGate;
use crate::ledger::{Backoff, Ledger, LedgerError};

/// How long this process counts as alive after each renewal (renewed every
/// third of it).
pub const LIVENESS_TTL: Duration = Duration::from_secs(10);

/// The first retry of a failed renewal, and the longest wait between
/// retries: several tries fit in the ttl.
const RETRY_FIRST: Duration = Duration::from_millis(100);
const RETRY_CAP: Duration = Duration::from_secs(1);

fn ttl_ms() -> i64 {
    i64::try_from(LIVENESS_TTL.as_millis()).unwrap_or(i64::MAX)
}

/// One renewal, bounded by a third of the ttl, reported to the gate when
/// it succeeds.
async fn renew(ledger: &Ledger, owner: &str, gate: &DurabilityGate) -> Result<(), LedgerError> {
    let sent = std::time::Instant::now();
    let limit = LIVENESS_TTL / 3;
    let renewed = tokio::time::timeout(limit, ledger.process_heartbeat(owner, ttl_ms()))
        .await
        .unwrap_or_else(|_| Err(LedgerError::no_answer_within("process_heartbeat", limit)));
    if renewed.is_ok() {
        gate.liveness_renewed(sent, LIVENESS_TTL);
    }
    metrics::gauge!("leasegate_ledger_up").set(f64::from(u8::from(renewed.is_ok())));
    renewed
}

/// The first renewal, before the process serves: transient failures (a
/// connection that broke, no connection) are retried with backoff for up
/// to `budget`; anything else, or the budget spent, is the caller's error.
pub async fn first_renewal(
    ledger: &Ledger,
    owner: &str,
    gate: &DurabilityGate,
    budget: Duration,
) -> Result<(), LedgerError> {
    crate::ledger::retry_within(
        "process_heartbeat",
        budget,
        LedgerError::is_transient,
        || renew(ledger, owner, gate),
    )
    .await
}

/// Renews the liveness row until `stop` fires, and runs the durability
/// check with every renewal and whenever a call woke the gate
/// ([`DurabilityGate::suspect`]).
pub fn spawn(
    ledger: Ledger,
    owner: String,
    gate: Arc<DurabilityGate>,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(LIVENESS_TTL / 3);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut backoff = Backoff::new(RETRY_FIRST, RETRY_CAP);
        // Set while a failed renewal waits for its retry.
        let mut retry_at: Option<Instant> = None;
        loop {
            let renew_now = tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => true,
                () = sleep_until(retry_at) => true,
                () = gate.woken() => false,
            };
            if renew_now {
                match renew(&ledger, &owner, &gate).await {
                    Ok(()) => {
                        backoff.reset();
                        retry_at = None;
                    }
                    Err(error) => {
                        let delay = backoff.next_delay();
                        retry_at = Some(Instant::now() + delay);
                        match gate.liveness_lapsed() {
                            Some(lapsed) => tracing::error!(%error, retry_in = ?delay,
                                "liveness renewal failed and {lapsed}"),
                            None => tracing::warn!(%error, retry_in = ?delay,
                                "liveness renewal failed; trying again"),
                        }
                        // The check would meet the same ledger: it runs
                        // again once a renewal gets through.
                        continue;
                    }
                }
            }
            if let Err(error) = gate.check(&ledger).await {
                tracing::warn!(%error, "the ledger's state could not be checked: dispatch held");
            }
        }
    })
}

/// Completes at `at`, or never when there is nothing to wait for.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// When this process's liveness row may have lapsed: the ttl passed since
/// the last successful renewal was sent (the parent module's "Liveness of
/// this process"). Lock-free: every admitted call reads it.
#[derive(Debug)]
pub struct LivenessClock {
    base: std::time::Instant,
    /// When the last successful renewal was sent, in nanoseconds after
    /// `base` (`u64::MAX`: not renewed yet, nothing to judge).
    sent: AtomicU64,
    ttl_nanos: AtomicU64,
}

impl Default for LivenessClock {
    fn default() -> LivenessClock {
        LivenessClock {
            base: std::time::Instant::now(),
            sent: AtomicU64::new(u64::MAX),
            ttl_nanos: AtomicU64::new(0),
        }
    }
}

impl LivenessClock {
    /// A renewal sent at `sent` succeeded; the row lives `ttl` from when
    /// the ledger ran it, so at least `ttl` from `sent`.
    pub fn renewed(&self, sent: std::time::Instant, ttl: Duration) {
        let ttl_nanos = u64::try_from(ttl.as_nanos()).unwrap_or(u64::MAX);
        self.ttl_nanos.store(ttl_nanos, Ordering::Release);
        let nanos = sent.saturating_duration_since(self.base).as_nanos();
        let nanos = u64::try_from(nanos).unwrap_or(u64::MAX - 1);
        // Renewals may finish out of order: keep the latest send.
        let _ = self
            .sent
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |was| {
                (was == u64::MAX || nanos > was).then_some(nanos)
            });
    }

    /// Why the row may have lapsed, if it may have.
    pub fn lapsed(&self) -> Option<String> {
        let sent = self.sent.load(Ordering::Acquire);
        if sent == u64::MAX {
            return None;
        }
        let ttl = Duration::from_nanos(self.ttl_nanos.load(Ordering::Acquire));
        let since = self
            .base
            .elapsed()
            .saturating_sub(Duration::from_nanos(sent));
        (since >= ttl).then(|| {
            format!(
                "this process's liveness may have lapsed: no renewal confirmed for {}s (ttl {}s); \
                 its claims may be judged as those of a stopped process, so it takes no new ones \
                 until a renewal reaches the ledger",
                since.as_secs(),
                ttl.as_secs()
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::durability::{DurabilityGate, Hold};

    #[test]
    fn new_claims_wait_only_once_the_liveness_may_have_lapsed() {
        let gate = DurabilityGate::unchecked();
        assert_eq!(
            gate.liveness_lapsed(),
            None,
            "never renewed: nothing to judge"
        );
        gate.liveness_renewed(std::time::Instant::now(), Duration::from_secs(3600));
        assert_eq!(gate.liveness_lapsed(), None);
        assert_eq!(gate.hold(), None);
        // A ttl that has passed since the renewal was sent.
        gate.liveness_renewed(std::time::Instant::now(), Duration::ZERO);
        let Some(Hold::LedgerUnavailable(reason)) = gate.hold() else {
            panic!("a lapsed liveness holds new claims: {:?}", gate.hold());
        };
        assert!(reason.contains("liveness may have lapsed"), "{reason}");
    }
}
