//! JSON as the ledger stores it: every valid JSON text, U+0000 included.
//!
//! PostgreSQL's `jsonb` cannot hold U+0000 (`\u0000`) in a string: the
//! insert fails with SQLSTATE 22P05, and retrying never helps. Arguments
//! and results must round-trip byte-exact all the same, so values that
//! contain U+0000 are stored escaped inside an envelope and unescaped on the
//! way out:
//!
//! ```text
//! {"dev.leasegate/escaped": <value with U+0000 → "\u{E000}0" and U+E000 → "\u{E000}e" in every string and key>}
//! ```
//!
//! Values without U+0000, U+E000 or an envelope-shaped object are stored as
//! they are, so the ledger stays readable with plain SQL for everything
//! else. Any value holding U+E000 or an envelope-shaped object is escaped
//! too, so decoding is unambiguous: an envelope found anywhere in a stored
//! value (SQL functions may nest a stored value inside evidence) is decoded
//! and not looked into further.
//!
//! The request digest never sees this form: it is computed from the value
//! the agent sent.
//!
//! Bodies (request arguments, results, evidence) may also hold sealed
//! envelopes (`{"dev.leasegate/sealed": …}`, `policy::secrets`). They are
//! read as [`Raw`] and opened by [`open`] in the same walk that decodes the
//! escape envelopes, so that a user value shaped like a sealed envelope
//! (stored escaped, like an escape envelope) is never taken for one.

use std::borrow::Cow;

use serde_json::{Map, Value};
use sqlx::postgres::{PgTypeInfo, PgValueRef};
use sqlx::types::Json;
use sqlx::{Decode, Postgres, Type};

use crate::policy::secrets::{SEALED_KEY, SecretsError, sealed_inner};

/// The envelope's only key.
pub const ENVELOPE_KEY: &str = "dev.leasegate/escaped";
const MARK: char = '\u{E000}';

/// A stored value, decoded when read.
#[derive(Debug, Clone, PartialEq)]
pub struct Stored(pub Value);

impl Type<Postgres> for Stored {
    fn type_info() -> PgTypeInfo {
        <Json<Value> as Type<Postgres>>::type_info()
    }
    fn compatible(ty: &PgTypeInfo) -> bool {
        <Json<Value> as Type<Postgres>>::compatible(ty)
    }
}

impl<'r> Decode<'r, Postgres> for Stored {
    fn decode(value: PgValueRef<'r>) -> Result<Self, sqlx::error::BoxDynError> {
        let Json(value) = <Json<Value> as Decode<'r, Postgres>>::decode(value)?;
        Ok(Stored(decode(value)))
    }
}

/// A stored body as the database holds it: escape envelopes not decoded,
/// sealed envelopes not opened ([`open`] does both).
#[derive(Debug, Clone, PartialEq)]
pub struct Raw(pub Value);

impl Type<Postgres> for Raw {
    fn type_info() -> PgTypeInfo {
        <Json<Value> as Type<Postgres>>::type_info()
    }
    fn compatible(ty: &PgTypeInfo) -> bool {
        <Json<Value> as Type<Postgres>>::compatible(ty)
    }
}

impl<'r> Decode<'r, Postgres> for Raw {
    fn decode(value: PgValueRef<'r>) -> Result<Self, sqlx::error::BoxDynError> {
        let Json(value) = <Json<Value> as Decode<'r, Postgres>>::decode(value)?;
        Ok(Raw(value))
    }
}

/// A stored body as it was before it was stored: escape envelopes
/// decoded, sealed envelopes opened by `opener` (given the envelope's inner
/// value), wherever they sit.
pub fn open(
    value: Value,
    opener: &dyn Fn(&Value) -> Result<Value, SecretsError>,
) -> Result<Value, SecretsError> {
    match value {
        Value::Object(map) if is_envelope(&map) => {
            let inner = map.into_iter().next().map(|(_, v)| v).unwrap_or_default();
            Ok(unescape(inner))
        }
        Value::Object(map) if map.len() == 1 && map.contains_key(SEALED_KEY) => {
            let value = Value::Object(map);
            opener(sealed_inner(&value).expect("checked above"))
        }
        Value::Object(map) => map
            .into_iter()
            .map(|(k, v)| Ok((k, open(v, opener)?)))
            .collect::<Result<Map<_, _>, _>>()
            .map(Value::Object),
        Value::Array(items) => items
            .into_iter()
            .map(|v| open(v, opener))
            .collect::<Result<Vec<_>, _>>()
            .map(Value::Array),
        other => Ok(other),
    }
}

/// The form to bind for `value`.
pub fn encode(value: &Value) -> Cow<'_, Value> {
    if needs_escape(value) {
        let mut envelope = Map::new();
        envelope.insert(ENVELOPE_KEY.to_owned(), escape(value));
        Cow::Owned(Value::Object(envelope))
    } else {
        Cow::Borrowed(value)
    }
}

