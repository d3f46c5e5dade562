//! Secrets at rest: what the ledger stores of request arguments, results
//! and evidence ([`Bodies`], from the policy's `request_body`,
//! `result_body` and `encryption_*` fields), masking by field name, and
//! authenticated encryption under named keys ([`Keyring`]).
//!
//! # Invariants
//!
//! 1. Under `masked`, no value of a masked field name reaches the ledger:
//!    the name is matched at any depth of objects and arrays, and inside
//!    strings that hold a JSON object or array (a tool result's text
//!    content is usually its structured content serialized), whose masked
//!    form is stored re-serialized.
//! 2. Under `encrypted`, a body is stored only as a sealed envelope
//!    (XChaCha20-Poly1305 with a random 192-bit nonce):
//!
//!    ```text
//!    {"dev.leasegate/sealed": {"v": 1, "kid": "<key id>", "nonce": "<base64>", "data": "<base64>"}}
//!    ```
//!
//!    The associated data binds the key id and the operation id, so a
//!    sealed body cannot be moved to another operation unnoticed. There is
//!    no fallback to plaintext: a body that cannot be sealed is not stored,
//!    and one that cannot be opened is an error naming the operation and
//!    the key id, never a silent default.
//! 3. A masked body is never taken for the request: whoever sends stored
//!    arguments again (the outbox, the reconciler) first checks that they
//!    hash to the intent's `request_digest` (see `reconcile`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use chacha20poly1305::aead::{Aead, AeadCore, KeyInit, OsRng, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use serde_json::{Map, Value, json};

use super::FieldError;

/// The key of a sealed envelope (an object with this one key).
pub const SEALED_KEY: &str = "dev.leasegate/sealed";
/// What a masked field's value is replaced by.
pub const MASK: &str = "***";

/// What the ledger stores of a request's arguments.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum RequestBodyPolicy {
    #[default]
    Full,
    /// These field names, at any depth, are replaced by `"***"`.
    Masked(Vec<String>),
    /// Only the digest (already in its own column) is kept.
    DigestOnly,
    /// Sealed under the policy's current key; the reconciler and the
    /// outbox open it to send the original again.
    Encrypted,
}

impl RequestBodyPolicy {
    /// The masked view of `arguments` (`Full`, `Encrypted`: as they are;
    /// `DigestOnly`: `null`). Sealing needs a key: see [`Bodies`].
    pub fn apply(&self, arguments: &Value) -> Value {
        match self {
            RequestBodyPolicy::Full | RequestBodyPolicy::Encrypted => arguments.clone(),
            RequestBodyPolicy::DigestOnly => Value::Null,
            RequestBodyPolicy::Masked(fields) => mask(arguments, fields),
        }
    }
}

/// What the ledger stores of a tool's result (and of evidence).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ResultBodyPolicy {
    #[default]
    Full,
    /// These field names, at any depth (JSON text included), are replaced
    /// by `"***"`; a replay returns the masked result.
    Masked(Vec<String>),
    Encrypted,
}

/// `value` with every field named in `fields` replaced by `"***"`, at any
/// depth, strings holding a JSON object or array included (invariant 1).
pub fn mask(value: &Value, fields: &[String]) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(key, item)| {
                    let item = if fields.iter().any(|f| f == key) {
                        Value::String(MASK.into())
                    } else {
                        mask(item, fields)
                    };
                    (key.clone(), item)
                })
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(|item| mask(item, fields)).collect()),
        Value::String(text) if text.trim_start().starts_with(['{', '[']) => {
            match serde_json::from_str::<Value>(text) {
                Ok(inner @ (Value::Object(_) | Value::Array(_))) => {
                    let masked = mask(&inner, fields);
                    if masked == inner {
                        value.clone()
                    } else {
                        Value::String(masked.to_string())
                    }
                }
                _ => value.clone(),
            }
        }
        other => other.clone(),
    }
}

