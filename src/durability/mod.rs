//! The durability contract ("a lease token never rolls back with the
//! WAL"): what an acknowledged ledger write survives, checked at startup and
//! every few seconds, and the failovers that broke it.
//!
//! # Contract
//!
//! * `durability = "local"` (default): a write is acknowledged once the
//!   primary committed it. It survives a crash and restart of that primary.
//!   It may be lost when an asynchronous standby is promoted: the standby
//!   has the WAL up to its switch point, and commits acknowledged after it
//!   are gone. leasegate detects such a failover (below), records it and
//!   holds dispatch until an operator resolves it; it never presents the
//!   new primary's history as complete.
//! * `durability = "sync_replica"`: a write is acknowledged only once a
//!   synchronous standby flushed it too (`synchronous_commit` at least `on`
//!   on every pooled session, `remote_apply` kept). `leasegate serve` refuses
//!   to start unless `synchronous_standby_names` is set, at least one
//!   standby streams as `sync` or `quorum`, and the session's
//!   `synchronous_commit` is `on` or `remote_apply`. While that stops being
//!   true (standby gone, names cleared), side-effecting calls are refused
//!   before anything is registered or sent, the outbox and the reconciler do
//!   not claim, `leasegate_durability_ok` is 0 and `GET /v1/durability`
//!   says why: it never silently degrades to `local`. Promoting the
//!   synchronous standby loses nothing acknowledged — with one PostgreSQL
//!   caveat: a commit whose wait for the standby is cancelled (the session's
//!   `statement_timeout`, `pg_cancel_backend`) is answered as committed with
//!   a WARNING while only the primary has it. The high-water below still
//!   covers such a write, so if a failover loses it, it is reported lossy,
//!   not silently.
//!
//! # Failover detection (both modes)
//!
//! [`DurabilityGate`] keeps, in memory, the highest WAL position this process saw
//! acknowledged: `(system identifier, timeline, LSN)`, sampled by every
//! check and after every answer of a side-effecting call (before the agent
//! hears it). A sample is the WAL flush position read after the
//! acknowledgement (the insert position under `synchronous_commit = off`,
//! where a commit is acknowledged before its flush), so it is an upper
//! bound: a failover may be reported as possibly lossy when the lost tail
//! held no acknowledged write, never the reverse. Not the insert position
//! otherwise: a crash-restart of the primary loses WAL inserted but not
//! flushed — never an acknowledged commit — and would read as a loss. When the same system comes back on a higher timeline, the
//! switch point is read from the new timeline's history file; if it is
//! below the high-water (or cannot be read, or the system identity changed,
//! or the timeline or position went back), acknowledged writes in
//! `(switch, high-water]` may be lost: a `ledger_failovers` row is recorded
//! (lossy), the error is logged, and every process holds dispatch while an
//! unresolved lossy row exists, until `POST /v1/failovers/{id}/resolve`
//! (`leasegate ops failover-resolve`). A failover with nothing acknowledged
//! beyond the switch point is recorded resolved ("clean") and holds nothing.
//!
//! A lost `dispatching` claim is not rewritten by the resolution: on the new
//! primary the operation is where the standby left it (absent, `prepared`
//! or `dispatching`); a `dispatching` claim lapses into `unknown` as always
//! and the reconciler derives the truth from the tool's own record; a
//! re-call of an absent one derives the same operation id, so an
//! `idempotency_key` tool answers it from its record.
//!
//! Limits: the high-water lives in the process. A process started after the
//! failover cannot tell what the old primary acknowledged; it still holds
//! while a row another process recorded is unresolved. Writes acknowledged
//! by the control API (leases, checkpoints) are covered by the periodic
//! sample only.
//!
//! # Failure handling
//!
//! A check that cannot reach the ledger holds dispatch until a check
//! succeeds. A connection-level ledger error seen by a call
//! ([`DurabilityGate::suspect`]) holds dispatch and wakes the check at once. While the
//! hold only says "unconfirmed" (a failed check, a suspicion), the next call
//! runs the check itself before deciding ([`DurabilityGate::admit`], again
//! while suspicions keep arriving, up to [`ADMIT_CHECKS`] times), so a
//! database blip costs a check rather than refused calls, and a call that
//! would reach a promoted standby is checked first. The check's reads go
//! through the ledger's pool, which validates its idle sessions after one
//! broke and reads again on a fresh one, so a lone terminated connection
//! fails neither the check nor the call behind it.
//!
//! What a refused call is told ([`Hold`]): "durability" only when the
//! contract itself failed (the server does not give what the policy
//! claims, or a lossy failover is unresolved); "ledger unavailable" when
//! the ledger could not be reached or confirmed — nothing says the
//! contract failed, and the next successful check ends it.
//!
//! # Liveness of this process
//!
//! The process renews its liveness row (`Ledger::process_heartbeat`, the
//! loop in `liveness`) every third of [`liveness::LIVENESS_TTL`], retrying
//! a failed renewal with capped backoff; claim holders are judged by that
//! row (`sql/process.sql`). The gate is told when each successful renewal
//! was *sent* ([`DurabilityGate::liveness_renewed`]): the row's expiry is
//! at least that instant plus the ttl, on any clock that runs no faster
//! than this host's monotonic one. Once the ttl has passed since then with
//! no renewal confirmed (the ledger unreachable for that long, or the
//! process frozen), the row may have lapsed, other processes may judge
//! this process's claims as those of a gone holder and turn them
//! `unknown`, and so a claim taken now could be expired under its own
//! dispatch: new claims are refused ("ledger unavailable", before
//! anything is registered) until a renewal succeeds again, which revives
//! the row. Claims this process already holds stay fenced by the ledger
//! (their settle is guarded by the claim); the process never exits over
//! it. What remains open: a call that
//! gets a fresh connection to a promoted standby before any error or check
//! noticed the old primary's death (the pooled connections to it all break
//! at once, and the check runs every ~3.3 s, so this needs a call to be the
//! very first user of the new server); the answer it gets is still recorded
//! and sampled, and the failover is detected at the next check.

