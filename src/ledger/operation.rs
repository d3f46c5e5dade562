//! The operations ledger: side-effect intents, claims, settlement, unknown
//! outcomes and evidence (the read side, the fate of a call, is in
//! `read.rs`). One SQL function call each (`sql/operation.sql`), so the proxy's hot path costs two
//! round trips: `operation_register_claim` before the upstream call (which
//! also checks the run's tenant, and on a replay samples the WAL position)
//! and `CALL operation_settle_acknowledged` after it (the settle committed,
//! then the WAL position read: the durability gate's sample, in the same
//! round trip). A replay served from the ledger costs one. With group
//! commit on ([`super::LedgerOptions::group_commit`], `group.rs`) both go
//! through the group committer, which sends many callers' calls as one
//! `operation_register_claim_batch` / `CALL
//! operation_settle_acknowledged_batch` and decodes each caller's verdict
//! here exactly as the single answer is decoded.
//!
//! # Failure handling (at each durability boundary)
//!
//! - Crash after `operation_register_claim` committed, before the upstream
//!   call: the row is `dispatching` under a claim nobody holds; when the
//!   claim expires `operation_mark_unknown` (reconciler) makes it `unknown`,
//!   and its adapter's capability decides how it converges. It is never
//!   re-sent as if new and never returns to `prepared`.
//! - Crash after the upstream call, before `operation_settle`: same, and the
//!   remote side effect exists; convergence finds it by operation id.
//! - A response that arrives after its claim lost validity is stored as
//!   evidence by `operation_settle` and settles nothing.
//! - A lost connection during any of these calls is
//!   [`LedgerError::OutcomeUnknown`]: read the operation back with
//!   [`Ledger::operation_get`] before acting.

use std::borrow::Cow;

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::postgres::types::PgRecordEncoder;
use sqlx::postgres::{PgArgumentBuffer, PgHasArrayType, PgTypeInfo};
use sqlx::types::Json;
use sqlx::{FromRow, Postgres};
use uuid::Uuid;

use super::durability::{WalColumns, WalPosition};
use super::group::{Flush, ItemAnswer};
use super::operation_types::route_of;
use super::stored_json::{self, Raw};
use super::verdict::{Expected, Found, Outcome, fence_rejection, rejected};
use super::{
    ClaimedOperation, Converge, ConvergeEvidence, ConvergeOutcome, DispatchClaim, Fenced,
    InlineClaim, InvalidInput, LeaseClaim, Ledger, LedgerError, MAX_OWNER_LEN, MarkUnknown,
    MarkUnknownOutcome, OperationRecord, OperationStatus, ReconcileItem, Registered, Rejection,
    ReleaseUnsentOutcome, ResendVerdict, RetryResetOutcome, RetryVerdict, RunId, RunStatus,
    SettleOutcome, Settlement, StaleReason, SupersedeOutcome, ToolRoute, UnknownBy, check_text,
};
use crate::intent::{Intent, OperationId, RequestDigest};
use crate::policy::Bodies;

/// Most intents registered in one call.
const MAX_INTENTS_PER_CALL: usize = 1_000;

/// The `operation_result` composite.
#[derive(Debug, FromRow)]
struct OpRow {
    outcome: String,
    run_status: Option<String>,
    run_revision: Option<i64>,
    lease_owner: Option<String>,
    lease_epoch: Option<i64>,
    lease_expires_at: Option<DateTime<Utc>>,
    db_now: DateTime<Utc>,
    operation_id: Option<String>,
    run_id: Option<Uuid>,
    step_id: Option<String>,
    effect_version: Option<i32>,
    tool_name: Option<String>,
    request_digest: Option<String>,
    status: Option<String>,
    revision: Option<i64>,
    dispatch_owner: Option<String>,
    dispatch_until: Option<DateTime<Utc>>,
    dispatch_count: Option<i32>,
    remote_id: Option<String>,
    result: Option<Raw>,
    evidence_id: Option<i64>,
    upstream: Option<String>,
    upstream_tool: Option<String>,
}

/// What `operation_register_claim` answers: the `operation_result` columns
/// and, on a replay, where the WAL stood.
#[derive(Debug, FromRow)]
pub(super) struct ClaimRow {
    #[sqlx(flatten)]
    row: OpRow,
    #[sqlx(flatten)]
    wal: WalColumns,
}

/// What `CALL operation_settle_acknowledged` answers: the operation's
/// columns of `operation_result` (no run, lease or result) and where the
/// WAL stood after the commit.
#[derive(Debug, FromRow)]
pub(super) struct SettleRow {
    outcome: String,
    db_now: Option<DateTime<Utc>>,
    operation_id: Option<String>,
    run_id: Option<Uuid>,
    step_id: Option<String>,
    effect_version: Option<i32>,
    tool_name: Option<String>,
    request_digest: Option<String>,
    status: Option<String>,
    revision: Option<i64>,
    dispatch_owner: Option<String>,
    dispatch_until: Option<DateTime<Utc>>,
    dispatch_count: Option<i32>,
    remote_id: Option<String>,
    evidence_id: Option<i64>,
    upstream: Option<String>,
    upstream_tool: Option<String>,
    #[sqlx(flatten)]
    wal: WalColumns,
}

impl SettleRow {
    fn into_op_row(self) -> OpRow {
        OpRow {
            outcome: self.outcome,
            run_status: None,
            run_revision: None,
            lease_owner: None,
            lease_epoch: None,
            lease_expires_at: None,
            db_now: self.db_now.unwrap_or_else(Utc::now),
            operation_id: self.operation_id,
            run_id: self.run_id,
            step_id: self.step_id,
            effect_version: self.effect_version,
            tool_name: self.tool_name,
            request_digest: self.request_digest,
            status: self.status,
            revision: self.revision,
            dispatch_owner: self.dispatch_owner,
            dispatch_until: self.dispatch_until,
            dispatch_count: self.dispatch_count,
            remote_id: self.remote_id,
            result: None,
            evidence_id: self.evidence_id,
            upstream: self.upstream,
            upstream_tool: self.upstream_tool,
        }
    }
}

