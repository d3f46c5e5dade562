//! Lease mode `key`: an agent that sends a per-call idempotency key and no
//! lease — the `Idempotency-Key` HTTP header, the draft field
//! `params.idempotencyKey`, or `_meta["dev.leasegate/idempotency_key"]`.
//! Same key and same request replay; same key and another request is a
//! conflict; past the retention window the key is a new request.

use crate::common;

use common::proxy::{LEASEGATE, RunningProxy, Scenario, call, operation_note, tool_fields};
use common::{TestDb, http, wait_until, within};
use serde_json::{Value, json};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

fn key_mode(scenario: &Scenario, retention: &str) {
    scenario.surround_config(
        "lease_mode = \"key\"",
        &format!("[idempotency]\nretention = \"{retention}\"\n"),
    );
}

/// One JSON-RPC `tools/call` over plain HTTP; returns the parsed answer.
async fn post_call(url: &str, headers: &[(&str, &str)], params: Value) -> Value {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params});
    let answer = http::post_mcp(url, headers, &body.to_string()).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    serde_json::from_str(&answer.body).unwrap_or_else(|_| panic!("JSON: {}", answer.body))
}

fn note(answer: &Value) -> &Value {
    &answer["result"]["_meta"]["dev.leasegate/operation"]
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn a_key_replays_its_request_refuses_another_and_is_free_again_after_retention(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let scenario = Scenario::new(&db.url, "claim_ttl = \"10s\"\n");
    key_mode(&scenario, "2s");
    let proxy = RunningProxy::start(&scenario.config_path()).await;
    let charge = json!({"name": "payments__charge", "arguments": {"amount": 5, "currency": "eur"}});

    // The Idempotency-Key header, twice: one charge, then the replay.
    let first = post_call(
        &proxy.url,
        &[("idempotency-key", "order-17")],
        charge.clone(),
    )
    .await;
    assert_eq!(note(&first)["status"], "succeeded", "{first}");
    assert_eq!(note(&first)["replayed"], false);
    let again = post_call(
        &proxy.url,
        &[("idempotency-key", "order-17")],
        charge.clone(),
    )
    .await;
    assert_eq!(note(&again)["replayed"], true, "{again}");
    assert_eq!(
        tool_fields(Some(&again["result"]["structuredContent"])),
        Some(first["result"]["structuredContent"].clone())
    );
    assert!(
        again["result"]["structuredContent"][leasegate::mcp::convert::OUTCOME_KEY]
            .as_str()
            .is_some_and(|s| s.starts_with("[leasegate] replayed")),
        "{again}"
    );
    // The draft field params.idempotencyKey names the same key.
    let mut drafted = charge.clone();
    drafted["idempotencyKey"] = json!("order-17");
    let drafted = post_call(&proxy.url, &[], drafted).await;
    assert_eq!(note(&drafted)["replayed"], true, "{drafted}");
    assert_eq!(scenario.side_effects("charges.jsonl").len(), 1);

    // The same key with another request is refused and writes nothing.
    let other = post_call(
        &proxy.url,
        &[("idempotency-key", "order-17")],
        json!({"name": "payments__charge", "arguments": {"amount": 6, "currency": "eur"}}),
    )
    .await;
    assert_eq!(other["error"]["code"], -31003, "{other}");
    let operations = db.row_count("tool_operations").await;
    assert_eq!(operations, 1);
    assert_eq!(scenario.side_effects("charges.jsonl").len(), 1);

    // Without a key (and without a lease) the call needs one, and says how.
    let bare = post_call(&proxy.url, &[], charge.clone()).await;
    assert!(
        common::http::rpc_error_message(&bare, -31001, "").contains("Idempotency-Key"),
        "{bare}"
    );

    // Past the retention window the key is a new request: a new run, a new
    // charge, and the old run is cancelled (kept for audit).
    let created: chrono::DateTime<chrono::Utc> =
        db.query_scalar("SELECT created_at FROM agent_runs").await;
    wait_until("the retention window to pass", || async {
        (chrono::Utc::now() > created + chrono::Duration::seconds(2)).then_some(())
    })
    .await;
    let later = post_call(&proxy.url, &[("idempotency-key", "order-17")], charge).await;
    assert_eq!(note(&later)["replayed"], false, "{later}");
    assert_eq!(scenario.side_effects("charges.jsonl").len(), 2);
    let runs: Vec<(String, i32)> = db
        .query_rows("SELECT status, attempt FROM agent_runs ORDER BY attempt")
        .await;
    assert_eq!(
        runs,
        vec![("cancelled".to_owned(), 1), ("running".to_owned(), 2)]
    );
    proxy.stop().await;
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn keys_in_meta_and_in_the_draft_field_work_over_stdio(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let scenario = Scenario::new(&db.url, "claim_ttl = \"10s\"\n");
    key_mode(&scenario, "24h");

    // An MCP client that puts the key in _meta.
    let mut command = tokio::process::Command::new(LEASEGATE);
    command
        .arg("stdio")
        .arg("--config")
        .arg(scenario.config_path());
    let agent = within("leasegate stdio to answer", async {
        rmcp::ServiceExt::serve(
            common::proxy::Agent::default(),
            rmcp::transport::TokioChildProcess::new(command).unwrap(),
        )
        .await
        .unwrap()
    })
    .await;
    let mut meta = serde_json::Map::new();
    meta.insert("dev.leasegate/idempotency_key".into(), json!("refund-9"));
    let charge = json!({"amount": 9, "currency": "eur"});
    let first = call(
        &agent,
        "payments__charge",
        charge.clone(),
        Some(meta.clone()),
    )
    .await
    .unwrap();
    let second = call(&agent, "payments__charge", charge.clone(), Some(meta))
        .await
        .unwrap();
    assert_eq!(
        (
            &operation_note(&first)["replayed"],
            &operation_note(&second)["replayed"]
        ),
        (&json!(false), &json!(true))
    );
    agent.cancel().await.unwrap();

    // A raw stdio client that sends the draft field.
    let mut child = tokio::process::Command::new(LEASEGATE)
        .arg("stdio")
        .arg("--config")
        .arg(scenario.config_path())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    for message in [
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "raw", "version": "1"}}}),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
            "name": "payments__charge", "arguments": charge, "idempotencyKey": "refund-9"}}),
    ] {
        stdin
            .write_all(format!("{message}\n").as_bytes())
            .await
            .unwrap();
    }
    let answer: Value = within("the raw client's answer", async {
        loop {
            let line = lines.next_line().await.unwrap().expect("an answer");
            let message: Value = serde_json::from_str(&line).unwrap();
            if message["id"] == 2 {
                return message;
            }
        }
    })
    .await;
    assert_eq!(note(&answer)["replayed"], true, "{answer}");
    assert_eq!(scenario.side_effects("charges.jsonl").len(), 1);

    // Lines JSON-RPC cannot read whole — nested deeper than 128 levels, a
    // number beyond a double's range — are answered with a parse error
    // under their own id, and the session goes on.
    let deep = format!(
        r#"{{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{{"name":"payments__charge","arguments":{{"amount":{}1{}}}}}}}"#,
        "[".repeat(200),
        "]".repeat(200)
    );
    let huge = r#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"payments__charge","arguments":{"amount":1e400,"currency":"eur"}}}"#;
    let ping = r#"{"jsonrpc":"2.0","id":5,"method":"ping"}"#;
    for line in [deep.as_str(), huge, ping] {
        stdin
            .write_all(format!("{line}\n").as_bytes())
            .await
            .unwrap();
    }
    let answers: Vec<Value> = within("answers to the unreadable lines and the ping", async {
        let mut answers = Vec::new();
        while answers.len() < 3 {
            let line = lines.next_line().await.unwrap().expect("an answer");
            let message: Value = serde_json::from_str(&line).unwrap();
            if [3, 4, 5].iter().any(|id| message["id"] == *id) {
                answers.push(message);
            }
        }
        answers
    })
    .await;
    for answer in &answers {
        if answer["id"] == 5 {
            assert!(answer.get("result").is_some(), "{answer}");
        } else {
            assert_eq!(answer["error"]["code"], -32700, "{answer}");
        }
    }
    assert_eq!(
        scenario.side_effects("charges.jsonl").len(),
        1,
        "nothing sent"
    );
    drop(stdin);
    let _ = within("leasegate stdio to end", child.wait()).await;
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn concurrent_calls_with_one_new_key_share_it_and_charge_once(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let scenario = Scenario::new(&db.url, "claim_ttl = \"10s\"\nin_flight_wait = \"5s\"\n");
    key_mode(&scenario, "24h");
    let proxy = RunningProxy::start(&scenario.config_path()).await;
    let charge = json!({"name": "payments__charge", "arguments": {"amount": 3, "currency": "eur"}});
    let calls = (0..8).map(|_| {
        let (url, charge) = (proxy.url.clone(), charge.clone());
        tokio::spawn(
            async move { post_call(&url, &[("idempotency-key", "burst-1")], charge).await },
        )
    });
    let mut replayed = 0;
    for call in calls {
        let answer = within("a concurrent call", call).await.unwrap();
        assert_eq!(
            note(&answer)["status"],
            "succeeded",
            "no call is fenced by another: {answer}"
        );
        if note(&answer)["replayed"] == true {
            replayed += 1;
        }
    }
    assert_eq!(replayed, 7, "one call sent, seven replayed");
    assert_eq!(scenario.side_effects("charges.jsonl").len(), 1);
    let runs = db.row_count("agent_runs").await;
    assert_eq!(runs, 1);
    proxy.stop().await;
}
