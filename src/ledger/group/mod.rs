//! Group commit of the proxy's hot path and of lease heartbeats:
//! concurrent `operation_register_claim` calls (and, separately,
//! concurrent settles, and concurrent single lease renews, `renew.rs`) of
//! different runs share one statement, one transaction and one WAL
//! flush. On by default ([`super::LedgerOptions::group_commit`]); off,
//! every call is its own statement (the single path), which a batch of one
//! also is.
//!
//! A caller that finds its kind idle (nothing queued, no batch in flight
//! on its slots, below) sends its call from its own task as the single
//! statement, with its borrowed arguments ([`Ledger::grouped`]: no copy,
//! no hop); otherwise it enqueues an owned copy of them and awaits a
//! oneshot. One drainer task per kind takes the first queued item, then
//! everything already queued and (with a [`GroupCommitSettings::window`],
//! while another batch is in flight on its slots) what arrives within it,
//! up to [`GroupCommitSettings::max_batch`], and sends the batch as ONE
//! statement (`operation_register_claim_batch`, `CALL
//! operation_settle_acknowledged_batch`, `sql/operation.sql`; a batch of
//! one as the single function's statement) on a task of its own, at most
//! [`GroupCommitSettings::in_flight`] at once (default 1: the next batch
//! is what queued while this one was in flight); each caller gets its own
//! item's verdict and decodes it exactly as the single path decodes its
//! answer.
//!
//! The hot path's two kinds share their in-flight slots: with the default
//! one, a register-claim batch and a settle batch take turns, and each is
//! what queued while the other was in flight too. Their batches are then
//! fuller (a batch's fixed cost, its statements' set-up, is shared by more
//! calls), which costs the database less per call, and measured it cost
//! neither calls per second nor latency. Renews keep slots of their own: a
//! heartbeat never waits for a call's batch.
//!
//! # Invariants
//!
//! - Every item's verdict is the single call's (`operation_register_claim`
//!   / `operation_settle` / `lease_renew`): fencing, lease tokens, tenants, the digest
//!   comparison and the event rows are the single path's. The batch
//!   functions answer the common case set-based (a new intent of a fenced
//!   run inserted as `dispatching`; a live claim settled) in one statement
//!   writing exactly the rows the single function writes, and send every
//!   other item (refused, existing, duplicate, malformed) through the
//!   single function itself; `tests/integration/group_commit.rs` compares the two.
//! - No caller is answered before its batch committed (a claim is never
//!   acted on while it could still roll back); a takeover of a run's lease
//!   waits for that commit (the lease row is held FOR SHARE).
//! - Lease rows are locked in run order, new operation rows inserted in
//!   (run, step) order, the single-function items applied in (run, step)
//!   order (settles: operation id order). A set-based phase that still
//!   deadlocks (a foreign lock order, e.g. a replay's row locks) is rolled
//!   back as a whole and its items go the per-item way. A renew batch
//!   locks its leases `FOR UPDATE` in run order in one statement and has
//!   no per-item phase: it fails as a whole (after the retries of
//!   40001/40P01) and its items then go alone.
//!
//! # Failure handling
//!
//! - A call sent alone (from an idle kind, or as a batch of one: the single
//!   statement either way) is the single path: its error is the single
//!   call's, and it is not sent again.
//! - An item that raises in SQL is rolled back alone (its own
//!   subtransaction) and answered [`ItemAnswer::Alone`]: the caller sends
//!   it again through the single path, which answers or fails exactly as
//!   it would have (retrying 40001/40P01 as every call does). Nothing of
//!   the item was written by the batch.
//! - The batch statement refused, or no connection had (nothing
//!   committed: `Database`, `RetryBudgetSpent` after the whole batch was
//!   retried, `Unavailable`): every caller is answered `Alone` and goes the
//!   single path, with its single-path error if the cause persists.
//! - Connection lost with the batch in flight (the commit may have
//!   happened) or an undecodable answer: every caller gets
//!   [`LedgerError::OutcomeUnknown`] (resp. `Protocol`), which the proxy
//!   treats as it treats the single call's: read back, never a success.
//! - A drainer that died (panic) with a batch in flight: its callers'
//!   oneshots close and they get `OutcomeUnknown`. A process crash loses
//!   no more than the single path's: the database commits or rolls back
//!   the one statement as a whole.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};
use tokio::time::Instant;

mod register;
mod renew;
mod settle;

