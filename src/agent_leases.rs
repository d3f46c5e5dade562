//! Lease modes `session` and `key`: leasegate holds a task's lease for
//! agents that know nothing of leases.
//!
//! A task here lives in its caller's namespace (`ledger::TaskKind`): the
//! principal a bearer token or a JWT subject stands for, or `anonymous`
//! without authentication. Another principal naming the same task key
//! names another task; the control API cannot create, lease or plan into
//! these namespaces.
//!
//! The lease is shared (`sql/members.sql`): every leasegate process serving
//! a principal's task is a member with its own token, and each process
//! holds one membership per task for all of its connections, sessions and
//! stateless requests ([`SessionLeases`]). So an agent's parallel calls and
//! parallel connections never fence each other, on one process or across
//! several behind a load balancer.
//!
//! # Who fences whom (session mode)
//!
//! * A member whose liveness lapsed (frozen, killed, partitioned) is
//!   removed by the next member to join or check, and its writes are
//!   refused from then on, whatever it believes.
//! * A newcomer registers its first side-effecting call only once every
//!   other member has renewed since it joined (alive: a parallel connection
//!   of the same agent; a probe on `ledger::MEMBER_PROBE_CHANNEL` makes
//!   live members renew at once) or has been removed as gone ([`SessionLease::ready`]).
//!   So a frozen predecessor never sends after its restarted successor's
//!   first call is registered; the successor's first call waits at most
//!   the session ttl for that, and sees no refusal.
//! * Within one process every connection of the principal under the task
//!   key shares the membership: a reconnecting agent is the same agent.
//!
//! # Guarantees
//!
//! * The first renewal the heartbeat cannot confirm ends the membership:
//!   every later call through it is refused before anything is registered
//!   or sent ([`SessionLease::current`]). The registry then joins afresh
//!   for the next call. A renewal that failed for a transient reason (a
//!   connection that broke) is retried while the membership cannot have
//!   lapsed yet, so one dead connection costs a retry, not the session
//!   (`worker`, invariant 2).
//! * Identity is per run and step: calls of a resumed run with the same
//!   derived step (tool + request digest) are the same intents, so an agent
//!   that repeats its calls after a restart gets the recorded answers.
//!
//! # Crash points
//!
//! A process that dies leaves its membership to lapse (the session ttl);
//! the next member removes it. A membership no call has used for one
//! heartbeat interval is left, and the last member to leave frees the lease
//! (the run stays running, for the next session to resume).
//!
//! # Key mode
//!
//! One run per (principal, idempotency key). Members of a key run are never
//! renewed: a process joins (or reuses its membership while half its ttl
//! is left), registers, and lets it lapse. Nothing is fenced; the lease
//! only orders registrations, so the same key replays and another request
//! under it is an intent conflict. Past its retention the key's run is
//! cancelled and the key starts a new one.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use tokio::sync::{Mutex, Notify};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::ledger::{Fenced, LeaseClaim, Ledger, LedgerError, TaskKind, TaskRef};
use crate::worker::{HeartbeatConfig, StopCause, WorkerCancellation};

/// Why a lease-mode call could not get a lease.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("invalid session lease settings: {0}")]
    Config(String),
    #[error("task {task:?}: {detail}")]
    Refused { task: String, detail: String },
    #[error(transparent)]
    Ledger(#[from] LedgerError),
}

/// Idempotency keys leasegate keeps for itself: an agent's key never
/// starts so, so no agent key names a run of leasegate's own.
pub const RESERVED_KEY_PREFIX: &str = "leasegate:";

/// The key of the run that holds, in lease mode `key`, the calls of tools
/// with a declared identity: one per principal and task key (`None`: the
/// principal's calls without a task key). A task key too long to carry
/// whole is named by its SHA-256.
pub fn identity_scope_key(task: Option<&str>) -> String {
    const PREFIX: &str = "leasegate:identity:";
    match task {
        None => "leasegate:identity".to_owned(),
        Some(task) if PREFIX.len() + task.len() <= MAX_IDEMPOTENCY_KEY_LEN => {
            format!("{PREFIX}{task}")
        }
        Some(task) => {
            use sha2::Digest;
            format!(
                "{PREFIX}sha256:{}",
                hex::encode(sha2::Sha256::digest(task.as_bytes()))
            )
        }
    }
}

