//! Shared leases of leasegate's lease modes (`sql/members.sql`): a task in
//! one principal's namespace ([`TaskKind::Session`], [`TaskKind::Key`]),
//! whose lease the leasegate processes serving it share as members. One SQL
//! function call each; one statement, one short transaction.
//!
//! A member's claim names the member (the process) as owner and carries the
//! shared lease's epoch and the member's own token; every fenced write
//! judges it on the member's row. See `sql/members.sql` for the rules: who
//! shares, who is removed, when a newcomer may register its first call.
//!
//! Crash points: a member that dies keeps its row until its liveness lapses
//! (`ttl_ms` after its last renewal); the next join or readiness check
//! removes it, and the lease is free once no live member is left.

use chrono::{DateTime, Utc};
use sqlx::FromRow;

use super::lease_token::bind_hash;
use super::verdict::{Expected, WriteRow};
use super::{
    Applied, Fenced, LeaseClaim, LeaseToken, Ledger, LedgerError, MAX_OWNER_LEN, Rejection, RunId,
    RunStatus, check_text,
};

/// The namespace of a task whose lease leasegate holds for its callers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TaskKind {
    /// Lease mode `session`: a task key named by the agent.
    Session,
    /// Lease mode `key`: one idempotency key.
    Key,
}

impl TaskKind {
    pub fn as_str(self) -> &'static str {
        match self {
            TaskKind::Session => "session",
            TaskKind::Key => "key",
        }
    }
}

/// The notification channel a joining member wakes the others on
/// (`pg_notify` payload: the run id).
pub const MEMBER_PROBE_CHANNEL: &str = "leasegate_lease_members";

/// Where a task's shared lease is.
#[derive(Debug, Clone)]
pub struct TaskRef<'a> {
    pub tenant: &'a str,
    pub kind: TaskKind,
    pub principal: &'a str,
    pub task: &'a str,
}

/// A member's place in a shared lease.
#[derive(Debug, Clone)]
pub struct MemberJoin {
    /// The member's claim (owner: the member, with its token).
    pub claim: LeaseClaim,
    pub run_status: RunStatus,
    /// Other members not yet proven alive since this join.
    pub waiting_on: i32,
    /// Members removed as gone by this join.
    pub evicted: i32,
    /// How the lease came to be held: `created`, `acquired`, `taken_over`
    /// (every earlier member gone), or `None` when it joined a held lease.
    pub took: Option<String>,
    /// The member's liveness ends here unless renewed (database clock).
    pub alive_until: DateTime<Utc>,
    /// When the run was created (key mode: its retention counts from here).
    pub run_created_at: DateTime<Utc>,
}

/// Whether a member may register its first call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Readiness {
    /// Other members not renewed since this one joined (0: ready).
    pub waiting_on: i32,
    /// Members removed as gone by this check.
    pub evicted: i32,
}

#[derive(Debug, FromRow)]
struct JoinRow {
    outcome: String,
    run_id: Option<uuid::Uuid>,
    epoch: Option<i64>,
    run_status: Option<String>,
    waiting_on: Option<i32>,
    evicted: Option<i32>,
    took: Option<String>,
    alive_until: Option<DateTime<Utc>>,
    run_created_at: Option<DateTime<Utc>>,
}

#[derive(Debug, FromRow)]
struct ReadyRow {
    outcome: String,
    waiting_on: Option<i32>,
    evicted: Option<i32>,
}

fn protocol(call: &'static str, detail: impl Into<String>) -> LedgerError {
    LedgerError::Protocol {
        call,
        detail: detail.into(),
    }
}

impl Ledger {
    /// Joins `member` to the shared lease of `task`, creating the task and a
    /// running run when it has no live one. With `retention` (key mode) a
    /// live run created longer ago is cancelled and a new one created.
    pub async fn lease_member_join(
        &self,
        task: &TaskRef<'_>,
        member: &str,
        ttl_ms: i64,
        retention: Option<std::time::Duration>,
    ) -> Result<MemberJoin, LedgerError> {
        const CALL: &str = "lease_member_join";
        check_text("member", member, MAX_OWNER_LEN)?;
        self.check_ttl(ttl_ms)?;
        // One token and run id per call: a retried statement stores the same.
        let token = LeaseToken::generate();
        let hash = token.sha256();
        let new_run = RunId::generate();
        let retention_ms = retention.map(|r| i64::try_from(r.as_millis()).unwrap_or(i64::MAX));
        let row: JoinRow = self
            .invoke(CALL, true, || {
                sqlx::query_as(
                    "SELECT * FROM lease_member_join($1, $2, $3, $4, $5, $6, $7, $8, $9)",
                )
                .bind(task.tenant)
                .bind(task.kind.as_str())
                .bind(task.principal)
                .bind(task.task)
                .bind(new_run.as_uuid())
                .bind(member)
                .bind(ttl_ms)
                .bind(hash.as_slice())
                .bind(retention_ms)
            })
            .await?;
        if row.outcome != "joined" {
            return Err(protocol(
                CALL,
                "the task's runs kept finishing while leasegate joined it; try again",
            ));
        }
        let run_status = row
            .run_status
            .as_deref()
            .and_then(RunStatus::parse)
            .ok_or_else(|| protocol(CALL, "no run status"))?;
        let join = MemberJoin {
            claim: LeaseClaim {
                run_id: RunId::from_uuid(row.run_id.ok_or_else(|| protocol(CALL, "no run id"))?),
                owner: member.to_owned(),
                epoch: row.epoch.ok_or_else(|| protocol(CALL, "no epoch"))?,
                token: Some(token),
            },
            run_status,
            waiting_on: row.waiting_on.unwrap_or(0),
            evicted: row.evicted.unwrap_or(0),
            took: row.took,
            alive_until: row
                .alive_until
                .ok_or_else(|| protocol(CALL, "no alive_until"))?,
            run_created_at: row
                .run_created_at
                .ok_or_else(|| protocol(CALL, "no run_created_at"))?,
        };
        if join.evicted > 0 {
            metrics::counter!("lease_members_removed_total").increment(join.evicted as u64);
        }
        if join.took.as_deref() == Some("taken_over") {
            metrics::counter!("lease_acquire_total", "outcome" => "taken_over").increment(1);
        }
        Ok(join)
    }