use super::error::protocol;
use super::{Ledger, LedgerError};
pub(super) use register::RegisterArgs;
pub(super) use renew::RenewArgs;
pub(super) use settle::SettleArgs;

/// The environment variable that turns group commit on (`1`, `true`,
/// `on`) or off (`0`, `false`, `off`) over the configuration, for the
/// config file's `serve`/`stdio` and for every [`super::LedgerOptions::default`]
/// (so `LEASEGATE_GROUP_COMMIT=0 cargo test` runs the suite on the single
/// path).
pub const GROUP_COMMIT_ENV: &str = "LEASEGATE_GROUP_COMMIT";

/// Largest batch: each item is one writing subtransaction, and a
/// transaction with more than 64 subtransaction ids overflows
/// PostgreSQL's per-backend subxid cache (every snapshot then reads
/// pg_subtrans). The SQL functions refuse more.
pub const MAX_BATCH_LIMIT: usize = 64;

/// Longest accepted batching window.
pub const MAX_WINDOW: Duration = Duration::from_millis(50);

/// Most batches of one kind in flight at once (`group_commit_in_flight`).
pub const MAX_IN_FLIGHT: usize = 8;

/// `group_commit_window`, `group_commit_max_batch` and
/// `group_commit_in_flight`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupCommitSettings {
    /// How long the drainer waits for more items once the first arrived,
    /// while `in_flight` batches are already under way on its slots. Zero
    /// (the default): never; a batch is what queued while the previous
    /// ones were in flight.
    pub window: Duration,
    /// Most items in one statement (1..=64).
    pub max_batch: usize,
    /// Batches sent at once (1..=8): of the hot path (register-claims and
    /// settles share these slots), and separately of renews. One (the
    /// default) gives the largest batches and the least database CPU per
    /// call; more keep a batch that waits on a row lock from holding up
    /// every other call behind it.
    pub in_flight: usize,
}

impl Default for GroupCommitSettings {
    fn default() -> Self {
        Self {
            window: Duration::ZERO,
            max_batch: MAX_BATCH_LIMIT,
            in_flight: 1,
        }
    }
}

impl GroupCommitSettings {
    /// [`GroupCommitSettings::in_flight`] within 1..=[`MAX_IN_FLIGHT`].
    fn in_flight_limit(&self) -> usize {
        self.in_flight.clamp(1, MAX_IN_FLIGHT)
    }

    /// A fresh set of in-flight slots: one permit per batch in flight.
    fn slots(&self) -> Arc<Semaphore> {
        Arc::new(Semaphore::new(self.in_flight_limit()))
    }
}

/// What [`GROUP_COMMIT_ENV`] says: `Some(on)`, or `None` when unset or
/// not one of the accepted words.
pub fn env_override() -> Option<bool> {
    match std::env::var(GROUP_COMMIT_ENV).ok()?.trim() {
        "1" | "true" | "on" => Some(true),
        "0" | "false" | "off" => Some(false),
        _ => None,
    }
}

/// One item's answer from a batch.
#[derive(Debug)]
pub(super) enum ItemAnswer<T> {
    Verdict(T),
    /// Send this item alone through the single path (see the module docs).
    Alone,
    /// This item's statement failed the way a whole batch's does when the
    /// commit may have happened or the answer was unreadable
    /// (`OutcomeUnknown`, `Protocol`); the caller gets the error. For a
    /// kind whose items may be left out of the statement
    /// (`renew.rs`), which are then `Alone` whatever became of it.
    Failed(LedgerError),
}

/// One kind of batch: how N items become one statement.
pub(super) trait Flush: Send + Sync + 'static {
    type Item: Send + 'static;
    type Answer: Send + 'static;
    const CALL: &'static str;
    /// The answers in item order, one per item. A batch of one must be
    /// sent as the single function's statement (its error is then the
    /// single call's, and the caller does not send it again).
    fn flush(
        ledger: &Ledger,
        items: &[Self::Item],
    ) -> impl Future<Output = Result<Vec<ItemAnswer<Self::Answer>>, LedgerError>> + Send;
}

type Reply<A> = oneshot::Sender<Result<ItemAnswer<A>, LedgerError>>;

/// The queue of one kind; the drainer ends when every sender is gone.
pub(super) struct Batcher<F: Flush> {
    queue: mpsc::UnboundedSender<(F::Item, Reply<F::Answer>)>,
    counts: Arc<Counts>,
    /// Batches in flight, shared with the drainer and with the batchers
    /// that share this kind's slots ([`Group::start`]).
    in_flight: Arc<Semaphore>,
    /// Items sent to the queue and not yet taken by the drainer.
    queued: Arc<AtomicUsize>,
    /// `group_commit_in_flight`: the semaphore's permits when idle.
    limit: usize,
}

