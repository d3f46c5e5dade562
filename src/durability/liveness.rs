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
