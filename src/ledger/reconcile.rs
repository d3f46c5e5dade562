//! The reconciler's writes: claiming unknown operations, recording each
//! attempt, re-sending, refunding a reconcile claim, resetting for a retry,
//! releasing, and finding dispatch claims that lapsed. Each is one SQL
//! function call (`sql/operation.sql`); a lost connection is
//! [`LedgerError::OutcomeUnknown`] and the reconciler reads the operation
//! back before acting again.

use serde_json::Value;
use sqlx::types::Json;

use super::operation_rows::{OpRow, TableRow, skip_unopenable};
use super::verdict::Outcome;
use super::{
    DispatchClaim, InvalidInput, Ledger, LedgerError, MAX_OWNER_LEN, OperationRecord,
    ReconcileItem, ResendVerdict, RetryResetOutcome, RetryVerdict, check_text,
};
use crate::intent::OperationId;

impl Ledger {
    // ----------------------------------------------------------------------
    // Reconciler
    // ----------------------------------------------------------------------

    /// Claims up to `limit` unknown operations for the reconciler `owner`
    /// for `ttl_ms` (those nobody holds, or whose reconcile claim lapsed).
    /// They stay `unknown`; only `operation_converge` settles them.
    pub async fn operation_reconcile_claim(
        &self,
        owner: &str,
        ttl_ms: i64,
        limit: u16,
        tenants: Option<&[String]>,
    ) -> Result<Vec<ReconcileItem>, LedgerError> {
        const CALL: &str = "operation_reconcile_claim";
        check_text("reconcile owner", owner, MAX_OWNER_LEN)?;
        self.check_claim_ttl(ttl_ms)?;
        let rows: Vec<TableRow> = self
            .invoke_all(CALL, true, || {
                sqlx::query_as("SELECT * FROM operation_reconcile_claim($1, $2, $3, $4)")
                    .bind(owner)
                    .bind(ttl_ms)
                    .bind(i32::from(limit))
                    .bind(tenants)
            })
            .await?;
        rows.into_iter()
            .filter_map(|row| {
                let item = (|| {
                    Ok(ReconcileItem {
                        operation: row.record(CALL, self.bodies())?,
                        request_body: row.request(self.bodies())?,
                        reconcile_attempts: row.reconcile_attempts,
                        first_dispatched_at: row.first_dispatched_at,
                    })
                })();
                skip_unopenable(CALL, item)
            })
            .collect()
    }

    /// Asks to retry `operation` with its same key: allowed inside the key
    /// retention window (from the first dispatch, database clock) and the
    /// retry budget, under the reconcile claim. Counted before the call.
    pub async fn operation_reconcile_attempt(
        &self,
        operation: &OperationRecord,
        owner: &str,
        retention_ms: i64,
        max_attempts: i32,
    ) -> Result<RetryVerdict, LedgerError> {
        const CALL: &str = "operation_reconcile_attempt";
        let (outcome, revision): (String, Option<i64>) = self
            .invoke(CALL, true, || {
                sqlx::query_as("SELECT * FROM operation_reconcile_attempt($1, $2, $3, $4, $5)")
                    .bind(operation.operation_id.as_str())
                    .bind(owner)
                    .bind(operation.revision)
                    .bind(retention_ms)
                    .bind(max_attempts)
            })
            .await?;
        Ok(match (Outcome::parse(CALL, &outcome)?, revision) {
            (Outcome::Attempt, Some(revision)) => RetryVerdict::Attempt { revision },
            (Outcome::WindowPassed, _) => RetryVerdict::WindowPassed,
            (Outcome::BudgetSpent, _) => RetryVerdict::BudgetSpent,
            (Outcome::StaleClaim, _) => RetryVerdict::StaleClaim,
            (other, _) => return Err(other.unexpected(CALL)),
        })
    }

    /// Hands an unknown operation the tool answered "not found" for back to
    /// the dispatcher (unknown -> prepared, same operation id), under the
    /// reconcile claim, once `settle_ms` passed since it was last sent and
    /// within the retry budget. `evidence` (the query and its answer) is kept.
    pub async fn operation_reconcile_resend(
        &self,
        operation: &OperationRecord,
        owner: &str,
        settle_ms: i64,
        max_attempts: i32,
        evidence: &Value,
    ) -> Result<ResendVerdict, LedgerError> {
        const CALL: &str = "operation_reconcile_resend";
        let evidence = self.stored_evidence(evidence, operation.operation_id.as_str())?;
        let (outcome, _): (String, Option<i64>) = self
            .invoke(CALL, true, || {
                sqlx::query_as("SELECT * FROM operation_reconcile_resend($1, $2, $3, $4, $5, $6)")
                    .bind(operation.operation_id.as_str())
                    .bind(owner)
                    .bind(operation.revision)
                    .bind(settle_ms)
                    .bind(max_attempts)
                    .bind(Json(&evidence))
            })
            .await?;
        Ok(match Outcome::parse(CALL, &outcome)? {
            Outcome::Resent => ResendVerdict::Resent,
            Outcome::Settling => ResendVerdict::Settling,
            Outcome::BudgetSpent => ResendVerdict::BudgetSpent,
            Outcome::StaleClaim => ResendVerdict::StaleClaim,
            other => return Err(other.unexpected(CALL)),
        })
    }