pub mod liveness;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio::sync::Notify;

use crate::ledger::{
    DurabilityFacts, FailoverRecord, FailoverSeen, Ledger, LedgerError, Lsn, WalPosition,
};
use crate::policy::Durability;

/// A WAL position on one server history: what a process saw acknowledged.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Position {
    pub system_identifier: String,
    pub timeline: i64,
    pub lsn: Lsn,
}

impl Position {
    fn of(facts: &DurabilityFacts) -> Option<Position> {
        Some(Position {
            system_identifier: facts.system_identifier.clone(),
            timeline: facts.timeline?,
            lsn: facts.wal_lsn?,
        })
    }
}

/// How a new reading relates to the high-water.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    /// No high-water yet, or the same history at or beyond it.
    Continues,
    /// A different history: the timeline or the system changed, or the
    /// position went back. `promoted` when the same system moved to a higher
    /// timeline (a promoted standby: the switch point is in its history).
    Diverged { promoted: bool },
}

/// Compares a reading with the high-water (pure).
pub fn compare(high_water: Option<&Position>, now: &Position) -> Seen {
    let Some(high) = high_water else {
        return Seen::Continues;
    };
    if high.system_identifier == now.system_identifier
        && high.timeline == now.timeline
        && now.lsn >= high.lsn
    {
        return Seen::Continues;
    }
    Seen::Diverged {
        promoted: high.system_identifier == now.system_identifier && now.timeline > high.timeline,
    }
}