/// The namespace of callers without authentication (loopback, stdio).
pub const ANONYMOUS: &str = "anonymous";

/// The longest idempotency key accepted (lease mode `key`).
pub use crate::ids::MAX_IDEMPOTENCY_KEY_LEN;

/// This process's membership of one task's shared lease (lease mode
/// `session`), renewed by its heartbeat until it ends.
#[derive(Debug)]
pub struct SessionLease {
    ledger: Ledger,
    task: String,
    claim: LeaseClaim,
    config: HeartbeatConfig,
    cancel: WorkerCancellation,
    /// Renew now (another member joined and waits for proof of life).
    probe: Arc<Notify>,
    liveness: Arc<Liveness>,
    heartbeat: Mutex<Option<JoinHandle<StopCause>>>,
    ready: tokio::sync::OnceCell<()>,
}

/// What this process knows of its membership's life (this host's
/// monotonic clock, which runs on while the process is paused).
#[derive(Debug)]
struct Liveness {
    /// The last renewal the database confirmed (or the join).
    renewed: std::sync::Mutex<Instant>,
    /// When this process learnt the membership was lost.
    lost_at: std::sync::OnceLock<Instant>,
}

impl Liveness {
    fn renewed_now(&self) {
        *self.renewed.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
    }

    fn renewed_within(&self, ttl: Duration) -> bool {
        self.renewed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .elapsed()
            < ttl
    }
}

impl SessionLease {
    /// Joins the task's shared lease (creating its run if it has none
    /// live) and starts renewing the membership.
    pub async fn begin(
        ledger: Ledger,
        task: TaskRef<'_>,
        member: &str,
        config: HeartbeatConfig,
    ) -> Result<Self, SessionError> {
        config.validate().map_err(SessionError::Config)?;
        let join = ledger
            .lease_member_join(&task, member, config.ttl_ms, None)
            .await?;
        let cancel = WorkerCancellation::new();
        let probe = Arc::new(Notify::new());
        let liveness = Arc::new(Liveness {
            renewed: std::sync::Mutex::new(Instant::now()),
            lost_at: std::sync::OnceLock::new(),
        });
        let heartbeat = spawn_member_heartbeat(
            ledger.clone(),
            join.claim.clone(),
            config,
            cancel.clone(),
            probe.clone(),
            liveness.clone(),
        );
        tracing::info!(task = %crate::logfield::clip(task.task), run_id = %join.claim.run_id,
            epoch = join.claim.epoch, waiting_on = join.waiting_on, removed = join.evicted,
            took = join.took.as_deref().unwrap_or("joined"), "session lease held");
        let ready = tokio::sync::OnceCell::new();
        if join.waiting_on == 0 {
            let _ = ready.set(());
        }
        Ok(Self {
            ledger,
            task: task.task.to_owned(),
            claim: join.claim,
            config,
            cancel,
            probe,
            liveness,
            heartbeat: Mutex::new(Some(heartbeat)),
            ready,
        })
    }

    /// The lease to send calls under while the membership holds; once it
    /// does not, why (the heartbeat's stop cause).
    pub fn current(&self) -> Result<&LeaseClaim, String> {
        match self.cancel.cause() {
            Some(cause) => Err(cause.to_string()),
            None if self.cancel.is_cancelled() => Err("session ended".into()),
            None => Ok(&self.claim),
        }
    }

    pub fn task(&self) -> &str {
        &self.task
    }