/// A `tool_operations` row, as the dispatcher's claim returns it.
#[derive(Debug, FromRow)]
pub(super) struct TableRow {
    pub(super) operation_id: String,
    pub(super) run_id: Uuid,
    pub(super) step_id: String,
    pub(super) effect_version: i32,
    pub(super) tool_name: String,
    pub(super) request_digest: String,
    pub(super) request_body: Raw,
    pub(super) status: String,
    pub(super) dispatch_owner: Option<String>,
    pub(super) dispatch_until: Option<DateTime<Utc>>,
    pub(super) remote_id: Option<String>,
    pub(super) result: Option<Raw>,
    pub(super) revision: i64,
    pub(super) updated_at: DateTime<Utc>,
    pub(super) created_at: DateTime<Utc>,
    pub(super) dispatch_count: i32,
    pub(super) superseded_by: Option<String>,
    pub(super) reconcile_attempts: i32,
    pub(super) first_dispatched_at: Option<DateTime<Utc>>,
    pub(super) upstream: Option<String>,
    pub(super) upstream_tool: Option<String>,
}

#[derive(Debug, FromRow)]
pub(super) struct EvidenceRow {
    pub(super) evidence_id: i64,
    pub(super) at: DateTime<Utc>,
    pub(super) kind: String,
    pub(super) source: String,
    pub(super) claim_owner: Option<String>,
    pub(super) claim_revision: Option<i64>,
    pub(super) outcome: Option<String>,
    pub(super) remote_id: Option<String>,
    pub(super) body: Raw,
}

pub(super) fn protocol(call: &'static str, detail: impl Into<String>) -> LedgerError {
    LedgerError::Protocol {
        call,
        detail: detail.into(),
    }
}

fn operation_status(call: &'static str, value: &str) -> Result<OperationStatus, LedgerError> {
    OperationStatus::parse(value).ok_or_else(|| {
        protocol(
            call,
            format!("operation status {value:?} is not one this build knows"),
        )
    })
}

impl TableRow {
    pub(super) fn record(
        &self,
        call: &'static str,
        bodies: &Bodies,
    ) -> Result<OperationRecord, LedgerError> {
        Ok(OperationRecord {
            operation_id: OperationId::from_string(self.operation_id.clone()),
            run_id: RunId::from_uuid(self.run_id),
            step_id: self.step_id.clone(),
            effect_version: self.effect_version,
            tool_name: self.tool_name.clone(),
            request_digest: RequestDigest::from_hex(self.request_digest.clone()),
            status: operation_status(call, &self.status)?,
            revision: self.revision,
            dispatch_owner: self.dispatch_owner.clone(),
            dispatch_until: self.dispatch_until,
            dispatch_count: self.dispatch_count,
            remote_id: self.remote_id.clone(),
            result: self
                .result
                .as_ref()
                .map(|raw| opened(bodies, raw, &self.operation_id))
                .transpose()?,
            route: route_of(self.upstream.as_ref(), self.upstream_tool.as_ref()),
        })
    }

    /// The stored request, opened.
    pub(super) fn request(&self, bodies: &Bodies) -> Result<Value, LedgerError> {
        opened(bodies, &self.request_body, &self.operation_id)
    }
}

/// A stored body as it was before it was stored (`stored_json::open` with
/// the ledger's keys); `operation_id`: the row it was read from.
pub(super) fn opened(bodies: &Bodies, raw: &Raw, operation_id: &str) -> Result<Value, LedgerError> {
    stored_json::open(raw.0.clone(), &|inner| bodies.open(inner, operation_id)).map_err(|source| {
        LedgerError::Sealed {
            operation_id: operation_id.to_owned(),
            source,
            after_call: true,
        }
    })
}

/// A claimed row whose body cannot be opened is left out of the batch
/// (its claim lapses; an operator sees the error in the log and on every
/// read of it), so one row under a missing key does not stop the others.
fn skip_unopenable<T>(
    call: &'static str,
    item: Result<T, LedgerError>,
) -> Option<Result<T, LedgerError>> {
    match item {
        Err(error @ LedgerError::Sealed { .. }) => {
            tracing::error!(call, %error, "claimed operation skipped: its stored body cannot be opened");
            None
        }
        other => Some(other),
    }
}

/// The stored form of a value that is not sealed.
fn plain(value: &Value) -> Value {
    stored_json::encode(value).into_owned()
}

fn sealing(operation_id: &str, source: crate::policy::secrets::SecretsError) -> LedgerError {
    LedgerError::Sealed {
        operation_id: operation_id.to_owned(),
        source,
        after_call: false,
    }
}

impl Ledger {
    fn bodies(&self) -> &Bodies {
        &self.options.bodies
    }

    /// Whether a planned intent can be stored: it is sent later from what
    /// the ledger stores, and a policy that keeps less than the request
    /// (masked fields present, digest only) could only ever send a
    /// placeholder (`encrypted` keeps it without plaintext at rest).
    fn keeps(&self, intent: &Intent) -> bool {
        self.bodies().keeps_request(&intent.request_body)
    }

    fn unplannable(&self, intent: &Intent) -> LedgerError {
        let policy = match self.bodies().request {
            crate::policy::RequestBodyPolicy::DigestOnly => "request_body = \"digest_only\" keeps",
            _ => "request_body = \"masked\" and a masked field in its arguments keep",
        };
        InvalidInput::Request(format!(
            "planned intent {} v{} cannot be stored: {policy} no sendable copy of its arguments (use \"encrypted\", or leave masked fields out of planned intents)",
            intent.step_id, intent.effect_version
        ))
        .into()
    }

    /// The stored form of `result` of `operation_id` (policy `result_body`).
    fn stored_result(&self, result: &Value, operation_id: &str) -> Result<Value, LedgerError> {
        self.bodies()
            .store_result(result, operation_id, &plain)
            .map_err(|e| sealing(operation_id, e))
    }

    /// The stored form of evidence about `operation_id`.
    fn stored_evidence(&self, evidence: &Value, operation_id: &str) -> Result<Value, LedgerError> {
        self.bodies()
            .store_evidence(evidence, operation_id, &plain)
            .map_err(|e| sealing(operation_id, e))
    }
}