/// Why the server does not give what `mode` promises (pure); empty when it
/// does.
pub fn unmet(mode: Durability, facts: &DurabilityFacts) -> Vec<String> {
    let mut reasons = Vec::new();
    if facts.in_recovery {
        reasons.push(
            "the ledger's server is a standby (in recovery): no write can commit there".to_owned(),
        );
    }
    if mode == Durability::SyncReplica {
        if facts.synchronous_standby_names.trim().is_empty() {
            reasons.push(
                "durability = \"sync_replica\" needs synchronous replication: the server's \
                 synchronous_standby_names is empty"
                    .to_owned(),
            );
        }
        if facts.sync_standbys == 0 {
            reasons.push(format!(
                "durability = \"sync_replica\" needs a synchronous standby: none streams as sync \
                 or quorum ({} standby(s) streaming; the ledger's owner role must be allowed to \
                 read pg_stat_replication, e.g. pg_monitor)",
                facts.streaming_standbys
            ));
        }
        if !matches!(facts.synchronous_commit.as_str(), "on" | "remote_apply") {
            reasons.push(format!(
                "durability = \"sync_replica\" needs synchronous_commit = on or remote_apply, \
                 found {:?}",
                facts.synchronous_commit
            ));
        }
    }
    reasons
}

/// What `GET /v1/durability` answers.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The policy's contract: `local` or `sync_replica`.
    pub durability: &'static str,
    /// Dispatch may proceed: the contract is met and no lossy failover is
    /// unresolved.
    pub ok: bool,
    /// Why dispatch is held (empty when `ok`).
    pub reasons: Vec<String>,
    pub facts: Option<DurabilityFacts>,
    /// The highest position this process saw acknowledged.
    pub high_water: Option<Position>,
    pub unresolved_failovers: Vec<FailoverRecord>,
    pub checked_at: Option<DateTime<Utc>>,
}

/// Why dispatch is held, as a refused caller is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hold {
    /// The durability contract failed: the server does not give what the
    /// policy claims, or a lossy failover is unresolved. Only the server's
    /// set-up or an operator ends it.
    Durability(String),
    /// The ledger could not be reached or confirmed (a failed check, a
    /// connection that broke, this process's liveness possibly lapsed):
    /// nothing says the contract failed; a successful check or renewal
    /// ends it.
    LedgerUnavailable(String),
}

impl Hold {
    /// The reasons, joined.
    pub fn reason(&self) -> &str {
        match self {
            Hold::Durability(reason) | Hold::LedgerUnavailable(reason) => reason,
        }
    }
}

impl std::fmt::Display for Hold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Hold::Durability(reason) => write!(f, "durability hold: {reason}"),
            Hold::LedgerUnavailable(reason) => write!(f, "ledger unavailable: {reason}"),
        }
    }
}

/// How many checks [`DurabilityGate::admit`] runs while suspicions keep
/// arriving before it refuses with the last reason.
pub const ADMIT_CHECKS: usize = 3;

#[derive(Debug, Default)]
struct State {
    high_water: Option<Position>,
    facts: Option<DurabilityFacts>,
    unmet: Vec<String>,
    failovers: Vec<FailoverRecord>,
    /// The last check could not finish.
    error: Option<String>,
    /// A ledger error seen since the last check.
    suspect: Option<String>,
    checked_at: Option<DateTime<Utc>>,
}

impl State {
    /// Held only because the last facts are unconfirmed (a failed check, a
    /// suspicion, no check yet): one successful check may clear it.
    fn unverified_only(&self) -> bool {
        self.contract_met() && (self.error.is_some() || self.suspect.is_some())
    }

    /// Nothing known says the contract failed.
    fn contract_met(&self) -> bool {
        self.unmet.is_empty() && !self.failovers.iter().any(|f| f.lossy)
    }

    fn reasons(&self) -> Vec<String> {
        let mut reasons = self.unmet.clone();
        if let Some(error) = &self.error {
            reasons.push(error.clone());
        }
        if let Some(suspect) = &self.suspect {
            reasons.push(suspect.clone());
        }
        for failover in self.failovers.iter().filter(|f| f.lossy) {
            reasons.push(format!(
                "unresolved failover {}: timeline {} -> {}, switch point {}, acknowledged up to \
                 {}: acknowledged writes may be lost; compare the ledger with the tools' records, \
                 then resolve it (POST /v1/failovers/{}/resolve)",
                failover.failover_id,
                failover.old_timeline,
                failover.new_timeline,
                failover
                    .switch_lsn
                    .map_or_else(|| "unknown".to_owned(), |lsn| lsn.to_string()),
                failover.acknowledged_lsn,
                failover.failover_id
            ));
        }
        reasons
    }
}

