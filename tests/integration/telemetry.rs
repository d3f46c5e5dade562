//! Traces (src/telemetry.rs): one gated call through a real proxy, ledger
//! and stdio tool server, with leasegate's spans captured by an in-memory
//! OpenTelemetry exporter installed the way `main` installs the OTLP one
//! (`Tracing::layer`).
//!
//! One test per binary: the tracing subscriber is process-wide.

use crate::common;
use crate::common::proxy::charge_eur;

use std::sync::OnceLock;

use common::proxy::{RunningProxy, connect_http, connect_http_with, operation_note};
use common::{TestDb, wait_until};
use leasegate::intent::OperationId;
use leasegate::ledger::OperationStatus;
use leasegate::telemetry::{Settings, Tracing};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SpanData};
use serde_json::{Value, json};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use tracing_subscriber::layer::SubscriberExt as _;

/// The exporter behind the process-wide subscriber.
fn exporter() -> &'static InMemorySpanExporter {
    static EXPORTER: OnceLock<InMemorySpanExporter> = OnceLock::new();
    EXPORTER.get_or_init(|| {
        let exporter = InMemorySpanExporter::default();
        let traces = Tracing::with_exporter(exporter.clone(), &Settings::default());
        let subscriber = tracing_subscriber::registry().with(traces.layer());
        tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");
        // The provider lives as long as the process.
        std::mem::forget(traces);
        exporter
    })
}

fn attribute(span: &SpanData, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| kv.value.as_str().into_owned())
}

fn spans_of_trace(trace_id: &str) -> Vec<SpanData> {
    exporter()
        .get_finished_spans()
        .unwrap()
        .into_iter()
        .filter(|span| span.span_context.trace_id().to_string() == trace_id)
        .collect()
}

/// The one span named `name` whose parent is `parent` (a span id in hex).
fn child<'a>(spans: &'a [SpanData], name: &str, parent: &str) -> &'a SpanData {
    let found: Vec<_> = spans
        .iter()
        .filter(|s| s.name == name && s.parent_span_id.to_string() == parent)
        .collect();
    assert_eq!(
        found.len(),
        1,
        "one {name} under {parent}; spans: {:#?}",
        spans
            .iter()
            .map(|s| (
                s.name.to_string(),
                s.span_context.span_id().to_string(),
                s.parent_span_id.to_string()
            ))
            .collect::<Vec<_>>()
    );
    found[0]
}