/// Why a body could not be sealed or opened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretsError {
    #[error("the policy encrypts bodies but no encryption key is configured")]
    NoKey,
    #[error("sealed under key id {kid:?}, which is not configured (encryption_keys)")]
    UnknownKey { kid: String },
    #[error(
        "key id {kid:?} does not open it: a different key under that id, or the stored body was altered"
    )]
    WrongKey { kid: String },
    #[error("malformed sealed envelope: {0}")]
    Malformed(String),
}

/// Where a key's material is read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    /// A file (relative paths: to the policy file's directory).
    File(PathBuf),
    /// An environment variable.
    Env(String),
}

impl KeySource {
    /// `"file:<path>"` or `"env:<VARIABLE>"`.
    pub fn parse(field: &str, text: &str) -> Result<Self, FieldError> {
        match text.split_once(':') {
            Some(("file", path)) if !path.is_empty() => Ok(KeySource::File(path.into())),
            Some(("env", name)) if !name.is_empty() => Ok(KeySource::Env(name.to_owned())),
            _ => Err(FieldError::new(
                field,
                format!("{text:?} is not \"file:<path>\" or \"env:<VARIABLE>\""),
            )),
        }
    }
}

/// Named 256-bit keys: the current one seals, every one opens what it
/// sealed (old keys stay configured while `leasegate secrets rotate`
/// re-seals their rows).
#[derive(Clone, PartialEq, Eq, Default)]
pub struct Keyring {
    current: Option<String>,
    keys: BTreeMap<String, [u8; 32]>,
}

impl std::fmt::Debug for Keyring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key material.
        f.debug_struct("Keyring")
            .field("current", &self.current)
            .field("ids", &self.keys.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// Key ids: what a sealed envelope names.
pub fn check_key_id(field: &str, id: &str) -> Result<(), FieldError> {
    let ok = !id.is_empty()
        && id.len() <= 64
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err(FieldError::new(
            field,
            format!("{id:?} is not a key id (1 to 64 of A-Z a-z 0-9 - _ .)"),
        ))
    }
}

fn parse_key(text: &str) -> Result<[u8; 32], String> {
    let text = text.trim();
    let bytes = if text.len() == 64 && text.chars().all(|c| c.is_ascii_hexdigit()) {
        hex::decode(text).map_err(|e| e.to_string())?
    } else {
        BASE64
            .decode(text)
            .map_err(|_| "is neither 64 hex digits nor base64".to_owned())?
    };
    <[u8; 32]>::try_from(bytes.as_slice())
        .map_err(|_| format!("must be 32 bytes, found {} bytes", bytes.len()))
}

impl Keyring {
    /// A keyring from key material (tests, tools).
    pub fn from_keys(current: Option<&str>, keys: &[(&str, [u8; 32])]) -> Self {
        Self {
            current: current.map(str::to_owned),
            keys: keys
                .iter()
                .map(|(id, key)| ((*id).to_owned(), *key))
                .collect(),
        }
    }

    /// Reads every key from its source; `base`: the directory relative key
    /// files are found from. An error names the key and what is wrong,
    /// never the key.
    pub fn load(
        current: Option<&str>,
        sources: &BTreeMap<String, KeySource>,
        base: &Path,
    ) -> Result<Self, FieldError> {
        let mut keys = BTreeMap::new();
        for (id, source) in sources {
            let field = format!("encryption_keys.{id}");
            let text = match source {
                KeySource::Env(name) => std::env::var(name).map_err(|_| {
                    FieldError::new(
                        &field,
                        format!("environment variable {name} is not set (or not UTF-8)"),
                    )
                })?,
                KeySource::File(path) => {
                    let path = base.join(path);
                    // A key others can read is no secret: refused, not used.
                    let mode = std::fs::metadata(&path)
                        .map(|meta| std::os::unix::fs::PermissionsExt::mode(&meta.permissions()))
                        .map_err(|e| {
                            FieldError::new(&field, format!("cannot read {}: {e}", path.display()))
                        })?;
                    if mode & 0o077 != 0 {
                        return Err(FieldError::new(
                            &field,
                            format!(
                                "{} is readable by others (mode {:o}): `chmod 600` it",
                                path.display(),
                                mode & 0o777
                            ),
                        ));
                    }
                    std::fs::read_to_string(&path).map_err(|e| {
                        FieldError::new(&field, format!("cannot read {}: {e}", path.display()))
                    })?
                }
            };
            let key = parse_key(&text).map_err(|message| FieldError::new(&field, message))?;
            keys.insert(id.clone(), key);
        }
        Ok(Self {
            current: current.map(str::to_owned),
            keys,
        })
    }

