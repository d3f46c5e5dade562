//! Outcomes an agent never received: the calls of this process whose agent
//! went away before the answer (it cancelled — an SDK's timeout sends a
//! cancel —, or its request was dropped with its connection). An `unknown`
//! outcome that reached its agent was delivered: its answer already says
//! what happened and what not to do. A model whose call timed out usually
//! plans it again with different words; while such an outcome is held, the
//! next call to the same tool in the same run with a *different* request is
//! not sent but answered with the earlier call and its outcome
//! (`Dispatcher`, adapter `after_undelivered = "show"`). Showing it
//! delivers it; the same call as the earlier one also takes it off, and is
//! answered as any repeat of an intent.
//!
//! # Invariants
//!
//! - Only a call whose agent provably stopped listening is held: a call
//!   whose future is still awaited is never in here, so parallel calls of
//!   a connected agent are never held.
//! - An entry holds at most the policy's `undelivered_hold`; a hold never
//!   sends anything nor loses an intent — at worst a re-planned call is
//!   sent as it would have been without this registry.
//!
//! # Crash points
//!
//! Nothing here is durable: a restarted process (or another replica) holds
//! nothing, and the re-planned call is sent as without the registry. The
//! earlier call's fate stays in the ledger for `leasegate ops show`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::ids::RunId;
use crate::intent::OperationId;

/// Where a held outcome blocks a different call: a run and an exposed tool.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct CallPlace {
    pub run_id: RunId,
    pub tool: String,
}

/// This process's held outcomes, by where they block.
#[derive(Debug, Default)]
pub(super) struct Undelivered {
    held: Mutex<HashMap<CallPlace, Vec<Held>>>,
}

#[derive(Debug)]
struct Held {
    operation_id: OperationId,
    since: Instant,
}

/// Past this many places the registry drops expired entries when it grows.
const PRUNE_AT: usize = 1024;

impl Undelivered {
    /// Holds `operation_id`'s outcome at `place` (once).
    pub(super) fn hold(&self, place: CallPlace, operation_id: OperationId, limit: Duration) {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if held.len() >= PRUNE_AT {
            held.retain(|_, entries| {
                entries.retain(|entry| entry.since.elapsed() < limit);
                !entries.is_empty()
            });
        }
        let entries = held.entry(place).or_default();
        if !entries.iter().any(|e| e.operation_id == operation_id) {
            entries.push(Held {
                operation_id,
                since: Instant::now(),
            });
        }
    }

    /// What a call of `operation_id` at `place` must be shown first: the
    /// other operations held there (taken off: showing delivers them). Its
    /// own entry stays until a repeat of it is answered with its outcome
    /// ([`Undelivered::release`]): a repeat that finds it still in flight
    /// delivers nothing.
    pub(super) fn take_others(
        &self,
        place: &CallPlace,
        operation_id: &OperationId,
        limit: Duration,
    ) -> Vec<OperationId> {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let Some(entries) = held.get_mut(place) else {
            return Vec::new();
        };
        let mut others = Vec::new();
        entries.retain(|e| {
            let other = e.operation_id != *operation_id;
            if other && e.since.elapsed() < limit {
                others.push(e.operation_id.clone());
            }
            !other && e.since.elapsed() < limit
        });
        if entries.is_empty() {
            held.remove(place);
        }
        others
    }

    /// `operation_id`'s outcome reached its agent (a repeat was answered
    /// with it).
    pub(super) fn release(&self, place: &CallPlace, operation_id: &OperationId) {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(entries) = held.get_mut(place) {
            entries.retain(|e| e.operation_id != *operation_id);
            if entries.is_empty() {
                held.remove(place);
            }
        }
    }
}

/// What one call's dispatch task and the agent's side of it know of each
/// other: whether the agent stopped waiting, and which operation the call
/// is. Whichever is learnt last holds the outcome.
#[derive(Debug)]
pub(super) struct Delivery {
    registry: Arc<Undelivered>,
    limit: Duration,
    state: Mutex<DeliveryState>,
}

#[derive(Debug, Default)]
struct DeliveryState {
    abandoned: bool,
    identified: Option<(CallPlace, OperationId)>,
    held: bool,
}

impl Delivery {
    pub(super) fn new(registry: Arc<Undelivered>, limit: Duration) -> Arc<Self> {
        Arc::new(Self {
            registry,
            limit,
            state: Mutex::default(),
        })
    }