impl OpRow {
    /// The operation this row reports, if it names one.
    fn record(&self, call: &'static str, bodies: &Bodies) -> Result<OperationRecord, LedgerError> {
        let missing = |field: &str| protocol(call, format!("{field} missing from the answer"));
        let operation_id = self
            .operation_id
            .clone()
            .ok_or_else(|| missing("operation_id"))?;
        Ok(OperationRecord {
            result: self
                .result
                .as_ref()
                .map(|raw| opened(bodies, raw, &operation_id))
                .transpose()?,
            operation_id: OperationId::from_string(operation_id),
            run_id: RunId::from_uuid(self.run_id.ok_or_else(|| missing("run_id"))?),
            step_id: self.step_id.clone().ok_or_else(|| missing("step_id"))?,
            effect_version: self
                .effect_version
                .ok_or_else(|| missing("effect_version"))?,
            tool_name: self.tool_name.clone().ok_or_else(|| missing("tool_name"))?,
            request_digest: RequestDigest::from_hex(
                self.request_digest
                    .clone()
                    .ok_or_else(|| missing("request_digest"))?,
            ),
            status: operation_status(
                call,
                self.status.as_deref().ok_or_else(|| missing("status"))?,
            )?,
            revision: self.revision.ok_or_else(|| missing("revision"))?,
            dispatch_owner: self.dispatch_owner.clone(),
            dispatch_until: self.dispatch_until,
            dispatch_count: self.dispatch_count.unwrap_or(0),
            remote_id: self.remote_id.clone(),
            route: route_of(self.upstream.as_ref(), self.upstream_tool.as_ref()),
        })
    }

    fn evidence_id(&self, call: &'static str) -> Result<i64, LedgerError> {
        self.evidence_id
            .ok_or_else(|| protocol(call, "evidence_id missing from the answer"))
    }

    fn outcome(&self, call: &'static str) -> Result<Outcome, LedgerError> {
        Outcome::parse(call, &self.outcome)
    }

    fn found(&self) -> Found<'_> {
        Found {
            run_status: self.run_status.as_deref(),
            run_revision: self.run_revision,
            lease_owner: self.lease_owner.as_deref(),
            lease_epoch: self.lease_epoch,
            lease_expires_at: self.lease_expires_at,
            db_now: self.db_now,
        }
    }

    /// The rejection this row reports, if any (counted once, in
    /// `verdict::rejected`): the shared fence and run-state verdicts, and an
    /// intent conflict against `intent` (what the caller sent, if it is the
    /// intent the row names).
    fn rejection(
        &self,
        call: &'static str,
        expected: Expected<'_>,
        intent: Option<&Intent>,
        bodies: &Bodies,
    ) -> Result<Option<Rejection>, LedgerError> {
        let outcome = self.outcome(call)?;
        let rejection = if outcome == Outcome::IntentConflict {
            let found = self.record(call, bodies)?;
            Rejection::IntentConflict {
                expected_digest: intent
                    .filter(|intent| {
                        intent.operation_id == found.operation_id
                            || (intent.step_id == found.step_id
                                && intent.effect_version == found.effect_version)
                    })
                    .map(|intent| intent.request_digest.clone()),
                operation_id: found.operation_id,
                found_digest: found.request_digest,
                found_tool: found.tool_name,
                found_step: found.step_id,
                found_effect_version: found.effect_version,
            }
        } else {
            match fence_rejection(call, outcome, expected, self.found())? {
                Some(rejection) => rejection,
                None => return Ok(None),
            }
        };
        Ok(Some(rejected(call, rejection)))
    }
}

/// An intent as the SQL functions take it: the `operation_intent` composite
/// (typed fields, checked by PostgreSQL on the way in).
/// Encoded by hand: sqlx's derive needs owned fields, and these borrow.
#[derive(Debug)]
struct IntentParams<'a> {
    operation_id: &'a str,
    step_id: &'a str,
    effect_version: i32,
    tool_name: &'a str,
    request_digest: &'a str,
    request_body: Json<Cow<'a, Value>>,
    upstream: Option<&'a str>,
    upstream_tool: Option<&'a str>,
}

impl sqlx::Type<Postgres> for IntentParams<'_> {
    fn type_info() -> PgTypeInfo {
        PgTypeInfo::with_name("operation_intent")
    }
}

impl PgHasArrayType for IntentParams<'_> {
    fn array_type_info() -> PgTypeInfo {
        PgTypeInfo::array_of("operation_intent")
    }
}

impl sqlx::Encode<'_, Postgres> for IntentParams<'_> {
    fn encode_by_ref(
        &self,
        buf: &mut PgArgumentBuffer,
    ) -> Result<sqlx::encode::IsNull, sqlx::error::BoxDynError> {
        let mut record = PgRecordEncoder::new(buf);
        record
            .encode(self.operation_id)?
            .encode(self.step_id)?
            .encode(self.effect_version)?
            .encode(self.tool_name)?
            .encode(self.request_digest)?
            .encode(&self.request_body)?
            .encode(self.upstream)?
            .encode(self.upstream_tool)?;
        record.finish();
        Ok(sqlx::encode::IsNull::No)
    }
}

impl<'a> IntentParams<'a> {
    /// The intent with its request body as `bodies` stores it (the policy's
    /// `request_body`: as sent, masked, digest only or sealed).
    fn new(
        intent: &'a Intent,
        route: Option<&'a ToolRoute>,
        bodies: &Bodies,
    ) -> Result<Self, LedgerError> {
        let operation_id = intent.operation_id.as_str();
        let stored = bodies
            .store_request(&intent.request_body, operation_id, &plain)
            .map_err(|e| sealing(operation_id, e))?;
        Ok(IntentParams {
            operation_id,
            step_id: &intent.step_id,
            effect_version: intent.effect_version,
            tool_name: &intent.tool_name,
            request_digest: intent.request_digest.as_str(),
            request_body: Json(Cow::Owned(stored)),
            upstream: route.map(|r| r.upstream.as_str()),
            upstream_tool: route.map(|r| r.tool.as_str()),
        })
    }
}

/// A checkpoint written in the same transaction as planned intents.
#[derive(Debug, Clone, Copy)]
pub struct PlannedCheckpoint<'a> {
    pub expected_revision: i64,
    pub checkpoint: &'a Value,
}

