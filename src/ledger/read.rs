//! Read side: runs, operations (the fate of a call), their event history and
//! evidence, and the health of the connection. Reads take no locks and may be
//! served while writes are in flight; each returns a committed snapshot of one statement.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::FromRow;
use uuid::Uuid;

use super::error::protocol;
use super::operation_rows::{EvidenceRow, TableRow};
use super::operation_types::claims_of;
use super::{
    Evidence, EvidenceKind, LeaseState, Ledger, LedgerError, LedgerEvent, OperationClaim,
    OperationRecord, OperationStatus, OperationView, RunId, RunView, UnknownSummary,
};
use crate::intent::OperationId;

#[derive(Debug, FromRow)]
struct RunRow {
    run_id: Uuid,
    tenant_id: String,
    kind: String,
    principal: String,
    task_id: String,
    attempt: i32,
    status: String,
    revision: i64,
    checkpoint: super::stored_json::Stored,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
    lease_owner: Option<String>,
    lease_epoch: i64,
    lease_expires_at: DateTime<Utc>,
    lease_expired: bool,
    active: bool,
}

const EVENTS_OF_RUN: &str =
    "SELECT event_id, at, run_id, operation_id, subject, from_status, to_status,
        actor_kind, actor, epoch, revision, detail
   FROM ledger_events WHERE run_id = $1 ORDER BY event_id";
const ARCHIVED_EVENTS_OF_OPERATION: &str =
    "SELECT e.event_id, e.at, e.run_id, e.operation_id, e.subject, e.from_status, e.to_status,
        e.actor_kind, e.actor, e.epoch, e.revision, e.detail
   FROM ledger_events_archive a
   CROSS JOIN LATERAL jsonb_populate_record(NULL::ledger_events, a.row) e
  WHERE a.operation_id = $1 ORDER BY a.event_id";
const EVENTS_OF_OPERATION: &str =
    "SELECT event_id, at, run_id, operation_id, subject, from_status, to_status,
        actor_kind, actor, epoch, revision, detail
   FROM ledger_events WHERE operation_id = $1 ORDER BY event_id";

#[derive(Debug, FromRow)]
struct EventRow {
    event_id: i64,
    at: DateTime<Utc>,
    run_id: Uuid,
    operation_id: Option<String>,
    subject: String,
    from_status: Option<String>,
    to_status: String,
    actor_kind: String,
    actor: Option<String>,
    epoch: Option<i64>,
    revision: Option<i64>,
    detail: super::stored_json::Stored,
}

impl EventRow {
    fn into_event(self) -> LedgerEvent {
        LedgerEvent {
            event_id: self.event_id,
            at: self.at,
            run_id: RunId::from_uuid(self.run_id),
            operation_id: self.operation_id,
            subject: self.subject,
            from_status: self.from_status,
            to_status: self.to_status,
            actor_kind: self.actor_kind,
            actor: self.actor,
            epoch: self.epoch,
            revision: self.revision,
            detail: self.detail.0,
        }
    }
}

/// Which operations [`Ledger::operations_page`] lists; `None` fields do not
/// filter.
#[derive(Debug, Clone, Default)]
pub struct OperationFilter<'a> {
    pub tenant: Option<&'a str>,
    pub run_id: Option<RunId>,
    pub status: Option<OperationStatus>,
    /// Exposed tool name, exact.
    pub tool: Option<&'a str>,
}

/// What the ledger's connection reports about itself.
#[derive(Debug, Clone, Serialize, FromRow)]
pub struct DbHealth {
    /// The role calls run as (the application role when `SET ROLE` applied).
    pub current_user: String,
    pub server_version: String,
    /// True on a standby: leases must never be judged there.
    pub in_recovery: bool,
    pub db_now: DateTime<Utc>,
}

