//! Retries that go back through the model: the call comes out with a new
//! tool-call id (a new key), a re-minted key argument, a reworded free-text
//! field. The argument leasegate fills is hidden from the agent and never
//! part of the identity; a tool's declared identity fields make a
//! rephrased call the same effect, answered by its `on_rephrase` policy;
//! whatever leasegate says of a call in flight reaches a client with a
//! 3 s timeout before it gives up. Effects are counted in the example
//! tool's own records.

use crate::common;

use common::proxy::{LEASEGATE, PAYMENTS_ADAPTER, RunningProxy, Scenario};
use common::{TestDb, http, wait_until, within};
use leasegate::mcp::convert::codes;
use rmcp::ServiceExt;
use rmcp::transport::TokioChildProcess;
use serde_json::{Value, json};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

const POLICY: &str = "claim_ttl = \"60s\"\n";

/// The example mailer with a declared identity: the recipient and the
/// subject make an e-mail; `on_rephrase` as given.
fn mailer_with_identity(on_rephrase: &str) -> String {
    format!(
        "upstream = \"mailer\"\ntrust_annotations = true\ntimeout = \"30s\"\n\
         [tools.send_email]\ncapability = \"none\"\nremote_id_pointer = \"/message_id\"\n\
         identity = [\"/to\", \"/subject\"]\non_rephrase = \"{on_rephrase}\"\n"
    )
}

/// leasegate in lease mode `session` over HTTP, with `mailer` as the
/// example mailer's adapter.
async fn session_proxy(db: &TestDb, mailer: &str) -> (Scenario, RunningProxy) {
    let scenario = Scenario::with_adapters(&db.url, POLICY, PAYMENTS_ADAPTER, mailer);
    scenario.prepend_config("lease_mode = \"session\"");
    let proxy = RunningProxy::start(&scenario.config_path()).await;
    (scenario, proxy)
}

/// One JSON-RPC `tools/call` over plain HTTP with `headers`; the parsed answer.
async fn post_call(url: &str, headers: &[(&str, &str)], name: &str, arguments: Value) -> Value {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                      "params": {"name": name, "arguments": arguments}});
    let answer = http::post_mcp(url, headers, &body.to_string()).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    serde_json::from_str(&answer.body).unwrap_or_else(|_| panic!("JSON: {}", answer.body))
}

/// The JSON-RPC `tools/list` answer's tool named `name`.
async fn listed_tool(url: &str, headers: &[(&str, &str)], name: &str) -> Value {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"});
    let answer = http::post_mcp(url, headers, &body.to_string()).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    let answer: Value = serde_json::from_str(&answer.body).unwrap();
    answer["result"]["tools"]
        .as_array()
        .and_then(|tools| tools.iter().find(|t| t["name"] == name).cloned())
        .unwrap_or_else(|| panic!("{name} is not listed: {answer}"))
}

fn note(answer: &Value) -> &Value {
    &answer["result"]["_meta"]["dev.leasegate/operation"]
}