/// Batches answered by the database and the items they answered with a
/// verdict (not those sent again alone), for tests and benchmarks.
#[derive(Debug, Default)]
struct Counts {
    batches: AtomicU64,
    items: AtomicU64,
    alone: AtomicU64,
}

/// What a ledger's group committer has done so far, per kind: batch
/// statements the database answered, calls answered by them, and calls
/// sent again alone (an item that raised, or a batch that failed).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GroupCommitCounts {
    pub register_batches: u64,
    pub register_items: u64,
    pub register_alone: u64,
    pub settle_batches: u64,
    pub settle_items: u64,
    pub settle_alone: u64,
    pub renew_batches: u64,
    pub renew_items: u64,
    pub renew_alone: u64,
}

impl<F: Flush> std::fmt::Debug for Batcher<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batcher").field("call", &F::CALL).finish()
    }
}

impl<F: Flush> Batcher<F> {
    /// Starts the drainer on the current runtime, sending batches on the
    /// in-flight slots `in_flight` ([`GroupCommitSettings::slots`]), which
    /// other batchers may share. `ledger` must not itself hold a group (it
    /// would keep the queue open forever).
    pub(super) fn start(
        ledger: Ledger,
        settings: GroupCommitSettings,
        in_flight: Arc<Semaphore>,
    ) -> Self {
        let (queue, receiver) = mpsc::unbounded_channel();
        let counts = Arc::new(Counts::default());
        let limit = settings.in_flight_limit();
        let queued = Arc::new(AtomicUsize::new(0));
        let drainer = Drainer {
            ledger,
            receiver,
            settings,
            counts: counts.clone(),
            in_flight: in_flight.clone(),
            queued: queued.clone(),
        };
        tokio::spawn(drain::<F>(drainer));
        Self {
            queue,
            counts,
            in_flight,
            queued,
            limit,
        }
    }

    /// A permit to send one call as a statement of its own from the
    /// caller's task: granted when the kind is idle, nothing queued and no
    /// batch in flight on its slots (a lone caller pays no hop through the
    /// drainer; calls arriving meanwhile queue and go as the next batch).
    fn idle_permit(&self) -> Option<OwnedSemaphorePermit> {
        if self.queued.load(Ordering::Acquire) != 0
            || self.in_flight.available_permits() != self.limit
        {
            return None;
        }
        self.in_flight.clone().try_acquire_owned().ok()
    }

    /// Enqueues `item` and waits for its batch's answer.
    async fn enqueue(&self, item: F::Item) -> Result<ItemAnswer<F::Answer>, LedgerError> {
        let (reply, answer) = oneshot::channel();
        self.queued.fetch_add(1, Ordering::AcqRel);
        if self.queue.send((item, reply)).is_err() {
            // No drainer (its runtime is gone): nothing was sent.
            self.queued.fetch_sub(1, Ordering::AcqRel);
            return Ok(ItemAnswer::Alone);
        }
        answer.await.unwrap_or(Err(LedgerError::OutcomeUnknown {
            call: F::CALL,
            source: sqlx::Error::WorkerCrashed,
        }))
    }
}

/// The borrowed arguments of one call of a batched kind: sent as a
/// statement of its own (the single path, and a batch of one), or owned
/// and queued for a batch.
pub(super) trait Call: Sync {
    type Batch: Flush;
    /// The single function's statement, with these arguments.
    fn alone(
        &self,
        ledger: &Ledger,
    ) -> impl Future<Output = Result<<Self::Batch as Flush>::Answer, LedgerError>> + Send;
    /// The arguments owned, to wait in the queue.
    fn queued(&self) -> <Self::Batch as Flush>::Item;
}