impl Ledger {
    /// A run with its lease, or `None` when no such run exists.
    pub async fn run_get(&self, run_id: RunId) -> Result<Option<RunView>, LedgerError> {
        const CALL: &str = "run_get";
        let row: Option<RunRow> = self
            .invoke_optional(CALL, false, || {
                sqlx::query_as(
                    "SELECT r.run_id, r.tenant_id, r.kind, r.principal, r.task_id, r.attempt,
                            r.status, r.revision, r.checkpoint, r.created_at, r.updated_at,
                            l.owner AS lease_owner, l.epoch AS lease_epoch,
                            l.expires_at AS lease_expires_at,
                            l.expires_at <= clock_timestamp() AS lease_expired,
                            t.active_run_id IS NOT DISTINCT FROM r.run_id AS active
                       FROM agent_runs r
                       JOIN worker_leases l ON l.run_id = r.run_id
                       JOIN agent_tasks t ON t.tenant_id = r.tenant_id AND t.kind = r.kind
                                          AND t.principal = r.principal AND t.task_id = r.task_id
                      WHERE r.run_id = $1",
                )
                .bind(run_id.as_uuid())
            })
            .await?;
        let Some(row) = row else {
            return Ok(None);
        };
        let status = super::RunStatus::parse(&row.status).ok_or_else(|| LedgerError::Protocol {
            call: CALL,
            detail: format!("unknown run status {:?}", row.status),
        })?;
        Ok(Some(RunView {
            run_id: RunId::from_uuid(row.run_id),
            tenant_id: row.tenant_id,
            kind: row.kind,
            principal: row.principal,
            task_id: row.task_id,
            attempt: row.attempt,
            status,
            revision: row.revision,
            checkpoint: row.checkpoint.0,
            created_at: row.created_at,
            updated_at: row.updated_at,
            lease: LeaseState {
                owner: row.lease_owner,
                epoch: row.lease_epoch,
                expires_at: row.lease_expires_at,
                expired: row.lease_expired,
            },
            active: row.active,
        }))
    }

    /// The tenant a run belongs to, and whether it lives in the tenant's
    /// shared namespace of tasks (`true`) or in a principal's namespace of
    /// a lease mode (`false`). Neither ever changes.
    pub async fn run_scope(&self, run_id: RunId) -> Result<Option<(String, bool)>, LedgerError> {
        let row: Option<(String, bool)> = self
            .invoke_optional("run_scope", false, || {
                sqlx::query_as("SELECT tenant_id, kind = 'task' FROM agent_runs WHERE run_id = $1")
                    .bind(run_id.as_uuid())
            })
            .await?;
        Ok(row)
    }

    /// The tenant of the run an operation belongs to.
    pub async fn operation_tenant(
        &self,
        operation_id: &crate::intent::OperationId,
    ) -> Result<Option<String>, LedgerError> {
        let row: Option<(String,)> = self
            .invoke_optional("operation_tenant", false, || {
                sqlx::query_as(
                    "SELECT r.tenant_id
                       FROM (SELECT run_id FROM tool_operations WHERE operation_id = $1
                             UNION ALL
                             SELECT run_id FROM tool_operations_archive WHERE operation_id = $1
                             LIMIT 1) o
                       JOIN agent_runs r ON r.run_id = o.run_id",
                )
                .bind(operation_id.as_str())
            })
            .await?;
        Ok(row.map(|(tenant,)| tenant))
    }

    /// The run's status history (run, lease and operation events), oldest first.
    pub async fn run_events(&self, run_id: RunId) -> Result<Vec<LedgerEvent>, LedgerError> {
        let rows: Vec<EventRow> = self
            .invoke_all("run_events", false, || {
                sqlx::query_as(EVENTS_OF_RUN).bind(run_id.as_uuid())
            })
            .await?;
        Ok(rows.into_iter().map(EventRow::into_event).collect())
    }

