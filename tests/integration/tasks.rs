//! The MCP Tasks extension through the ledger: an upstream that answers a
//! gated `tools/call` with a task handle. The agent gets the handle as the
//! upstream sent it and follows the task through leasegate; the operation
//! stays `dispatching` with the task as evidence and settles from the
//! task's terminal status — from the agent's own `tasks/get`, from this
//! process's follower when the agent is gone, and from the reconciler when
//! the process that dispatched it is gone too. What the tests count is the
//! tool's own record of exports.

use crate::common;

use common::TestDb;
use common::proxy::{RunningProxy, Scenario, ServedChild, http_tool_server, lease_meta};
use leasegate::ledger::LeaseClaim;
use serde_json::{Value, json};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

/// `none`: only the task can settle these operations without an operator.
const REPORTS_ADAPTER: &str = "upstream = \"reports\"\ntimeout = \"2s\"\n\
    [tools.export_report]\ncapability = \"none\"\nremote_id_pointer = \"/export_id\"\n\
    [tools.report_status]\nread_only = true\n";

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(common::DEADLINE)
        .build()
        .unwrap()
}

/// One stateless MCP 2026-07-28 request (JSON-RPC `id`, `method`,
/// `params`), declaring the Tasks extension when `tasks`; its JSON-RPC
/// answer.
async fn rpc(url: &str, id: u64, method: &str, mut params: Value, tasks: bool) -> Value {
    let capabilities = if tasks {
        json!({"extensions": {"io.modelcontextprotocol/tasks": {}}})
    } else {
        json!({})
    };
    let meta = params
        .as_object_mut()
        .unwrap()
        .entry("_meta")
        .or_insert_with(|| json!({}));
    meta["io.modelcontextprotocol/protocolVersion"] = json!("2026-07-28");
    meta["io.modelcontextprotocol/clientInfo"] = json!({"name": "tasks-test", "version": "1"});
    meta["io.modelcontextprotocol/clientCapabilities"] = capabilities;
    let body = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
    let mut request = client()
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", method);
    // 2026-07-28 names the request's target in a header: a tool, a task.
    let target = body
        .pointer("/params/name")
        .or_else(|| body.pointer("/params/taskId"));
    if let Some(name) = target.and_then(Value::as_str) {
        request = request.header("mcp-name", name);
    }
    let response = request.body(body.to_string()).send().await.unwrap();
    let text = response.text().await.unwrap();
    text.lines()
        .filter_map(|line| line.strip_prefix("data:"))
        .filter_map(|data| serde_json::from_str::<Value>(data.trim()).ok())
        .find(|message| message.get("id").is_some())
        .unwrap_or_else(|| serde_json::from_str(text.trim()).expect("a JSON-RPC answer"))
}

/// `reports__export_report` of `name` under `lease`.
async fn export(url: &str, id: u64, name: &str, lease: &LeaseClaim, tasks: bool) -> Value {
    let params = json!({"name": "reports__export_report", "arguments": {"name": name},
        "_meta": Value::Object(lease_meta(lease))});
    rpc(url, id, "tools/call", params, tasks).await
}

async fn task_status(url: &str, id: u64, task_id: &str) -> Value {
    rpc(url, id, "tasks/get", json!({"taskId": task_id}), true).await
}

/// The operation's status and its task evidence's task ids.
async fn ledger_view(db: &TestDb, operation_id: &str) -> (String, Vec<String>) {
    let status: String = db
        .scalar(
            "SELECT status FROM tool_operations WHERE operation_id = $1",
            operation_id.to_owned(),
        )
        .await;
    let tasks: Vec<String> = db
        .scalars(
            "SELECT body->>'task_id' FROM operation_evidence WHERE operation_id = $1 AND kind = 'task' ORDER BY evidence_id",
            operation_id.to_owned(),
        )
        .await;
    (status, tasks)
}

fn release(scenario: &Scenario, name: &str) {
    std::fs::write(
        scenario.dir.join("state").join(format!("release-{name}")),
        "",
    )
    .unwrap();
}

