//! What the ledger's server promises about an acknowledged commit, where its
//! WAL stands, and the failovers leasegate detected (`sql/durability.sql`,
//! table `ledger_failovers` in `migrations/0003_failovers.sql`). The policy
//! judged from these facts lives in `crate::durability`.
//!
//! Every call here is a read of one statement, except [`Ledger::failover_record`]
//! and [`Ledger::failover_resolve`] (one function each).

use std::fmt;

use chrono::{DateTime, Utc};
use serde::{Serialize, Serializer};
use sqlx::FromRow;

use super::error::protocol;
use super::{Ledger, LedgerError, MAX_OWNER_LEN, check_length, check_text};

/// A WAL position (`pg_lsn`), shown as PostgreSQL does: `16/B374D848`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Lsn(pub u64);

impl fmt::Display for Lsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:X}/{:X}", self.0 >> 32, self.0 & 0xffff_ffff)
    }
}

impl Serialize for Lsn {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl Lsn {
    fn from_db(call: &'static str, value: i64) -> Result<Lsn, LedgerError> {
        u64::try_from(value)
            .map(Lsn)
            .map_err(|_| protocol(call, format!("negative WAL position {value}")))
    }
}

/// One snapshot of the server's durability facts (`ledger_durability()`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DurabilityFacts {
    /// A standby: no write can commit there.
    pub in_recovery: bool,
    /// What this session's commits wait for (`off` … `remote_apply`).
    pub synchronous_commit: String,
    /// Empty: no commit waits for any standby.
    pub synchronous_standby_names: String,
    /// Standbys streaming with `sync_state` `sync` or `quorum`.
    pub sync_standbys: i32,
    pub streaming_standbys: i32,
    /// `pg_control_system().system_identifier`: a streaming standby shares
    /// its primary's; a restored logical dump does not.
    pub system_identifier: String,
    /// The current timeline; `None` on a standby.
    pub timeline: Option<i64>,
    /// The WAL insert position: at least every commit acknowledged before
    /// the reading, on any session. `None` on a standby.
    pub wal_lsn: Option<Lsn>,
}

/// Where the WAL stood right after a hot-path call committed (or, for a
/// replay, after the recorded answer was read): an upper bound of that
/// call's acknowledged write, sampled by the call's own statement
/// (`ledger_wal_position()`), so the durability gate needs no extra round
/// trip. `crate::durability::DurabilityGate::acknowledged_at` judges it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WalPosition {
    pub system_identifier: String,
    pub timeline: i64,
    pub lsn: Lsn,
}

/// The `system_identifier, timeline, wal_lsn` columns of an answer.
#[derive(Debug, Clone, Default, FromRow, serde::Deserialize)]
pub(super) struct WalColumns {
    system_identifier: Option<String>,
    timeline: Option<i64>,
    wal_lsn: Option<i64>,
}

impl WalColumns {
    /// The position, when the answer carries one (none on a standby, or on
    /// an outcome that read none).
    pub(super) fn position(&self, call: &'static str) -> Result<Option<WalPosition>, LedgerError> {
        match (&self.system_identifier, self.timeline, self.wal_lsn) {
            (Some(system_identifier), Some(timeline), Some(lsn)) => Ok(Some(WalPosition {
                system_identifier: system_identifier.clone(),
                timeline,
                lsn: Lsn::from_db(call, lsn)?,
            })),
            _ => Ok(None),
        }
    }
}

#[derive(Debug, FromRow)]
struct FactsRow {
    in_recovery: bool,
    synchronous_commit: String,
    synchronous_standby_names: String,
    sync_standbys: i32,
    streaming_standbys: i32,
    system_identifier: String,
    timeline: Option<i64>,
    wal_lsn: Option<i64>,
}