    /// Gives back the attempt `operation_reconcile_attempt` granted at
    /// `revision` when the retry provably never left (nothing was sent).
    /// Returns whether it was given back (false: the claim moved on).
    pub async fn operation_reconcile_refund(
        &self,
        operation_id: &OperationId,
        owner: &str,
        revision: i64,
    ) -> Result<bool, LedgerError> {
        const CALL: &str = "operation_reconcile_refund";
        let (outcome, _): (String, Option<i64>) = self
            .invoke(CALL, true, || {
                sqlx::query_as("SELECT * FROM operation_reconcile_refund($1, $2, $3)")
                    .bind(operation_id.as_str())
                    .bind(owner)
                    .bind(revision)
            })
            .await?;
        match Outcome::parse(CALL, &outcome)? {
            Outcome::Refunded => Ok(true),
            Outcome::StaleClaim => Ok(false),
            other => Err(other.unexpected(CALL)),
        }
    }

    /// An operator asks for an unknown operation to be tried again: its
    /// same-key retry budget starts over (e.g. after the upstream was down
    /// or fixed). `actor` and `note` go to the history. Only a ledger
    /// connected as [`super::OPERATOR_ROLE`] may (SQLSTATE 42501 otherwise).
    pub async fn operation_reconcile_reset(
        &self,
        operation_id: &OperationId,
        actor: &str,
        note: &str,
    ) -> Result<RetryResetOutcome, LedgerError> {
        const CALL: &str = "operation_reconcile_reset";
        check_text("actor", actor, MAX_OWNER_LEN)?;
        if note.trim().is_empty() {
            return Err(InvalidInput::Request("a retry needs a note".into()).into());
        }
        let row: OpRow = self
            .invoke(CALL, true, || {
                sqlx::query_as("SELECT * FROM operation_reconcile_reset($1, $2, $3)")
                    .bind(operation_id.as_str())
                    .bind(actor)
                    .bind(note)
            })
            .await?;
        Ok(match row.outcome(CALL)? {
            Outcome::Reset => RetryResetOutcome::Reset(row.record(CALL, self.bodies())?),
            Outcome::NotUnknown => RetryResetOutcome::NotUnknown(row.record(CALL, self.bodies())?),
            Outcome::NotFound => RetryResetOutcome::NotFound,
            other => return Err(other.unexpected(CALL)),
        })
    }

    /// Hands a reconcile claim back early: the operation (still unknown)
    /// may be claimed again after `retry_after_ms`. Returns whether the
    /// caller still held it.
    pub async fn operation_reconcile_release(
        &self,
        operation_id: &OperationId,
        owner: &str,
        retry_after_ms: i64,
    ) -> Result<bool, LedgerError> {
        const CALL: &str = "operation_reconcile_release";
        let (outcome,): (String,) = self
            .invoke(CALL, true, || {
                sqlx::query_as("SELECT outcome FROM operation_reconcile_release($1, $2, $3)")
                    .bind(operation_id.as_str())
                    .bind(owner)
                    .bind(retry_after_ms)
            })
            .await?;
        match Outcome::parse(CALL, &outcome)? {
            Outcome::Released => Ok(true),
            Outcome::StaleClaim => Ok(false),
            other => Err(other.unexpected(CALL)),
        }
    }

    /// `dispatching` operations whose claim has expired (database clock) or
    /// whose holder is provably gone (its liveness lapsed).
    pub async fn operations_expired_claims(
        &self,
        limit: i64,
        tenants: Option<&[String]>,
    ) -> Result<Vec<DispatchClaim>, LedgerError> {
        const CALL: &str = "operations_expired_claims";
        let rows: Vec<TableRow> = self
            .invoke_all(CALL, false, || {
                sqlx::query_as(
                    "SELECT o.* FROM tool_operations o JOIN agent_runs r ON r.run_id = o.run_id
                      WHERE o.status = 'dispatching'
                        AND (o.dispatch_until <= clock_timestamp()
                             OR EXISTS (SELECT 1 FROM leasegate_processes p
                                         WHERE p.owner = o.dispatch_owner
                                           AND p.alive_until <= clock_timestamp()))
                        AND ($2::text[] IS NULL OR r.tenant_id = ANY ($2))
                      ORDER BY o.dispatch_until LIMIT $1",
                )
                .bind(limit)
                .bind(tenants)
            })
            .await?;
        let mut claims = Vec::with_capacity(rows.len());
        for row in &rows {
            if let Some(claim) = row.record(CALL, self.bodies())?.claim() {
                claims.push(claim);
            }
        }
        Ok(claims)
    }
}