/// The value as it was before [`encode`], wherever envelopes sit in it.
pub fn decode(value: Value) -> Value {
    match value {
        Value::Object(map) if is_envelope(&map) => {
            let inner = map.into_iter().next().map(|(_, v)| v).unwrap_or_default();
            unescape(inner)
        }
        Value::Object(map) => Value::Object(map.into_iter().map(|(k, v)| (k, decode(v))).collect()),
        Value::Array(items) => Value::Array(items.into_iter().map(decode).collect()),
        other => other,
    }
}

fn is_envelope(map: &Map<String, Value>) -> bool {
    map.len() == 1 && map.contains_key(ENVELOPE_KEY)
}

/// A user value shaped like a sealed envelope is stored escaped, so that
/// [`open`] never takes it for one.
fn is_sealed_shape(map: &Map<String, Value>) -> bool {
    map.len() == 1 && map.contains_key(SEALED_KEY)
}

fn needs_escape(value: &Value) -> bool {
    let text_needs = |s: &str| s.contains(['\0', MARK]);
    match value {
        Value::String(s) => text_needs(s),
        Value::Array(items) => items.iter().any(needs_escape),
        Value::Object(map) => {
            is_envelope(map)
                || is_sealed_shape(map)
                || map.iter().any(|(k, v)| text_needs(k) || needs_escape(v))
        }
        _ => false,
    }
}

fn escape_text(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\0' => {
                out.push(MARK);
                out.push('0');
            }
            MARK => {
                out.push(MARK);
                out.push('e');
            }
            other => out.push(other),
        }
    }
    out
}

fn unescape_text(s: &str) -> String {
    if !s.contains(MARK) {
        return s.to_owned();
    }
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == MARK {
            match chars.next() {
                Some('0') => out.push('\0'),
                Some('e') => out.push(MARK),
                // Not written by `escape`: keep what is there.
                Some(other) => {
                    out.push(MARK);
                    out.push(other);
                }
                None => out.push(MARK),
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn escape(value: &Value) -> Value {
    match value {
        Value::String(s) => Value::String(escape_text(s)),
        Value::Array(items) => Value::Array(items.iter().map(escape).collect()),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| (escape_text(k), escape(v)))
                .collect(),
        ),
        other => other.clone(),
    }
}

fn unescape(value: Value) -> Value {
    match value {
        Value::String(s) => Value::String(unescape_text(&s)),
        Value::Array(items) => Value::Array(items.into_iter().map(unescape).collect()),
        Value::Object(map) => Value::Object(
            map.into_iter()
                .map(|(k, v)| (unescape_text(&k), unescape(v)))
                .collect(),
        ),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn round_trip(value: Value) {
        let stored = encode(&value).into_owned();
        assert!(!serde_json::to_string(&stored).unwrap().contains("\\u0000"));
        assert_eq!(decode(stored), value);
    }

    #[test]
    fn plain_values_are_stored_as_they_are() {
        let value = json!({"a": [1, "x", {"b": null}], "c": "text"});
        assert!(matches!(encode(&value), Cow::Borrowed(_)));
        assert_eq!(decode(value.clone()), value);
    }

    #[test]
    fn nul_and_the_marker_round_trip() {
        round_trip(json!({"to": "a\u{0}b", "k\u{0}": ["\u{0}", "\u{E000}0", "\u{E000}"]}));
        round_trip(json!("\u{E000}e\u{0}"));
        round_trip(json!({"only marker": "\u{E000}"}));
    }

    #[test]
    fn envelope_shaped_user_values_round_trip() {
        round_trip(json!({ENVELOPE_KEY: "x"}));
        round_trip(json!({"nested": {ENVELOPE_KEY: {"y": "\u{0}"}}}));
    }

    #[test]
    fn sealed_shaped_user_values_are_not_opened() {
        let user = json!({"a": {SEALED_KEY: {"kid": "k"}}});
        let stored = encode(&user).into_owned();
        let refuse = |_: &Value| -> Result<Value, SecretsError> { Err(SecretsError::NoKey) };
        assert_eq!(open(stored, &refuse).unwrap(), user);
        let sealed = json!({"result": {SEALED_KEY: {"kid": "k"}}, "n": 1});
        let opener = |inner: &Value| -> Result<Value, SecretsError> { Ok(json!([inner["kid"]])) };
        assert_eq!(
            open(sealed, &opener).unwrap(),
            json!({"result": ["k"], "n": 1})
        );
    }

    #[test]
    fn envelopes_nested_by_sql_are_decoded() {
        let inner = json!({"text": "a\u{0}"});
        let evidence = json!({"result": encode(&inner).into_owned(), "kind": "late"});
        assert_eq!(decode(evidence), json!({"result": inner, "kind": "late"}));
    }
}
