//! `init`'s rendering and heuristics, checked on tool lists like real servers'.

use super::adapter_file::words;
use super::*;
use crate::adapter::{Capability, RawAdapter};
use crate::config::{EnvValue, RawConfig};
use serde_json::json;

fn tool(name: &str, read_only: Option<bool>, schema: Value, description: &str) -> ToolSummary {
    ToolSummary {
        name: name.into(),
        description: Some(description.into()),
        read_only_hint: read_only,
        input_schema: schema,
        ..ToolSummary::default()
    }
}

fn payments() -> InitUpstream {
    InitUpstream {
        name: "payments".into(),
        transport: RawUpstream::Stdio {
            command: "pay-server".into(),
            args: vec!["--mode".into(), "a \"quoted\" arg".into()],
            env: Default::default(),
        },
        server: Some("pay 1.0".into()),
        tools: vec![
            tool(
                "charge",
                Some(false),
                json!({"type": "object", "properties": {
                    "amount": {"type": "integer"}, "currency": {"type": "string"},
                    "idempotency_key": {"type": "string"}}, "required": ["amount"]}),
                "Charge a card.\nHonours   idempotency_key.",
            ),
            tool(
                "get_charge",
                Some(true),
                json!({"type": "object", "properties": {"idempotency_key": {"type": "string"}},
                       "required": ["idempotency_key"]}),
                "Find a charge.",
            ),
            tool(
                "createBucket",
                None,
                json!({"type": "object", "properties": {
                    "name": {"type": "string"}, "region": {"type": "string"}},
                    "required": ["name"]}),
                &"A very long description. ".repeat(20),
            ),
            tool(
                "getBucket",
                Some(true),
                json!({"type": "object", "properties": {"name": {"type": "string"}},
                       "required": ["name"]}),
                "",
            ),
            tool(
                "weird tool.name",
                Some(false),
                json!({"type": "object", "properties": {"clientToken": {}}}),
                "bell\u{7}",
            ),
        ],
    }
}