/// The durability gate of one process: dispatch asks it before registering
/// anything ([`DurabilityGate::hold`]); the liveness loop runs [`DurabilityGate::check`].
#[derive(Debug)]
pub struct DurabilityGate {
    mode: Durability,
    /// This process's identity, recorded as the failover's detector.
    owner: String,
    state: Mutex<State>,
    /// Fast path of [`DurabilityGate::hold`].
    held: AtomicBool,
    /// Bumped by [`DurabilityGate::suspect`]; a check clears the suspicion only when
    /// none arrived while it ran.
    suspicions: AtomicU64,
    wake: Notify,
    /// One check at a time: callers of [`DurabilityGate::admit`] that find the gate
    /// unverified wait for the same check instead of each running one.
    checking: tokio::sync::Mutex<()>,
    /// Whether this process's liveness row may have lapsed (module docs).
    liveness: liveness::LivenessClock,
}

impl DurabilityGate {
    /// A gate that holds until its first check.
    pub fn new(mode: Durability, owner: impl Into<String>) -> DurabilityGate {
        let gate = DurabilityGate {
            mode,
            owner: owner.into(),
            state: Mutex::new(State {
                error: Some("durability not checked yet".to_owned()),
                ..State::default()
            }),
            held: AtomicBool::new(true),
            suspicions: AtomicU64::new(0),
            wake: Notify::new(),
            checking: tokio::sync::Mutex::new(()),
            liveness: liveness::LivenessClock::default(),
        };
        gate.publish(&gate.lock());
        gate
    }

    /// A gate that never holds (no checks: embedders and unit tests that
    /// wire dispatch by hand).
    pub fn unchecked() -> DurabilityGate {
        DurabilityGate {
            mode: Durability::Local,
            owner: String::new(),
            state: Mutex::new(State::default()),
            held: AtomicBool::new(false),
            suspicions: AtomicU64::new(0),
            wake: Notify::new(),
            checking: tokio::sync::Mutex::new(()),
            liveness: liveness::LivenessClock::default(),
        }
    }