/// A failover a leasegate process detected (a `ledger_failovers` row).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FailoverRecord {
    pub failover_id: i64,
    pub detected_at: DateTime<Utc>,
    pub detected_by: String,
    pub system_identifier: String,
    /// Set when the server's identity changed (not a promoted standby).
    pub old_system_identifier: Option<String>,
    pub old_timeline: i64,
    pub new_timeline: i64,
    /// Where the old timeline ended on the new primary; `None`: unknown, so
    /// the loss is not bounded.
    pub switch_lsn: Option<Lsn>,
    /// The highest position the detecting process saw acknowledged.
    pub acknowledged_lsn: Lsn,
    /// Acknowledged writes in (`switch_lsn`, `acknowledged_lsn`] may be lost.
    pub lossy: bool,
    pub resolved_at: Option<DateTime<Utc>>,
    pub resolved_by: Option<String>,
    pub resolved_reason: Option<String>,
}

#[derive(Debug, FromRow)]
struct FailoverRow {
    failover_id: i64,
    detected_at: DateTime<Utc>,
    detected_by: String,
    system_identifier: String,
    old_system_identifier: Option<String>,
    old_timeline: i64,
    new_timeline: i64,
    switch_lsn: Option<i64>,
    acknowledged_lsn: i64,
    lossy: bool,
    resolved_at: Option<DateTime<Utc>>,
    resolved_by: Option<String>,
    resolved_reason: Option<String>,
}

impl FailoverRow {
    fn into_record(self, call: &'static str) -> Result<FailoverRecord, LedgerError> {
        Ok(FailoverRecord {
            failover_id: self.failover_id,
            detected_at: self.detected_at,
            detected_by: self.detected_by,
            system_identifier: self.system_identifier,
            old_system_identifier: self.old_system_identifier,
            old_timeline: self.old_timeline,
            new_timeline: self.new_timeline,
            switch_lsn: self
                .switch_lsn
                .map(|lsn| Lsn::from_db(call, lsn))
                .transpose()?,
            acknowledged_lsn: Lsn::from_db(call, self.acknowledged_lsn)?,
            lossy: self.lossy,
            resolved_at: self.resolved_at,
            resolved_by: self.resolved_by,
            resolved_reason: self.resolved_reason,
        })
    }
}

/// The columns of a failover, WAL positions as byte offsets.
macro_rules! failover_columns {
    () => {
        "failover_id, detected_at, detected_by, system_identifier, \
         old_system_identifier, old_timeline, new_timeline, \
         (switch_lsn - '0/0'::pg_lsn)::bigint AS switch_lsn, \
         (acknowledged_lsn - '0/0'::pg_lsn)::bigint AS acknowledged_lsn, \
         lossy, resolved_at, resolved_by, resolved_reason"
    };
}

const FAILOVER_RECORD: &str = concat!(
    "SELECT ",
    failover_columns!(),
    " FROM failover_record($1, $2, $3, $4, $5, $6::pg_lsn, $7::pg_lsn)"
);

const FAILOVERS: &str = concat!(
    "SELECT ",
    failover_columns!(),
    " FROM ledger_failovers WHERE NOT $1 OR resolved_at IS NULL \
      ORDER BY failover_id DESC LIMIT 1000"
);

/// What a failover detection saw, for [`Ledger::failover_record`].
#[derive(Debug, Clone)]
pub struct FailoverSeen<'a> {
    pub detected_by: &'a str,
    pub system_identifier: &'a str,
    /// The identity seen before, when it differs.
    pub old_system_identifier: Option<&'a str>,
    pub old_timeline: i64,
    pub new_timeline: i64,
    pub switch_lsn: Option<Lsn>,
    pub acknowledged_lsn: Lsn,
}

/// The answer of [`Ledger::failover_resolve`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailoverResolveOutcome {
    Resolved,
    AlreadyResolved,
    NotFound,
}