    /// The key id new bodies are sealed under.
    pub fn current(&self) -> Option<&str> {
        self.current.as_deref()
    }

    fn cipher(&self, kid: &str) -> Result<XChaCha20Poly1305, SecretsError> {
        let key = self.keys.get(kid).ok_or_else(|| SecretsError::UnknownKey {
            kid: kid.to_owned(),
        })?;
        XChaCha20Poly1305::new_from_slice(key).map_err(|e| SecretsError::Malformed(e.to_string()))
    }

    /// `value` sealed under the current key, bound to `context` (the
    /// operation id).
    pub fn seal(&self, value: &Value, context: &str) -> Result<Value, SecretsError> {
        let kid = self.current.as_deref().ok_or(SecretsError::NoKey)?;
        let cipher = self.cipher(kid)?;
        let nonce = XChaCha20Poly1305::generate_nonce(&mut OsRng);
        let plaintext = serde_json::to_vec(value).expect("a JSON value serializes");
        let aad = associated_data(kid, context);
        let data = cipher
            .encrypt(
                &nonce,
                Payload {
                    msg: &plaintext,
                    aad: &aad,
                },
            )
            .map_err(|_| SecretsError::Malformed("encryption failed".into()))?;
        let mut envelope = Map::new();
        envelope.insert(
            SEALED_KEY.to_owned(),
            json!({"v": 1, "kid": kid, "nonce": BASE64.encode(nonce), "data": BASE64.encode(data)}),
        );
        Ok(Value::Object(envelope))
    }

    /// The value inside a sealed envelope (`inner`: the envelope's one
    /// value), checked against `context`.
    pub fn open(&self, inner: &Value, context: &str) -> Result<Value, SecretsError> {
        let field = |name: &str| {
            inner
                .get(name)
                .and_then(Value::as_str)
                .ok_or_else(|| SecretsError::Malformed(format!("no {name}")))
        };
        if inner.get("v") != Some(&json!(1)) {
            return Err(SecretsError::Malformed("unknown version".into()));
        }
        let kid = field("kid")?;
        let nonce = BASE64
            .decode(field("nonce")?)
            .map_err(|e| SecretsError::Malformed(format!("nonce: {e}")))?;
        let nonce: [u8; 24] = nonce
            .try_into()
            .map_err(|_| SecretsError::Malformed("nonce: not 24 bytes".into()))?;
        let data = BASE64
            .decode(field("data")?)
            .map_err(|e| SecretsError::Malformed(format!("data: {e}")))?;
        let aad = associated_data(kid, context);
        let plaintext = self
            .cipher(kid)?
            .decrypt(
                &XNonce::from(nonce),
                Payload {
                    msg: &data,
                    aad: &aad,
                },
            )
            .map_err(|_| SecretsError::WrongKey {
                kid: kid.to_owned(),
            })?;
        serde_json::from_slice(&plaintext).map_err(|e| SecretsError::Malformed(e.to_string()))
    }
}

fn associated_data(kid: &str, context: &str) -> Vec<u8> {
    format!("leasegate/sealed/v1\0{kid}\0{context}").into_bytes()
}

/// The envelope's inner value, when `value` is a sealed envelope.
pub fn sealed_inner(value: &Value) -> Option<&Value> {
    match value {
        Value::Object(map) if map.len() == 1 => map.get(SEALED_KEY),
        _ => None,
    }
}

