//! Intent identity: what makes two tool calls "the same side effect".
//!
//! - `request_digest` = hex SHA-256 of the RFC 8785 canonical JSON of
//!   `{"tool": <name>, "arguments": <arguments>}`. Key order, whitespace and
//!   equal number spellings (`1.0` vs `1`) do not change it; any change of
//!   the tool or a value does. Transport noise never enters it: the JSON-RPC
//!   id, `_meta` (progress token, trace context, leasegate's own keys) and the
//!   operation id leasegate injects live outside `arguments`, and the digest
//!   is taken before anything is injected.
//! - `operation_id` = a deterministic function of (tenant, run_id, step_id,
//!   effect_version) only — never owner, epoch, attempt or time (invariant 3,
//!   docs/architecture.md). It is a UUID (version 8, from SHA-256), 36 characters of
//!   `[0-9a-f-]`, so every third-party idempotency key field accepts it
//!   (Stripe: up to 255 characters; many APIs: a UUID). Its first 12 hex
//!   digits come from (tenant, run_id) alone, so a run's operations are
//!   neighbours in the ledger's indexes ([`operation_id`]).
//!
//! # Declared identity
//!
//! A tool's adapter may name the fields that make two calls the same effect
//! (`identity`, JSON pointers into the arguments). A derived step then
//! hashes only those fields ([`identity_step_id`], step
//! `auto:<tool>:identity:<digest>`), so a model that re-plans a call with a
//! reworded free-text field or an added optional one lands on the same
//! step; the full request digest is still what the ledger records and
//! compares, so the difference is seen, never silently sent.
//!
//! # Integers beyond 2^53
//!
//! RFC 8785 prints numbers as IEEE doubles, so `9007199254740993` and
//! `9007199254740992` canonicalize to the same bytes. Two different requests
//! would share a digest. [`IntegerPolicy::Reject`] (the default) refuses
//! integers with a magnitude above 2^53; [`IntegerPolicy::AsDouble`] accepts
//! RFC 8785's double semantics knowingly. Non-integer spellings are judged as
//! doubles by the JSON parser already (`1e400` does not parse).

mod canonical;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::ids::RunId;

pub use canonical::{IntegerPolicy, MAX_SAFE_INTEGER, canonical_bytes};

/// Longest accepted step id, tool name and tenant.
pub use crate::ids::MAX_STEP_ID_LEN;
pub const MAX_TOOL_NAME_LEN: usize = 256;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IntentError {
    #[error(
        "integer {value} at {path} is beyond ±2^53: RFC 8785 would give it the digest of a \
         different number; send it as a string"
    )]
    UnsafeInteger { path: String, value: String },
    #[error("arguments cannot be canonicalized: {0}")]
    Canonicalize(String),
    #[error("{field} must be 1 to {max} characters, got {len}")]
    TextLength {
        field: &'static str,
        len: usize,
        max: usize,
    },
    #[error("effect_version must be >= 1, got {0}")]
    EffectVersion(i64),
}

impl IntentError {
    pub fn code(&self) -> &'static str {
        match self {
            IntentError::UnsafeInteger { .. } => "unsafe_integer",
            IntentError::Canonicalize(_) => "invalid_arguments",
            IntentError::TextLength { .. } | IntentError::EffectVersion(_) => "invalid_input",
        }
    }
}

/// Hex SHA-256 of the canonical request: 64 lowercase hex characters.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct RequestDigest(String);

impl RequestDigest {
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Wraps a digest read back from the ledger.
    pub fn from_hex(hex: String) -> Self {
        Self(hex)
    }
}

impl std::fmt::Display for RequestDigest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The stable identity of one side-effect intent.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct OperationId(String);

impl OperationId {
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Wraps an id read back from the ledger or given by an operator.
    pub fn from_string(id: String) -> Self {
        Self(id)
    }
}

impl std::fmt::Display for OperationId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The digest of a `tools/call`: tool name and arguments only.
pub fn request_digest(
    tool: &str,
    arguments: &Value,
    policy: IntegerPolicy,
) -> Result<RequestDigest, IntentError> {
    check_text("tool_name", tool, MAX_TOOL_NAME_LEN)?;
    // Checked on the arguments themselves, so that paths in errors read as
    // the caller wrote them.
    canonical::check_policy(arguments, policy)?;
    digest_of(&json!({ "tool": tool, "arguments": arguments }))
}

