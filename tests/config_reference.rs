//! `docs/configuration.md` lists exactly the fields the parser accepts.
//!
//! The parser itself says which fields it accepts: every file type is
//! parsed with unknown fields refused, and serde's refusal of an unknown
//! field names all the expected ones. Each `<!-- fields: NAME -->` table of
//! the reference must list exactly those.

use std::collections::BTreeSet;

use leasegate::adapter::RawAdapter;
use leasegate::config::RawConfig;
use leasegate::policy::RawPolicy;

const PROBE: &str = "zz_not_a_field";

/// The fields serde expects, from its "unknown field" refusal of `text`.
fn accepted<T: serde::de::DeserializeOwned>(text: &str) -> BTreeSet<String> {
    let error = match toml::from_str::<T>(text) {
        Ok(_) => panic!("{text:?} was accepted"),
        Err(error) => error.to_string(),
    };
    assert!(
        error.contains(&format!("unknown field `{PROBE}`")),
        "{text:?}: {error}"
    );
    let expected = error
        .split("expected one of ")
        .nth(1)
        .or_else(|| error.split("expected ").nth(1))
        .unwrap_or_else(|| panic!("no expected fields in {error}"));
    // "`a`, `b`, `c`", "`a` or `b`", or "`a`": every quoted name.
    let expected = expected.lines().next().unwrap_or(expected);
    expected
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

/// The first column of the table after `<!-- fields: name -->`.
fn documented(reference: &str, name: &str) -> BTreeSet<String> {
    let marker = format!("<!-- fields: {name} -->");
    let start = reference
        .find(&marker)
        .unwrap_or_else(|| panic!("docs/configuration.md has no {marker}"));
    reference[start + marker.len()..]
        .lines()
        .skip_while(|line| line.trim().is_empty())
        .take_while(|line| line.starts_with('|'))
        .skip(2)
        .filter_map(|line| line.split('`').nth(1))
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_configuration_reference_lists_exactly_the_accepted_fields() {
    let reference = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docs/configuration.md"
    ))
    .unwrap();
    let with_transport = |mut fields: BTreeSet<String>| {
        // The tag is read before the variant's fields.
        fields.insert("transport".to_owned());
        fields
    };
    let cases = [
        ("config", accepted::<RawConfig>(&format!("{PROBE} = 1"))),
        (
            "session",
            accepted::<RawConfig>(&format!("[session]\n{PROBE} = 1")),
        ),
        (
            "idempotency",
            accepted::<RawConfig>(&format!("[idempotency]\n{PROBE} = 1")),
        ),
        (
            "auth",
            accepted::<RawConfig>(&format!("[auth]\n{PROBE} = 1")),
        ),
        (
            "jwt",
            accepted::<RawConfig>(&format!("[auth.jwt]\n{PROBE} = 1")),
        ),
        (
            "limits",
            accepted::<RawConfig>(&format!("[limits]\n{PROBE} = 1")),
        ),
        (
            "telemetry",
            accepted::<RawConfig>(&format!("[telemetry]\n{PROBE} = 1")),
        ),
        (
            "stdio",
            with_transport(accepted::<RawConfig>(&format!(
                "[upstreams.a]\ntransport = \"stdio\"\ncommand = \"x\"\n{PROBE} = 1"
            ))),
        ),
        (
            "streamable_http",
            with_transport(accepted::<RawConfig>(&format!(
                "[upstreams.a]\ntransport = \"streamable_http\"\nurl = \"http://x\"\n{PROBE} = 1"
            ))),
        ),
        (
            "adapter",
            accepted::<RawAdapter>(&format!("upstream = \"a\"\n{PROBE} = 1")),
        ),
        (
            "tool",
            accepted::<RawAdapter>(&format!("upstream = \"a\"\n[tools.t]\n{PROBE} = 1")),
        ),
        (
            "not_done",
            accepted::<RawAdapter>(&format!(
                "upstream = \"a\"\n[tools.t]\nnot_done_errors = [{{ {PROBE} = 1 }}]"
            )),
        ),
        ("policy", accepted::<RawPolicy>(&format!("{PROBE} = 1"))),
    ];
    for (name, parsed) in cases {
        assert!(!parsed.is_empty(), "{name}: {parsed:?}");
        let written = documented(&reference, name);
        let missing: Vec<_> = parsed.difference(&written).collect();
        let stale: Vec<_> = written.difference(&parsed).collect();
        assert!(
            missing.is_empty() && stale.is_empty(),
            "docs/configuration.md, table {name}: not documented {missing:?}, not accepted {stale:?}"
        );
    }
}
