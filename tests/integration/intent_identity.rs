//! Intent identity without a database: RFC 8785 golden vectors, digest
//! invariances and sensitivities (property-tested), the 2^53 rule, and the
//! operation id's inputs.

use std::fs;
use std::path::Path;

use leasegate::ids::RunId;
use leasegate::intent::{
    IntegerPolicy, Intent, IntentError, StepRef, canonical_bytes, default_step_id, operation_id,
    request_digest, request_digest_of_params,
};
use proptest::prelude::*;
use serde_json::{Value, json};

#[test]
fn rfc8785_reference_vectors_canonicalize_byte_for_byte() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/jcs");
    let mut checked = 0;
    for entry in fs::read_dir(fixtures.join("input")).unwrap() {
        let input = entry.unwrap().path();
        let name = input.file_name().unwrap().to_owned();
        let value: Value = serde_json::from_slice(&fs::read(&input).unwrap()).unwrap();
        let expected = fs::read(fixtures.join("output").join(&name)).unwrap();
        let got = canonical_bytes(&value, IntegerPolicy::AsDouble).unwrap();
        assert_eq!(
            String::from_utf8_lossy(&got),
            String::from_utf8_lossy(&expected),
            "{name:?}"
        );
        checked += 1;
    }
    assert_eq!(checked, 8, "every golden file was read");
}