fn adapter_of(text: &str) -> crate::adapter::Adapter {
    let raw: RawAdapter = toml::from_str(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    raw.validate().unwrap_or_else(|e| panic!("{e}\n{text}"))
}

#[test]
fn the_adapter_marks_read_only_tools_and_defaults_the_rest_to_none() {
    let text = render_adapter(&payments());
    let adapter = adapter_of(&text);
    assert_eq!(adapter.upstream, "payments");
    assert!(!adapter.trust_annotations);
    assert_eq!(adapter.tools.len(), 5);
    for read_only in ["get_charge", "getBucket"] {
        assert!(adapter.tools[read_only].read_only, "{read_only}");
    }
    for side_effecting in ["charge", "createBucket", "weird tool.name"] {
        let tool = &adapter.tools[side_effecting];
        assert!(!tool.read_only, "{side_effecting}");
        assert_eq!(tool.capability, Capability::None, "{side_effecting}");
    }
    assert!(text.contains("That is its claim, not a proof"), "{text}");
    // The description on one line.
    assert!(
        text.contains("[tools.charge]\n# Charge a card. Honours idempotency_key.\n"),
        "{text}"
    );
    // Long descriptions are cut, control characters dropped.
    assert!(text.contains("A very long description. A very"), "{text}");
    assert!(text.contains("…\n"), "{text}");
    assert!(!text.contains('\u{7}'), "{text}");
    assert!(text.contains("[tools.\"weird tool.name\"]"), "{text}");
}

#[test]
fn an_obvious_key_argument_is_recognised_and_prefilled() {
    let upstream = payments();
    assert_eq!(key_argument(&upstream.tools[0]), Some("idempotency_key"));
    assert_eq!(key_argument(&upstream.tools[4]), Some("clientToken"));
    assert_eq!(key_argument(&upstream.tools[2]), None);
    let text = render_adapter(&upstream);
    assert!(
        text.contains("its argument \"idempotency_key\" looks like an idempotency key"),
        "{text}"
    );
    assert!(
        text.contains("# operation_id_argument = \"idempotency_key\""),
        "{text}"
    );
    assert!(
        text.contains("hides \"idempotency_key\" from the agent's tools/list"),
        "{text}"
    );
    // Uncommenting the suggestion gives a valid adapter.
    let section = text
        .split("[tools.charge]")
        .nth(1)
        .unwrap()
        .split("\n[tools.")
        .next()
        .unwrap();
    let suggestion: Vec<&str> = section
        .lines()
        .skip_while(|l| !l.starts_with("# capability = \"idempotency_key\""))
        .take(3)
        .map(|l| l.trim_start_matches("# "))
        .collect();
    let edited = format!(
        "upstream = \"payments\"\n[tools.charge]\n{}\n",
        suggestion.join("\n")
    );
    let tool = &adapter_of(&edited).tools["charge"];
    assert_eq!(tool.capability, Capability::IdempotencyKey);
    assert_eq!(
        tool.placement,
        crate::adapter::OperationIdPlacement::Argument("idempotency_key".into())
    );
}

#[test]
fn a_read_only_sibling_is_named_as_the_query_tool() {
    let upstream = payments();
    let names = |tool: &ToolSummary| -> Vec<String> {
        query_candidates(tool, &upstream.tools)
            .iter()
            .map(|t| t.name.clone())
            .collect()
    };
    assert_eq!(names(&upstream.tools[0]), ["get_charge"]);
    assert_eq!(names(&upstream.tools[2]), ["getBucket"]);
    assert!(names(&upstream.tools[4]).is_empty());
    let text = render_adapter(&upstream);
    assert!(
        text.contains("# A query_tool candidate: getBucket (read-only)."),
        "{text}"
    );
    // The resource_id suggestion asks by the shared required argument.
    let section = text.split("[tools.createBucket]").nth(1).unwrap();
    let section = section.split("\n[tools.").next().unwrap();
    assert!(
        section.contains("# resource_id_pointer = \"/name\""),
        "{section}"
    );
    assert!(
        section.contains("# query_tool = \"getBucket\""),
        "{section}"
    );
    assert!(section.contains("# query_argument = \"name\""), "{section}");
    assert!(
        section.contains("# match_fields = [\"region\"]"),
        "{section}"
    );
    let suggestion: Vec<&str> = section
        .lines()
        .skip_while(|l| !l.starts_with("# capability = \"resource_id\""))
        .take(5)
        .map(|l| l.trim_start_matches("# "))
        .collect();
    let edited = format!(
        "upstream = \"payments\"\n[tools.createBucket]\n{}\n",
        suggestion.join("\n")
    );
    let tool = &adapter_of(&edited).tools["createBucket"];
    assert_eq!(tool.capability, Capability::ResourceId);
    assert_eq!(tool.query.as_ref().unwrap().tool, "getBucket");
}

#[test]
fn the_config_names_every_upstream_and_parses() {
    let mut http = payments();
    http.name = "api".into();
    http.transport = RawUpstream::StreamableHttp {
        url: "http://127.0.0.1:9000/mcp".into(),
    };
    let text = render_config(&[payments(), http]);
    let raw: RawConfig = toml::from_str(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    // No database_url: the default server, else the private PostgreSQL.
    assert_eq!(raw.database_url, None);
    assert!(text.contains(&format!("# database_url = \"{DEFAULT_DATABASE_URL}\"")));
    assert_eq!(raw.tenant.as_deref(), Some("default"));
    assert_eq!(raw.listen.as_deref(), Some(DEFAULT_LISTEN));
    assert_eq!(raw.adapters.as_deref(), Some("adapters"));
    assert_eq!(raw.policy.as_deref(), Some("policies/default.toml"));
    assert_eq!(raw.upstreams["payments"], payments().transport);
    assert_eq!(
        raw.upstreams["api"],
        RawUpstream::StreamableHttp {
            url: "http://127.0.0.1:9000/mcp".into()
        }
    );
    let files = render(&[payments()]);
    let paths: Vec<_> = files.iter().map(|f| f.path.clone()).collect();
    assert_eq!(
        paths,
        [
            PathBuf::from("leasegate.toml"),
            PathBuf::from("policies/default.toml"),
            PathBuf::from("adapters/payments.toml")
        ]
    );
    crate::policy::RawPolicy::validate(&toml::from_str(&files[1].contents).unwrap()).unwrap();
}

#[test]
fn written_files_load_and_are_not_overwritten_without_force() {
    let dir = std::env::temp_dir().join(format!("leasegate-init-{}", uuid::Uuid::new_v4()));
    let files = render(&[payments()]);
    write_files(&dir, &files, false).unwrap();
    let config = crate::config::Config::load(&dir.join("leasegate.toml")).unwrap();
    assert_eq!(config.adapters["payments"].tools.len(), 5);
    match write_files(&dir, &files, false) {
        Err(InitError::WouldOverwrite(paths)) => assert_eq!(paths.len(), 3),
        other => panic!("{other:?}"),
    }
    write_files(&dir, &files, true).unwrap();
    // Another upstream's adapter in the way.
    let mut other = payments();
    other.name = "other".into();
    let message = write_files(&dir, &render(&[other]), true)
        .unwrap_err()
        .to_string();
    assert!(message.contains("adapters/payments.toml"), "{message}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn names_and_words() {
    assert!(invalid_upstream_name("files").is_none());
    assert!(invalid_upstream_name("my-api_2").is_none());
    assert!(invalid_upstream_name("").is_some());
    assert!(invalid_upstream_name("a__b").is_some());
    assert!(invalid_upstream_name("a/b").is_some());
    assert_eq!(words("createBucket"), ["create", "bucket"]);
    assert_eq!(words("get_bucket-status"), ["get", "bucket", "status"]);
    assert_eq!(words("HTTPGet"), ["httpget"]);
    assert_eq!(quote("a\"b\\c\u{1}"), "\"a\\\"b\\\\c\\u0001\"");
    assert_eq!(key("a.b"), "\"a.b\"");
}

/// Adding upstreams keeps the file's text, replaces a table of the same
/// name with its sub-tables, and writes secrets as references.
#[test]
fn upstreams_are_added_to_a_config_and_replace_their_namesakes() {
    let existing = "# mine\nlisten = \"127.0.0.1:9000\"\n\n[upstreams.payments]\ntransport = \"stdio\"\ncommand = \"old\"\n\n[upstreams.payments.env]\nA = \"1\"\n\n[upstreams.mail]\ntransport = \"streamable_http\"\nurl = \"http://127.0.0.1:1/mcp\"\n";
    assert_eq!(upstream_names(existing), ["payments", "mail"]);
    let mut new = payments();
    if let RawUpstream::Stdio { env, .. } = &mut new.transport {
        env.insert("API_KEY".into(), EnvValue::from_env("API_KEY"));
    }
    let text = with_upstreams(existing, &[new]);
    assert!(
        text.starts_with("# mine\nlisten = \"127.0.0.1:9000\"\n"),
        "{text}"
    );
    assert!(
        !text.contains("command = \"old\"") && !text.contains("A = \"1\""),
        "{text}"
    );
    let raw: RawConfig = toml::from_str(&text).unwrap();
    assert_eq!(raw.upstreams.len(), 2, "{text}");
    let RawUpstream::Stdio { command, env, .. } = &raw.upstreams["payments"] else {
        panic!("{text}");
    };
    assert_eq!(command, "pay-server");
    assert_eq!(env["API_KEY"], EnvValue::from_env("API_KEY"));
    assert!(looks_secret("GITHUB_TOKEN") && looks_secret("api_key") && looks_secret("DB_PASSWORD"));
    assert!(!looks_secret("LOG_LEVEL"));
}

#[test]
fn an_env_reference_reads_leasegates_environment_when_resolved() {
    let raw: RawUpstream = toml::from_str(
        "transport = \"stdio\"\ncommand = \"x\"\nenv = { HOME_SEEN = { from_env = \"PATH\" }, MISSING = { from_env = \"LEASEGATE_TEST_UNSET_VARIABLE\" }, PLAIN = \"v\" }\n",
    )
    .unwrap();
    let RawUpstream::Stdio { env, .. } = raw else {
        panic!("stdio");
    };
    assert_eq!(
        env["HOME_SEEN"].resolve().unwrap(),
        std::env::var("PATH").unwrap()
    );
    assert_eq!(env["PLAIN"].resolve().unwrap(), "v");
    let why = env["MISSING"].resolve().unwrap_err();
    assert!(
        why.contains("LEASEGATE_TEST_UNSET_VARIABLE is not set"),
        "{why}"
    );
    let refused = toml::from_str::<RawUpstream>(
        "transport = \"stdio\"\ncommand = \"x\"\nenv = { A = { form_env = \"B\" } }\n",
    )
    .unwrap_err()
    .to_string();
    assert!(refused.contains("from_env"), "{refused}");
}
