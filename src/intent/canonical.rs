//! RFC 8785 canonical JSON, behind one function. The canonicalizer is
//! serde_json_canonicalizer (it passes the RFC's reference vectors, kept as
//! golden files in `tests/fixtures/jcs/`).

use serde_json::Value;

use super::IntentError;

/// 2^53: the largest magnitude up to which every integer is an IEEE double.
pub const MAX_SAFE_INTEGER: u64 = 1 << 53;

/// What to do with integers that RFC 8785 cannot keep apart.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IntegerPolicy {
    /// Refuse numbers with |n| > 2^53 (two of them could share a digest):
    /// integers, and doubles of that magnitude, which may be integers that
    /// lost digits on the way in.
    #[default]
    Reject,
    /// Accept RFC 8785's double semantics: such integers are rounded.
    AsDouble,
}

/// The canonical bytes of `value` under `policy`.
pub fn canonical_bytes(value: &Value, policy: IntegerPolicy) -> Result<Vec<u8>, IntentError> {
    check_policy(value, policy)?;
    serde_json_canonicalizer::to_vec(value).map_err(|e| IntentError::Canonicalize(e.to_string()))
}

/// Refuses what `policy` refuses, naming the path from `$` (= `value`).
pub(super) fn check_policy(value: &Value, policy: IntegerPolicy) -> Result<(), IntentError> {
    match policy {
        IntegerPolicy::Reject => check_integers(value, &mut String::from("$")),
        IntegerPolicy::AsDouble => Ok(()),
    }
}

fn check_integers(value: &Value, path: &mut String) -> Result<(), IntentError> {
    match value {
        Value::Number(number) => {
            let magnitude = number
                .as_u64()
                .or_else(|| number.as_i64().map(i64::unsigned_abs));
            // A number parsed as a double beyond ±2^53 (an integer at or
            // beyond 2^64, or any spelling of such a magnitude) may already
            // have lost digits on the way in: numbers that differ would
            // share its digest. Every double that large is an integer.
            let unsafe_double = magnitude.is_none()
                && number
                    .as_f64()
                    .is_some_and(|x| x.abs() > MAX_SAFE_INTEGER as f64);
            if magnitude.is_some_and(|m| m > MAX_SAFE_INTEGER) || unsafe_double {
                return Err(IntentError::UnsafeInteger {
                    path: path.clone(),
                    value: number.to_string(),
                });
            }
        }
        Value::Array(items) => {
            for (index, item) in items.iter().enumerate() {
                let len = path.len();
                path.push_str(&format!("[{index}]"));
                check_integers(item, path)?;
                path.truncate(len);
            }
        }
        Value::Object(map) => {
            for (key, item) in map {
                let len = path.len();
                path.push('.');
                path.push_str(key);
                check_integers(item, path)?;
                path.truncate(len);
            }
        }
        Value::Null | Value::Bool(_) | Value::String(_) => {}
    }
    Ok(())
}