    /// Waits until this member may register its first call: every other
    /// member has renewed since it joined, or has been removed as gone (see
    /// the module docs). Answers at once after the first success. Bounded:
    /// a gone member lapses within the ttl.
    pub async fn ready(&self) -> Result<(), SessionError> {
        let refused = |detail: String| SessionError::Refused {
            task: self.task.clone(),
            detail,
        };
        self.ready
            .get_or_try_init(|| async {
                let ttl = Duration::from_millis(u64::try_from(self.config.ttl_ms).unwrap_or(0));
                let deadline = tokio::time::Instant::now() + ttl + ttl / 2;
                let mut pause = Duration::from_millis(5);
                loop {
                    let claim = self.current().map_err(refused)?;
                    match self.ledger.lease_member_ready(claim).await {
                        Ok(Ok(readiness)) if readiness.waiting_on == 0 => return Ok(()),
                        Ok(Ok(_)) => {}
                        Ok(Err(rejection)) => {
                            let _ = self.liveness.lost_at.set(Instant::now());
                            let cause = StopCause::LeaseLost(rejection);
                            let message = cause.to_string();
                            self.cancel.cancel_with(cause);
                            return Err(refused(message));
                        }
                        Err(error) => return Err(SessionError::Ledger(error)),
                    }
                    if tokio::time::Instant::now() >= deadline {
                        return Err(refused(format!(
                            "other holders of the task neither renewed nor lapsed within {:?}",
                            ttl + ttl / 2
                        )));
                    }
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(200));
                }
            })
            .await
            .map(|_| ())
    }

    /// Renews now instead of at the next tick (a newcomer waits on us).
    fn probe(&self) {
        self.probe.notify_one();
    }

    fn ttl(&self) -> Duration {
        Duration::from_millis(u64::try_from(self.config.ttl_ms).unwrap_or(0))
    }

    /// Whether the membership still holds, asking the database when no
    /// renewal was confirmed for a whole ttl (this process may have been
    /// paused: its heartbeat has not run yet). A refusal ends it.
    async fn confirm(&self) -> bool {
        if self.current().is_err() {
            return false;
        }
        if self.liveness.renewed_within(self.ttl()) {
            return true;
        }
        match self
            .ledger
            .lease_member_renew(&self.claim, self.config.ttl_ms)
            .await
        {
            Ok(Fenced::Applied(_)) => {
                self.liveness.renewed_now();
                true
            }
            Ok(Fenced::Rejected(rejection)) => {
                let _ = self.liveness.lost_at.set(Instant::now());
                self.cancel
                    .cancel_with(StopCause::from_rejection(rejection));
                false
            }
            Err(error) => {
                let _ = self.liveness.lost_at.set(Instant::now());
                self.cancel
                    .cancel_with(StopCause::RenewalUnconfirmed(error.to_string()));
                false
            }
        }
    }

    /// Stops renewing and leaves the lease if this membership still holds
    /// (the run stays as it is, for the next session to resume).
    pub async fn end(&self) {
        let held = self.current().is_ok();
        self.cancel
            .cancel_with(StopCause::Stopped("session ended".into()));
        if let Some(heartbeat) = self.heartbeat.lock().await.take() {
            let _ = heartbeat.await;
        }
        if held {
            match self.ledger.lease_member_leave(&self.claim).await {
                Ok(Fenced::Applied(_)) => {
                    tracing::info!(task = %crate::logfield::clip(&self.task), run_id = %self.claim.run_id, "session lease left")
                }
                Ok(Fenced::Rejected(rejection)) => {
                    tracing::info!(task = %crate::logfield::clip(&self.task), rejection = %crate::logfield::clip_display(&rejection), "session lease was no longer ours")
                }
                Err(error) => {
                    tracing::warn!(task = %crate::logfield::clip(&self.task), error = %crate::logfield::clip_display(&error), "leaving the session lease failed; it lapses on its own")
                }
            }
        }
    }
}