/// An agent that follows tasks: the gated call is answered with the
/// upstream's task handle (the operation `dispatching`, the task on
/// record), a repeat of the intent gets the same handle, `tasks/get`
/// passes the task's statuses through, and by the time the agent reads
/// `completed` the operation is `succeeded` with the task's result; a
/// later repeat replays it. An agent that does not follow tasks gets a
/// plain result, and a read-only task passes through. One export per
/// intent.
#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn a_task_made_of_a_gated_call_is_one_operation_settled_from_its_terminal_status(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let scenario = Scenario::new(&db.url, "in_flight_wait = \"1s\"\n");
    scenario.add_upstream("reports", "tasks", REPORTS_ADAPTER);
    let proxy = RunningProxy::start(&scenario.config_path()).await;
    let (lease, _) = db.running_run("task-agent", 60_000).await;

    let first = export(&proxy.url, 1, "q1", &lease, true).await;
    let handle = &first["result"];
    assert_eq!(handle["resultType"], "task", "a task handle: {first}");
    let task_id = handle["taskId"]
        .as_str()
        .expect("the upstream's task id")
        .to_owned();
    assert_eq!(handle["status"], "working", "{first}");
    let note = &handle["_meta"]["dev.leasegate/operation"];
    assert_eq!(note["status"], "dispatching", "{first}");
    let operation_id = note["operation_id"].as_str().unwrap().to_owned();
    assert_eq!(
        ledger_view(&db, &operation_id).await,
        ("dispatching".to_owned(), vec![task_id.clone()]),
        "the operation waits on its task, which is on record"
    );

    let again = export(&proxy.url, 2, "q1", &lease, true).await;
    assert_eq!(again["result"]["taskId"], task_id.as_str(), "{again}");
    assert_eq!(
        again["result"]["_meta"]["dev.leasegate/operation"]["replayed"],
        true
    );

    let working = task_status(&proxy.url, 3, &task_id).await;
    assert_eq!(working["result"]["status"], "working", "{working}");

    release(&scenario, "q1");
    let completed = common::wait_until("the agent to read the task completed", || async {
        let answer = task_status(&proxy.url, 4, &task_id).await;
        (answer["result"]["status"] == "completed").then_some(answer)
    })
    .await;
    let export_id = completed["result"]["result"]["structuredContent"]["export_id"].clone();
    assert_eq!(export_id, "exp_1", "{completed}");
    // Written before the agent heard it.
    let (status, _) = ledger_view(&db, &operation_id).await;
    assert_eq!(status, "succeeded");
    let remote_id: Option<String> = db
        .scalar(
            "SELECT remote_id FROM tool_operations WHERE operation_id = $1",
            operation_id.clone(),
        )
        .await;
    assert_eq!(remote_id.as_deref(), Some("exp_1"));

    let replay = export(&proxy.url, 5, "q1", &lease, true).await;
    assert_eq!(
        replay["result"]["structuredContent"]["export_id"], "exp_1",
        "{replay}"
    );
    let note = &replay["result"]["_meta"]["dev.leasegate/operation"];
    assert_eq!(
        (note["status"].as_str(), note["replayed"].as_bool()),
        (Some("succeeded"), Some(true))
    );
    // Said in the content too, for clients that drop `_meta`.
    let last = replay["result"]["content"]
        .as_array()
        .unwrap()
        .last()
        .unwrap();
    assert!(
        last["text"]
            .as_str()
            .unwrap()
            .starts_with("[leasegate] replayed"),
        "{replay}"
    );

    // An agent that does not follow tasks is never handed one.
    let plain = rpc(
        &proxy.url,
        6,
        "tools/call",
        json!({"name": "reports__export_report", "arguments": {"name": "q2", "wait": false},
            "_meta": Value::Object(lease_meta(&lease))}),
        false,
    )
    .await;
    assert_eq!(
        plain["result"]["structuredContent"]["export_id"], "exp_2",
        "{plain}"
    );
    // A read-only tool's task passes straight through.
    let status = rpc(
        &proxy.url,
        7,
        "tools/call",
        json!({"name": "reports__report_status", "arguments": {}}),
        true,
    )
    .await;
    assert_eq!(status["result"]["resultType"], "task", "{status}");
    let read_task = status["result"]["taskId"].as_str().unwrap().to_owned();
    let read = common::wait_until("the read-only task to complete", || async {
        let answer = task_status(&proxy.url, 8, &read_task).await;
        (answer["result"]["status"] == "completed").then_some(answer)
    })
    .await;
    assert_eq!(
        read["result"]["result"]["structuredContent"]["exports"], 2,
        "{read}"
    );

    let exports = scenario.side_effects("exports.jsonl");
    assert_eq!(exports.len(), 2, "one export per intent: {exports:?}");
    proxy.stop().await;
}