impl Ledger {
    /// Registers intents as `prepared` under the caller's lease — the seed's
    /// "step planned" (9.1) — optionally with a checkpoint CAS in the same
    /// transaction. All or nothing: one conflicting intent (same identity,
    /// different request) rejects the call with
    /// [`Rejection::IntentConflict`] and nothing is written. Intents that
    /// already exist with the same request come back as replays.
    pub async fn operation_register(
        &self,
        claim: &LeaseClaim,
        intents: &[Intent],
        checkpoint: Option<PlannedCheckpoint<'_>>,
    ) -> Result<Fenced<Vec<Registered>>, LedgerError> {
        const CALL: &str = "operation_register";
        if intents.is_empty() || intents.len() > MAX_INTENTS_PER_CALL {
            return Err(InvalidInput::Request(format!(
                "register 1 to {MAX_INTENTS_PER_CALL} intents per call, got {}",
                intents.len()
            ))
            .into());
        }
        for (index, intent) in intents.iter().enumerate() {
            if intents[..index].iter().any(|earlier| {
                earlier.operation_id == intent.operation_id
                    || (earlier.step_id == intent.step_id
                        && earlier.effect_version == intent.effect_version)
            }) {
                return Err(InvalidInput::Request(format!(
                    "step {} v{} appears twice in one registration",
                    intent.step_id, intent.effect_version
                ))
                .into());
            }
        }
        if let Some(intent) = intents.iter().find(|i| !self.keeps(i)) {
            return Err(self.unplannable(intent));
        }
        let batch: Vec<IntentParams> = intents
            .iter()
            .map(|i| IntentParams::new(i, None, self.bodies()))
            .collect::<Result<_, _>>()?;
        let rows: Vec<OpRow> = self
            .invoke_all(CALL, true, || {
                sqlx::query_as("SELECT * FROM operation_register($1, $2, $3, $4, $5, $6, $7)")
                    .bind(claim.run_id.as_uuid())
                    .bind(claim.owner.as_str())
                    .bind(claim.epoch)
                    .bind(super::token::bind_hash(claim.token.as_ref()))
                    .bind(&batch)
                    .bind(checkpoint.map(|c| c.expected_revision))
                    .bind(checkpoint.map(|c| Json(stored_json::encode(c.checkpoint))))
            })
            .await?;
        let expected_revision = checkpoint.map(|c| c.expected_revision);
        let mut registered = Vec::with_capacity(rows.len());
        for row in &rows {
            let expected = intents.iter().find(|intent| {
                row.operation_id.as_deref() == Some(intent.operation_id.as_str())
                    || (row.step_id.as_deref() == Some(intent.step_id.as_str())
                        && row.effect_version == Some(intent.effect_version))
            });
            let fence = Expected {
                claim: Some(claim),
                revision: expected_revision,
                status: Some(RunStatus::Running),
            };
            if let Some(rejection) = row.rejection(CALL, fence, expected, self.bodies())? {
                return Ok(Fenced::Rejected(rejection));
            }
            let newly_registered = match row.outcome(CALL)? {
                Outcome::Registered => true,
                Outcome::Exists => false,
                other => return Err(other.unexpected(CALL)),
            };
            registered.push(Registered {
                operation: row.record(CALL, self.bodies())?,
                newly_registered,
                run_revision: row
                    .run_revision
                    .ok_or_else(|| protocol(CALL, "run revision missing from the answer"))?,
            });
        }
        if registered.len() != intents.len() {
            return Err(protocol(
                CALL,
                format!("{} rows for {} intents", registered.len(), intents.len()),
            ));
        }
        Ok(Fenced::Applied(registered))
    }

    /// The proxy's hot path, one transaction: validate the lease, register
    /// or find the intent (comparing run, tool and digest on every path),
    /// and claim it under `dispatch_owner` for `claim_ttl_ms`. Any tenant's
    /// run; see [`Ledger::operation_register_claim_in`].
    pub async fn operation_register_claim(
        &self,
        claim: &LeaseClaim,
        intent: &Intent,
        route: Option<&ToolRoute>,
        dispatch_owner: &str,
        claim_ttl_ms: i64,
    ) -> Result<Fenced<InlineClaim>, LedgerError> {
        self.operation_register_claim_in(None, claim, intent, route, dispatch_owner, claim_ttl_ms)
            .await
            .map(|(outcome, _)| outcome)
    }

    /// [`Ledger::operation_register_claim`] for a run of `tenant` (`None`:
    /// any): a run of another tenant is [`Rejection::NotFound`], judged in
    /// the same statement, so the proxy's first call of a run costs no
    /// tenant lookup. On a replay ([`InlineClaim::Existing`]) the answer also
    /// carries where the WAL stood after the recorded row was read: an upper
    /// bound of the write being replayed (`crate::durability`).
    pub async fn operation_register_claim_in(
        &self,
        tenant: Option<&str>,
        claim: &LeaseClaim,
        intent: &Intent,
        route: Option<&ToolRoute>,
        dispatch_owner: &str,
        claim_ttl_ms: i64,
    ) -> Result<(Fenced<InlineClaim>, Option<WalPosition>), LedgerError> {
        const CALL: &str = "operation_register_claim";
        check_text("dispatch_owner", dispatch_owner, MAX_OWNER_LEN)?;
        self.check_claim_ttl(claim_ttl_ms)?;
        let params = IntentParams::new(intent, route, self.bodies())?;
        let token_sha256 = super::token::bind_hash(claim.token.as_ref());
        let args = RegisterArgs {
            run_id: claim.run_id.as_uuid(),
            owner: &claim.owner,
            epoch: claim.epoch,
            token_sha256: token_sha256.as_deref(),
            intent: &params,
            dispatch_owner,
            claim_ttl_ms,
            tenant,
        };
        let batched = match &self.group {
            Some(group) => group.registers.verdict(args.queued()).await?,
            None => None,
        };
        let ClaimRow { row, wal } = match batched {
            Some(row) => row,
            None => args.alone(self).await?,
        };
        let expected = Expected::claim(claim);
        if let Some(rejection) = row.rejection(CALL, expected, Some(intent), self.bodies())? {
            return Ok((Fenced::Rejected(rejection), None));
        }
        let operation = row.record(CALL, self.bodies())?;
        Ok(match row.outcome(CALL)? {
            Outcome::Claimed => {
                let claim = operation
                    .claim()
                    .ok_or_else(|| protocol(CALL, "claimed without a claim"))?;
                (
                    Fenced::Applied(InlineClaim::Claimed { operation, claim }),
                    None,
                )
            }
            Outcome::Exists => (
                Fenced::Applied(InlineClaim::Existing(operation)),
                wal.position(CALL)?,
            ),
            other => return Err(other.unexpected(CALL)),
        })
    }