/// Renews `claim`'s membership every `config.interval`, and at once when
/// probed, until `cancel` fires or a renewal is unconfirmed (then cancels
/// `cancel` with the cause); `liveness` records each confirmed renewal and
/// the loss.
fn spawn_member_heartbeat(
    ledger: Ledger,
    claim: LeaseClaim,
    config: HeartbeatConfig,
    cancel: WorkerCancellation,
    probe: Arc<Notify>,
    liveness: Arc<Liveness>,
) -> JoinHandle<StopCause> {
    let renewed = claim.clone();
    let heartbeat = crate::worker::spawn_renewals(claim, config, cancel, Some(probe), {
        let liveness = liveness.clone();
        move || {
            let (ledger, claim, liveness) = (ledger.clone(), renewed.clone(), liveness.clone());
            async move {
                let renewal = ledger.lease_member_renew(&claim, config.ttl_ms).await;
                if matches!(renewal, Ok(Fenced::Applied(_))) {
                    liveness.renewed_now();
                }
                renewal
            }
        }
    });
    tokio::spawn(async move {
        let cause = heartbeat
            .await
            .unwrap_or_else(|e| StopCause::RenewalUnconfirmed(format!("heartbeat failed: {e}")));
        if !matches!(cause, StopCause::Stopped(_)) {
            let _ = liveness.lost_at.set(Instant::now());
        }
        cause
    })
}

type Slot = Arc<Mutex<Option<Arc<SessionLease>>>>;

struct Entry {
    slot: Slot,
    last_used: Instant,
    /// Requests received before this instant are refused: the membership
    /// they would have used was lost then (see `http_server::Arrived`).
    refuse_before: Option<Instant>,
}

/// This process's memberships in session mode, one per (principal, task
/// key), shared by every connection, session and request that names it.
/// A membership no call has used for one heartbeat interval is left.
pub struct SessionLeases {
    inner: Arc<Registry>,
}

struct Registry {
    ledger: Ledger,
    tenant: String,
    member: String,
    config: HeartbeatConfig,
    entries: std::sync::Mutex<HashMap<(String, String), Entry>>,
    started: std::sync::Once,
    stop: CancellationToken,
}

impl std::fmt::Debug for SessionLeases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionLeases")
            .field("member", &self.inner.member)
            .finish_non_exhaustive()
    }
}

impl SessionLeases {
    /// `member` names this process (its dispatch owner).
    pub fn new(ledger: Ledger, tenant: &str, member: &str, config: HeartbeatConfig) -> Self {
        Self {
            inner: Arc::new(Registry {
                ledger,
                tenant: tenant.to_owned(),
                member: member.to_owned(),
                config,
                entries: std::sync::Mutex::new(HashMap::new()),
                started: std::sync::Once::new(),
                stop: CancellationToken::new(),
            }),
        }
    }

    /// The principal's membership of `task` for a request received at
    /// `arrived`: this process's current one, or a new one (joined now).
    /// Hold the answer while a call or a session uses it. After a lost
    /// membership, a request received before the loss was learnt is
    /// refused: it may have waited out a pause of this process, and the
    /// task's other members may have moved on.
    pub async fn get(
        &self,
        principal: &str,
        task: &str,
        arrived: Instant,
    ) -> Result<Arc<SessionLease>, SessionError> {
        let registry = &self.inner;
        registry.started.call_once(|| {
            tokio::spawn(probe_responder(Arc::downgrade(registry)));
            tokio::spawn(idle_sweeper(Arc::downgrade(registry)));
        });
        let slot = {
            let mut entries = registry.entries.lock().unwrap_or_else(|e| e.into_inner());
            let entry = entries
                .entry((principal.to_owned(), task.to_owned()))
                .or_insert_with(|| Entry {
                    slot: Slot::default(),
                    last_used: Instant::now(),
                    refuse_before: None,
                });
            entry.last_used = Instant::now();
            entry.slot.clone()
        };
        let mut held = slot.lock().await;
        let stale = |refuse_before: Option<Instant>| {
            refuse_before
                .is_some_and(|at| arrived < at)
                .then(|| SessionError::Refused {
                    task: task.to_owned(),
                    detail:
                        "this request reached leasegate before it lost the task's lease (was this \
                         process paused?); nothing was sent; send it again"
                            .into(),
                })
        };
        // Read under the slot's lock: only a holder of it moves the fence.
        let mut fence = self.refuse_before(principal, task);
        if let Some(lease) = held.as_ref() {
            if lease.confirm().await {
                return match stale(fence) {
                    Some(refused) => Err(refused),
                    None => Ok(lease.clone()),
                };
            }
            // Lost: requests received before the loss was learnt are refused.
            let at = lease
                .liveness
                .lost_at
                .get()
                .copied()
                .unwrap_or_else(Instant::now);
            fence = Some(fence.map_or(at, |t| t.max(at)));
            let mut entries = registry.entries.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(entry) = entries.get_mut(&(principal.to_owned(), task.to_owned())) {
                entry.refuse_before = fence;
            }
        }
        if let Some(refused) = stale(fence) {
            return Err(refused);
        }
        let lease = Arc::new(
            SessionLease::begin(
                registry.ledger.clone(),
                TaskRef {
                    tenant: &registry.tenant,
                    kind: TaskKind::Session,
                    principal,
                    task,
                },
                &registry.member,
                registry.config,
            )
            .await?,
        );
        *held = Some(lease.clone());
        Ok(lease)
    }