fn text_of(answer: &Value) -> String {
    answer["result"]["content"]
        .as_array()
        .map(|blocks| {
            blocks
                .iter()
                .filter_map(|b| b["text"].as_str())
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_default()
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn the_key_leasegate_fills_is_hidden_and_a_re_minted_one_is_the_same_charge_over_http(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let scenario = Scenario::new(&db.url, POLICY);
    scenario.prepend_config("lease_mode = \"session\"");
    let proxy = RunningProxy::start(&scenario.config_path()).await;
    let task = [("leasegate-task", "order-77")];

    let charge = listed_tool(&proxy.url, &task, "payments__charge").await;
    let schema = &charge["inputSchema"];
    assert!(
        schema["properties"].get("idempotency_key").is_none(),
        "the filled argument is hidden: {charge}"
    );
    assert!(schema["properties"].get("amount").is_some(), "{charge}");
    assert!(
        !schema["required"]
            .as_array()
            .unwrap()
            .contains(&json!("idempotency_key")),
        "{charge}"
    );

    // What a model does when it re-plans the call: the same charge with a
    // key of its own making, new each time.
    let first = post_call(
        &proxy.url,
        &task,
        "payments__charge",
        json!({"amount": 500, "currency": "eur", "idempotency_key": "model-key-1"}),
    )
    .await;
    assert_eq!(note(&first)["replayed"], false, "{first}");
    assert_eq!(
        note(&first)["replaced_argument"]["name"],
        "idempotency_key",
        "{first}"
    );
    let replanned = post_call(
        &proxy.url,
        &task,
        "payments__charge",
        json!({"amount": 500, "currency": "eur", "idempotency_key": "model-key-2"}),
    )
    .await;
    assert_eq!(note(&replanned)["replayed"], true, "{replanned}");
    assert_eq!(
        note(&replanned)["operation_id"],
        note(&first)["operation_id"]
    );
    let charges = scenario.side_effects("charges.jsonl");
    assert_eq!(charges.len(), 1, "one charge: {charges:?}");
    // The tool saw leasegate's operation id as its key, never the model's.
    assert_eq!(charges[0]["idempotency_key"], note(&first)["operation_id"]);

    // Another amount is another charge.
    let other = post_call(
        &proxy.url,
        &task,
        "payments__charge",
        json!({"amount": 700, "currency": "eur", "idempotency_key": "model-key-3"}),
    )
    .await;
    assert_eq!(note(&other)["replayed"], false, "{other}");
    assert_eq!(scenario.side_effects("charges.jsonl").len(), 2);
    proxy.stop().await;
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn the_key_leasegate_fills_is_hidden_and_a_re_minted_one_is_the_same_charge_over_stdio(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let scenario = Scenario::new(&db.url, POLICY);
    scenario.prepend_config("lease_mode = \"session\"");
    let mut command = tokio::process::Command::new(LEASEGATE);
    command
        .arg("stdio")
        .arg("--config")
        .arg(scenario.config_path())
        .args(["--task", "order-78"])
        .env_remove("LEASEGATE_TASK");
    let transport = TokioChildProcess::new(command).unwrap();
    let agent = within("leasegate stdio to answer initialize", async {
        common::proxy::Agent::default()
            .serve(transport)
            .await
            .unwrap()
    })
    .await;
    let tools = agent.peer().list_all_tools().await.unwrap();
    let charge = tools
        .iter()
        .find(|t| t.name == "payments__charge")
        .expect("listed");
    let properties = charge.input_schema.get("properties").unwrap();
    assert!(properties.get("idempotency_key").is_none(), "{charge:?}");

    let mut answers = Vec::new();
    for key in ["model-key-1", "model-key-2"] {
        let result = common::proxy::call(
            &agent,
            "payments__charge",
            json!({"amount": 42, "currency": "usd", "idempotency_key": key}),
            None,
        )
        .await
        .expect("answered");
        answers.push(common::proxy::operation_note(&result));
    }
    assert_eq!(answers[0]["replayed"], false, "{answers:?}");
    assert_eq!(answers[1]["replayed"], true, "{answers:?}");
    assert_eq!(scenario.side_effects("charges.jsonl").len(), 1);
    let _ = agent.cancel().await;
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn a_reworded_email_with_a_declared_identity_is_one_email_in_session_and_key_mode(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    for mode in ["session", "key"] {
        let scenario = Scenario::with_adapters(
            &db.url,
            POLICY,
            PAYMENTS_ADAPTER,
            &mailer_with_identity("replay"),
        );
        scenario.prepend_config(&format!("lease_mode = \"{mode}\""));
        let proxy = RunningProxy::start(&scenario.config_path()).await;
        // Session mode: one task key. Key mode: a new key on every model
        // turn, as frameworks mint it from their tool-call id.
        let headers = |turn: &'static str| -> Vec<(&'static str, &'static str)> {
            match mode {
                "session" => vec![("leasegate-task", "mail-1")],
                _ => vec![("idempotency-key", turn)],
            }
        };
        let first = post_call(
            &proxy.url,
            &headers("call-1"),
            "mailer__send_email",
            json!({"to": "ann@example.com", "subject": "Your refund",
                   "body": "Your refund of 20 EUR is on its way."}),
        )
        .await;
        assert_eq!(note(&first)["status"], "succeeded", "{mode}: {first}");
        let reworded = post_call(
            &proxy.url,
            &headers("call-2"),
            "mailer__send_email",
            json!({"to": "ann@example.com", "subject": "Your refund",
                   "body": "We have sent your 20 EUR refund.", "cc": "desk@example.com"}),
        )
        .await;
        assert_eq!(note(&reworded)["replayed"], true, "{mode}: {reworded}");
        assert_eq!(
            note(&reworded)["rephrased"]["differs"],
            json!(["/body", "/cc"]),
            "{mode}: {reworded}"
        );
        assert!(
            text_of(&reworded).contains("differs only in /body, /cc"),
            "{mode}: {reworded}"
        );
        assert_eq!(
            scenario.side_effects("emails.jsonl").len(),
            1,
            "{mode}: one e-mail"
        );
        // Another recipient is another e-mail.
        let other = post_call(
            &proxy.url,
            &headers("call-3"),
            "mailer__send_email",
            json!({"to": "bob@example.com", "subject": "Your refund",
                   "body": "Your refund of 20 EUR is on its way."}),
        )
        .await;
        assert_eq!(note(&other)["replayed"], false, "{mode}: {other}");
        assert_eq!(scenario.side_effects("emails.jsonl").len(), 2, "{mode}");
        proxy.stop().await;
    }
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn on_rephrase_conflict_refuses_naming_the_fields_and_sends_nothing(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let (scenario, proxy) = session_proxy(&db, &mailer_with_identity("conflict")).await;
    let task = [("leasegate-task", "mail-2")];
    let first = post_call(
        &proxy.url,
        &task,
        "mailer__send_email",
        json!({"to": "ann@example.com", "subject": "Invoice", "body": "Attached."}),
    )
    .await;
    assert_eq!(note(&first)["status"], "succeeded", "{first}");
    let reworded = post_call(
        &proxy.url,
        &task,
        "mailer__send_email",
        json!({"to": "ann@example.com", "subject": "Invoice", "body": "Please find it attached."}),
    )
    .await;
    assert_eq!(
        reworded["error"]["code"],
        codes::INTENT_CONFLICT,
        "{reworded}"
    );
    assert_eq!(reworded["error"]["data"]["reason"], "rephrased");
    assert_eq!(reworded["error"]["data"]["differs"], json!(["/body"]));
    assert_eq!(
        reworded["error"]["data"]["operation_id"],
        note(&first)["operation_id"]
    );
    assert!(
        reworded["error"]["message"]
            .as_str()
            .unwrap()
            .contains("nothing was sent"),
        "{reworded}"
    );
    assert_eq!(scenario.side_effects("emails.jsonl").len(), 1);
    // The earlier call's own arguments get its outcome.
    let again = post_call(
        &proxy.url,
        &task,
        "mailer__send_email",
        json!({"to": "ann@example.com", "subject": "Invoice", "body": "Attached."}),
    )
    .await;
    assert_eq!(note(&again)["replayed"], true, "{again}");
    proxy.stop().await;
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn a_corrected_call_after_a_failure_with_the_same_identity_is_sent_once(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    // The subject alone names the e-mail: the model fixes the recipient.
    let mailer = "upstream = \"mailer\"\ntrust_annotations = true\ntimeout = \"30s\"\n\
                  [tools.send_email]\ncapability = \"none\"\nidentity = [\"/subject\"]\n";
    let (scenario, proxy) = session_proxy(&db, mailer).await;
    let task = [("leasegate-task", "mail-3")];
    let failed = post_call(
        &proxy.url,
        &task,
        "mailer__send_email",
        json!({"to": "ann", "subject": "Welcome"}),
    )
    .await;
    assert_eq!(note(&failed)["status"], "failed_final", "{failed}");
    let corrected = post_call(
        &proxy.url,
        &task,
        "mailer__send_email",
        json!({"to": "ann@example.com", "subject": "Welcome"}),
    )
    .await;
    assert_eq!(note(&corrected)["status"], "succeeded", "{corrected}");
    assert_eq!(note(&corrected)["replayed"], false, "{corrected}");
    assert_ne!(
        note(&corrected)["operation_id"],
        note(&failed)["operation_id"]
    );
    // A rewording of the corrected call is that call.
    let reworded = post_call(
        &proxy.url,
        &task,
        "mailer__send_email",
        json!({"to": "ann@example.com", "subject": "Welcome", "body": "Hello!"}),
    )
    .await;
    assert_eq!(note(&reworded)["replayed"], true, "{reworded}");
    assert_eq!(
        note(&reworded)["operation_id"],
        note(&corrected)["operation_id"]
    );
    assert_eq!(scenario.side_effects("emails.jsonl").len(), 1);
    let versions: Vec<i32> = sqlx::query_scalar(
        "SELECT effect_version FROM tool_operations WHERE tool_name = 'mailer__send_email' \
         ORDER BY effect_version",
    )
    .fetch_all(&db.admin)
    .await
    .unwrap();
    assert_eq!(versions, vec![1, 2], "one step, two versions");
    proxy.stop().await;
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn a_client_with_a_three_second_timeout_hears_of_the_call_in_flight_before_it_gives_up(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let (scenario, proxy) = session_proxy(&db, &mailer_with_identity("replay")).await;
    let task = [("leasegate-task", "mail-4")];
    let hanging = json!({"to": "ann@example.com", "subject": "Receipt", "body": "v1",
                         "hang_ms": 4000});
    // The first call hangs at the tool after sending; its client gives up.
    let url = proxy.url.clone();
    let first = {
        let hanging = hanging.clone();
        tokio::spawn(async move {
            post_call(
                &url,
                &[("leasegate-task", "mail-4")],
                "mailer__send_email",
                hanging,
            )
            .await
        })
    };
    wait_until("the e-mail to be sent", || async {
        (scenario.side_effects("emails.jsonl").len() == 1).then_some(())
    })
    .await;
    // The client's own read timeout: what leasegate says must arrive first.
    let client_timeout = std::time::Duration::from_secs(3);
    let identical = tokio::time::timeout(
        client_timeout,
        post_call(&proxy.url, &task, "mailer__send_email", hanging.clone()),
    )
    .await
    .expect("the identical retry is answered before the client's timeout");
    assert_eq!(
        identical["error"]["code"],
        codes::IN_PROGRESS,
        "{identical}"
    );
    let replanned_call = json!({"to": "ann@example.com", "subject": "Receipt",
                                "body": "Here is your receipt."});
    let replanned = tokio::time::timeout(
        client_timeout,
        post_call(
            &proxy.url,
            &task,
            "mailer__send_email",
            replanned_call.clone(),
        ),
    )
    .await
    .expect("the re-planned call is answered before the client's timeout");
    assert_eq!(
        replanned["error"]["code"],
        codes::IN_PROGRESS,
        "{replanned}"
    );
    assert_eq!(scenario.side_effects("emails.jsonl").len(), 1);
    // Once the first call settles, the re-planned one gets its outcome.
    let first = first.await.unwrap();
    assert_eq!(note(&first)["status"], "succeeded", "{first}");
    let settled = post_call(&proxy.url, &task, "mailer__send_email", replanned_call).await;
    assert_eq!(note(&settled)["replayed"], true, "{settled}");
    assert_eq!(
        note(&settled)["rephrased"]["differs"],
        json!(["/body", "/hang_ms"])
    );
    assert_eq!(scenario.side_effects("emails.jsonl").len(), 1);
    proxy.stop().await;
}

/// `leasegate stdio --task <task>` with `mailer` as the mailer's adapter,
/// and an rmcp client on it.
async fn stdio_agent(
    db: &TestDb,
    mailer: &str,
    task: &str,
) -> (Scenario, common::proxy::AgentClient) {
    let scenario = Scenario::with_adapters(&db.url, POLICY, PAYMENTS_ADAPTER, mailer);
    scenario.prepend_config("lease_mode = \"session\"");
    let mut command = tokio::process::Command::new(LEASEGATE);
    command
        .arg("stdio")
        .arg("--config")
        .arg(scenario.config_path())
        .args(["--task", task])
        .env_remove("LEASEGATE_TASK");
    let transport = TokioChildProcess::new(command).unwrap();
    let agent = within("leasegate stdio to answer initialize", async {
        common::proxy::Agent::default()
            .serve(transport)
            .await
            .unwrap()
    })
    .await;
    (scenario, agent)
}

/// Starts a call that hangs at the tool after sending, waits for the
/// e-mail, and cancels it as an SDK does when its timeout runs out.
async fn send_and_give_up(scenario: &Scenario, agent: &common::proxy::AgentClient, to: &str) {
    use rmcp::model::{CallToolRequest, CallToolRequestParams, ClientRequest};
    let arguments = json!({"to": to, "subject": "Receipt", "body": "first", "hang_ms": 20000});
    let params = CallToolRequestParams::new("mailer__send_email")
        .with_arguments(arguments.as_object().cloned().unwrap());
    let handle = agent
        .peer()
        .send_request_with_option(
            ClientRequest::CallToolRequest(CallToolRequest::new(params)),
            rmcp::service::PeerRequestOptions::no_options(),
        )
        .await
        .unwrap();
    wait_until("the e-mail to be sent", || async {
        (scenario.side_effects("emails.jsonl").len() == 1).then_some(())
    })
    .await;
    handle.cancel(Some("timed out".into())).await.unwrap();
    // The tool heard the cancel after leasegate did: the call is over.
    wait_until("the tool to see the cancel", || async {
        std::fs::read_to_string(scenario.dir.join("state/calls.jsonl"))
            .unwrap_or_default()
            .lines()
            .any(|line| line.contains(to) && line.contains("\"cancelled\":true"))
            .then_some(())
    })
    .await;
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn after_undelivered_show_holds_a_different_call_once_and_send_sends_it(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    for (setting, held) in [("show", true), ("send", false)] {
        let mailer = format!(
            "upstream = \"mailer\"\ntimeout = \"30s\"\n[tools.send_email]\ncapability = \"none\"\n\
             after_undelivered = \"{setting}\"\n"
        );
        let (scenario, agent) = stdio_agent(&db, &mailer, &format!("undelivered-{setting}")).await;
        send_and_give_up(&scenario, &agent, "ann@example.com").await;
        let replanned = json!({"to": "ann@example.com", "subject": "Your receipt"});
        let answer = common::proxy::call(&agent, "mailer__send_email", replanned.clone(), None)
            .await
            .expect("answered");
        let shown = answer
            .meta
            .as_ref()
            .and_then(|meta| meta.get(leasegate::mcp::convert::SHOWN_META).cloned());
        assert_eq!(shown.is_some(), held, "{setting}: {answer:?}");
        let emails = if held { 1 } else { 2 };
        assert_eq!(
            scenario.side_effects("emails.jsonl").len(),
            emails,
            "{setting}"
        );
        if held {
            // Shown once: the same call again is sent.
            let again = common::proxy::call(&agent, "mailer__send_email", replanned, None)
                .await
                .expect("answered");
            assert_eq!(common::proxy::operation_note(&again)["status"], "succeeded");
            assert_eq!(scenario.side_effects("emails.jsonl").len(), 2);
        }
        let _ = agent.cancel().await;
    }
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn a_call_waiting_for_the_same_intent_in_flight_reports_progress(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let mailer =
        "upstream = \"mailer\"\ntimeout = \"30s\"\n[tools.send_email]\ncapability = \"none\"\n";
    let (scenario, agent) = stdio_agent(&db, mailer, "progress-1").await;
    let agent = std::sync::Arc::new(agent);
    let hanging = json!({"to": "ann@example.com", "subject": "Receipt", "hang_ms": 3000});
    let first = common::proxy::spawn_call(&agent, "mailer__send_email", hanging.clone());
    wait_until("the e-mail to be sent", || async {
        (scenario.side_effects("emails.jsonl").len() == 1).then_some(())
    })
    .await;
    let mut meta = serde_json::Map::new();
    meta.insert("progressToken".into(), json!("waiting-1"));
    let (code, _) = common::proxy::call(&agent, "mailer__send_email", hanging, Some(meta))
        .await
        .expect_err("still in flight after the wait");
    assert_eq!(code, codes::IN_PROGRESS);
    let progress = agent.service().progress.lock().unwrap().clone();
    assert!(
        progress.iter().any(|p| p
            .message
            .as_deref()
            .is_some_and(|m| m.contains("is in flight"))),
        "{progress:?}"
    );
    let first = first.await.unwrap().expect("answered");
    assert_eq!(common::proxy::operation_note(&first)["status"], "succeeded");
    assert_eq!(scenario.side_effects("emails.jsonl").len(), 1);
}