    /// The dispatcher's claim: up to `limit` prepared operations of live
    /// runs, skipping rows other claimers hold (`FOR UPDATE SKIP LOCKED`).
    pub async fn operation_claim(
        &self,
        dispatch_owner: &str,
        claim_ttl_ms: i64,
        limit: u16,
        tenants: Option<&[String]>,
    ) -> Result<Vec<ClaimedOperation>, LedgerError> {
        const CALL: &str = "operation_claim";
        check_text("dispatch_owner", dispatch_owner, MAX_OWNER_LEN)?;
        self.check_claim_ttl(claim_ttl_ms)?;
        let rows: Vec<TableRow> = self
            .invoke_all(CALL, true, || {
                sqlx::query_as("SELECT * FROM operation_claim($1, $2, $3, $4)")
                    .bind(dispatch_owner)
                    .bind(claim_ttl_ms)
                    .bind(i32::from(limit))
                    .bind(tenants)
            })
            .await?;
        rows.into_iter()
            .filter_map(|row| {
                let item = (|| {
                    let operation = row.record(CALL, self.bodies())?;
                    let claim = operation
                        .claim()
                        .ok_or_else(|| protocol(CALL, "claimed row without a claim"))?;
                    Ok(ClaimedOperation {
                        operation,
                        claim,
                        request_body: row.request(self.bodies())?,
                    })
                })();
                skip_unopenable(CALL, item)
            })
            .collect()
    }

    /// Records a verified response: `succeeded` (with the remote id and
    /// result) or `failed_final` (e.g. the tool answered `isError: true`).
    /// Only the live claim settles; anything else is kept as evidence.
    pub async fn operation_settle(
        &self,
        claim: &DispatchClaim,
        settlement: Settlement,
        remote_id: Option<&str>,
        result: &Value,
    ) -> Result<SettleOutcome, LedgerError> {
        self.operation_settle_acknowledged(claim, settlement, remote_id, result)
            .await
            .map(|(outcome, _)| outcome)
    }

    /// [`Ledger::operation_settle`], and where the WAL stood once the settle
    /// had committed (`CALL operation_settle_acknowledged`: the commit and
    /// the reading in one statement, one round trip): an upper bound of
    /// this acknowledgement for the durability gate. `None` on a server
    /// that reports no position (a standby).
    pub async fn operation_settle_acknowledged(
        &self,
        claim: &DispatchClaim,
        settlement: Settlement,
        remote_id: Option<&str>,
        result: &Value,
    ) -> Result<(SettleOutcome, Option<WalPosition>), LedgerError> {
        const CALL: &str = "operation_settle";
        let result = self.stored_result(result, claim.operation_id.as_str())?;
        let args = SettleArgs {
            operation_id: claim.operation_id.as_str(),
            dispatch_owner: claim.dispatch_owner.as_str(),
            expected_revision: claim.revision,
            request_digest: claim.request_digest.as_str(),
            status: settlement.as_str(),
            remote_id,
            result: &result,
        };
        let batched = match &self.group {
            Some(group) => group.settles.verdict(args.queued()).await?,
            None => None,
        };
        let answer: SettleRow = match batched {
            Some(row) => row,
            None => args.alone(self).await?,
        };
        let position = answer.wal.position(CALL)?;
        let row = answer.into_op_row();
        let outcome = match row.outcome(CALL)? {
            Outcome::Settled => {
                let mut record = row.record(CALL, self.bodies())?;
                // What was stored, as every read shows it (not sent back).
                record.result = Some(opened(
                    self.bodies(),
                    &Raw(result),
                    claim.operation_id.as_str(),
                )?);
                SettleOutcome::Settled(record)
            }
            outcome @ (Outcome::StaleClaim | Outcome::DigestMismatch) => {
                SettleOutcome::KeptAsEvidence {
                    reason: if outcome == Outcome::StaleClaim {
                        StaleReason::StaleClaim
                    } else {
                        StaleReason::DigestMismatch
                    },
                    found: row.record(CALL, self.bodies())?,
                    evidence_id: row.evidence_id(CALL)?,
                }
            }
            Outcome::NotFound => SettleOutcome::NotFound,
            other => return Err(other.unexpected(CALL)),
        };
        Ok((outcome, position))
    }

    /// `dispatching` → `unknown`, guarded by the claim's owner and revision;
    /// the evidence is kept with its cause as kind. A reconciler
    /// ([`UnknownBy::Reconciler`]) only marks an expired claim.
    pub async fn operation_mark_unknown(
        &self,
        mark: MarkUnknown<'_>,
    ) -> Result<MarkUnknownOutcome, LedgerError> {
        const CALL: &str = "operation_mark_unknown";
        check_text("actor", mark.actor, MAX_OWNER_LEN)?;
        let evidence = self.stored_evidence(mark.evidence, mark.claim.operation_id.as_str())?;
        let row: OpRow = self
            .invoke(CALL, true, || {
                sqlx::query_as("SELECT * FROM operation_mark_unknown($1, $2, $3, $4, $5, $6, $7)")
                    .bind(mark.claim.operation_id.as_str())
                    .bind(mark.claim.dispatch_owner.as_str())
                    .bind(mark.claim.revision)
                    .bind(mark.by == UnknownBy::ClaimHolder)
                    .bind(mark.actor)
                    .bind(mark.cause.as_str())
                    .bind(Json(&evidence))
            })
            .await?;
        Ok(match row.outcome(CALL)? {
            Outcome::MarkedUnknown => MarkUnknownOutcome::MarkedUnknown {
                operation: row.record(CALL, self.bodies())?,
                evidence_id: row.evidence_id(CALL)?,
            },
            Outcome::ClaimLive => {
                MarkUnknownOutcome::ClaimStillLive(row.record(CALL, self.bodies())?)
            }
            Outcome::StaleClaim => MarkUnknownOutcome::StaleClaim(row.record(CALL, self.bodies())?),
            Outcome::NotFound => MarkUnknownOutcome::NotFound,
            other => return Err(other.unexpected(CALL)),
        })
    }

