//! Policies (`policies/*.toml`): timing, step identity, request size, what
//! the ledger stores of requests, results and evidence and under which keys
//! ([`secrets`]: masked, digest only, encrypted), and the durability
//! contract ([`Durability`]; enforced by `crate::durability`).
//!
//! Files parse with `deny_unknown_fields` into [`RawPolicy`], then
//! [`RawPolicy::validate`] turns them into a [`Policy`] with every value
//! checked; an error names the field. Durations are strings (`"30s"`,
//! `"1m 30s"`).

pub mod secrets;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use crate::intent::IntegerPolicy;
pub use secrets::{Bodies, KeySource, Keyring, RequestBodyPolicy, ResultBodyPolicy};

/// A policy file as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPolicy {
    /// Largest lease TTL a worker may ask for.
    pub lease_ttl_ceiling: Option<String>,
    /// Heartbeat interval recommended to workers (reported, not enforced).
    pub heartbeat_interval: Option<String>,
    /// How long a dispatch claim lasts; must exceed every tool timeout.
    pub claim_ttl: Option<String>,
    /// How long a call waits for the same intent in flight elsewhere.
    pub in_flight_wait: Option<String>,
    /// How long an outcome its agent never received is shown before a
    /// different call to the same tool is sent (adapter `after_undelivered`).
    pub undelivered_hold: Option<String>,
    /// Whether a replayed answer also says so in its content (default true).
    pub outcome_in_content: Option<bool>,
    /// "derived" (default: step id from tool + digest) or "explicit".
    pub step_identity: Option<String>,
    /// "full" (default), "masked" (with `masked_fields`), "digest_only" or
    /// "encrypted" (with `encryption_key_id`).
    pub request_body: Option<String>,
    pub masked_fields: Option<Vec<String>>,
    /// "full" (default), "masked" (with `result_masked_fields`) or
    /// "encrypted": what the ledger keeps of results and evidence.
    pub result_body: Option<String>,
    pub result_masked_fields: Option<Vec<String>>,
    /// The key new bodies are sealed under (one of `encryption_keys`).
    pub encryption_key_id: Option<String>,
    /// Key id → `"file:<path>"` or `"env:<VARIABLE>"`: the current key and
    /// the old ones rows may still be sealed under.
    pub encryption_keys: Option<BTreeMap<String, String>>,
    /// Largest accepted `arguments`, in bytes of JSON.
    pub max_arguments_bytes: Option<usize>,
    /// "reject" (default) or "as_double": integers beyond ±2^53.
    pub integers: Option<String>,
    /// Run the dispatcher, claim-expiry and reconciler loops (default true).
    pub background: Option<bool>,
    /// How often the dispatcher looks for planned (prepared) intents.
    pub dispatch_interval: Option<String>,
    /// How often claims that lapsed are turned unknown.
    pub claim_expiry_interval: Option<String>,
    /// How often unknown operations are looked at.
    pub reconcile_interval: Option<String>,
    /// How long one reconciler holds an unknown operation.
    pub reconcile_claim_ttl: Option<String>,
    /// Same-key retries per operation (idempotency_key tools).
    pub reconcile_retries: Option<i32>,
    /// "local" (default) or "sync_replica": what an acknowledged write
    /// survives (see [`Durability`]).
    pub durability: Option<String>,
}

/// What an acknowledged ledger write survives: the contract leasegate
/// claims, checks at startup and every few seconds, and never silently
/// weakens (`docs/operating.md`, durability).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// The primary's own commit (`synchronous_commit` as the server says).
    /// A crash of the primary loses nothing acknowledged; promoting an
    /// asynchronous standby may lose acknowledged writes: leasegate detects
    /// such a failover, records it and holds dispatch until an operator
    /// resolves it.
    #[default]
    Local,
    /// Every acknowledged write is also flushed on a synchronous standby:
    /// leasegate refuses to start unless `synchronous_standby_names` is set,
    /// a synchronous standby streams and commits wait for it
    /// (`synchronous_commit` at least `on`, forced on every session), and
    /// holds dispatch while that stops being true.
    SyncReplica,
}

impl Durability {
    pub fn as_str(self) -> &'static str {
        match self {
            Durability::Local => "local",
            Durability::SyncReplica => "sync_replica",
        }
    }
}

/// How a call's step identity is found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepIdentity {
    /// `_meta` `dev.leasegate/step` when given, else `auto:<tool>:<digest>`.
    Derived,
    /// `_meta` `dev.leasegate/step` is required on side-effecting calls.
    Explicit,
}

/// Default `max_arguments_bytes`: the MCP HTTP front's request body limit.
pub const DEFAULT_MAX_ARGUMENTS_BYTES: usize = 4 * 1024 * 1024;