#[test]
fn number_edge_cases_follow_ecmascript() {
    // RFC 8785's own number semantics (beyond ±2^53 too).
    let canonical = |text: &str| {
        let value: Value = serde_json::from_str(text).unwrap();
        String::from_utf8(canonical_bytes(&value, IntegerPolicy::AsDouble).unwrap()).unwrap()
    };
    assert_eq!(
        canonical("[1e21, 1e20, 1e-7, 1e-6]"),
        "[1e+21,100000000000000000000,1e-7,0.000001]"
    );
    assert_eq!(canonical("[-0, 0.0, -0.0]"), "[0,0,0]");
    assert_eq!(
        canonical("[1.0, 1, 10.50, 9007199254740992]"),
        "[1,1,10.5,9007199254740992]"
    );
    assert_eq!(
        canonical("[333333333.33333329, 4.50, 2e-3]"),
        "[333333333.3333333,4.5,0.002]"
    );
    // UTF-16 code unit order: U+1F600 (D83D DE00) sorts before U+FB01.
    assert_eq!(
        canonical(r#"{"\ufb01": 1, "\ud83d\ude00": 2}"#),
        "{\"😀\":2,\"ﬁ\":1}"
    );
    assert_eq!(
        canonical(r#"{"b": 1, "a": {"d": 1, "c": 2}}"#),
        r#"{"a":{"c":2,"d":1},"b":1}"#
    );
    // Escapes: only the required ones, lowercase hex for control characters.
    assert_eq!(
        canonical(r#""\u00e9\u0007\t\"\\/""#),
        "\"é\\u0007\\t\\\"\\\\/\""
    );
}

#[test]
fn integers_beyond_two_to_the_53_are_refused_by_default() {
    for text in [
        "9007199254740993",
        "-9007199254740993",
        "18446744073709551615",
        "[{\"a\": 9007199254740993}]",
        // Beyond the 64-bit integers they arrive as doubles, already
        // rounded alike: each refused, never merged into one intent.
        "18446744073709551616",
        "18446744073709551617",
        "18446744073709551616.0",
        "1.8446744073709552e19",
        "-9223372036854775809",
        "123456789012345678901234567890",
        "1e20",
    ] {
        let value: Value = serde_json::from_str(text).unwrap();
        let error = request_digest("pay", &value, IntegerPolicy::Reject).unwrap_err();
        assert!(
            matches!(error, IntentError::UnsafeInteger { .. }),
            "{text}: {error:?}"
        );
        assert_eq!(error.code(), "unsafe_integer");
    }
    let error = request_digest(
        "pay",
        &json!({"amount": {"cents": 9007199254740993u64}}),
        IntegerPolicy::Reject,
    )
    .unwrap_err();
    assert_eq!(
        error.to_string(),
        "integer 9007199254740993 at $.amount.cents is beyond ±2^53: RFC 8785 would give it the \
         digest of a different number; send it as a string"
    );
    // 2^53 itself is exact and accepted, as a double too; so is a fraction.
    request_digest("pay", &json!(9007199254740992u64), IntegerPolicy::Reject).unwrap();
    for text in [
        "9007199254740992.0",
        "-9.007199254740992e15",
        "12345.678",
        "1e-300",
    ] {
        let value: Value = serde_json::from_str(text).unwrap();
        request_digest("pay", &value, IntegerPolicy::Reject).unwrap();
    }
    // Knowingly accepting RFC 8785's doubles makes the collision visible.
    let a = request_digest("pay", &json!(9007199254740993u64), IntegerPolicy::AsDouble).unwrap();
    let b = request_digest("pay", &json!(9007199254740992u64), IntegerPolicy::AsDouble).unwrap();
    assert_eq!(a, b, "this is why the default refuses them");
}

#[test]
fn digest_ignores_transport_noise_and_spelling() {
    let plain = request_digest(
        "send_email",
        &json!({"to": "a@b.c", "n": 1}),
        IntegerPolicy::Reject,
    )
    .unwrap();
    let spelled: Value = serde_json::from_str("{ \"n\" : 1.0,\n  \"to\":\"a@b.c\" }").unwrap();
    assert_eq!(
        request_digest("send_email", &spelled, IntegerPolicy::Reject).unwrap(),
        plain
    );
    let params_a = json!({"name": "send_email", "arguments": {"to": "a@b.c", "n": 1},
                          "_meta": {"progressToken": 7, "traceparent": "00-aa-bb-01"}});
    let params_b = json!({"name": "send_email", "arguments": {"n": 1, "to": "a@b.c"},
                          "_meta": {"dev.leasegate/lease": {"epoch": 3}, "operationId": "x"}});
    assert_eq!(
        request_digest_of_params(&params_a, IntegerPolicy::Reject).unwrap(),
        plain
    );
    assert_eq!(
        request_digest_of_params(&params_b, IntegerPolicy::Reject).unwrap(),
        plain
    );
    assert_eq!(plain.as_str().len(), 64);
    assert!(
        plain
            .as_str()
            .chars()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
    );
}

#[test]
fn operation_id_depends_on_tenant_run_step_and_version_only() {
    let run = RunId::generate();
    let base = operation_id("acme", run, "charge-card", 1);
    assert_eq!(
        base,
        operation_id("acme", run, "charge-card", 1),
        "deterministic"
    );
    let variants = [
        operation_id("other", run, "charge-card", 1),
        operation_id("acme", RunId::generate(), "charge-card", 1),
        operation_id("acme", run, "charge-card-2", 1),
        operation_id("acme", run, "charge-card", 2),
        // No ambiguity between fields: moving text from one to the other differs.
        operation_id("acmec", run, "harge-card", 1),
    ];
    for variant in &variants {
        assert_ne!(*variant, base);
    }
    // Usable as any provider's idempotency key: a UUID, 36 safe characters.
    let text = base.as_str();
    assert_eq!(text.len(), 36);
    assert!(text.chars().all(|c| c.is_ascii_hexdigit() || c == '-'));
    assert!(uuid::Uuid::parse_str(text).is_ok());
}

#[test]
fn a_runs_operation_ids_share_their_first_twelve_hex_digits_and_nothing_else_does() {
    // Golden values, computed outside Rust (Python: hashlib.sha256 over
    // json.dumps(..., separators=(",", ":")), the RFC 8785 form of these
    // inputs; bytes 0..6 from the run's digest, 6..16 from the tuple's,
    // then the UUID version 8 and variant bits). A change of shape would
    // give every new call of a live run a new id: it must be deliberate.
    let run: RunId = "0190a6a0-0000-7000-8000-000000000001".parse().unwrap();
    let charge = operation_id("acme", run, "charge-card", 1);
    let refund = operation_id("acme", run, "refund", 1);
    assert_eq!(charge.as_str(), "9cdeebd1-5e13-8c40-a316-0c79ab4512ca");
    assert_eq!(refund.as_str(), "9cdeebd1-5e13-8d10-b789-eb879fcc39c5");
    assert_eq!(
        uuid::Uuid::parse_str(charge.as_str())
            .unwrap()
            .get_version_num(),
        8
    );

    // The run's prefix: its own, the same for every step and version.
    let prefix = |id: &leasegate::intent::OperationId| id.as_str()[..13].to_owned();
    assert_eq!(prefix(&operation_id("acme", run, "x", 7)), prefix(&charge));
    let other_run = RunId::generate();
    assert_ne!(
        prefix(&operation_id("acme", other_run, "charge-card", 1)),
        prefix(&charge)
    );
    assert_ne!(
        prefix(&operation_id("other", run, "charge-card", 1)),
        prefix(&charge)
    );
}

#[test]
fn intents_default_their_step_from_tool_and_digest() {
    let run = RunId::generate();
    let args = json!({"to": "x"});
    let a = Intent::new("acme", run, None, "send", &args, IntegerPolicy::Reject).unwrap();
    let b = Intent::new(
        "acme",
        run,
        None,
        "send",
        &json!({"to": "x"}),
        IntegerPolicy::Reject,
    )
    .unwrap();
    assert_eq!(a, b, "the same call in the same run is the same intent");
    assert_eq!(a.step_id, default_step_id("send", &a.request_digest));
    assert_eq!(a.effect_version, 1);
    let named = Intent::new(
        "acme",
        run,
        Some(StepRef {
            step_id: "step-1".into(),
            effect_version: 1,
        }),
        "send",
        &args,
        IntegerPolicy::Reject,
    )
    .unwrap();
    assert_ne!(named.operation_id, a.operation_id);
    let revised = named
        .revise(
            "acme",
            run,
            "send",
            &json!({"to": "y"}),
            IntegerPolicy::Reject,
        )
        .unwrap();
    assert_eq!(
        (revised.step_id.as_str(), revised.effect_version),
        ("step-1", 2)
    );
    assert_ne!(revised.operation_id, named.operation_id);
    let bad = Intent::new(
        "acme",
        run,
        Some(StepRef {
            step_id: String::new(),
            effect_version: 1,
        }),
        "send",
        &args,
        IntegerPolicy::Reject,
    );
    assert!(matches!(
        bad,
        Err(IntentError::TextLength {
            field: "step_id",
            ..
        })
    ));
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        (-(1i64 << 53)..=(1i64 << 53)).prop_map(|n| json!(n)),
        (-1e12f64..1e12).prop_map(|f| json!(f)),
        "[a-zA-Z0-9 é😀\\\\\"\\n]{0,8}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::btree_map("[a-z]{1,4}", inner, 0..5)
                .prop_map(|map| Value::Object(map.into_iter().collect())),
        ]
    })
}