    /// `dispatching` → `prepared` by the claim's holder, with proof that no
    /// byte of the request left (kept as `not_sent` evidence): the same
    /// operation id may be sent again — at once by the agent's re-call, by
    /// the outbox after a backoff.
    pub async fn operation_release_unsent(
        &self,
        claim: &DispatchClaim,
        evidence: &Value,
    ) -> Result<ReleaseUnsentOutcome, LedgerError> {
        const CALL: &str = "operation_release_unsent";
        let evidence = self.stored_evidence(evidence, claim.operation_id.as_str())?;
        let row: OpRow = self
            .invoke(CALL, true, || {
                sqlx::query_as("SELECT * FROM operation_release_unsent($1, $2, $3, $4)")
                    .bind(claim.operation_id.as_str())
                    .bind(claim.dispatch_owner.as_str())
                    .bind(claim.revision)
                    .bind(Json(&evidence))
            })
            .await?;
        Ok(match row.outcome(CALL)? {
            Outcome::Released => ReleaseUnsentOutcome::Released {
                operation: row.record(CALL, self.bodies())?,
                evidence_id: row.evidence_id(CALL)?,
            },
            Outcome::StaleClaim => {
                ReleaseUnsentOutcome::StaleClaim(row.record(CALL, self.bodies())?)
            }
            Outcome::NotFound => ReleaseUnsentOutcome::NotFound,
            other => return Err(other.unexpected(CALL)),
        })
    }

    /// `unknown` → `succeeded` / `failed_final` from verified evidence. An
    /// operator resolution ([`ConvergeEvidence::Operator`]) needs a `note`;
    /// both who and why are recorded. It runs `operation_resolve`, which
    /// only a ledger connected as [`super::OPERATOR_ROLE`] may execute: as
    /// the application role it is refused (`LedgerError::Database`,
    /// SQLSTATE 42501) and nothing is written.
    pub async fn operation_converge(
        &self,
        converge: Converge<'_>,
    ) -> Result<ConvergeOutcome, LedgerError> {
        const CALL: &str = "operation_converge";
        let Converge {
            operation_id,
            expected_revision,
            settlement,
            remote_id,
            result,
            kind,
            actor,
            note,
            evidence,
        } = converge;
        check_text("actor", actor, MAX_OWNER_LEN)?;
        if kind == ConvergeEvidence::Operator && note.is_none_or(|n| n.trim().is_empty()) {
            return Err(InvalidInput::Request("an operator resolution needs a note".into()).into());
        }
        let result = result
            .map(|r| self.stored_result(r, operation_id.as_str()))
            .transpose()?;
        let evidence = self.stored_evidence(evidence, operation_id.as_str())?;
        // An operator's resolution is its own function, which only the
        // operator role may execute (`OPERATOR_ROLE`; migrations/0007): the
        // application role's `operation_converge` refuses the kind.
        let row: OpRow = if kind == ConvergeEvidence::Operator {
            self.invoke("operation_resolve", true, || {
                sqlx::query_as("SELECT * FROM operation_resolve($1, $2, $3, $4, $5, $6, $7, $8)")
                    .bind(operation_id.as_str())
                    .bind(expected_revision)
                    .bind(settlement.as_str())
                    .bind(remote_id)
                    .bind(result.as_ref().map(Json))
                    .bind(actor)
                    .bind(note)
                    .bind(Json(&evidence))
            })
            .await?
        } else {
            self.invoke(CALL, true, || {
                sqlx::query_as(
                    "SELECT * FROM operation_converge($1, $2, $3, $4, $5, $6, $7, $8, $9)",
                )
                .bind(operation_id.as_str())
                .bind(expected_revision)
                .bind(settlement.as_str())
                .bind(remote_id)
                .bind(result.as_ref().map(Json))
                .bind(kind.as_str())
                .bind(actor)
                .bind(note)
                .bind(Json(&evidence))
            })
            .await?
        };
        Ok(match row.outcome(CALL)? {
            Outcome::Converged => ConvergeOutcome::Converged {
                operation: row.record(CALL, self.bodies())?,
                evidence_id: row.evidence_id(CALL)?,
            },
            Outcome::NotUnknown => ConvergeOutcome::NotUnknown(row.record(CALL, self.bodies())?),
            Outcome::Conflict => ConvergeOutcome::Conflict {
                expected_revision,
                found: row.record(CALL, self.bodies())?,
            },
            Outcome::NotFound => ConvergeOutcome::NotFound,
            other => return Err(other.unexpected(CALL)),
        })
    }

    /// Replaces a planned (still `prepared`) intent with `revised` — the same
    /// step with a higher effect_version. The old row is kept, `cancelled`,
    /// pointing at its successor.
    pub async fn operation_supersede(
        &self,
        claim: &LeaseClaim,
        old: &OperationId,
        revised: &Intent,
    ) -> Result<Fenced<SupersedeOutcome>, LedgerError> {
        const CALL: &str = "operation_supersede";
        if !self.keeps(revised) {
            return Err(self.unplannable(revised));
        }
        let params = IntentParams::new(revised, None, self.bodies())?;
        let row: OpRow = self
            .invoke(CALL, true, || {
                sqlx::query_as("SELECT * FROM operation_supersede($1, $2, $3, $4, $5, $6)")
                    .bind(claim.run_id.as_uuid())
                    .bind(claim.owner.as_str())
                    .bind(claim.epoch)
                    .bind(super::token::bind_hash(claim.token.as_ref()))
                    .bind(old.as_str())
                    .bind(&params)
            })
            .await?;
        let expected = Expected::claim(claim);
        if let Some(rejection) = row.rejection(CALL, expected, Some(revised), self.bodies())? {
            return Ok(Fenced::Rejected(rejection));
        }
        Ok(Fenced::Applied(match row.outcome(CALL)? {
            Outcome::Superseded => SupersedeOutcome::Superseded(row.record(CALL, self.bodies())?),
            Outcome::NotChangeable => {
                SupersedeOutcome::NotChangeable(row.record(CALL, self.bodies())?)
            }
            other => return Err(other.unexpected(CALL)),
        }))
    }

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

/// An intent of a queued group-commit item (owned: it outlives the caller's
/// borrow while it waits in the queue).
#[derive(Debug)]
pub(super) struct OwnedIntent {
    operation_id: String,
    step_id: String,
    effect_version: i32,
    tool_name: String,
    request_digest: String,
    request_body: Value,
    upstream: Option<String>,
    upstream_tool: Option<String>,
}

impl OwnedIntent {
    fn of(params: &IntentParams<'_>) -> Self {
        Self {
            operation_id: params.operation_id.to_owned(),
            step_id: params.step_id.to_owned(),
            effect_version: params.effect_version,
            tool_name: params.tool_name.to_owned(),
            request_digest: params.request_digest.to_owned(),
            request_body: params.request_body.0.clone().into_owned(),
            upstream: params.upstream.map(str::to_owned),
            upstream_tool: params.upstream_tool.map(str::to_owned),
        }
    }