    /// One operation's status history, oldest first.
    pub async fn operation_events(
        &self,
        operation_id: &crate::intent::OperationId,
    ) -> Result<Vec<LedgerEvent>, LedgerError> {
        let rows: Vec<EventRow> = self
            .invoke_all("operation_events", false, || {
                sqlx::query_as(EVENTS_OF_OPERATION).bind(operation_id.as_str())
            })
            .await?;
        Ok(rows.into_iter().map(EventRow::into_event).collect())
    }

    /// Who we are connected as, to what, and whether it is a primary.
    pub async fn health(&self) -> Result<DbHealth, LedgerError> {
        self.invoke("health", false, || {
            sqlx::query_as(
                "SELECT current_user::text AS current_user,
                        current_setting('server_version') AS server_version,
                        pg_is_in_recovery() AS in_recovery,
                        clock_timestamp() AS db_now",
            )
        })
        .await
    }

    /// A new transaction id (`txid_current()`, which assigns one). The
    /// difference of two readings counts the write transactions committed or
    /// aborted in between, cluster-wide; benchmarks use it to show that one
    /// ledger call is one transaction.
    pub async fn transaction_id(&self) -> Result<i64, LedgerError> {
        self.invoke("transaction_id", false, || {
            sqlx::query_as::<_, (i64,)>("SELECT txid_current()")
        })
        .await
        .map(|(id,)| id)
    }

    // Operations: the fate of a call.

    /// The fate of a call: the operation, its request, every status change,
    /// every claim (who, when, which epoch and dispatch, how it ended) and
    /// every piece of evidence. `None` when no such operation exists.
    /// An operation moved to the archive by retention
    /// (`operations_archive`, migration 0009) is read from there, whole,
    /// and marked `archived`.
    pub async fn operation_get(
        &self,
        operation_id: &OperationId,
    ) -> Result<Option<OperationView>, LedgerError> {
        const CALL: &str = "operation_get";
        let mut archived = false;
        let mut row: Option<TableRow> = self
            .invoke_optional(CALL, false, || {
                sqlx::query_as("SELECT * FROM tool_operations WHERE operation_id = $1")
                    .bind(operation_id.as_str())
            })
            .await?;
        if row.is_none() {
            row = self
                .invoke_optional(CALL, false, || {
                    sqlx::query_as(
                        "SELECT (jsonb_populate_record(NULL::tool_operations, a.row)).*
                           FROM tool_operations_archive a WHERE a.operation_id = $1",
                    )
                    .bind(operation_id.as_str())
                })
                .await?;
            archived = row.is_some();
        }
        let Some(row) = row else {
            return Ok(None);
        };
        let (events, evidence) = if archived {
            let rows: Vec<EventRow> = self
                .invoke_all("operation_events", false, || {
                    sqlx::query_as(ARCHIVED_EVENTS_OF_OPERATION).bind(operation_id.as_str())
                })
                .await?;
            let events = rows.into_iter().map(EventRow::into_event).collect();
            (events, self.evidence_from(operation_id, true).await?)
        } else {
            (
                self.operation_events(operation_id).await?,
                self.operation_evidence(operation_id).await?,
            )
        };
        let operation = row.record(CALL, &self.options.bodies)?;
        // A claim in flight has no event yet: the row is its record.
        let live = (operation.status == OperationStatus::Dispatching && row.claimed_at.is_some())
            .then(|| OperationClaim {
                dispatch_owner: operation.dispatch_owner.clone(),
                worker: row.claim_worker.clone(),
                at: row.claimed_at,
                epoch: row.claim_epoch,
                dispatch_count: Some(i64::from(operation.dispatch_count)),
                revision: Some(operation.revision),
                dispatch_until: operation.dispatch_until,
                ended: None,
                ended_by_event: None,
            });
        let claims = claims_of(&events, live);
        Ok(Some(OperationView {
            operation,
            request_body: row.request(&self.options.bodies)?,
            created_at: row.created_at,
            updated_at: row.updated_at,
            superseded_by: row.superseded_by.clone().map(OperationId::from_string),
            events,
            claims,
            evidence,
            archived,
        }))
    }