/// Writes `value` as JSON text with object keys reversed and extra
/// whitespace: the same value, spelled differently.
fn respell(value: &Value) -> String {
    match value {
        Value::Object(map) => {
            let members: Vec<String> = map
                .iter()
                .rev()
                .map(|(k, v)| format!(" {} :\n {} ", Value::String(k.clone()), respell(v)))
                .collect();
            format!("{{ {} }}", members.join(" , "))
        }
        Value::Array(items) => {
            format!(
                "[ {} ]",
                items.iter().map(respell).collect::<Vec<_>>().join(" ,\t")
            )
        }
        Value::Number(n) if n.is_i64() => format!("{n}.0"),
        other => other.to_string(),
    }
}

/// Changes one leaf of `value` (the `pick`-th, wrapping) to a different value.
fn mutate(value: &mut Value, pick: &mut usize) -> bool {
    match value {
        Value::Object(map) => map.values_mut().any(|v| mutate(v, pick)),
        Value::Array(items) => items.iter_mut().any(|v| mutate(v, pick)),
        leaf => {
            if *pick > 0 {
                *pick -= 1;
                return false;
            }
            *leaf = match leaf {
                Value::Null => json!(0),
                Value::Bool(b) => json!(!*b),
                Value::Number(n) => json!(n.as_f64().unwrap() + 1.0),
                Value::String(s) => json!(format!("{s}x")),
                _ => unreachable!(),
            };
            true
        }
    }
}

proptest! {
    #[test]
    fn digest_is_invariant_under_key_order_whitespace_and_number_spelling(value in json_value()) {
        let reparsed: Value = serde_json::from_str(&respell(&value)).unwrap();
        prop_assert_eq!(
            request_digest("tool", &value, IntegerPolicy::Reject).unwrap(),
            request_digest("tool", &reparsed, IntegerPolicy::Reject).unwrap()
        );
    }

    #[test]
    fn digest_changes_with_any_leaf_and_with_the_tool(value in json_value(), pick in 0usize..32) {
        let original = request_digest("tool", &value, IntegerPolicy::Reject).unwrap();
        prop_assert_ne!(&original, &request_digest("tool2", &value, IntegerPolicy::Reject).unwrap());
        let mut changed = value.clone();
        let mut index = pick;
        if !mutate(&mut changed, &mut index) {
            let mut first = 0;
            mutate(&mut changed, &mut first);
        }
        if changed != value {
            prop_assert_ne!(original, request_digest("tool", &changed, IntegerPolicy::Reject).unwrap());
        }
    }
}
