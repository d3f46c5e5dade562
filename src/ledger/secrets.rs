//! Key rotation of sealed bodies (`leasegate secrets rotate`): every
//! operation whose stored request or result, and every evidence row whose
//! body, holds a value sealed under another key than the policy's current
//! one is opened (with the old key, still configured) and sealed again
//! under the current key (`operation_reseal`, `evidence_reseal`: one
//! compare-and-swap per row in `sql/secrets.sql`, as `leasegate_operator`).
//!
//! # Invariants
//!
//! 1. A row is rewritten only from the exact value read: a row that changed
//!    meanwhile is counted and left for the next pass, never overwritten.
//! 2. Nothing is ever written in plaintext: a row that cannot be opened is
//!    reported (operation id and why) and left as it is.
//! 3. Evidence is append-only (DESIGN invariant 8) except for this: each
//!    sealed value in a body is opened and sealed again under the current
//!    key, in place, nothing else of the row changes (the table's trigger
//!    allows the body alone, only inside `evidence_reseal`). Rows that
//!    could not be re-sealed are reported and counted per key, so the
//!    operator knows which old keys must stay configured. Ledger events
//!    carry no bodies.
//!
//! Crash: each row is its own transaction; a rotation stopped midway leaves
//! some rows under the old key (still configured, still readable), and
//! running it again finishes them.

use serde_json::Value;
use sqlx::FromRow;
use sqlx::types::Json;

use super::operation_rows::opened;
use super::stored_json::Raw;
use super::{InvalidInput, Ledger, LedgerError};
use crate::policy::secrets::{SEALED_KEY, sealed_inner, sealed_key_ids};

/// What one rotation did.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct RotationReport {
    /// The key rows are sealed under now.
    pub key_id: String,
    /// Operations re-sealed under `key_id`.
    pub resealed: u64,
    /// Operations that changed while being re-sealed (run it again).
    pub changed_meanwhile: u64,
    /// Operations (or their evidence) that could not be opened:
    /// (operation id, why).
    pub failed: Vec<(String, String)>,
    /// Evidence rows re-sealed under `key_id`.
    pub evidence_resealed: u64,
    /// Evidence bodies still sealed under other keys (those that failed or
    /// changed meanwhile), per key id.
    pub evidence_under_other_keys: Vec<(String, i64)>,
}

#[derive(Debug, FromRow)]
struct EvidenceRow {
    evidence_id: i64,
    operation_id: String,
    body: Json<Value>,
}

/// `value` with every sealed envelope under another key than `current`
/// opened and sealed again under it (the same plaintext, the same
/// operation as context); `None` when nothing in it needed it.
fn resealed_in_place(
    value: &Value,
    current: &str,
    reseal: &dyn Fn(&Value) -> Result<Value, crate::policy::secrets::SecretsError>,
) -> Result<Option<Value>, crate::policy::secrets::SecretsError> {
    if let Some(inner) = sealed_inner(value) {
        return match inner.get("kid").and_then(Value::as_str) {
            Some(kid) if kid == current => Ok(None),
            _ => reseal(inner).map(Some),
        };
    }
    match value {
        Value::Object(map) => {
            let mut changed = false;
            let mut out = serde_json::Map::new();
            for (key, item) in map {
                match resealed_in_place(item, current, reseal)? {
                    Some(new) => {
                        changed = true;
                        out.insert(key.clone(), new);
                    }
                    None => {
                        out.insert(key.clone(), item.clone());
                    }
                }
            }
            Ok(changed.then_some(Value::Object(out)))
        }
        Value::Array(items) => {
            let mut changed = false;
            let mut out = Vec::with_capacity(items.len());
            for item in items {
                match resealed_in_place(item, current, reseal)? {
                    Some(new) => {
                        changed = true;
                        out.push(new);
                    }
                    None => out.push(item.clone()),
                }
            }
            Ok(changed.then_some(Value::Array(out)))
        }
        _ => Ok(None),
    }
}

#[derive(Debug, FromRow)]
struct SealedRow {
    operation_id: String,
    request_body: Raw,
    result: Option<Raw>,
}

/// The key id of a top-level sealed envelope.
fn top_key(value: &Value) -> Option<&str> {
    sealed_inner(value)?.get("kid")?.as_str()
}