fn span_id(span: &SpanData) -> String {
    span.span_context.span_id().to_string()
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn one_trace_spans_agent_leasegate_and_tool(pool: PgPoolOptions, connect: PgConnectOptions) {
    let exporter = exporter();
    let db = TestDb::new(pool, connect).await;
    let (scenario, proxy) = RunningProxy::serve(&db.url, "claim_ttl = \"60s\"\n").await;
    let (lease, _) = db.running_run("agent-1", 60_000).await;
    let (agent, _) = connect_http(&proxy.url, Some(&lease)).await;

    // The agent's trace context in `_meta`.
    let agent_trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let agent_span = "00f067aa0ba902b7";
    let mut meta = serde_json::Map::new();
    meta.insert(
        "traceparent".into(),
        json!(format!("00-{agent_trace}-{agent_span}-01")),
    );
    meta.insert("tracestate".into(), json!("vendor=abc"));
    let answer = charge_eur(&agent, 700, Some(meta)).await.unwrap();
    let operation_id = operation_note(&answer)["operation_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let view = db
        .ledger
        .operation_get(&OperationId::from_string(operation_id.clone()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(view.operation.status, OperationStatus::Succeeded);
    assert_eq!(scenario.side_effects("charges.jsonl").len(), 1);

    // The call's spans: all five end around the answer; wait for them.
    let spans = wait_until("the call's spans are exported", || async {
        let spans = spans_of_trace(agent_trace);
        let names: Vec<_> = spans.iter().map(|s| s.name.to_string()).collect();
        [
            "tools/call",
            "ledger.operation_register_claim",
            "dispatch",
            "upstream.attempt",
            "ledger.operation_settle",
        ]
        .iter()
        .all(|name| names.iter().any(|n| n == name))
        .then_some(spans)
    })
    .await;
    let front = child(&spans, "tools/call", agent_span);
    assert!(
        front.parent_span_is_remote,
        "the agent's span is the parent"
    );
    assert_eq!(
        attribute(front, "run_id").as_deref(),
        Some(lease.run_id.to_string().as_str())
    );
    assert_eq!(attribute(front, "epoch").as_deref(), Some("1"));
    assert_eq!(
        attribute(front, "tool").as_deref(),
        Some("payments__charge")
    );
    assert_eq!(
        attribute(front, "operation_id").as_deref(),
        Some(operation_id.as_str())
    );
    assert_eq!(attribute(front, "outcome").as_deref(), Some("succeeded"));
    child(&spans, "ledger.operation_register_claim", &span_id(front));
    let dispatch = child(&spans, "dispatch", &span_id(front));
    assert_eq!(
        attribute(dispatch, "operation_id").as_deref(),
        Some(operation_id.as_str())
    );
    assert_eq!(attribute(dispatch, "tool").as_deref(), Some("charge"));
    assert_eq!(attribute(dispatch, "outcome").as_deref(), Some("succeeded"));
    let attempt = child(&spans, "upstream.attempt", &span_id(dispatch));
    assert_eq!(attribute(attempt, "attempt").as_deref(), Some("1"));
    assert_eq!(attribute(attempt, "outcome").as_deref(), Some("answered"));
    let settle = child(&spans, "ledger.operation_settle", &span_id(dispatch));
    assert_eq!(
        attribute(settle, "settlement").as_deref(),
        Some("succeeded")
    );
    // Only leasegate's own spans leave the process (no rmcp, sqlx, hyper).
    for span in &spans {
        assert_eq!(
            span.instrumentation_scope.name(),
            "leasegate",
            "{}",
            span.name
        );
        let target = attribute(span, "target").unwrap_or_default();
        assert!(
            target.is_empty() || target.starts_with("leasegate"),
            "{}: target {target}",
            span.name
        );
    }

    // The tool saw the upstream attempt as its parent, in the agent's trace.
    let calls = scenario.side_effects("calls.jsonl");
    let sent = calls
        .iter()
        .find(|c| c["tool"] == "charge")
        .expect("the tool recorded the call");
    assert_eq!(
        sent["traceparent"],
        Value::String(format!("00-{agent_trace}-{}-01", span_id(attempt))),
        "the upstream's parent is the upstream attempt"
    );

    // A trace context in the HTTP headers (no `_meta`) is the parent as well.
    let header_trace = "0af7651916cd43dd8448eb211c80319c";
    let header_span = "b7ad6b7169203331";
    let token = lease.token.as_ref().unwrap().expose().to_owned();
    let run = lease.run_id.to_string();
    let traceparent = format!("00-{header_trace}-{header_span}-01");
    let by_headers = connect_http_with(
        &proxy.url,
        &[
            ("leasegate-run-id", run.as_str()),
            ("leasegate-owner", "agent-1"),
            ("leasegate-epoch", "1"),
            ("leasegate-lease-token", token.as_str()),
            ("traceparent", traceparent.as_str()),
        ],
    )
    .await;
    charge_eur(&by_headers, 900, None).await.unwrap();
    let spans = wait_until("the second call's spans are exported", || async {
        let spans = spans_of_trace(header_trace);
        spans
            .iter()
            .any(|s| s.name == "upstream.attempt")
            .then_some(spans)
    })
    .await;
    let front = child(&spans, "tools/call", header_span);
    let dispatch = child(&spans, "dispatch", &span_id(front));
    let attempt = child(&spans, "upstream.attempt", &span_id(dispatch));
    let calls = scenario.side_effects("calls.jsonl");
    assert!(
        calls.iter().any(|c| c["tool"] == "charge"
            && c["traceparent"] == format!("00-{header_trace}-{}-01", span_id(attempt))),
        "the tool joined the header's trace: {calls:?}"
    );
    assert_eq!(scenario.side_effects("charges.jsonl").len(), 2);

    // The background loops' activations are spans of their own.
    wait_until("a background pass is exported", || async {
        exporter
            .get_finished_spans()
            .unwrap()
            .iter()
            .any(|s| s.name == "background.pass" && attribute(s, "loop").is_some())
            .then_some(())
    })
    .await;
    proxy.stop().await;
}

/// A JSON log's records: every line but the startup banners (plain
/// `leasegate: …` lines) must be one JSON object.
fn json_records(lines: &[String]) -> Vec<Value> {
    lines
        .iter()
        .filter(|line| !line.starts_with("leasegate: "))
        .map(|line| {
            serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("not one JSON object per line ({e}): {line}"))
        })
        .collect()
}

/// A stdio upstream that writes to its stderr (as most servers do at start
/// and on errors) does not break the JSON log: each of its lines becomes a
/// record of its own naming the upstream, and every record leasegate
/// writes is one JSON object per line (the startup banners, plain
/// `leasegate: …` lines, aside) — also under load, with both upstreams
/// logging every message they handle while gated and read-only calls run
/// concurrently.
#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn an_upstreams_stderr_becomes_log_records_of_its_own(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let scenario = common::proxy::Scenario::new(&db.url, "");
    let config = std::fs::read_to_string(scenario.config_path()).unwrap();
    // The mailer, started by a script that first talks on stderr.
    let script = scenario.dir.join("chatty-mailer.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nprintf 'chatty {{\"not\": json\\nsecond line\\n' >&2\nexec {} --tools mailer --state-dir {}\n",
            common::proxy::EXAMPLE_TOOLS,
            scenario.dir.join("state").display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    // Both upstreams log each message they handle (rmcp at debug, with
    // bodies): many lines, some of them JSON-like, while calls run.
    let talkative = "env = { RUST_LOG = \"debug\", LEASEGATE_LOG_BODIES = \"1\" }";
    let chatty = format!("command = \"{}\"\nargs = []\n{talkative}", script.display());
    let mailer = format!(
        "command = \"{}\"\nargs = [\"--tools\", \"mailer\", \"--state-dir\", \"{}\"]",
        common::proxy::EXAMPLE_TOOLS,
        scenario.dir.join("state").display()
    );
    let payments = format!(
        "args = [\"--tools\", \"payments\", \"--state-dir\", \"{}\"]",
        scenario.dir.join("state").display()
    );
    let config = common::replace_exactly(&config, &mailer, &chatty);
    let config = common::replace_exactly(&config, &payments, &format!("{payments}\n{talkative}"));
    std::fs::write(scenario.config_path(), config).unwrap();
    let served = common::proxy::ServedChild::spawn(common::proxy::ServedChild::command(
        &scenario,
        &[("LEASEGATE_LOG_FORMAT", "json")],
    ))
    .await;
    let records = wait_until("the upstream's stderr lines as records", || async {
        let chatty: Vec<Value> = json_records(&served.log.lock().unwrap())
            .into_iter()
            .filter(|r| r["target"] == "leasegate::upstream_stderr")
            .collect();
        (chatty.len() >= 2).then_some(chatty)
    })
    .await;
    assert_eq!(records[0]["upstream"], "mailer", "{records:?}");
    assert_eq!(records[0]["line"], "chatty {\"not\": json", "{records:?}");
    assert_eq!(records[1]["line"], "second line", "{records:?}");

    // Under load: 24 gated charges and 24 read-only reads at once.
    let (lease, _) = db.running_run("busy-agent", 60_000).await;
    let (agent, _) = connect_http(&served.mcp, None).await;
    let meta = common::proxy::lease_meta(&lease);
    let charges = (1..=24).map(|amount| charge_eur(&agent, amount, Some(meta.clone())));
    let reads = (1..=24).map(|n| {
        common::proxy::call(
            &agent,
            "payments__get_charge",
            json!({"idempotency_key": format!("none-{n}")}),
            None,
        )
    });
    let (charged, read) = tokio::join!(
        futures::future::join_all(charges),
        futures::future::join_all(reads)
    );
    assert!(charged.iter().all(Result::is_ok), "{charged:?}");
    assert!(read.iter().all(Result::is_ok), "{read:?}");
    // Every line parses (`json_records` fails the test on one that does
    // not): the 24 gated calls' lines and the upstreams' own among them.
    let (gated, upstream) = wait_until("a gated call line for each charge", || async {
        let records = json_records(&served.log.lock().unwrap());
        let gated = records
            .iter()
            .filter(|r| r["message"] == "gated call")
            .count();
        let upstream: Vec<String> = records
            .iter()
            .filter(|r| r["target"] == "leasegate::upstream_stderr")
            .map(|r| r["upstream"].as_str().unwrap_or_default().to_owned())
            .collect();
        (gated >= 24).then_some((gated, upstream))
    })
    .await;
    assert_eq!(gated, 24);
    for name in ["payments", "mailer"] {
        assert!(
            upstream.iter().filter(|u| *u == name).count() >= 2,
            "{name} logged too little to test anything: {upstream:?}"
        );
    }
    assert!(
        upstream.iter().filter(|u| *u == "payments").count() >= 48,
        "the payments upstream logs each call it handles: {upstream:?}"
    );
    json_records(&served.log.lock().unwrap());
}

/// Every side-effecting call logs exactly one `gated call` line at info
/// naming its operation, run, step, tool, outcome, whether it was replayed
/// and how long it took (a call refused for want of a lease: its tool and
/// why); a read-only call logs none at info.
#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn every_gated_call_logs_one_line_naming_its_operation(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let scenario = common::proxy::Scenario::new(&db.url, "");
    let served = common::proxy::ServedChild::spawn(common::proxy::ServedChild::command(
        &scenario,
        &[("LEASEGATE_LOG_FORMAT", "json")],
    ))
    .await;
    let (lease, _) = db.running_run("logged-agent", 60_000).await;
    let (agent, _) = connect_http(&served.mcp, None).await;
    let mut meta = common::proxy::lease_meta(&lease);
    meta.insert(
        "dev.leasegate/step".into(),
        json!({"step_id": "charge-once", "effect_version": 1}),
    );
    let charged = charge_eur(&agent, 5, Some(meta.clone())).await.unwrap();
    charge_eur(&agent, 5, Some(meta)).await.unwrap();
    let (code, _) = charge_eur(&agent, 6, None).await.unwrap_err();
    assert_eq!(code, -31001);
    let operation_id = operation_note(&charged)["operation_id"]
        .as_str()
        .unwrap()
        .to_owned();
    common::proxy::call(
        &agent,
        "payments__get_charge",
        json!({"idempotency_key": operation_id}),
        None,
    )
    .await
    .unwrap();
    let gated_lines = || {
        json_records(&served.log.lock().unwrap())
            .into_iter()
            .filter(|record| record["message"] == "gated call")
            .collect::<Vec<Value>>()
    };
    let lines = wait_until("a gated call line for each charge", || async {
        let lines = gated_lines();
        (lines.len() >= 3).then_some(lines)
    })
    .await;
    assert_eq!(lines.len(), 3, "{lines:#?}");
    for (line, replayed) in lines.iter().zip(["false", "true"]) {
        assert_eq!(line["level"], "INFO", "{line}");
        assert_eq!(line["operation_id"], operation_id.as_str(), "{line}");
        assert_eq!(line["run_id"], lease.run_id.to_string().as_str(), "{line}");
        assert_eq!(line["step_id"], "charge-once", "{line}");
        assert_eq!(line["tool"], "payments__charge", "{line}");
        assert_eq!(line["outcome"], "succeeded", "{line}");
        assert_eq!(line["replayed"], replayed, "{line}");
        assert!(line["duration_ms"].is_u64(), "{line}");
    }
    // Refused before a lease carried it: no run, no operation, the reason.
    let refused = &lines[2];
    assert_eq!(refused["level"], "INFO", "{refused}");
    assert_eq!(refused["tool"], "payments__charge", "{refused}");
    assert_eq!(refused["outcome"], "refused", "{refused}");
    assert_eq!(refused["detail"], "lease_missing", "{refused}");
    assert_eq!(refused["run_id"], "", "{refused}");
    assert_eq!(refused["operation_id"], "", "{refused}");
    assert!(refused["duration_ms"].is_u64(), "{refused}");
    // The read-only call was answered before this read: no line of its own.
    assert!(
        gated_lines()
            .iter()
            .all(|line| line["tool"] != "payments__get_charge"),
        "{lines:#?}"
    );
}