impl Ledger {
    /// One call of a batched kind, answered as the single function answers
    /// it: its own statement when group commit is off or `batcher` is idle
    /// (no copy of the arguments), else its item's verdict from a batch,
    /// or its own statement after all when the batch says so
    /// ([`ItemAnswer::Alone`]).
    pub(super) async fn grouped<C: Call>(
        &self,
        batcher: impl FnOnce(&Group) -> &Batcher<C::Batch>,
        call: &C,
    ) -> Result<<C::Batch as Flush>::Answer, LedgerError> {
        let Some(group) = &self.group else {
            return call.alone(self).await;
        };
        let batcher = batcher(group);
        if let Some(permit) = batcher.idle_permit() {
            record_batch_size::<C::Batch>(1);
            let answer = call.alone(self).await;
            drop(permit);
            if answer.is_ok() {
                batcher.counts.batches.fetch_add(1, Ordering::Relaxed);
                batcher.counts.items.fetch_add(1, Ordering::Relaxed);
            }
            return answer;
        }
        match batcher.enqueue(call.queued()).await? {
            ItemAnswer::Verdict(answer) => Ok(answer),
            ItemAnswer::Alone => call.alone(self).await,
            ItemAnswer::Failed(error) => Err(error),
        }
    }
}

/// The batchers of a ledger: the hot path's two statements and the
/// single lease renew.
#[derive(Debug)]
pub(super) struct Group {
    pub(super) registers: Batcher<register::RegisterBatch>,
    pub(super) settles: Batcher<settle::SettleBatch>,
    pub(super) renews: Batcher<renew::RenewBatch>,
}

impl Group {
    pub(super) fn counts(&self) -> GroupCommitCounts {
        GroupCommitCounts {
            register_batches: self.registers.counts.batches.load(Ordering::Relaxed),
            register_items: self.registers.counts.items.load(Ordering::Relaxed),
            register_alone: self.registers.counts.alone.load(Ordering::Relaxed),
            settle_batches: self.settles.counts.batches.load(Ordering::Relaxed),
            settle_items: self.settles.counts.items.load(Ordering::Relaxed),
            settle_alone: self.settles.counts.alone.load(Ordering::Relaxed),
            renew_batches: self.renews.counts.batches.load(Ordering::Relaxed),
            renew_items: self.renews.counts.items.load(Ordering::Relaxed),
            renew_alone: self.renews.counts.alone.load(Ordering::Relaxed),
        }
    }

    pub(super) fn start(plain: &Ledger, settings: GroupCommitSettings) -> Arc<Self> {
        // The hot path's two kinds take turns: each kind's batch is what
        // queued during the other kind's flight too, so it is fuller.
        let hot_path = settings.slots();
        Arc::new(Self {
            registers: Batcher::start(plain.clone(), settings, hot_path.clone()),
            settles: Batcher::start(plain.clone(), settings, hot_path),
            renews: Batcher::start(plain.clone(), settings, settings.slots()),
        })
    }
}

/// The drainer's half of a [`Batcher`].
struct Drainer<F: Flush> {
    ledger: Ledger,
    receiver: mpsc::UnboundedReceiver<(F::Item, Reply<F::Answer>)>,
    settings: GroupCommitSettings,
    counts: Arc<Counts>,
    in_flight: Arc<Semaphore>,
    queued: Arc<AtomicUsize>,
}

impl<F: Flush> Drainer<F> {
    async fn recv(&mut self) -> Option<(F::Item, Reply<F::Answer>)> {
        let next = self.receiver.recv().await;
        self.took(next.is_some());
        next
    }