    /// The operation row alone (no history or evidence): what a caller
    /// polling for a status or reading a revision needs.
    pub async fn operation_record(
        &self,
        operation_id: &OperationId,
    ) -> Result<Option<OperationRecord>, LedgerError> {
        const CALL: &str = "operation_record";
        self.operation_row(CALL, operation_id)
            .await?
            .map(|row| row.record(CALL, &self.options.bodies))
            .transpose()
    }

    /// The operation row and its stored request, opened (as the ledger
    /// keeps it: in full, masked, digest only), in one statement: what a
    /// call answered from another intent compares itself with.
    pub async fn operation_record_with_request(
        &self,
        operation_id: &OperationId,
    ) -> Result<Option<(OperationRecord, serde_json::Value)>, LedgerError> {
        const CALL: &str = "operation_record_with_request";
        self.operation_row(CALL, operation_id)
            .await?
            .map(|row| {
                Ok((
                    row.record(CALL, &self.options.bodies)?,
                    row.request(&self.options.bodies)?,
                ))
            })
            .transpose()
    }

    /// The live row of one operation (`call` names the caller in errors).
    async fn operation_row(
        &self,
        call: &'static str,
        operation_id: &OperationId,
    ) -> Result<Option<TableRow>, LedgerError> {
        self.invoke_optional(call, false, || {
            sqlx::query_as("SELECT * FROM tool_operations WHERE operation_id = $1")
                .bind(operation_id.as_str())
        })
        .await
    }

    /// Every piece of evidence kept for an operation, oldest first.
    pub async fn operation_evidence(
        &self,
        operation_id: &OperationId,
    ) -> Result<Vec<Evidence>, LedgerError> {
        self.evidence_from(operation_id, false).await
    }

    /// An operation's evidence from the live table or (`archived`) the
    /// archive.
    async fn evidence_from(
        &self,
        operation_id: &OperationId,
        archived: bool,
    ) -> Result<Vec<Evidence>, LedgerError> {
        const CALL: &str = "operation_evidence";
        let sql = if archived {
            "SELECT e.evidence_id, e.at, e.kind, e.source, e.claim_owner, e.claim_revision, e.outcome,
                    e.remote_id, e.body
               FROM operation_evidence_archive a
               CROSS JOIN LATERAL jsonb_populate_record(NULL::operation_evidence, a.row) e
              WHERE a.operation_id = $1 ORDER BY a.evidence_id"
        } else {
            "SELECT evidence_id, at, kind, source, claim_owner, claim_revision, outcome,
                    remote_id, body
               FROM operation_evidence WHERE operation_id = $1 ORDER BY evidence_id"
        };
        let rows: Vec<EvidenceRow> = self
            .invoke_all(CALL, false, || {
                sqlx::query_as(sql).bind(operation_id.as_str())
            })
            .await?;
        rows.into_iter()
            .map(|e| {
                Ok(Evidence {
                    evidence_id: e.evidence_id,
                    at: e.at,
                    kind: EvidenceKind::parse(&e.kind).ok_or_else(|| {
                        protocol(CALL, format!("evidence kind {:?} is unknown", e.kind))
                    })?,
                    source: e.source,
                    claim_owner: e.claim_owner,
                    claim_revision: e.claim_revision,
                    outcome: e.outcome,
                    body: super::operation_rows::opened(
                        &self.options.bodies,
                        &e.body,
                        operation_id.as_str(),
                    )?,
                    remote_id: e.remote_id,
                })
            })
            .collect()
    }

    /// A run's operations, oldest first, optionally only those in `status`.
    pub async fn operations_list(
        &self,
        run_id: RunId,
        status: Option<OperationStatus>,
    ) -> Result<Vec<OperationRecord>, LedgerError> {
        const CALL: &str = "operations_list";
        let rows: Vec<TableRow> = self
            .invoke_all(CALL, false, || {
                sqlx::query_as(
                    "SELECT * FROM tool_operations
                      WHERE run_id = $1 AND ($2::text IS NULL OR status = $2)
                      ORDER BY created_at, operation_id",
                )
                .bind(run_id.as_uuid())
                .bind(status.map(OperationStatus::as_str))
            })
            .await?;
        rows.iter()
            .map(|row| row.record(CALL, &self.options.bodies))
            .collect()
    }