    pub fn mode(&self) -> Durability {
        self.mode
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Why dispatch is held, or `None` when it may proceed.
    pub fn hold(&self) -> Option<Hold> {
        if let Some(lapsed) = self.liveness_lapsed() {
            return Some(Hold::LedgerUnavailable(lapsed));
        }
        if !self.held.load(Ordering::Acquire) {
            return None;
        }
        let state = self.lock();
        let reasons = state.reasons();
        if reasons.is_empty() {
            return None;
        }
        let reasons = reasons.join("; ");
        Some(if state.contract_met() {
            Hold::LedgerUnavailable(reasons)
        } else {
            Hold::Durability(reasons)
        })
    }

    /// Why dispatch is held, or `None` when it may proceed — after checking
    /// at once when the hold only says the facts are unconfirmed (a ledger
    /// blip, a suspicion), so a transient error costs a check, not a
    /// refused call; checked again while new suspicions arrive during a
    /// successful check, up to [`ADMIT_CHECKS`] checks. A contract that is not met,
    /// an unresolved lossy failover, or a possibly lapsed liveness is
    /// answered without a check.
    pub async fn admit(&self, ledger: &Ledger) -> Option<Hold> {
        for _ in 0..ADMIT_CHECKS {
            if self.liveness_lapsed().is_some() || !self.held.load(Ordering::Acquire) {
                return self.hold();
            }
            if !self.lock().unverified_only() {
                return self.hold();
            }
            let _one = self.checking.lock().await;
            // Someone else's check may have settled it while we waited.
            if !self.held.load(Ordering::Acquire) || !self.lock().unverified_only() {
                return self.hold();
            }
            if self.check_locked(ledger).await.is_err() {
                // The ledger could not be read: another check now would
                // only wait as long again.
                break;
            }
        }
        self.hold()
    }

    /// A liveness renewal sent at `sent` succeeded; the row lives `ttl`
    /// from the moment the ledger ran it (module docs, "Liveness").
    pub fn liveness_renewed(&self, sent: Instant, ttl: Duration) {
        self.liveness.renewed(sent, ttl);
    }

    /// Why this process's liveness row may have lapsed, if it may have.
    pub fn liveness_lapsed(&self) -> Option<String> {
        self.liveness.lapsed()
    }

    /// A call saw the ledger fail: hold until a check succeeds, and check now.
    pub fn suspect(&self, why: &str) {
        if self.owner.is_empty() {
            return;
        }
        self.suspicions.fetch_add(1, Ordering::AcqRel);
        let mut state = self.lock();
        state.suspect = Some(format!(
            "the ledger failed a call ({why}); re-checking the ledger before dispatching again"
        ));
        self.publish(&state);
        drop(state);
        self.wake.notify_one();
    }

    /// Completes when [`DurabilityGate::suspect`] asks for a check.
    pub async fn woken(&self) {
        self.wake.notified().await;
    }

    /// What `GET /v1/durability` answers.
    pub fn report(&self) -> Report {
        let state = self.lock();
        let mut reasons = state.reasons();
        reasons.extend(self.liveness_lapsed());
        Report {
            durability: self.mode.as_str(),
            ok: reasons.is_empty(),
            reasons,
            facts: state.facts.clone(),
            high_water: state.high_water.clone(),
            unresolved_failovers: state.failovers.clone(),
            checked_at: state.checked_at,
        }
    }

    fn publish(&self, state: &State) {
        let held = !state.reasons().is_empty();
        let was = self.held.swap(held, Ordering::AcqRel);
        metrics::gauge!("leasegate_durability_ok").set(if held { 0.0 } else { 1.0 });
        metrics::gauge!("leasegate_failovers_unresolved")
            .set(state.failovers.iter().filter(|f| f.lossy).count() as f64);
        if held && !was && !self.owner.is_empty() {
            tracing::error!(
                reasons = %state.reasons().join("; "),
                durability = self.mode.as_str(),
                "durability not met: dispatch held"
            );
        } else if !held && was && !self.owner.is_empty() {
            tracing::info!(
                durability = self.mode.as_str(),
                "durability met: dispatch resumes"
            );
        }
    }

    /// One check: reads the facts, judges the policy, detects a failover
    /// against the high-water (recording it), reads the unresolved
    /// failovers, and publishes the result. An error leaves dispatch held.
    pub async fn check(&self, ledger: &Ledger) -> Result<Report, LedgerError> {
        let _one = self.checking.lock().await;
        self.check_locked(ledger).await
    }

    async fn check_locked(&self, ledger: &Ledger) -> Result<Report, LedgerError> {
        let suspicions = self.suspicions.load(Ordering::Acquire);
        match self.check_inner(ledger).await {
            Ok((facts, failovers)) => {
                let mut state = self.lock();
                state.unmet = unmet(self.mode, &facts);
                state.facts = Some(facts);
                state.failovers = failovers;
                state.error = None;
                state.checked_at = Some(Utc::now());
                if self.suspicions.load(Ordering::Acquire) == suspicions {
                    state.suspect = None;
                }
                self.publish(&state);
            }
            Err(error) => {
                let mut state = self.lock();
                state.error = Some(format!("the ledger's state could not be checked: {error}"));
                self.publish(&state);
                drop(state);
                return Err(error);
            }
        }
        Ok(self.report())
    }

    async fn check_inner(
        &self,
        ledger: &Ledger,
    ) -> Result<(DurabilityFacts, Vec<FailoverRecord>), LedgerError> {
        // The baseline is what was read before this reading began: a
        // reading that finished meanwhile may be ahead of ours without any
        // history having changed (the WAL position only grows in real time).
        let baseline = self.lock().high_water.clone();
        let facts = ledger.durability_facts().await?;
        if let Some(now) = Position::of(&facts) {
            self.advance(ledger, baseline, now).await?;
        }
        let failovers = ledger.failovers(true).await?;
        Ok((facts, failovers))
    }

    /// Raises the high-water to `now`, or records the failover that `now`
    /// shows against `baseline` (the high-water before `now` was read).
    async fn advance(
        &self,
        ledger: &Ledger,
        baseline: Option<Position>,
        now: Position,
    ) -> Result<(), LedgerError> {
        let high = baseline;
        let Seen::Diverged { promoted } = compare(high.as_ref(), &now) else {
            let mut state = self.lock();
            // Another reading may have raised it meanwhile: keep the higher.
            if compare(state.high_water.as_ref(), &now) == Seen::Continues {
                state.high_water = Some(now);
            }
            return Ok(());
        };
        let high = high.expect("a divergence needs a high-water");
        let switch_lsn = if promoted {
            ledger.timeline_switch(high.timeline, now.timeline).await?
        } else {
            None
        };
        // If we crash here nothing is recorded: the new primary holds no
        // row, and a process that restarts has no high-water to compare.
        let record = ledger
            .failover_record(&FailoverSeen {
                detected_by: &self.owner,
                system_identifier: &now.system_identifier,
                old_system_identifier: (high.system_identifier != now.system_identifier)
                    .then_some(high.system_identifier.as_str()),
                old_timeline: high.timeline,
                new_timeline: now.timeline,
                switch_lsn,
                acknowledged_lsn: high.lsn,
            })
            .await?;
        if record.lossy {
            metrics::counter!("leasegate_failovers_detected_total", "kind" => "lossy").increment(1);
            tracing::error!(
                failover_id = record.failover_id,
                old_timeline = record.old_timeline,
                new_timeline = record.new_timeline,
                switch_lsn = %record.switch_lsn.map_or_else(|| "unknown".to_owned(), |l| l.to_string()),
                acknowledged_lsn = %record.acknowledged_lsn,
                "failover lost acknowledged ledger writes: dispatch held until an operator \
                 resolves it"
            );
        } else {
            metrics::counter!("leasegate_failovers_detected_total", "kind" => "clean").increment(1);
            tracing::warn!(
                failover_id = record.failover_id,
                old_timeline = record.old_timeline,
                new_timeline = record.new_timeline,
                "clean failover: nothing acknowledged beyond the switch point"
            );
        }
        // The new history is the one to follow from now on.
        self.lock().high_water = Some(now);
        Ok(())
    }

    /// The high-water as it is now: the baseline a reading that begins
    /// after this is judged against (see [`DurabilityGate::acknowledged_at`]).
    pub fn baseline(&self) -> Option<Position> {
        self.lock().high_water.clone()
    }

    /// Samples the position after an acknowledgement (before the agent
    /// hears it). A different history is left to the check, woken now.
    pub async fn acknowledged(&self, ledger: &Ledger) {
        if self.owner.is_empty() {
            return;
        }
        // Judged against what was read before this reading began (see
        // `check_inner`); the high-water only ever moves forward.
        let baseline = self.baseline();
        self.acknowledged_at(ledger, baseline, None).await;
    }

    /// [`DurabilityGate::acknowledged`] with the reading the acknowledged call made
    /// itself (`sampled`: where the WAL stood after its commit, from the
    /// same statement — `Ledger::operation_settle_acknowledged`, or a
    /// replay's `Ledger::operation_register_claim_in`), so the sample costs
    /// no round trip; `None` reads it now (one round trip, as before).
    /// `baseline` is [`DurabilityGate::baseline`] taken before that call began: a
    /// reading that finished meanwhile may be ahead of this one without any
    /// history having changed, so only the high-water from before the
    /// reading is a fair comparison.
    pub async fn acknowledged_at(
        &self,
        ledger: &Ledger,
        baseline: Option<Position>,
        sampled: Option<WalPosition>,
    ) {
        if self.owner.is_empty() {
            return;
        }
        let now = match sampled {
            Some(position) => Position::from(position),
            None => match ledger.durability_facts().await {
                Ok(facts) => match Position::of(&facts) {
                    Some(now) => now,
                    None => return,
                },
                Err(error) => {
                    tracing::warn!(%error, "could not sample the acknowledged WAL position");
                    self.suspect("sampling the acknowledged WAL position");
                    return;
                }
            },
        };
        if compare(baseline.as_ref(), &now) != Seen::Continues {
            self.suspect("the ledger's server history changed");
            return;
        }
        let mut state = self.lock();
        if compare(state.high_water.as_ref(), &now) == Seen::Continues {
            state.high_water = Some(now);
        }
    }
}

impl From<WalPosition> for Position {
    fn from(position: WalPosition) -> Position {
        Position {
            system_identifier: position.system_identifier,
            timeline: position.timeline,
            lsn: position.lsn,
        }
    }
}

/// A gate shared by the front, the loops and the control API.
pub type SharedGate = Arc<DurabilityGate>;

#[cfg(test)]
mod tests {
    use super::*;