    /// Renews the member's liveness by `ttl_ms` from now. A lapsed member is
    /// [`Rejection::LeaseLost`]: it must join again.
    pub async fn lease_member_renew(
        &self,
        claim: &LeaseClaim,
        ttl_ms: i64,
    ) -> Result<Fenced<Applied>, LedgerError> {
        const CALL: &str = "lease_member_renew";
        self.check_ttl(ttl_ms)?;
        let row: WriteRow = self
            .invoke(CALL, true, || {
                sqlx::query_as("SELECT * FROM lease_member_renew($1, $2, $3, $4, $5)")
                    .bind(claim.run_id.as_uuid())
                    .bind(claim.owner.as_str())
                    .bind(claim.epoch)
                    .bind(bind_hash(claim.token.as_ref()))
                    .bind(ttl_ms)
            })
            .await?;
        row.into_fenced(CALL, Expected::claim(claim))
    }

    /// Removes gone members and says how many others are not yet proven
    /// alive since `claim`'s member joined. A rejection means the member is
    /// no longer one (lapsed, removed, or the run ended).
    pub async fn lease_member_ready(
        &self,
        claim: &LeaseClaim,
    ) -> Result<Result<Readiness, Rejection>, LedgerError> {
        const CALL: &str = "lease_member_ready";
        let row: ReadyRow = self
            .invoke(CALL, true, || {
                sqlx::query_as("SELECT * FROM lease_member_ready($1, $2, $3, $4)")
                    .bind(claim.run_id.as_uuid())
                    .bind(claim.owner.as_str())
                    .bind(claim.epoch)
                    .bind(bind_hash(claim.token.as_ref()))
            })
            .await?;
        let evicted = row.evicted.unwrap_or(0);
        if evicted > 0 {
            metrics::counter!("lease_members_removed_total").increment(evicted as u64);
        }
        Ok(match row.outcome.as_str() {
            "applied" => Ok(Readiness {
                waiting_on: row.waiting_on.unwrap_or(0),
                evicted,
            }),
            "not_found" => Err(Rejection::NotFound),
            "terminal" => Err(Rejection::Terminal {
                status: RunStatus::Cancelled,
            }),
            "lease_token_invalid" => Err(Rejection::LeaseTokenInvalid {
                claim: claim.clone(),
                fault: super::TokenFault::Wrong,
            }),
            "lease_lost" => Err(Rejection::LeaseLost {
                expected: claim.clone(),
                found: super::LeaseState {
                    owner: None,
                    epoch: claim.epoch,
                    expires_at: Utc::now(),
                    expired: true,
                },
            }),
            other => return Err(protocol(CALL, format!("unknown outcome {other:?}"))),
        })
    }

    /// The member leaves; the last live member to leave frees the lease.
    pub async fn lease_member_leave(
        &self,
        claim: &LeaseClaim,
    ) -> Result<Fenced<Applied>, LedgerError> {
        self.claim_write(
            "lease_member_leave",
            "SELECT * FROM lease_member_leave($1, $2, $3, $4)",
            claim,
        )
        .await
    }

    /// Listens for joins that wait on this process's members
    /// ([`MEMBER_PROBE_CHANNEL`]): each item is the run a newcomer joined.
    /// The listener reconnects on its own after a broken connection.
    pub async fn listen_member_probes(&self) -> Result<MemberProbes, LedgerError> {
        const CALL: &str = "listen_member_probes";
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(1)
            .max_lifetime(None)
            .idle_timeout(None)
            .connect_lazy_with(self.pool.connect_options());
        let mut listener = sqlx::postgres::PgListener::connect_with(&pool)
            .await
            .map_err(|source| LedgerError::Unavailable { call: CALL, source })?;
        listener
            .listen(MEMBER_PROBE_CHANNEL)
            .await
            .map_err(|source| LedgerError::Unavailable { call: CALL, source })?;
        Ok(MemberProbes { listener })
    }
}

/// Runs newcomers joined and wait on (see [`Ledger::listen_member_probes`]).
pub struct MemberProbes {
    listener: sqlx::postgres::PgListener,
}

impl std::fmt::Debug for MemberProbes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemberProbes").finish_non_exhaustive()
    }
}

impl MemberProbes {
    /// The next run a newcomer waits on; `Err` when the connection broke
    /// (the next call reconnects).
    pub async fn next(&mut self) -> Result<RunId, LedgerError> {
        loop {
            let notification =
                self.listener
                    .recv()
                    .await
                    .map_err(|source| LedgerError::Unavailable {
                        call: "listen_member_probes",
                        source,
                    })?;
            if let Ok(run) = notification.payload().parse::<uuid::Uuid>() {
                return Ok(RunId::from_uuid(run));
            }
        }
    }
}
