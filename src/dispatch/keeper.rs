//! What a tool answered, kept until the ledger has it.
//!
//! A claim's holder learns something only it knows — the tool's answer, or
//! proof that no byte of the request left — and must write it under the
//! claim. When that write meets a ledger that cannot take it (a terminated
//! backend, a restarting server, a broken connection mid-commit), the fact
//! is not dropped: [`keep`] hands it to a task of its own that writes it
//! again with backoff until the ledger answers. The agent meanwhile hears
//! `unknown` (`execute`), and its re-call or the reconciler finds the
//! outcome once the write lands.
//!
//! # What a late write becomes
//!
//! - An answer whose claim is still the operation's (`dispatching`, same
//!   owner and revision; the deadline may have passed as long as nobody
//!   acted on it): settled, exactly as the first settle would have.
//! - An answer whose claim has moved on (expired into `unknown`): stored as
//!   `late_response` evidence of the same request digest, from which the
//!   reconciler converges the operation whatever the tool's capability
//!   (`reconcile::plan`).
//! - Proof of "not sent" while the claim is still the operation's: the
//!   operation goes back to `prepared`. Once the claim has moved on it is
//!   dropped: the operation is `unknown` and converges like any other.
//! - A write the ledger answers definitely (stale, not found, refused) is
//!   not tried again; a write that may have committed before its connection
//!   broke is tried again, which is safe: every write is guarded by the
//!   claim's revision, and a repeat of a committed settle only adds evidence.
//!
//! # Bounds and crashes
//!
//! At most [`MAX_KEPT`] facts wait at once in a process, whichever path
//! (inline or outbox) learned them; beyond that a fact is logged and
//! dropped, and its claim expires into `unknown` as before. Nothing kept is
//! written to disk: if the process dies holding kept facts, those facts are
//! lost, and nothing else is — every committed write stays committed, the
//! operations stay `dispatching` until their claims expire into `unknown`,
//! and the reconciler converges them from the tool's own record where the
//! capability allows (a `none` tool waits for an operator). A graceful
//! shutdown waits a bounded time for kept facts before closing the ledger
//! ([`drain`]).

use std::time::Duration;

use serde_json::Value;
use tokio::sync::Semaphore;
use tracing::Instrument;

use crate::ledger::{
    DispatchClaim, Ledger, LedgerError, OperationStatus, ReleaseUnsentOutcome, SettleOutcome,
    Settlement,
};

/// How many facts may wait for the ledger at once in one process.
pub const MAX_KEPT: usize = 4096;

/// The first pause before writing a kept fact again; it doubles up to
/// [`LONGEST_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(200);
const LONGEST_PAUSE: Duration = Duration::from_secs(5);

/// One slot per kept fact, for the whole process: the bound is on what the
/// process holds in memory, whichever dispatcher learned it.
static SLOTS: Semaphore = Semaphore::const_new(MAX_KEPT);

/// What the claim's holder learned and the ledger does not know yet.
#[derive(Debug, Clone)]
pub(super) enum Fact {
    /// The tool answered.
    Answer {
        settlement: Settlement,
        remote_id: Option<String>,
        result: Value,
    },
    /// Nothing left (the evidence says why).
    NotSent { evidence: Value },
}

impl Fact {
    fn kind(&self) -> &'static str {
        match self {
            Fact::Answer { .. } => "answer",
            Fact::NotSent { .. } => "not_sent",
        }
    }
}

/// Keeps `fact`, whose write under `claim` just failed with `failed`, and
/// writes it again in the background until the ledger answers — when the
/// failure is transient (the ledger unreachable, the session broken with
/// the statement in flight: every write here is guarded by the claim, so a
/// repeat is safe; not once this process closed its own pool). `false`:
/// not kept (a definite refusal, or [`MAX_KEPT`] facts kept already, which
/// is logged).
pub(super) fn keep(ledger: Ledger, claim: DispatchClaim, fact: Fact, failed: &LedgerError) -> bool {
    if !failed.is_transient() {
        return false;
    }
    let Ok(slot) = SLOTS.try_acquire() else {
        tracing::error!(operation_id = %claim.operation_id, fact = fact.kind(), kept = MAX_KEPT,
            "too many facts wait for the ledger: this one is dropped and its claim will expire into unknown");
        metrics::counter!("leasegate_ledger_kept_facts_dropped_total", "fact" => fact.kind())
            .increment(1);
        return false;
    };
    metrics::gauge!("leasegate_ledger_kept_facts").increment(1.0);
    let span =
        tracing::info_span!("ledger.keep", operation_id = %claim.operation_id, fact = fact.kind());
    tokio::spawn(
        async move {
            write_until_answered(&ledger, &claim, &fact).await;
            metrics::gauge!("leasegate_ledger_kept_facts").decrement(1.0);
            drop(slot);
        }
        .instrument(span),
    );
    true
}