/// Hex SHA-256 of `value`'s canonical bytes, its integers already checked
/// against the caller's policy.
fn digest_of(value: &Value) -> Result<RequestDigest, IntentError> {
    let bytes = canonical_bytes(value, IntegerPolicy::AsDouble)?;
    Ok(RequestDigest(hex::encode(Sha256::digest(&bytes))))
}

/// The digest of a `tools/call` from its JSON-RPC `params`
/// (`{"name", "arguments", "_meta"}`): `_meta` never enters it.
pub fn request_digest_of_params(
    params: &Value,
    policy: IntegerPolicy,
) -> Result<RequestDigest, IntentError> {
    let tool = params.get("name").and_then(Value::as_str).unwrap_or("");
    let arguments = params.get("arguments").cloned().unwrap_or(Value::Null);
    request_digest(tool, &arguments, policy)
}

/// The operation id of (tenant, run, step, effect_version), and nothing else.
///
/// A UUID (version 8) of two SHA-256 digests, each over domain-separated
/// canonical JSON (so no two tuples share an input):
///
/// - bytes 0..6: the run's prefix, from (tenant, run) alone. Every operation
///   of a run shares its first 12 hex digits, so the run's rows sit together
///   in every B-tree keyed by the id (`tool_operations`' primary key,
///   `ledger_events_operation_idx`): a live run's inserts touch a few hot
///   pages, not a random page of an index of millions.
/// - bytes 6..16 (less the version and variant bits: 74 bits): the whole
///   tuple.
///
/// Ledgers written before this shape (`leasegate/operation/v1`: all 16
/// bytes from the tuple) keep their stored ids: the ledger looks an intent
/// up by (run, step, effect_version) as well as by id, and answers with the
/// id it stored (`operation_register_claim`).
pub fn operation_id(
    tenant_id: &str,
    run_id: RunId,
    step_id: &str,
    effect_version: i32,
) -> OperationId {
    let run = run_id.to_string();
    let run_input = json!(["leasegate/operation-run/v2", tenant_id, run]);
    let tuple_input = json!([
        "leasegate/operation/v2",
        tenant_id,
        run,
        step_id,
        effect_version
    ]);
    let digest = |input: &Value| {
        Sha256::digest(
            canonical_bytes(input, IntegerPolicy::Reject)
                .expect("strings and a small integer always canonicalize"),
        )
    };
    let (run_hash, tuple_hash) = (digest(&run_input), digest(&tuple_input));
    let mut bytes = [0u8; 16];
    bytes[..RUN_PREFIX_BYTES].copy_from_slice(&run_hash[..RUN_PREFIX_BYTES]);
    bytes[RUN_PREFIX_BYTES..].copy_from_slice(&tuple_hash[..16 - RUN_PREFIX_BYTES]);
    OperationId(uuid::Uuid::new_v8(bytes).to_string())
}

/// How many leading bytes of an operation id come from its run alone.
pub const RUN_PREFIX_BYTES: usize = 6;

/// The step id used when the caller names none: the same call (tool and
/// digest) in the same run is the same intent. A caller that calls the same
/// tool with the same arguments twice *on purpose* must name its steps.
pub fn default_step_id(tool: &str, digest: &RequestDigest) -> String {
    format!("auto:{tool}:{digest}")
}

/// The step id derived from a declared identity: the same tool and the same
/// values at the identity's pointers (an absent field counts as absent, not
/// as `null`) in the same run are the same intent, whatever else differs.
pub fn identity_step_id(
    tool: &str,
    arguments: &Value,
    pointers: &[String],
    policy: IntegerPolicy,
) -> Result<String, IntentError> {
    Ok(format!(
        "auto:{tool}:identity:{}",
        identity_digest(tool, arguments, pointers, policy)?
    ))
}

/// Hex SHA-256 of the canonical `{"tool", "identity": {pointer: value}}`,
/// absent fields left out.
fn identity_digest(
    tool: &str,
    arguments: &Value,
    pointers: &[String],
    policy: IntegerPolicy,
) -> Result<RequestDigest, IntentError> {
    check_text("tool_name", tool, MAX_TOOL_NAME_LEN)?;
    let fields: serde_json::Map<String, Value> = pointers
        .iter()
        .filter_map(|pointer| {
            arguments
                .pointer(pointer)
                .map(|value| (pointer.clone(), value.clone()))
        })
        .collect();
    let fields = Value::Object(fields);
    canonical::check_policy(&fields, policy)?;
    digest_of(&json!({ "tool": tool, "identity": fields }))
}