    /// The call is `operation_id` at `place` (a tool whose adapter shows
    /// undelivered outcomes).
    pub(super) fn identified(&self, place: CallPlace, operation_id: OperationId) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.identified = Some((place, operation_id));
        if state.abandoned {
            self.hold_locked(&mut state);
        }
    }

    /// The agent stopped waiting before it got the answer.
    pub(super) fn abandoned(&self) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.abandoned = true;
        self.hold_locked(&mut state);
    }

    /// The call's answer, its outcome, reached the caller's side: an
    /// earlier abandoned call of the same operation is delivered now.
    pub(super) fn answered(&self) {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.abandoned {
            return;
        }
        if let Some((place, operation_id)) = &state.identified {
            self.registry.release(place, operation_id);
        }
    }

    fn hold_locked(&self, state: &mut DeliveryState) {
        if state.held {
            return;
        }
        if let Some((place, operation_id)) = state.identified.clone() {
            state.held = true;
            self.registry.hold(place, operation_id, self.limit);
        }
    }
}

/// Marks the call abandoned when dropped before [`AbandonGuard::delivered`]:
/// the agent's side of the call (the front's future) went away.
pub(super) struct AbandonGuard(Option<Arc<Delivery>>);

impl AbandonGuard {
    pub(super) fn new(delivery: Arc<Delivery>) -> Self {
        Self(Some(delivery))
    }

    /// The answer reached the caller's side.
    pub(super) fn delivered(mut self) {
        self.0 = None;
    }
}

impl Drop for AbandonGuard {
    fn drop(&mut self) {
        if let Some(delivery) = self.0.take() {
            delivery.abandoned();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn place(tool: &str) -> CallPlace {
        CallPlace {
            run_id: RunId::from_uuid(uuid::Uuid::nil()),
            tool: tool.to_owned(),
        }
    }

    fn op(id: &str) -> OperationId {
        OperationId::from_string(id.to_owned())
    }

    #[test]
    fn an_abandoned_call_is_held_whichever_comes_first() {
        let registry = Arc::new(Undelivered::default());
        let limit = Duration::from_secs(60);
        // Abandoned before it was identified, and after.
        let early = Delivery::new(registry.clone(), limit);
        early.abandoned();
        early.identified(place("mail"), op("a"));
        let late = Delivery::new(registry.clone(), limit);
        late.identified(place("mail"), op("b"));
        late.abandoned();
        // Delivered: never held.
        let delivered = Delivery::new(registry.clone(), limit);
        delivered.identified(place("mail"), op("c"));
        AbandonGuard::new(delivered).delivered();
        assert_eq!(
            registry.take_others(&place("mail"), &op("d"), limit),
            vec![op("a"), op("b")]
        );
        // Shown once: nothing left.
        assert!(
            registry
                .take_others(&place("mail"), &op("d"), limit)
                .is_empty()
        );
    }

    #[test]
    fn the_same_call_again_shows_nothing_and_delivers_only_with_its_outcome() {
        let registry = Arc::new(Undelivered::default());
        let limit = Duration::from_secs(60);
        registry.hold(place("mail"), op("a"), limit);
        assert!(
            registry
                .take_others(&place("mail"), &op("a"), limit)
                .is_empty()
        );
        // Still held: the repeat may have found it in flight.
        assert_eq!(
            registry.take_others(&place("mail"), &op("b"), limit),
            vec![op("a")]
        );
        registry.hold(place("mail"), op("a"), limit);
        registry.release(&place("mail"), &op("a"));
        assert!(
            registry
                .take_others(&place("mail"), &op("b"), limit)
                .is_empty()
        );
    }

    #[test]
    fn an_expired_hold_shows_nothing() {
        let registry = Arc::new(Undelivered::default());
        registry.hold(place("mail"), op("b"), Duration::ZERO);
        assert!(
            registry
                .take_others(&place("mail"), &op("c"), Duration::ZERO)
                .is_empty()
        );
        // Another tool is another place.
        registry.hold(place("mail"), op("e"), Duration::from_secs(60));
        assert!(
            registry
                .take_others(&place("pay"), &op("f"), Duration::from_secs(60))
                .is_empty()
        );
    }
}