impl Ledger {
    /// Re-seals, `batch` rows at a time, every operation body sealed under
    /// another key than the policy's current one (see the module docs).
    pub async fn secrets_rotate(&self, batch: u16) -> Result<RotationReport, LedgerError> {
        const CALL: &str = "secrets_rotate";
        let bodies = &self.options.bodies;
        let Some(keyring) = bodies.keyring.as_ref() else {
            return Err(InvalidInput::Request(
                "the policy configures no encryption_keys: nothing to rotate to".into(),
            )
            .into());
        };
        let Some(current) = keyring.current().map(str::to_owned) else {
            return Err(InvalidInput::Request(
                "the policy names no encryption_key_id to rotate to".into(),
            )
            .into());
        };
        let mut report = RotationReport {
            key_id: current.clone(),
            ..RotationReport::default()
        };
        let mut after = String::new();
        loop {
            let rows: Vec<SealedRow> = self
                .invoke_all(CALL, false, || {
                    sqlx::query_as(
                        "SELECT operation_id, request_body, result FROM tool_operations
                          WHERE operation_id > $1
                            AND ((request_body ? $2 AND request_body -> $2 ->> 'kid' IS DISTINCT FROM $3)
                              OR (result ? $2 AND result -> $2 ->> 'kid' IS DISTINCT FROM $3))
                          ORDER BY operation_id LIMIT $4",
                    )
                    .bind(after.as_str())
                    .bind(SEALED_KEY)
                    .bind(current.as_str())
                    .bind(i64::from(batch.max(1)))
                })
                .await?;
            let Some(last) = rows.last() else {
                break;
            };
            after = last.operation_id.clone();
            for row in rows {
                let reseal = |raw: &Raw| -> Result<Value, LedgerError> {
                    if top_key(&raw.0).is_none_or(|kid| kid == current) {
                        return Ok(raw.0.clone());
                    }
                    let plain = opened(bodies, raw, &row.operation_id)?;
                    keyring
                        .seal(&plain, &row.operation_id)
                        .map_err(|source| LedgerError::Sealed {
                            operation_id: row.operation_id.clone(),
                            source,
                            after_call: false,
                        })
                };
                let resealed = reseal(&row.request_body).and_then(|request| {
                    let result = row.result.as_ref().map(reseal).transpose()?;
                    Ok((request, result))
                });
                let (request, result) = match resealed {
                    Ok(pair) => pair,
                    Err(error) => {
                        report
                            .failed
                            .push((row.operation_id.clone(), error.to_string()));
                        continue;
                    }
                };
                let (outcome,): (String,) = self
                    .invoke(CALL, true, || {
                        sqlx::query_as("SELECT operation_reseal($1, $2, $3, $4, $5)")
                            .bind(row.operation_id.as_str())
                            .bind(Json(&row.request_body.0))
                            .bind(Json(&request))
                            .bind(row.result.as_ref().map(|r| Json(&r.0)))
                            .bind(result.as_ref().map(Json))
                    })
                    .await?;
                match outcome.as_str() {
                    "resealed" => report.resealed += 1,
                    _ => report.changed_meanwhile += 1,
                }
            }
        }
        // Evidence: each sealed value re-sealed in place (module docs, 3).
        let mut after_id = 0_i64;
        loop {
            let rows: Vec<EvidenceRow> = self
                .invoke_all(CALL, false, || {
                    sqlx::query_as(
                        "SELECT evidence_id, operation_id, body FROM operation_evidence
                          WHERE evidence_id > $1 AND body::text LIKE '%' || $2 || '%'
                          ORDER BY evidence_id LIMIT $3",
                    )
                    .bind(after_id)
                    .bind(SEALED_KEY)
                    .bind(i64::from(batch.max(1)))
                })
                .await?;
            let Some(last) = rows.last() else {
                break;
            };
            after_id = last.evidence_id;
            for row in rows {
                let context = row.operation_id.as_str();
                let reseal = |inner: &Value| {
                    let plain = keyring.open(inner, context)?;
                    keyring.seal(&plain, context)
                };
                let body = match resealed_in_place(&row.body.0, &current, &reseal) {
                    Ok(Some(body)) => body,
                    Ok(None) => continue,
                    Err(error) => {
                        report.failed.push((
                            row.operation_id.clone(),
                            format!("evidence {}: {error}", row.evidence_id),
                        ));
                        continue;
                    }
                };
                let (outcome,): (String,) = self
                    .invoke(CALL, true, || {
                        sqlx::query_as("SELECT evidence_reseal($1, $2, $3)")
                            .bind(row.evidence_id)
                            .bind(&row.body)
                            .bind(Json(&body))
                    })
                    .await?;
                match outcome.as_str() {
                    "resealed" => report.evidence_resealed += 1,
                    _ => report.changed_meanwhile += 1,
                }
            }
        }
        // What stays under other keys (failed or changed meanwhile).
        let bodies: Vec<(Json<Value>,)> = self
            .invoke_all(CALL, false, || {
                sqlx::query_as(
                    "SELECT body FROM operation_evidence WHERE body::text LIKE '%' || $1 || '%'",
                )
                .bind(SEALED_KEY)
            })
            .await?;
        let mut counts = std::collections::BTreeMap::<String, i64>::new();
        for (Json(body),) in bodies {
            let mut ids = Vec::new();
            sealed_key_ids(&body, &mut ids);
            ids.sort();
            ids.dedup();
            for id in ids.into_iter().filter(|id| *id != current) {
                *counts.entry(id).or_default() += 1;
            }
        }
        report.evidence_under_other_keys = counts.into_iter().collect();
        Ok(report)
    }
}