/// The key ids of the sealed envelopes in `value`, at any depth.
pub fn sealed_key_ids(value: &Value, out: &mut Vec<String>) {
    if let Some(inner) = sealed_inner(value) {
        if let Some(kid) = inner.get("kid").and_then(Value::as_str) {
            out.push(kid.to_owned());
        }
        return;
    }
    match value {
        Value::Object(map) => map.values().for_each(|v| sealed_key_ids(v, out)),
        Value::Array(items) => items.iter().for_each(|v| sealed_key_ids(v, out)),
        _ => {}
    }
}

/// The data policy the ledger applies to every body it stores, and the
/// keys it opens sealed bodies with.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Bodies {
    pub request: RequestBodyPolicy,
    pub result: ResultBodyPolicy,
    pub keyring: Option<Keyring>,
}

impl Bodies {
    fn seal(&self, value: &Value, context: &str) -> Result<Value, SecretsError> {
        self.keyring
            .as_ref()
            .ok_or(SecretsError::NoKey)?
            .seal(value, context)
    }

    /// What the ledger stores of a request's arguments for `operation_id`.
    /// `plain` turns a value that is not sealed into its stored form (the
    /// ledger's escaping of what `jsonb` cannot hold).
    pub fn store_request(
        &self,
        arguments: &Value,
        operation_id: &str,
        plain: &dyn Fn(&Value) -> Value,
    ) -> Result<Value, SecretsError> {
        match &self.request {
            RequestBodyPolicy::Encrypted => self.seal(arguments, operation_id),
            other => Ok(plain(&other.apply(arguments))),
        }
    }

    /// Whether the stored request is the request itself (or seals it): the
    /// only case a planned intent can be sent later from the ledger.
    pub fn keeps_request(&self, arguments: &Value) -> bool {
        match &self.request {
            RequestBodyPolicy::Full | RequestBodyPolicy::Encrypted => true,
            RequestBodyPolicy::DigestOnly => false,
            RequestBodyPolicy::Masked(fields) => mask(arguments, fields) == *arguments,
        }
    }

    /// What the ledger stores of a result (see [`Bodies::store_request`]).
    pub fn store_result(
        &self,
        result: &Value,
        operation_id: &str,
        plain: &dyn Fn(&Value) -> Value,
    ) -> Result<Value, SecretsError> {
        match &self.result {
            ResultBodyPolicy::Full => Ok(plain(result)),
            ResultBodyPolicy::Masked(fields) => Ok(plain(&mask(result, fields))),
            ResultBodyPolicy::Encrypted => self.seal(result, operation_id),
        }
    }

    /// What the ledger stores of evidence (errors, answers of queries and
    /// retries): as results are stored, with the request's masked field
    /// names masked too; under `encrypted`, each top-level value sealed
    /// (the keys stay readable, and the SQL functions may add their own).
    pub fn store_evidence(
        &self,
        evidence: &Value,
        operation_id: &str,
        plain: &dyn Fn(&Value) -> Value,
    ) -> Result<Value, SecretsError> {
        let request_fields: &[String] = match &self.request {
            RequestBodyPolicy::Masked(fields) => fields,
            _ => &[],
        };
        match &self.result {
            ResultBodyPolicy::Encrypted => match evidence {
                Value::Object(map) => map
                    .iter()
                    .map(|(k, v)| Ok((k.clone(), self.seal(v, operation_id)?)))
                    .collect::<Result<Map<_, _>, _>>()
                    .map(Value::Object),
                other => self.seal(other, operation_id),
            },
            ResultBodyPolicy::Masked(fields) => {
                let all: Vec<String> = fields.iter().chain(request_fields).cloned().collect();
                Ok(plain(&mask(evidence, &all)))
            }
            ResultBodyPolicy::Full => Ok(plain(&mask(evidence, request_fields))),
        }
    }