    /// One page of the operations of `tenant`'s runs (`None`: every
    /// tenant's), newest first, of `run`, `status` and `tool` when given,
    /// after `after` (the `created_at` and id of the last operation of the
    /// page before): at most `limit`, and whether more follow. Each with
    /// its `created_at`, the cursor of the next page.
    pub async fn operations_page(
        &self,
        filter: &OperationFilter<'_>,
        after: Option<(DateTime<Utc>, &str)>,
        limit: i64,
    ) -> Result<(Vec<(OperationRecord, DateTime<Utc>)>, bool), LedgerError> {
        const CALL: &str = "operations_page";
        let rows: Vec<TableRow> = self
            .invoke_all(CALL, false, || {
                sqlx::query_as(
                    "SELECT o.* FROM tool_operations o JOIN agent_runs r ON r.run_id = o.run_id
                      WHERE ($1::text IS NULL OR r.tenant_id = $1)
                        AND ($2::uuid IS NULL OR o.run_id = $2)
                        AND ($3::text IS NULL OR o.status = $3)
                        AND ($4::text IS NULL OR o.tool_name = $4)
                        AND ($5::timestamptz IS NULL OR (o.created_at, o.operation_id) < ($5, $6::text))
                      ORDER BY o.created_at DESC, o.operation_id DESC
                      LIMIT $7",
                )
                .bind(filter.tenant)
                .bind(filter.run_id.map(|r| r.as_uuid()))
                .bind(filter.status.map(OperationStatus::as_str))
                .bind(filter.tool)
                .bind(after.map(|(at, _)| at))
                .bind(after.map(|(_, id)| id))
                .bind(limit + 1)
            })
            .await?;
        let more = rows.len() as i64 > limit;
        let page = rows
            .iter()
            .take(limit as usize)
            .map(|row| Ok((row.record(CALL, &self.options.bodies)?, row.created_at)))
            .collect::<Result<_, LedgerError>>()?;
        Ok((page, more))
    }

    /// How many operations are `unknown` and how old the oldest is.
    pub async fn operations_unknown_summary(&self) -> Result<UnknownSummary, LedgerError> {
        self.operations_unknown_summary_of(None).await
    }

    /// [`Ledger::operations_unknown_summary`] of one tenant's runs (`Some`).
    pub async fn operations_unknown_summary_of(
        &self,
        tenant: Option<&str>,
    ) -> Result<UnknownSummary, LedgerError> {
        let (count, oldest_operation_id, oldest_age_seconds): (i64, Option<String>, Option<f64>) =
            self.invoke("operations_unknown_summary", false, || {
                sqlx::query_as(
                    "WITH unknown AS (
                       SELECT o.operation_id, o.updated_at FROM tool_operations o
                        WHERE o.status = 'unknown'
                          AND ($1::text IS NULL OR EXISTS (
                                SELECT 1 FROM agent_runs r
                                 WHERE r.run_id = o.run_id AND r.tenant_id = $1)))
                     SELECT (SELECT count(*) FROM unknown),
                            oldest.operation_id,
                            extract(epoch FROM clock_timestamp() - oldest.updated_at)::float8
                       FROM (SELECT 1) one
                       LEFT JOIN LATERAL (
                         SELECT operation_id, updated_at FROM unknown
                          ORDER BY updated_at LIMIT 1
                       ) oldest ON true",
                )
                .bind(tenant)
            })
            .await?;
        Ok(UnknownSummary {
            count,
            oldest_operation_id: oldest_operation_id.map(OperationId::from_string),
            oldest_age_seconds,
        })
    }
}