/// Waits until no fact is kept, or `grace` has passed; `false` when some
/// are still waiting (they are lost when the process ends).
pub async fn drain(grace: Duration) -> bool {
    let all = u32::try_from(MAX_KEPT).expect("the bound fits a u32");
    match tokio::time::timeout(grace, SLOTS.acquire_many(all)).await {
        Ok(Ok(_all_free)) => true,
        Ok(Err(_)) => true,
        Err(_) => {
            let waiting = MAX_KEPT - SLOTS.available_permits();
            tracing::error!(
                waiting,
                "stopping with facts the ledger never took: their operations expire into unknown"
            );
            false
        }
    }
}

async fn write_until_answered(ledger: &Ledger, claim: &DispatchClaim, fact: &Fact) {
    let mut pause = FIRST_PAUSE;
    let mut attempt: u32 = 1;
    loop {
        let written = match fact {
            Fact::Answer {
                settlement,
                remote_id,
                result,
            } => ledger
                .operation_settle(claim, *settlement, remote_id.as_deref(), result)
                .await
                .map(|outcome| settled(claim, *settlement, outcome)),
            Fact::NotSent { evidence } => ledger
                .operation_release_unsent(claim, evidence)
                .await
                .map(|outcome| released(claim, outcome)),
        };
        match written {
            Ok(what) => {
                tracing::info!(attempts = attempt, what, "a kept fact reached the ledger");
                metrics::counter!("leasegate_ledger_kept_facts_written_total", "fact" => fact.kind())
                    .increment(1);
                return;
            }
            Err(error) if error.is_transient() => {
                if attempt == 1 || attempt.is_multiple_of(10) {
                    tracing::warn!(attempt, error = %crate::logfield::clip_display(&error),
                        "the ledger cannot take a kept fact yet; trying again");
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(LONGEST_PAUSE);
                attempt += 1;
            }
            Err(error) => {
                tracing::error!(attempt, error = %crate::logfield::clip_display(&error),
                    "the ledger refused a kept fact: it is dropped and the claim will expire into unknown");
                metrics::counter!("leasegate_ledger_kept_facts_dropped_total", "fact" => fact.kind())
                    .increment(1);
                return;
            }
        }
    }
}

/// What a late settle became, for the log.
fn settled(claim: &DispatchClaim, settlement: Settlement, outcome: SettleOutcome) -> &'static str {
    match outcome {
        SettleOutcome::Settled(_) => "settled",
        SettleOutcome::KeptAsEvidence { found, .. }
            if settled_by_this_claim(claim, settlement, found.status, found.revision) =>
        {
            "settled (an earlier try had committed)"
        }
        SettleOutcome::KeptAsEvidence { .. } => "kept as late evidence for the reconciler",
        SettleOutcome::NotClaimed(_) => "dropped: the operation has no such claim on record",
        SettleOutcome::NotFound => "dropped: the operation is no longer on record",
    }
}

/// What a late release became, for the log.
fn released(claim: &DispatchClaim, outcome: ReleaseUnsentOutcome) -> &'static str {
    match outcome {
        ReleaseUnsentOutcome::Released { .. } => "released: the operation is prepared again",
        ReleaseUnsentOutcome::StaleClaim(found)
            if found.status == OperationStatus::Prepared
                && found.revision == claim.revision + 1 =>
        {
            "released (an earlier try had committed)"
        }
        ReleaseUnsentOutcome::StaleClaim(_) => "dropped: the claim had moved on",
        ReleaseUnsentOutcome::NotFound => "dropped: the operation is no longer on record",
    }
}

/// Whether an operation found after a settle that met a broken connection
/// shows that very settle committed: the status it would have written, one
/// revision after the claim (nothing else writes a `dispatching` row's
/// terminal status without passing through `unknown` first).
pub(super) fn settled_by_this_claim(
    claim: &DispatchClaim,
    settlement: Settlement,
    status: OperationStatus,
    revision: i64,
) -> bool {
    status.as_str() == settlement.as_str() && revision == claim.revision + 1
}