/// The top-level argument fields (as JSON pointers) in which two requests
/// differ, in order: what a rephrased call is told it changed.
pub fn differing_fields(recorded: &Value, sent: &Value) -> Vec<String> {
    let empty = serde_json::Map::new();
    let (recorded, sent) = (
        recorded.as_object().unwrap_or(&empty),
        sent.as_object().unwrap_or(&empty),
    );
    let mut keys: Vec<&String> = recorded.keys().chain(sent.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .filter(|key| {
            match (recorded.get(*key), sent.get(*key)) {
                (Some(a), Some(b)) => {
                    // Equal numbers spelt differently are equal (RFC 8785).
                    canonical_bytes(a, IntegerPolicy::AsDouble).ok()
                        != canonical_bytes(b, IntegerPolicy::AsDouble).ok()
                }
                _ => true,
            }
        })
        .map(|key| format!("/{}", key.replace('~', "~0").replace('/', "~1")))
        .collect()
}

/// Where a call sits in the run's plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepRef {
    pub step_id: String,
    pub effect_version: i32,
}

/// One side-effect intent, ready for the ledger.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Intent {
    pub operation_id: OperationId,
    pub step_id: String,
    pub effect_version: i32,
    pub tool_name: String,
    pub request_digest: RequestDigest,
    /// What the ledger stores of the request (the arguments, or less, per
    /// the data policy of the caller).
    pub request_body: Value,
}

impl Intent {
    /// Builds the intent of calling `tool` with `arguments` as step `step`
    /// (or the default step) of `run_id`. The request body stored is the
    /// arguments as given.
    pub fn new(
        tenant_id: &str,
        run_id: RunId,
        step: Option<StepRef>,
        tool: &str,
        arguments: &Value,
        policy: IntegerPolicy,
    ) -> Result<Self, IntentError> {
        let mut intent = Self::identify(tenant_id, run_id, step, tool, arguments, policy)?;
        intent.request_body = arguments.clone();
        Ok(intent)
    }

    /// [`Intent::new`] without a request body (`null`): for callers that
    /// store something else (a data policy's view of the arguments).
    pub fn identify(
        tenant_id: &str,
        run_id: RunId,
        step: Option<StepRef>,
        tool: &str,
        arguments: &Value,
        policy: IntegerPolicy,
    ) -> Result<Self, IntentError> {
        Self::identify_by(tenant_id, run_id, step, tool, arguments, policy, None)
    }

    /// [`Intent::identify`] with the tool's declared identity: without a
    /// step, the step is derived from those fields alone
    /// ([`identity_step_id`]); the request digest is always the whole
    /// request's.
    pub fn identify_by(
        tenant_id: &str,
        run_id: RunId,
        step: Option<StepRef>,
        tool: &str,
        arguments: &Value,
        policy: IntegerPolicy,
        identity: Option<&[String]>,
    ) -> Result<Self, IntentError> {
        let digest = request_digest(tool, arguments, policy)?;
        let step = match (step, identity) {
            (Some(step), _) => step,
            (None, Some(pointers)) => StepRef {
                step_id: identity_step_id(tool, arguments, pointers, policy)?,
                effect_version: 1,
            },
            (None, None) => StepRef {
                step_id: default_step_id(tool, &digest),
                effect_version: 1,
            },
        };
        check_text("step_id", &step.step_id, MAX_STEP_ID_LEN)?;
        if step.effect_version < 1 {
            return Err(IntentError::EffectVersion(step.effect_version.into()));
        }
        Ok(Self {
            operation_id: operation_id(tenant_id, run_id, &step.step_id, step.effect_version),
            step_id: step.step_id,
            effect_version: step.effect_version,
            tool_name: tool.to_owned(),
            request_digest: digest,
            request_body: Value::Null,
        })
    }

    /// The same step with a changed plan: effect_version + 1, new id.
    pub fn revise(
        &self,
        tenant_id: &str,
        run_id: RunId,
        tool: &str,
        arguments: &Value,
        policy: IntegerPolicy,
    ) -> Result<Self, IntentError> {
        Self::new(
            tenant_id,
            run_id,
            Some(StepRef {
                step_id: self.step_id.clone(),
                effect_version: self.effect_version + 1,
            }),
            tool,
            arguments,
            policy,
        )
    }
}

fn check_text(field: &'static str, value: &str, max: usize) -> Result<(), IntentError> {
    let len = value.chars().count();
    if len == 0 || len > max {
        return Err(IntentError::TextLength { field, len, max });
    }
    Ok(())
}