    fn took(&self, one: bool) {
        if one {
            self.queued.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

async fn drain<F: Flush>(mut drainer: Drainer<F>) {
    let settings = drainer.settings;
    let max_batch = settings.max_batch.clamp(1, MAX_BATCH_LIMIT);
    let limit = settings.in_flight_limit();
    while let Some(first) = drainer.recv().await {
        // Idle (no batch in flight on these slots) or no window: send what is
        // queued once a batch may go (what queued while the batches in
        // flight were, up to max_batch); a lone caller waits for nothing.
        // Busy with a window: wait up to it for more (tokio's timer rounds
        // it up to its 1 ms tick).
        let no_wait = drainer.in_flight.available_permits() == limit || settings.window.is_zero();
        let Ok(permit) = drainer.in_flight.clone().acquire_owned().await else {
            return;
        };
        let mut batch = vec![first];
        let deadline = Instant::now() + settings.window;
        while batch.len() < max_batch {
            match drainer.receiver.try_recv() {
                Ok(next) => {
                    drainer.took(true);
                    batch.push(next);
                    continue;
                }
                Err(mpsc::error::TryRecvError::Disconnected) => break,
                // What was queued is the batch. (A timer, even one already
                // due, would cost up to a tick: tokio's 1 ms.)
                Err(mpsc::error::TryRecvError::Empty) if no_wait => break,
                Err(mpsc::error::TryRecvError::Empty) => {}
            }
            match tokio::time::timeout_at(deadline, drainer.recv()).await {
                Ok(Some(next)) => batch.push(next),
                Ok(None) | Err(_) => break,
            }
        }
        let ledger = drainer.ledger.clone();
        let counts = drainer.counts.clone();
        tokio::spawn(async move {
            let _permit = permit;
            send_batch::<F>(&ledger, &counts, batch).await;
        });
    }
}

/// `leasegate_group_commit_batch_size`: the calls one statement of `F`
/// carries (a lone call counts one).
fn record_batch_size<F: Flush>(calls: usize) {
    metrics::histogram!("leasegate_group_commit_batch_size", "call" => F::CALL)
        .record(calls as f64);
}

/// Sends one batch and answers each of its callers.
async fn send_batch<F: Flush>(
    ledger: &Ledger,
    counts: &Counts,
    batch: Vec<(F::Item, Reply<F::Answer>)>,
) {
    let (items, replies): (Vec<_>, Vec<_>) = batch.into_iter().unzip();
    record_batch_size::<F>(items.len());
    match F::flush(ledger, &items).await {
        Ok(answers) if answers.len() == replies.len() => {
            counts.batches.fetch_add(1, Ordering::Relaxed);
            for (reply, answer) in replies.into_iter().zip(answers) {
                match answer {
                    ItemAnswer::Verdict(_) => counts.items.fetch_add(1, Ordering::Relaxed),
                    ItemAnswer::Alone => counts.alone.fetch_add(1, Ordering::Relaxed),
                    ItemAnswer::Failed(_) => 0,
                };
                let _ = reply.send(Ok(answer));
            }
        }
        Ok(answers) => {
            let detail = format!("{} answers for {} items", answers.len(), replies.len());
            for reply in replies {
                let _ = reply.send(Err(LedgerError::Protocol {
                    call: F::CALL,
                    detail: detail.clone(),
                }));
            }
        }
        // A batch of one was the single statement (every `Flush`): its
        // error is the single call's, and it is not sent again.
        Err(error) if replies.len() == 1 => {
            if let Some(reply) = replies.into_iter().next() {
                let _ = reply.send(Err(error));
            }
        }
        Err(error) => {
            tracing::warn!(call = F::CALL, %error, "group commit batch failed");
            counts
                .alone
                .fetch_add(replies.len() as u64, Ordering::Relaxed);
            for reply in replies {
                let _ = reply.send(fan_out(&error));
            }
        }
    }
}

/// [`fan_out`] as one item's answer.
fn failed_item<T>(error: &LedgerError) -> ItemAnswer<T> {
    fan_out(error).unwrap_or_else(ItemAnswer::Failed)
}

/// What one caller of a failed batch is answered (module docs).
fn fan_out<T>(error: &LedgerError) -> Result<ItemAnswer<T>, LedgerError> {
    match error {
        LedgerError::OutcomeUnknown { call, source } => Err(LedgerError::OutcomeUnknown {
            call,
            source: sqlx::Error::Protocol(format!("group commit batch: {source}")),
        }),
        LedgerError::Protocol { call, detail } => Err(LedgerError::Protocol {
            call,
            detail: detail.clone(),
        }),
        LedgerError::Sealed {
            after_call: true, ..
        } => Err(LedgerError::Protocol {
            call: "group commit",
            detail: error.to_string(),
        }),
        // Nothing was committed: the single path decides.
        _ => Ok(ItemAnswer::Alone),
    }
}
/// Puts (1-based item, answer) pairs in item order: exactly one per item.
fn in_item_order<T>(
    call: &'static str,
    len: usize,
    answers: impl Iterator<Item = (i32, ItemAnswer<T>)>,
) -> Result<Vec<ItemAnswer<T>>, LedgerError> {
    let mut slots: Vec<Option<ItemAnswer<T>>> = (0..len).map(|_| None).collect();
    for (item, answer) in answers {
        let slot = usize::try_from(item)
            .ok()
            .and_then(|i| i.checked_sub(1))
            .and_then(|i| slots.get_mut(i))
            .ok_or_else(|| protocol(call, format!("answer for item {item} of {len}")))?;
        if slot.replace(answer).is_some() {
            return Err(protocol(call, format!("two answers for item {item}")));
        }
    }
    slots
        .into_iter()
        .enumerate()
        .map(|(i, slot)| {
            slot.ok_or_else(|| protocol(call, format!("no answer for item {}", i + 1)))
        })
        .collect()
}