/// A validated policy.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    pub lease_ttl_ceiling: Duration,
    pub heartbeat_interval: Duration,
    pub claim_ttl: Duration,
    pub in_flight_wait: Duration,
    /// See [`RawPolicy::undelivered_hold`].
    pub undelivered_hold: Duration,
    /// A replayed answer carries a line saying so in its content, beside
    /// `_meta`, and the same sentence in a free-form object structured
    /// content (`mcp::convert::OutcomeShown`): clients that drop `_meta`, or
    /// show the model the structured content alone, still tell it the truth.
    pub outcome_in_content: bool,
    pub step_identity: StepIdentity,
    pub request_body: RequestBodyPolicy,
    pub result_body: ResultBodyPolicy,
    pub encryption_key_id: Option<String>,
    pub encryption_keys: BTreeMap<String, KeySource>,
    /// The keys read from `encryption_keys` ([`Policy::load_keys`]; `None`
    /// until then).
    pub keyring: Option<Keyring>,
    pub max_arguments_bytes: usize,
    pub integers: IntegerPolicy,
    pub background: bool,
    pub dispatch_interval: Duration,
    pub claim_expiry_interval: Duration,
    pub reconcile_interval: Duration,
    pub reconcile_claim_ttl: Duration,
    pub reconcile_retries: i32,
    pub durability: Durability,
}

impl Default for Policy {
    fn default() -> Self {
        RawPolicy::default()
            .validate()
            .expect("the defaults are valid")
    }
}

/// A field with a bad value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct FieldError {
    pub field: String,
    pub message: String,
}

impl FieldError {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }
}

/// Parses `"30s"`-style durations, naming the field on error.
pub fn parse_duration(field: &str, text: &str) -> Result<Duration, FieldError> {
    let duration = humantime::parse_duration(text).map_err(|e| {
        FieldError::new(
            field,
            format!("{text:?} is not a duration like \"30s\": {e}"),
        )
    })?;
    if duration.is_zero() {
        return Err(FieldError::new(field, "must be longer than 0"));
    }
    Ok(duration)
}

impl RawPolicy {
    pub fn validate(&self) -> Result<Policy, FieldError> {
        let duration = |field: &str, value: &Option<String>, default: &str| {
            parse_duration(field, value.as_deref().unwrap_or(default))
        };
        let lease_ttl_ceiling = duration("lease_ttl_ceiling", &self.lease_ttl_ceiling, "10m")?;
        let heartbeat_interval = duration("heartbeat_interval", &self.heartbeat_interval, "5s")?;
        let claim_ttl = duration("claim_ttl", &self.claim_ttl, "2m")?;
        let in_flight_wait = duration("in_flight_wait", &self.in_flight_wait, "1s")?;
        let undelivered_hold = duration("undelivered_hold", &self.undelivered_hold, "10m")?;
        if heartbeat_interval >= lease_ttl_ceiling {
            return Err(FieldError::new(
                "heartbeat_interval",
                format!("must be below lease_ttl_ceiling ({lease_ttl_ceiling:?})"),
            ));
        }
        let step_identity = match self.step_identity.as_deref().unwrap_or("derived") {
            "derived" => StepIdentity::Derived,
            "explicit" => StepIdentity::Explicit,
            other => {
                return Err(FieldError::new(
                    "step_identity",
                    format!("{other:?} is not one of \"derived\", \"explicit\""),
                ));
            }
        };
        let request_body = match (
            self.request_body.as_deref().unwrap_or("full"),
            &self.masked_fields,
        ) {
            ("full", None) => RequestBodyPolicy::Full,
            ("digest_only", None) => RequestBodyPolicy::DigestOnly,
            ("encrypted", None) => RequestBodyPolicy::Encrypted,
            ("masked", Some(fields)) if !fields.is_empty() => {
                RequestBodyPolicy::Masked(fields.clone())
            }
            ("masked", _) => {
                return Err(FieldError::new(
                    "masked_fields",
                    "\"masked\" needs a non-empty list of field names",
                ));
            }
            ("full" | "digest_only" | "encrypted", Some(_)) => {
                return Err(FieldError::new(
                    "masked_fields",
                    "only used with request_body = \"masked\"",
                ));
            }
            (other, _) => {
                return Err(FieldError::new(
                    "request_body",
                    format!(
                        "{other:?} is not one of \"full\", \"masked\", \"digest_only\", \"encrypted\""
                    ),
                ));
            }
        };
        let result_body = match (
            self.result_body.as_deref().unwrap_or("full"),
            &self.result_masked_fields,
        ) {
            ("full", None) => ResultBodyPolicy::Full,
            ("encrypted", None) => ResultBodyPolicy::Encrypted,
            ("masked", Some(fields)) if !fields.is_empty() => {
                ResultBodyPolicy::Masked(fields.clone())
            }
            ("masked", _) => {
                return Err(FieldError::new(
                    "result_masked_fields",
                    "\"masked\" needs a non-empty list of field names",
                ));
            }
            ("full" | "encrypted", Some(_)) => {
                return Err(FieldError::new(
                    "result_masked_fields",
                    "only used with result_body = \"masked\"",
                ));
            }
            (other, _) => {
                return Err(FieldError::new(
                    "result_body",
                    format!("{other:?} is not one of \"full\", \"masked\", \"encrypted\""),
                ));
            }
        };
        let mut encryption_keys = BTreeMap::new();
        for (id, source) in self.encryption_keys.iter().flatten() {
            let field = format!("encryption_keys.{id}");
            secrets::check_key_id(&field, id)?;
            encryption_keys.insert(id.clone(), KeySource::parse(&field, source)?);
        }
        if let Some(id) = &self.encryption_key_id {
            secrets::check_key_id("encryption_key_id", id)?;
            if !encryption_keys.contains_key(id) {
                return Err(FieldError::new(
                    "encryption_key_id",
                    format!("{id:?} is not one of encryption_keys"),
                ));
            }
        }
        let encrypts = request_body == RequestBodyPolicy::Encrypted
            || result_body == ResultBodyPolicy::Encrypted;
        if encrypts && self.encryption_key_id.is_none() {
            return Err(FieldError::new(
                "encryption_key_id",
                "\"encrypted\" needs the id of the key to seal with (and encryption_keys)",
            ));
        }
        // The HTTP front's request body limit: an argument payload the front
        // accepts is not refused later for a few bytes of JSON-RPC framing.
        let max_arguments_bytes = self
            .max_arguments_bytes
            .unwrap_or(DEFAULT_MAX_ARGUMENTS_BYTES);
        if max_arguments_bytes == 0 || max_arguments_bytes > 16 * 1024 * 1024 {
            return Err(FieldError::new(
                "max_arguments_bytes",
                "must be 1 to 16777216",
            ));
        }
        let integers = match self.integers.as_deref().unwrap_or("reject") {
            "reject" => IntegerPolicy::Reject,
            "as_double" => IntegerPolicy::AsDouble,
            other => {
                return Err(FieldError::new(
                    "integers",
                    format!("{other:?} is not one of \"reject\", \"as_double\""),
                ));
            }
        };
        let dispatch_interval = duration("dispatch_interval", &self.dispatch_interval, "1s")?;
        let claim_expiry_interval =
            duration("claim_expiry_interval", &self.claim_expiry_interval, "2s")?;
        let reconcile_interval = duration("reconcile_interval", &self.reconcile_interval, "5s")?;
        let reconcile_claim_ttl = duration("reconcile_claim_ttl", &self.reconcile_claim_ttl, "2m")?;
        let reconcile_retries = self.reconcile_retries.unwrap_or(3);
        if !(0..=100).contains(&reconcile_retries) {
            return Err(FieldError::new("reconcile_retries", "must be 0 to 100"));
        }
        let durability = match self.durability.as_deref().unwrap_or("local") {
            "local" => Durability::Local,
            "sync_replica" => Durability::SyncReplica,
            other => {
                return Err(FieldError::new(
                    "durability",
                    format!("{other:?} is not one of \"local\", \"sync_replica\""),
                ));
            }
        };
        Ok(Policy {
            durability,
            background: self.background.unwrap_or(true),
            dispatch_interval,
            claim_expiry_interval,
            reconcile_interval,
            reconcile_claim_ttl,
            reconcile_retries,
            lease_ttl_ceiling,
            heartbeat_interval,
            claim_ttl,
            in_flight_wait,
            undelivered_hold,
            outcome_in_content: self.outcome_in_content.unwrap_or(true),
            step_identity,
            request_body,
            result_body,
            encryption_key_id: self.encryption_key_id.clone(),
            encryption_keys,
            keyring: None,
            max_arguments_bytes,
            integers,
        })
    }
}