    fn facts() -> DurabilityFacts {
        DurabilityFacts {
            in_recovery: false,
            synchronous_commit: "on".into(),
            synchronous_standby_names: "*".into(),
            sync_standbys: 1,
            streaming_standbys: 1,
            system_identifier: "7".into(),
            timeline: Some(1),
            wal_lsn: Some(Lsn(100)),
        }
    }

    #[test]
    fn a_refusal_blames_durability_only_when_the_contract_failed() {
        let gate = DurabilityGate::new(Durability::Local, "leasegate-test");
        assert!(
            matches!(gate.hold(), Some(Hold::LedgerUnavailable(_))),
            "not checked yet: {:?}",
            gate.hold()
        );
        gate.suspect("outcome unknown: read back");
        let Some(Hold::LedgerUnavailable(reason)) = gate.hold() else {
            panic!("a suspicion is not a durability failure: {:?}", gate.hold());
        };
        assert!(reason.contains("the ledger failed a call"), "{reason}");
        {
            let mut state = gate.lock();
            state.unmet = vec!["the ledger's server is a standby".to_owned()];
            gate.publish(&state);
        }
        let hold = gate.hold().expect("held");
        assert!(matches!(hold, Hold::Durability(_)), "{hold:?}");
        assert!(hold.to_string().starts_with("durability hold: "), "{hold}");
    }