    fn params(&self) -> IntentParams<'_> {
        IntentParams {
            operation_id: &self.operation_id,
            step_id: &self.step_id,
            effect_version: self.effect_version,
            tool_name: &self.tool_name,
            request_digest: &self.request_digest,
            request_body: Json(Cow::Borrowed(&self.request_body)),
            upstream: self.upstream.as_deref(),
            upstream_tool: self.upstream_tool.as_deref(),
        }
    }
}

/// The arguments of one `operation_register_claim`, borrowed: sent as a
/// statement of its own ([`RegisterArgs::alone`]: the single path, a batch
/// of one) or queued for a batch ([`RegisterArgs::queued`]).
struct RegisterArgs<'a, 'p> {
    run_id: Uuid,
    owner: &'a str,
    epoch: i64,
    token_sha256: Option<&'a [u8]>,
    intent: &'a IntentParams<'p>,
    dispatch_owner: &'a str,
    claim_ttl_ms: i64,
    tenant: Option<&'a str>,
}

impl RegisterArgs<'_, '_> {
    /// One `operation_register_claim` statement of its own.
    async fn alone(&self, ledger: &Ledger) -> Result<ClaimRow, LedgerError> {
        ledger
            .invoke("operation_register_claim", true, || {
                sqlx::query_as(
                    "SELECT * FROM operation_register_claim($1, $2, $3, $4, $5, $6, $7, $8)",
                )
                .bind(self.run_id)
                .bind(self.owner)
                .bind(self.epoch)
                .bind(self.token_sha256)
                .bind(self.intent)
                .bind(self.dispatch_owner)
                .bind(self.claim_ttl_ms)
                .bind(self.tenant)
            })
            .await
    }

    fn queued(&self) -> RegisterItem {
        RegisterItem {
            run_id: self.run_id,
            owner: self.owner.to_owned(),
            epoch: self.epoch,
            token_sha256: self.token_sha256.map(<[u8]>::to_vec),
            intent: OwnedIntent::of(self.intent),
            dispatch_owner: self.dispatch_owner.to_owned(),
            claim_ttl_ms: self.claim_ttl_ms,
            tenant: self.tenant.map(str::to_owned),
        }
    }
}

/// One queued `operation_register_claim` (the single call's arguments).
#[derive(Debug)]
pub(super) struct RegisterItem {
    run_id: Uuid,
    owner: String,
    epoch: i64,
    token_sha256: Option<Vec<u8>>,
    intent: OwnedIntent,
    dispatch_owner: String,
    claim_ttl_ms: i64,
    tenant: Option<String>,
}

impl RegisterItem {
    fn args<'a, 'p>(&'a self, intent: &'a IntentParams<'p>) -> RegisterArgs<'a, 'p> {
        RegisterArgs {
            run_id: self.run_id,
            owner: &self.owner,
            epoch: self.epoch,
            token_sha256: self.token_sha256.as_deref(),
            intent,
            dispatch_owner: &self.dispatch_owner,
            claim_ttl_ms: self.claim_ttl_ms,
            tenant: self.tenant.as_deref(),
        }
    }
}

/// A row of `operation_register_claim_batch`: the item it answers, and its
/// error (the item was rolled back) or the single function's columns.
#[derive(Debug, FromRow)]
struct BatchClaimRow {
    item: i32,
    error_sqlstate: Option<String>,
    #[sqlx(flatten)]
    claim: ClaimRow,
}

/// `operation_register_claim_batch` (`group.rs`).
#[derive(Debug)]
pub(super) struct RegisterBatch;

impl Flush for RegisterBatch {
    type Item = RegisterItem;
    type Answer = ClaimRow;
    const CALL: &'static str = "operation_register_claim_batch";

    async fn flush(
        ledger: &Ledger,
        items: &[RegisterItem],
    ) -> Result<Vec<ItemAnswer<ClaimRow>>, LedgerError> {
        if let [item] = items {
            // A batch of one is the single function's statement: the same
            // verdict, without the batch function's layers.
            let params = item.intent.params();
            let row = item.args(&params).alone(ledger).await?;
            return Ok(vec![ItemAnswer::Verdict(row)]);
        }
        let run_ids: Vec<Uuid> = items.iter().map(|i| i.run_id).collect();
        let owners: Vec<&str> = items.iter().map(|i| i.owner.as_str()).collect();
        let epochs: Vec<i64> = items.iter().map(|i| i.epoch).collect();
        let tokens: Vec<Option<&[u8]>> = items.iter().map(|i| i.token_sha256.as_deref()).collect();
        let intents: Vec<IntentParams<'_>> = items.iter().map(|i| i.intent.params()).collect();
        let dispatch_owners: Vec<&str> = items.iter().map(|i| i.dispatch_owner.as_str()).collect();
        let ttls: Vec<i64> = items.iter().map(|i| i.claim_ttl_ms).collect();
        let tenants: Vec<Option<&str>> = items.iter().map(|i| i.tenant.as_deref()).collect();
        let rows: Vec<BatchClaimRow> = ledger
            .invoke_all(Self::CALL, true, || {
                sqlx::query_as(
                    "SELECT * FROM operation_register_claim_batch($1, $2, $3, $4, $5, $6, $7, $8)",
                )
                .bind(&run_ids[..])
                .bind(&owners[..])
                .bind(&epochs[..])
                .bind(&tokens[..])
                .bind(&intents[..])
                .bind(&dispatch_owners[..])
                .bind(&ttls[..])
                .bind(&tenants[..])
            })
            .await?;
        in_item_order(
            Self::CALL,
            items.len(),
            rows.into_iter().map(|row| {
                let answer = match row.error_sqlstate {
                    Some(sqlstate) => {
                        tracing::debug!(sqlstate, "group commit item raised; sent alone");
                        ItemAnswer::Alone
                    }
                    None => ItemAnswer::Verdict(row.claim),
                };
                (row.item, answer)
            }),
        )
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

/// One queued settle (the single call's arguments, the result as stored).
#[derive(Debug)]
pub(super) struct SettleItem {
    operation_id: String,
    dispatch_owner: String,
    expected_revision: i64,
    request_digest: String,
    status: &'static str,
    remote_id: Option<String>,
    result: Value,
}

impl SettleItem {
    fn args(&self) -> SettleArgs<'_> {
        SettleArgs {
            operation_id: &self.operation_id,
            dispatch_owner: &self.dispatch_owner,
            expected_revision: self.expected_revision,
            request_digest: &self.request_digest,
            status: self.status,
            remote_id: self.remote_id.as_deref(),
            result: &self.result,
        }
    }
}

/// The arguments of one settle (the result as stored), borrowed: sent as
/// a statement of its own ([`SettleArgs::alone`]) or queued for a batch.
struct SettleArgs<'a> {
    operation_id: &'a str,
    dispatch_owner: &'a str,
    expected_revision: i64,
    request_digest: &'a str,
    status: &'static str,
    remote_id: Option<&'a str>,
    result: &'a Value,
}