impl Policy {
    /// Reads the keys `encryption_keys` names (relative files: from `base`,
    /// the policy file's directory). Without keys configured, nothing.
    pub fn load_keys(&mut self, base: &Path) -> Result<(), FieldError> {
        if !self.encryption_keys.is_empty() {
            self.keyring = Some(Keyring::load(
                self.encryption_key_id.as_deref(),
                &self.encryption_keys,
                base,
            )?);
        }
        Ok(())
    }

    /// The data policy the ledger applies to every body it stores.
    pub fn bodies(&self) -> Bodies {
        Bodies {
            request: self.request_body.clone(),
            result: self.result_body.clone(),
            keyring: self.keyring.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn masking_replaces_named_fields_at_any_depth() {
        let policy = RequestBodyPolicy::Masked(vec!["card".into()]);
        assert_eq!(
            policy.apply(&json!({"card": "4242", "nested": [{"card": 1, "x": 2}]})),
            json!({"card": "***", "nested": [{"card": "***", "x": 2}]})
        );
    }

    #[test]
    fn bad_values_name_their_field() {
        let raw = RawPolicy {
            claim_ttl: Some("soon".into()),
            ..RawPolicy::default()
        };
        assert_eq!(raw.validate().unwrap_err().field, "claim_ttl");
        let raw = RawPolicy {
            request_body: Some("masked".into()),
            ..RawPolicy::default()
        };
        assert_eq!(raw.validate().unwrap_err().field, "masked_fields");
        let raw = RawPolicy {
            durability: Some("sync".into()),
            ..RawPolicy::default()
        };
        assert_eq!(raw.validate().unwrap_err().field, "durability");
        let raw = RawPolicy {
            durability: Some("sync_replica".into()),
            ..RawPolicy::default()
        };
        assert_eq!(raw.validate().unwrap().durability, Durability::SyncReplica);
        assert_eq!(Policy::default().durability, Durability::Local);
    }
}
