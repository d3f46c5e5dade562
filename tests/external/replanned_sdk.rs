//! The official MCP Python SDK in its default settings but for a 3 s read
//! timeout, as an agent whose model re-plans a call that timed out
//! (`tests/sdk/replanned.py`), against leasegate in lease mode `session`
//! over Streamable HTTP and over stdio, with the example tools: the key
//! argument leasegate fills is not in the schema the SDK lists; the
//! identical retry and the re-planned call are each answered before the
//! SDK gives up; the re-planned call is not sent but shown the first call
//! and its fate; calling it again sends it; 16 parallel distinct calls of
//! a connected agent are all sent. Effects are counted in the tool's own
//! records.

use crate::common;

use common::TestDb;
use common::proxy::{LEASEGATE, RunningProxy, Scenario};
use leasegate::mcp::convert::{SHOWN_META, UNDELIVERED_KEY, codes};
use serde_json::{Value, json};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/sdk/replanned.py");

/// Runs the script against `server` (a URL, or `stdio` with the command);
/// its JSON lines by step.
async fn agent(server: &str, stdio_command: &[String], task: &str) -> Vec<Value> {
    let mut command = tokio::process::Command::new(common::peers::python());
    command
        .arg(SCRIPT)
        .args(["--server", server, "--task", task])
        .args([
            "--stdio-command",
            &serde_json::to_string(stdio_command).unwrap(),
        ])
        .kill_on_drop(true);
    let output = tokio::time::timeout(std::time::Duration::from_secs(120), command.output())
        .await
        .expect("the agent finishes within two minutes")
        .expect("python runs");
    assert!(
        output.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        common::peers::stderr_tail(&output)
    );
    common::peers::json_lines(&output)
}

fn step<'a>(lines: &'a [Value], name: &str) -> &'a Value {
    lines
        .iter()
        .find(|line| line["step"] == name)
        .unwrap_or_else(|| panic!("no step {name}: {lines:?}"))
}

/// What every front must show: see the module docs.
fn judge(front: &str, lines: &[Value], scenario: &Scenario) {
    let properties = &step(lines, "charge_schema")["properties"];
    assert_eq!(
        properties,
        &json!(["amount", "currency", "hang_ms"]),
        "{front}"
    );
    let first = step(lines, "first");
    assert!(
        first.get("timed_out").is_some() || first.get("error").is_some(),
        "{front}: {first}"
    );
    // Answered before the SDK's own timeout: in flight, or its fate.
    let identical = step(lines, "identical");
    assert!(identical.get("timed_out").is_none(), "{front}: {identical}");
    let in_flight = identical["error"]["code"] == codes::IN_PROGRESS;
    let unknown = identical["result"]["structuredContent"]["status"] == "unknown";
    assert!(in_flight || unknown, "{front}: {identical}");
    // The re-planned call: nothing sent, the first call and its fate shown.
    let replanned = &step(lines, "replanned")["result"];
    assert_eq!(replanned["isError"], true, "{front}: {replanned}");
    assert_eq!(
        replanned["_meta"][SHOWN_META]["sent"], false,
        "{front}: {replanned}"
    );
    let shown = &replanned["structuredContent"][UNDELIVERED_KEY][0];
    assert_eq!(
        shown["arguments"]["body"], "Your receipt.",
        "{front}: {replanned}"
    );
    assert!(
        ["dispatching", "unknown", "succeeded"].contains(&shown["status"].as_str().unwrap()),
        "{front}: {replanned}"
    );
    let text = replanned["content"][0]["text"].as_str().unwrap();
    assert!(
        text.starts_with("[leasegate] nothing was sent."),
        "{front}: {text}"
    );
    let receipts = |scenario: &Scenario| {
        scenario
            .side_effects("emails.jsonl")
            .iter()
            .filter(|email| email["to"] == "ann@example.com")
            .count()
    };
    // Calling again sends it: the first e-mail and this one.
    let again = &step(lines, "replanned_again")["result"];
    assert_eq!(
        again["_meta"]["dev.leasegate/operation"]["replayed"], false,
        "{front}: {again}"
    );
    assert_eq!(receipts(scenario), 2, "{front}");
    // Parallel distinct calls of a connected agent: all sent, none held.
    let parallel = step(lines, "parallel")["answers"].as_array().unwrap();
    for answer in parallel {
        assert_eq!(
            answer["result"]["_meta"]["dev.leasegate/operation"]["status"], "succeeded",
            "{front}: {answer}"
        );
    }
    let hello = scenario
        .side_effects("emails.jsonl")
        .iter()
        .filter(|email| email["subject"] == "Hello")
        .count();
    assert_eq!(hello, 16, "{front}");
}

fn session_scenario(db: &TestDb) -> Scenario {
    let mailer = "upstream = \"mailer\"\ntrust_annotations = true\ntimeout = \"30s\"\n\
                  [tools.send_email]\ncapability = \"none\"\n";
    let scenario = Scenario::with_adapters(
        &db.url,
        "claim_ttl = \"60s\"\n",
        common::proxy::PAYMENTS_ADAPTER,
        mailer,
    );
    scenario.prepend_config("lease_mode = \"session\"");
    scenario
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn a_re_planned_call_after_an_sdk_timeout_is_shown_the_first_over_http(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let scenario = session_scenario(&db);
    let proxy = RunningProxy::start(&scenario.config_path()).await;
    let lines = agent(&proxy.url, &[], "receipt-http").await;
    judge("http", &lines, &scenario);
    proxy.stop().await;
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn a_re_planned_call_after_an_sdk_timeout_is_shown_the_first_over_stdio(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let scenario = session_scenario(&db);
    let command = vec![
        LEASEGATE.to_owned(),
        "stdio".to_owned(),
        "--config".to_owned(),
        scenario.config_path().display().to_string(),
        "--task".to_owned(),
        "receipt-stdio".to_owned(),
    ];
    let lines = agent("stdio", &command, "receipt-stdio").await;
    judge("stdio", &lines, &scenario);
}