    #[test]
    fn sync_replica_names_every_missing_guarantee() {
        assert!(unmet(Durability::SyncReplica, &facts()).is_empty());
        let weak = DurabilityFacts {
            synchronous_standby_names: String::new(),
            sync_standbys: 0,
            synchronous_commit: "local".into(),
            ..facts()
        };
        let reasons = unmet(Durability::SyncReplica, &weak).join("\n");
        assert!(
            reasons.contains("synchronous_standby_names is empty"),
            "{reasons}"
        );
        assert!(reasons.contains("none streams as sync"), "{reasons}");
        assert!(reasons.contains("found \"local\""), "{reasons}");
        assert!(unmet(Durability::Local, &weak).is_empty());
        let standby = DurabilityFacts {
            in_recovery: true,
            ..facts()
        };
        assert_eq!(unmet(Durability::Local, &standby).len(), 1);
    }

    #[test]
    fn a_higher_timeline_of_the_same_system_is_a_promotion() {
        let at = |system: &str, timeline, lsn| Position {
            system_identifier: system.into(),
            timeline,
            lsn: Lsn(lsn),
        };
        let high = at("7", 1, 100);
        assert_eq!(compare(None, &high), Seen::Continues);
        assert_eq!(compare(Some(&high), &at("7", 1, 150)), Seen::Continues);
        assert_eq!(
            compare(Some(&high), &at("7", 2, 90)),
            Seen::Diverged { promoted: true }
        );
        assert_eq!(
            compare(Some(&high), &at("7", 1, 90)),
            Seen::Diverged { promoted: false }
        );
        assert_eq!(
            compare(Some(&high), &at("8", 2, 200)),
            Seen::Diverged { promoted: false }
        );
        assert_eq!(
            compare(Some(&at("7", 2, 100)), &at("7", 1, 200)),
            Seen::Diverged { promoted: false }
        );
        assert_eq!(Lsn(0x1_0000_00A0).to_string(), "1/A0");
    }
}