impl Ledger {
    /// The server's durability facts, as seen by a pooled session (so
    /// `synchronous_commit` is what this process's commits wait for).
    pub async fn durability_facts(&self) -> Result<DurabilityFacts, LedgerError> {
        const CALL: &str = "durability_facts";
        let row: FactsRow = self
            .invoke(CALL, false, || {
                sqlx::query_as(
                    "SELECT in_recovery, synchronous_commit, synchronous_standby_names, \
                            sync_standbys, streaming_standbys, system_identifier, timeline, \
                            (wal_lsn - '0/0'::pg_lsn)::bigint AS wal_lsn \
                       FROM ledger_durability()",
                )
            })
            .await?;
        Ok(DurabilityFacts {
            in_recovery: row.in_recovery,
            synchronous_commit: row.synchronous_commit,
            synchronous_standby_names: row.synchronous_standby_names,
            sync_standbys: row.sync_standbys,
            streaming_standbys: row.streaming_standbys,
            system_identifier: row.system_identifier,
            timeline: row.timeline,
            wal_lsn: row.wal_lsn.map(|lsn| Lsn::from_db(CALL, lsn)).transpose()?,
        })
    }

    /// Where `old_timeline` ended, from the history file of `new_timeline`;
    /// `None` when the server does not let the ledger's owner read it.
    pub async fn timeline_switch(
        &self,
        old_timeline: i64,
        new_timeline: i64,
    ) -> Result<Option<Lsn>, LedgerError> {
        const CALL: &str = "timeline_switch";
        let (lsn,): (Option<i64>,) = self
            .invoke(CALL, false, || {
                sqlx::query_as("SELECT (ledger_timeline_switch($1, $2) - '0/0'::pg_lsn)::bigint")
                    .bind(old_timeline)
                    .bind(new_timeline)
            })
            .await?;
        lsn.map(|lsn| Lsn::from_db(CALL, lsn)).transpose()
    }

    /// Records a failover (once per detecting process and new timeline);
    /// returns the row.
    pub async fn failover_record(
        &self,
        seen: &FailoverSeen<'_>,
    ) -> Result<FailoverRecord, LedgerError> {
        const CALL: &str = "failover_record";
        check_text("detected_by", seen.detected_by, MAX_OWNER_LEN)?;
        let row: FailoverRow = self
            .invoke(CALL, true, || {
                sqlx::query_as(FAILOVER_RECORD)
                    .bind(seen.detected_by)
                    .bind(seen.system_identifier)
                    .bind(seen.old_system_identifier)
                    .bind(seen.old_timeline)
                    .bind(seen.new_timeline)
                    .bind(seen.switch_lsn.map(|lsn| lsn.to_string()))
                    .bind(seen.acknowledged_lsn.to_string())
            })
            .await?;
        row.into_record(CALL)
    }

    /// The recorded failovers, newest first; only the unresolved ones when
    /// `unresolved_only`.
    pub async fn failovers(
        &self,
        unresolved_only: bool,
    ) -> Result<Vec<FailoverRecord>, LedgerError> {
        const CALL: &str = "failovers";
        let rows: Vec<FailoverRow> = self
            .invoke_all(CALL, false, || {
                sqlx::query_as(FAILOVERS).bind(unresolved_only)
            })
            .await?;
        rows.into_iter().map(|row| row.into_record(CALL)).collect()
    }

    /// An operator resolves a failover, with who and why. Only a ledger
    /// connected as [`super::OPERATOR_ROLE`] may (SQLSTATE 42501 otherwise).
    pub async fn failover_resolve(
        &self,
        failover_id: i64,
        by: &str,
        reason: &str,
    ) -> Result<FailoverResolveOutcome, LedgerError> {
        const CALL: &str = "failover_resolve";
        check_text("by", by, MAX_OWNER_LEN)?;
        check_length("reason", reason, 2000)?;
        let (outcome,): (String,) = self
            .invoke(CALL, true, || {
                sqlx::query_as("SELECT outcome FROM failover_resolve($1, $2, $3)")
                    .bind(failover_id)
                    .bind(by)
                    .bind(reason)
            })
            .await?;
        match outcome.as_str() {
            "resolved" => Ok(FailoverResolveOutcome::Resolved),
            "already_resolved" => Ok(FailoverResolveOutcome::AlreadyResolved),
            "not_found" => Ok(FailoverResolveOutcome::NotFound),
            other => Err(protocol(CALL, format!("unexpected outcome {other:?}"))),
        }
    }
}