impl SettleArgs<'_> {
    /// One `CALL operation_settle_acknowledged` of its own.
    async fn alone(&self, ledger: &Ledger) -> Result<SettleRow, LedgerError> {
        ledger
            .invoke("operation_settle", true, || {
                sqlx::query_as("CALL operation_settle_acknowledged($1, $2, $3, $4, $5, $6, $7)")
                    .bind(self.operation_id)
                    .bind(self.dispatch_owner)
                    .bind(self.expected_revision)
                    .bind(self.request_digest)
                    .bind(self.status)
                    .bind(self.remote_id)
                    .bind(Json(self.result))
            })
            .await
    }

    fn queued(&self) -> SettleItem {
        SettleItem {
            operation_id: self.operation_id.to_owned(),
            dispatch_owner: self.dispatch_owner.to_owned(),
            expected_revision: self.expected_revision,
            request_digest: self.request_digest.to_owned(),
            status: self.status,
            remote_id: self.remote_id.map(str::to_owned),
            result: self.result.clone(),
        }
    }
}

/// One element of `operation_settle_acknowledged_batch`'s verdicts.
#[derive(Debug, serde::Deserialize)]
struct SettleVerdict {
    item: i32,
    error_sqlstate: Option<String>,
    outcome: Option<String>,
    db_now: Option<DateTime<Utc>>,
    operation_id: Option<String>,
    run_id: Option<Uuid>,
    step_id: Option<String>,
    effect_version: Option<i32>,
    tool_name: Option<String>,
    request_digest: Option<String>,
    status: Option<String>,
    revision: Option<i64>,
    dispatch_owner: Option<String>,
    dispatch_until: Option<DateTime<Utc>>,
    dispatch_count: Option<i32>,
    remote_id: Option<String>,
    evidence_id: Option<i64>,
    upstream: Option<String>,
    upstream_tool: Option<String>,
}

#[derive(Debug, FromRow)]
struct SettleBatchRow {
    verdicts: Json<Vec<SettleVerdict>>,
    #[sqlx(flatten)]
    wal: WalColumns,
}

/// `CALL operation_settle_acknowledged_batch` (`group.rs`).
#[derive(Debug)]
pub(super) struct SettleBatch;

impl Flush for SettleBatch {
    type Item = SettleItem;
    type Answer = SettleRow;
    const CALL: &'static str = "operation_settle_batch";

    async fn flush(
        ledger: &Ledger,
        items: &[SettleItem],
    ) -> Result<Vec<ItemAnswer<SettleRow>>, LedgerError> {
        if let [item] = items {
            // A batch of one: the single procedure's statement.
            let row = item.args().alone(ledger).await?;
            return Ok(vec![ItemAnswer::Verdict(row)]);
        }
        let ids: Vec<&str> = items.iter().map(|i| i.operation_id.as_str()).collect();
        let owners: Vec<&str> = items.iter().map(|i| i.dispatch_owner.as_str()).collect();
        let revisions: Vec<i64> = items.iter().map(|i| i.expected_revision).collect();
        let digests: Vec<&str> = items.iter().map(|i| i.request_digest.as_str()).collect();
        let statuses: Vec<&str> = items.iter().map(|i| i.status).collect();
        let remote_ids: Vec<Option<&str>> = items.iter().map(|i| i.remote_id.as_deref()).collect();
        let results: Vec<Json<&Value>> = items.iter().map(|i| Json(&i.result)).collect();
        let answer: SettleBatchRow = ledger
            .invoke(Self::CALL, true, || {
                sqlx::query_as(
                    "CALL operation_settle_acknowledged_batch($1, $2, $3, $4, $5, $6, $7)",
                )
                .bind(&ids[..])
                .bind(&owners[..])
                .bind(&revisions[..])
                .bind(&digests[..])
                .bind(&statuses[..])
                .bind(&remote_ids[..])
                .bind(&results[..])
            })
            .await?;
        let wal = answer.wal;
        in_item_order(
            Self::CALL,
            items.len(),
            answer.verdicts.0.into_iter().map(|v| {
                let item = v.item;
                let answer = match (v.error_sqlstate, v.outcome) {
                    (None, Some(outcome)) => ItemAnswer::Verdict(SettleRow {
                        outcome,
                        db_now: v.db_now,
                        operation_id: v.operation_id,
                        run_id: v.run_id,
                        step_id: v.step_id,
                        effect_version: v.effect_version,
                        tool_name: v.tool_name,
                        request_digest: v.request_digest,
                        status: v.status,
                        revision: v.revision,
                        dispatch_owner: v.dispatch_owner,
                        dispatch_until: v.dispatch_until,
                        dispatch_count: v.dispatch_count,
                        remote_id: v.remote_id,
                        evidence_id: v.evidence_id,
                        upstream: v.upstream,
                        upstream_tool: v.upstream_tool,
                        wal: wal.clone(),
                    }),
                    (sqlstate, _) => {
                        tracing::debug!(?sqlstate, "group commit settle item raised; sent alone");
                        ItemAnswer::Alone
                    }
                };
                (item, answer)
            }),
        )
    }
}