    fn refuse_before(&self, principal: &str, task: &str) -> Option<Instant> {
        let entries = self.inner.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries
            .get(&(principal.to_owned(), task.to_owned()))
            .and_then(|entry| entry.refuse_before)
    }

    /// Leaves every membership (shutdown); the background tasks stop.
    pub async fn end_all(&self) {
        self.inner.stop.cancel();
        let leases: Vec<Arc<SessionLease>> = {
            let mut entries = self.inner.entries.lock().unwrap_or_else(|e| e.into_inner());
            entries
                .drain()
                .filter_map(|(_, entry)| entry.slot.try_lock().ok().and_then(|held| held.clone()))
                .collect()
        };
        for lease in leases {
            lease.end().await;
        }
    }
}

impl Drop for SessionLeases {
    fn drop(&mut self) {
        self.inner.stop.cancel();
    }
}

impl Registry {
    fn leases(&self) -> Vec<Arc<SessionLease>> {
        let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries
            .values()
            .filter_map(|entry| entry.slot.try_lock().ok().and_then(|held| held.clone()))
            .collect()
    }
}

/// Renews at once the memberships of every run a newcomer waits on.
async fn probe_responder(registry: Weak<Registry>) {
    let mut backoff = Duration::from_millis(100);
    loop {
        let Some(strong) = registry.upgrade() else {
            return;
        };
        let (ledger, stop) = (strong.ledger.clone(), strong.stop.clone());
        drop(strong);
        let mut probes = tokio::select! {
            _ = stop.cancelled() => return,
            probes = ledger.listen_member_probes() => match probes {
                Ok(probes) => probes,
                Err(error) => {
                    tracing::warn!(error = %crate::logfield::clip_display(&error),
                        "cannot listen for newcomers to session leases; members renew on their heartbeat");
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(10));
                    continue;
                }
            },
        };
        backoff = Duration::from_millis(100);
        loop {
            let run = tokio::select! {
                _ = stop.cancelled() => return,
                run = probes.next() => run,
            };
            let Ok(run) = run else { break };
            let Some(strong) = registry.upgrade() else {
                return;
            };
            for lease in strong.leases() {
                if lease.claim.run_id == run {
                    lease.probe();
                }
            }
        }
    }
}