    /// Opens one sealed envelope's inner value.
    pub fn open(&self, inner: &Value, operation_id: &str) -> Result<Value, SecretsError> {
        match &self.keyring {
            Some(keyring) => keyring.open(inner, operation_id),
            None => Err(SecretsError::UnknownKey {
                kid: inner
                    .get("kid")
                    .and_then(Value::as_str)
                    .unwrap_or("?")
                    .to_owned(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring() -> Keyring {
        Keyring::from_keys(Some("k2"), &[("k1", [1; 32]), ("k2", [2; 32])])
    }

    #[test]
    fn masking_reaches_nested_fields_and_json_text() {
        let fields = vec!["to".to_owned()];
        let result = json!({
            "structuredContent": {"to": "ceo@x.y", "id": 1},
            "content": [{"type": "text", "text": "{\"id\":1,\"to\":\"ceo@x.y\"}"}, {"type": "text", "text": "{not json"}],
        });
        let masked = mask(&result, &fields);
        assert!(!masked.to_string().contains("ceo@x.y"), "{masked}");
        assert_eq!(masked["structuredContent"]["to"], "***");
        assert_eq!(masked["content"][1]["text"], "{not json");
    }

    #[test]
    fn sealed_bodies_open_with_their_key_and_context_only() {
        let value = json!({"card": "4242", "n": [1, "\u{0}"]});
        let sealed = ring().seal(&value, "op-1").unwrap();
        assert!(!sealed.to_string().contains("4242"));
        let inner = sealed_inner(&sealed).unwrap();
        assert_eq!(inner["kid"], "k2");
        assert_eq!(ring().open(inner, "op-1").unwrap(), value);
        assert_eq!(
            ring().open(inner, "op-2").unwrap_err(),
            SecretsError::WrongKey { kid: "k2".into() }
        );
        let other = Keyring::from_keys(Some("k2"), &[("k2", [9; 32])]);
        assert_eq!(
            other.open(inner, "op-1").unwrap_err(),
            SecretsError::WrongKey { kid: "k2".into() }
        );
        let old_only = Keyring::from_keys(Some("k1"), &[("k1", [1; 32])]);
        assert_eq!(
            old_only.open(inner, "op-1").unwrap_err(),
            SecretsError::UnknownKey { kid: "k2".into() }
        );
    }

    #[test]
    fn keys_parse_from_hex_or_base64_and_name_what_is_wrong() {
        assert_eq!(parse_key(&"ab".repeat(32)).unwrap(), [0xab; 32]);
        assert_eq!(parse_key(&BASE64.encode([7u8; 32])).unwrap(), [7; 32]);
        assert!(parse_key("c2hvcnQ=").unwrap_err().contains("32 bytes"));
        let mut sources = BTreeMap::new();
        sources.insert(
            "k1".to_owned(),
            KeySource::Env("LEASEGATE_TEST_KEY_THAT_IS_NOT_SET".into()),
        );
        let error = Keyring::load(Some("k1"), &sources, Path::new(".")).unwrap_err();
        assert_eq!(error.field, "encryption_keys.k1");
        assert!(error.message.contains("LEASEGATE_TEST_KEY_THAT_IS_NOT_SET"));
    }

    #[test]
    fn evidence_keeps_its_keys_and_seals_or_masks_its_values() {
        let bodies = Bodies {
            request: RequestBodyPolicy::Encrypted,
            result: ResultBodyPolicy::Encrypted,
            keyring: Some(ring()),
        };
        let plain = |v: &Value| v.clone();
        let stored = bodies
            .store_evidence(&json!({"error": "to a@b.c failed"}), "op", &plain)
            .unwrap();
        assert!(sealed_inner(&stored["error"]).is_some());
        let bodies = Bodies {
            request: RequestBodyPolicy::Masked(vec!["to".into()]),
            ..Bodies::default()
        };
        assert_eq!(
            bodies
                .store_evidence(&json!({"answer": {"to": "a@b.c"}}), "op", &plain)
                .unwrap(),
            json!({"answer": {"to": "***"}})
        );
        assert!(!bodies.keeps_request(&json!({"to": "a@b.c"})));
        assert!(bodies.keeps_request(&json!({"subject": "hi"})));
    }
}
