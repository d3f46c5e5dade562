//! How the operation functions' answers are read and their arguments
//! written: the `operation_result` composite and its narrower forms (the
//! register-claim and settle answers, a table row, an evidence row), their
//! decoding into the public records and verdicts, and the `intent_params`
//! composite an intent is sent as. Shared by the single statements
//! (`operation.rs`, `reconcile.rs`, `read.rs`) and the batch encoders
//! (`group/`), so a verdict reads the same whichever path carried it.

use std::borrow::Cow;

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::postgres::types::PgRecordEncoder;
use sqlx::postgres::{PgArgumentBuffer, PgHasArrayType, PgTypeInfo};
use sqlx::types::Json;
use sqlx::{FromRow, Postgres};
use uuid::Uuid;

use super::durability::WalColumns;
use super::error::protocol;
use super::operation_types::route_of;
use super::stored_json::{self, Raw};
use super::verdict::{Expected, Found, Outcome, fence_rejection, rejected};
use super::{LedgerError, OperationRecord, OperationStatus, Rejection, RunId, ToolRoute};
use crate::intent::{Intent, OperationId, RequestDigest};
use crate::policy::Bodies;

/// The `operation_result` composite.
#[derive(Debug, FromRow)]
pub(super) struct OpRow {
    pub(super) outcome: String,
    pub(super) run_status: Option<String>,
    pub(super) run_revision: Option<i64>,
    pub(super) lease_owner: Option<String>,
    pub(super) lease_epoch: Option<i64>,
    pub(super) lease_expires_at: Option<DateTime<Utc>>,
    pub(super) db_now: DateTime<Utc>,
    pub(super) operation_id: Option<String>,
    pub(super) run_id: Option<Uuid>,
    pub(super) step_id: Option<String>,
    pub(super) effect_version: Option<i32>,
    pub(super) tool_name: Option<String>,
    pub(super) request_digest: Option<String>,
    pub(super) status: Option<String>,
    pub(super) revision: Option<i64>,
    pub(super) dispatch_owner: Option<String>,
    pub(super) dispatch_until: Option<DateTime<Utc>>,
    pub(super) dispatch_count: Option<i32>,
    pub(super) remote_id: Option<String>,
    pub(super) result: Option<Raw>,
    pub(super) evidence_id: Option<i64>,
    pub(super) upstream: Option<String>,
    pub(super) upstream_tool: Option<String>,
}

/// What `operation_register_claim` answers: the `operation_result` columns
/// and, on a replay, where the WAL stood.
#[derive(Debug, FromRow)]
pub(super) struct ClaimRow {
    #[sqlx(flatten)]
    pub(super) row: OpRow,
    #[sqlx(flatten)]
    pub(super) wal: WalColumns,
}

/// What `CALL operation_settle_acknowledged` answers: the operation's
/// columns of `operation_result` (no run, lease or result) and where the
/// WAL stood after the commit.
#[derive(Debug, FromRow)]
pub(super) struct SettleRow {
    pub(super) outcome: String,
    pub(super) db_now: Option<DateTime<Utc>>,
    pub(super) operation_id: Option<String>,
    pub(super) run_id: Option<Uuid>,
    pub(super) step_id: Option<String>,
    pub(super) effect_version: Option<i32>,
    pub(super) tool_name: Option<String>,
    pub(super) request_digest: Option<String>,
    pub(super) status: Option<String>,
    pub(super) revision: Option<i64>,
    pub(super) dispatch_owner: Option<String>,
    pub(super) dispatch_until: Option<DateTime<Utc>>,
    pub(super) dispatch_count: Option<i32>,
    pub(super) remote_id: Option<String>,
    pub(super) evidence_id: Option<i64>,
    pub(super) upstream: Option<String>,
    pub(super) upstream_tool: Option<String>,
    #[sqlx(flatten)]
    pub(super) wal: WalColumns,
}

impl SettleRow {
    pub(super) fn into_op_row(self) -> OpRow {
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
    /// The last claim's facts (migration 0017); absent from the rows of
    /// statements that name their columns.
    #[sqlx(default)]
    pub(super) claimed_at: Option<DateTime<Utc>>,
    #[sqlx(default)]
    pub(super) claim_epoch: Option<i64>,
    #[sqlx(default)]
    pub(super) claim_worker: Option<String>,
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

pub(super) fn operation_status(
    call: &'static str,
    value: &str,
) -> Result<OperationStatus, LedgerError> {
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
pub(super) fn skip_unopenable<T>(
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
pub(super) fn plain(value: &Value) -> Value {
    stored_json::encode(value).into_owned()
}

pub(super) fn sealing(
    operation_id: &str,
    source: crate::policy::secrets::SecretsError,
) -> LedgerError {
    LedgerError::Sealed {
        operation_id: operation_id.to_owned(),
        source,
        after_call: false,
    }
}

impl OpRow {
    /// The operation this row reports, if it names one.
    pub(super) fn record(
        &self,
        call: &'static str,
        bodies: &Bodies,
    ) -> Result<OperationRecord, LedgerError> {
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

    pub(super) fn evidence_id(&self, call: &'static str) -> Result<i64, LedgerError> {
        self.evidence_id
            .ok_or_else(|| protocol(call, "evidence_id missing from the answer"))
    }

    pub(super) fn outcome(&self, call: &'static str) -> Result<Outcome, LedgerError> {
        Outcome::parse(call, &self.outcome)
    }

    pub(super) fn found(&self) -> Found<'_> {
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
    pub(super) fn rejection(
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
pub(super) struct IntentParams<'a> {
    pub(super) operation_id: &'a str,
    pub(super) step_id: &'a str,
    pub(super) effect_version: i32,
    pub(super) tool_name: &'a str,
    pub(super) request_digest: &'a str,
    pub(super) request_body: Json<Cow<'a, Value>>,
    pub(super) upstream: Option<&'a str>,
    pub(super) upstream_tool: Option<&'a str>,
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
    pub(super) fn new(
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