/// Leaves memberships no call has used for one heartbeat interval.
async fn idle_sweeper(registry: Weak<Registry>) {
    loop {
        let Some(strong) = registry.upgrade() else {
            return;
        };
        let (interval, stop) = (strong.config.interval, strong.stop.clone());
        let idle: Vec<Arc<SessionLease>> = {
            let mut entries = strong.entries.lock().unwrap_or_else(|e| e.into_inner());
            let mut idle = Vec::new();
            entries.retain(|_, entry| {
                if entry.last_used.elapsed() < interval || Arc::strong_count(&entry.slot) > 1 {
                    return true;
                }
                let Ok(mut held) = entry.slot.try_lock() else {
                    return true;
                };
                match held.take() {
                    // Only the registry holds it, and it is known alive:
                    // nobody uses it, leave it.
                    Some(lease)
                        if Arc::strong_count(&lease) == 1
                            && lease.current().is_ok()
                            && lease.liveness.renewed_within(lease.ttl()) =>
                    {
                        idle.push(lease);
                        entry.refuse_before.is_some()
                    }
                    // Lost, or not confirmed lately (this process may have
                    // been paused): kept until a request decides, so that
                    // its fence on earlier requests is not forgotten.
                    Some(lease) => {
                        *held = Some(lease);
                        true
                    }
                    // Forget a fence once every request it guards is long
                    // answered.
                    None => entry
                        .refuse_before
                        .is_some_and(|at| at.elapsed() < interval * 6),
                }
            });
            idle
        };
        drop(strong);
        for lease in idle {
            lease.end().await;
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
    }
}

/// Lease mode `key`: this process's memberships of key runs, with their
/// tokens, by (principal, key). Calls with one key in this process take
/// turns on the key's slot while they join, so they share one membership.
#[derive(Debug, Default)]
pub struct KeyLeases {
    slots: std::sync::Mutex<HashMap<(String, String), KeySlot>>,
}

type KeySlot = Arc<Mutex<Option<HeldKeyLease>>>;

#[derive(Debug)]
struct HeldKeyLease {
    claim: LeaseClaim,
    /// This host's estimate of the membership's end.
    until: Instant,
    /// Past this the key is a new request (its run's retention ends).
    retire_at: chrono::DateTime<chrono::Utc>,
}

impl KeyLeases {
    pub fn new() -> Self {
        Self::default()
    }

    /// The key's slot; forgets slots nobody uses whose membership ended.
    fn slot(&self, principal: &str, key: &str) -> KeySlot {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        slots.retain(|name, slot| {
            (name.0 == principal && name.1 == key)
                || Arc::strong_count(slot) > 1
                || slot
                    .try_lock()
                    .map(|held| held.as_ref().is_some_and(|held| held.until > now))
                    .unwrap_or(true)
        });
        slots
            .entry((principal.to_owned(), key.to_owned()))
            .or_default()
            .clone()
    }
}

/// Lease mode `key`: a membership of the run that stands for one
/// idempotency key of `principal` in `tenant`, with its token (kept in
/// `leases`). A membership of this process with half its ttl left is used
/// as it is (the call registers before it lapses); otherwise the process
/// joins again. Past `retention` since the key's run was created, the run
/// is cancelled and the key starts a new one, as at providers that prune
/// keys.
#[allow(clippy::too_many_arguments)]
pub async fn key_lease(
    ledger: &Ledger,
    leases: &KeyLeases,
    tenant: &str,
    principal: &str,
    key: &str,
    member: &str,
    ttl_ms: i64,
    retention: Duration,
) -> Result<LeaseClaim, SessionError> {
    if let Err(invalid) =
        crate::ids::check_identifier("idempotency key", key, MAX_IDEMPOTENCY_KEY_LEN)
    {
        return Err(SessionError::Refused {
            task: key.chars().take(80).collect(),
            detail: invalid.to_string(),
        });
    }
    let ttl = Duration::from_millis(u64::try_from(ttl_ms).unwrap_or(0));
    let slot = leases.slot(principal, key);
    let mut held = slot.lock().await;
    if let Some(current) = held.as_ref()
        && current.until > Instant::now() + ttl / 2
        && current.retire_at > chrono::Utc::now()
    {
        return Ok(current.claim.clone());
    }
    let started = Instant::now();
    let join = ledger
        .lease_member_join(
            &TaskRef {
                tenant,
                kind: TaskKind::Key,
                principal,
                task: key,
            },
            member,
            ttl_ms,
            Some(retention),
        )
        .await?;
    *held = Some(HeldKeyLease {
        claim: join.claim.clone(),
        until: started + ttl,
        retire_at: join.run_created_at
            + chrono::Duration::from_std(retention).unwrap_or(chrono::Duration::MAX),
    });
    Ok(join.claim)
}