/// The agent takes the handle and goes away: the process that dispatched
/// the call follows the task itself and settles the operation when the
/// task completes.
#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn a_task_whose_agent_is_gone_is_settled_by_the_process_that_dispatched_it(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let scenario = Scenario::new(&db.url, "");
    scenario.add_upstream("reports", "tasks", REPORTS_ADAPTER);
    let proxy = RunningProxy::start(&scenario.config_path()).await;
    let (lease, _) = db.running_run("task-agent", 60_000).await;
    let first = export(&proxy.url, 1, "gone", &lease, true).await;
    let operation_id = first["result"]["_meta"]["dev.leasegate/operation"]["operation_id"]
        .as_str()
        .expect("an operation for the task")
        .to_owned();
    release(&scenario, "gone");
    common::wait_until("the operation to settle from its task", || async {
        (ledger_view(&db, &operation_id).await.0 == "succeeded").then_some(())
    })
    .await;
    assert_eq!(scenario.side_effects("exports.jsonl").len(), 1);
    proxy.stop().await;
}

/// The process that dispatched the call is killed while the task runs (the
/// tool server, over HTTP, lives on): its claim lapses into `unknown`, and
/// another process's reconciler follows the task from its evidence and
/// converges the operation — a `none` tool, with no operator — once the
/// task completes. One export.
#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn a_task_whose_proxy_died_converges_through_the_reconciler(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let scenario = Scenario::new(
        &db.url,
        "claim_ttl = \"4s\"\nreconcile_interval = \"100ms\"\nclaim_expiry_interval = \"200ms\"\n",
    );
    let (_server, address) =
        http_tool_server("tasks", "127.0.0.1:0", &scenario.dir.join("state"), &[]).await;
    scenario.surround_config(
        "",
        &format!(
            "[upstreams.reports]\ntransport = \"streamable_http\"\nurl = \"http://{address}/mcp\"\n"
        ),
    );
    std::fs::write(scenario.dir.join("adapters/reports.toml"), REPORTS_ADAPTER).unwrap();
    let mut first = ServedChild::spawn(ServedChild::command(&scenario, &[])).await;
    let (lease, _) = db.running_run("task-agent", 60_000).await;
    let answer = export(&first.mcp, 1, "crash", &lease, true).await;
    let operation_id = answer["result"]["_meta"]["dev.leasegate/operation"]["operation_id"]
        .as_str()
        .unwrap_or_else(|| panic!("an operation for the task: {answer}"))
        .to_owned();
    assert_eq!(ledger_view(&db, &operation_id).await.1.len(), 1);
    first.child.kill().await.unwrap();

    let second = RunningProxy::start(&scenario.config_path()).await;
    common::wait_until("the lapsed claim to turn unknown", || async {
        (ledger_view(&db, &operation_id).await.0 == "unknown").then_some(())
    })
    .await;
    release(&scenario, "crash");
    common::wait_until("the reconciler to converge it from the task", || async {
        (ledger_view(&db, &operation_id).await.0 == "succeeded").then_some(())
    })
    .await;
    let result: Value = db
        .scalar(
            "SELECT result FROM tool_operations WHERE operation_id = $1",
            operation_id.clone(),
        )
        .await;
    assert_eq!(
        result["structuredContent"]["export_id"], "exp_1",
        "{result}"
    );
    let operator_events: i64 = db
        .scalar(
            "SELECT count(*) FROM ledger_events WHERE operation_id = $1 AND actor_kind = 'operator'",
            operation_id.clone(),
        )
        .await;
    assert_eq!(operator_events, 0, "no operator was needed");
    assert_eq!(scenario.side_effects("exports.jsonl").len(), 1);
    second.stop().await;
}
