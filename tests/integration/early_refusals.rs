//! Early refusals: input that could only fail later, or
//! be misread, is refused at the edge with a precise answer, and nothing is
//! written — rows and events counted before and after, side effects of the
//! example tool server counted too.
//!
//! * a plan naming a tool no upstream lists (control API: 422
//!   `unknown_tool`), or arguments that are not an object (422
//!   `invalid_arguments`);
//! * identifiers out of bounds: a 10 KB owner, a task id with a newline,
//!   an owner with a space (control API 422 `invalid_input`; MCP -32602);
//! * a `Leasegate-*` header given twice (-32602, `duplicate_header`);
//! * a body that is not JSON (HTTP 400, -32700), JSON that is not JSON-RPC
//!   (HTTP 400, -32600), `tools/call` params of the wrong shape (-32602, not
//!   rmcp's -32601).

use crate::common;

use common::proxy::{RunningProxy, call, connect_http, lease_meta};
use common::{TestDb, http};
use leasegate::ledger::{LeaseClaim, RunId};
use serde_json::{Value, json};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

const POLICY: &str = "claim_ttl = \"60s\"\ndispatch_interval = \"100ms\"\n";

/// (tasks, runs, operations, events, revisions summed): every table a
/// refused request could have touched.
async fn ledger_rows(db: &TestDb) -> (i64, i64, i64, i64, i64) {
    db.query_row(
        "SELECT (SELECT count(*) FROM agent_tasks), (SELECT count(*) FROM agent_runs),
                (SELECT count(*) FROM tool_operations), (SELECT count(*) FROM ledger_events),
                (SELECT coalesce(sum(revision), 0)::bigint FROM agent_runs)",
    )
    .await
}

fn json_body(answer: &http::Answer) -> Value {
    serde_json::from_str(&answer.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", answer.body))
}

async fn post_json(url: &str, body: &Value) -> (u16, Value) {
    let answer = http::post(
        url,
        &[("content-type", "application/json")],
        &body.to_string(),
    )
    .await;
    let value = json_body(&answer);
    (answer.status, value)
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn plans_for_unknown_tools_and_identifiers_out_of_bounds_are_refused_by_the_control_api_and_write_nothing(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let (scenario, proxy) = RunningProxy::serve(&db.url, POLICY).await;
    let api = format!("{}/v1", proxy.control_url);

    // Identifiers at creation: nothing is created.
    let before = ledger_rows(&db).await;
    for (body, field) in [
        (json!({"task_id": "t\nforged log line"}), "task_id"),
        (json!({"task_id": "t 1"}), "task_id"),
        (json!({"task_id": "x".repeat(257)}), "task_id"),
        (
            json!({"task_id": "t-1", "owner": "o".repeat(10_240), "ttl_ms": 30_000}),
            "owner",
        ),
        (
            json!({"task_id": "t-1", "owner": "agent one", "ttl_ms": 30_000}),
            "owner",
        ),
        // Checked before the tenant is compared (and quoted).
        (
            json!({"tenant_id": "t".repeat(10_240), "task_id": "t-1"}),
            "tenant_id",
        ),
    ] {
        let (status, answer) = post_json(&format!("{api}/runs"), &body).await;
        assert_eq!(
            (status, answer["code"].as_str()),
            (422, Some("invalid_input")),
            "{answer}"
        );
        let message = answer["message"].as_str().unwrap();
        assert!(message.starts_with(field), "{message}");
        assert!(message.len() < 300, "the value is not echoed: {message}");
    }
    assert_eq!(ledger_rows(&db).await, before, "nothing was created");

    // A run with its lease.
    let (status, created) = post_json(
        &format!("{api}/runs"),
        &json!({"task_id": "t-1", "owner": "agent-1", "ttl_ms": 60_000}),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    let run = created["run_id"].as_str().unwrap().to_owned();
    let epoch = created["lease"]["epoch"].as_i64().unwrap();
    let token = created["lease_token"]
        .as_str()
        .expect("the lease token")
        .to_owned();
    let checkpoint_url = format!("{api}/runs/{run}/checkpoint");
    let revision = || async {
        sqlx::query_scalar::<_, i64>("SELECT revision FROM agent_runs WHERE run_id = $1")
            .bind(run.parse::<RunId>().unwrap().as_uuid())
            .fetch_one(&db.admin)
            .await
            .unwrap()
    };
    let (status, started) = post_json(
        &format!("{api}/runs/{run}/start"),
        &json!({"owner": "agent-1", "epoch": epoch, "lease_token": token,
                "expected_revision": revision().await}),
    )
    .await;
    assert_eq!(status, 200, "{started}");
    let revision = revision().await;
    let plan = |intents: Value| {
        json!({"owner": "agent-1", "epoch": epoch, "lease_token": token,
               "expected_revision": revision, "checkpoint": {"step": 1}, "intents": intents})
    };

    let before = ledger_rows(&db).await;
    // One known tool, one that no upstream lists: the whole plan is refused.
    let (status, answer) = post_json(
        &checkpoint_url,
        &plan(json!([
            {"tool": "payments__charge", "step_id": "charge-1",
             "arguments": {"amount": 5, "currency": "eur"}},
            {"tool": "payments__refund_everything", "step_id": "refund-1", "arguments": {}},
        ])),
    )
    .await;
    assert_eq!(
        (status, answer["code"].as_str()),
        (422, Some("unknown_tool")),
        "{answer}"
    );
    assert!(
        answer["message"]
            .as_str()
            .unwrap()
            .contains("\"payments__refund_everything\""),
        "{answer}"
    );
    assert_eq!(
        answer["detail"]["unknown"],
        json!([{"index": 1, "step_id": "refund-1", "tool": "payments__refund_everything"}])
    );
    // The shape of the arguments is the outbox's business too.
    let (status, answer) = post_json(
        &checkpoint_url,
        &plan(json!([{"tool": "payments__charge", "step_id": "c-1", "arguments": "amount=5"}])),
    )
    .await;
    assert_eq!(
        (status, answer["code"].as_str()),
        (422, Some("invalid_arguments")),
        "{answer}"
    );
    // A step id with a control character.
    let (status, answer) = post_json(
        &checkpoint_url,
        &plan(json!([{"tool": "payments__charge", "step_id": "c\u{1b}[2J", "arguments": {}}])),
    )
    .await;
    assert_eq!(
        (status, answer["code"].as_str()),
        (422, Some("invalid_input")),
        "{answer}"
    );
    // A 10 KB owner on the fenced writes: invalid input, not "lease lost".
    let huge = "o".repeat(10_240);
    for (path, body) in [
        (
            "checkpoint",
            json!({"owner": huge, "epoch": epoch, "expected_revision": revision, "checkpoint": {}}),
        ),
        (
            "lease/renew",
            json!({"owner": huge, "epoch": epoch, "ttl_ms": 30_000}),
        ),
        ("lease/release", json!({"owner": huge, "epoch": epoch})),
        ("lease", json!({"owner": huge, "ttl_ms": 30_000})),
    ] {
        let (status, answer) = post_json(&format!("{api}/runs/{run}/{path}"), &body).await;
        assert_eq!(
            (status, answer["code"].as_str()),
            (422, Some("invalid_input")),
            "{path}: {answer}"
        );
        assert_eq!(
            answer["message"], "owner must be 1 to 200 characters, got 10240",
            "{path}"
        );
    }
    assert_eq!(ledger_rows(&db).await, before, "no refusal wrote anything");

    // The same plan with known tools only is registered, and the outbox
    // sends it.
    let (status, answer) = post_json(
        &checkpoint_url,
        &plan(json!([{"tool": "payments__charge", "step_id": "charge-1",
                       "arguments": {"amount": 5, "currency": "eur"}}])),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["intents"][0]["status"], "prepared", "{answer}");
    common::wait_until("the outbox to send the planned charge", || async {
        (scenario.side_effects("charges.jsonl").len() == 1).then_some(())
    })
    .await;
    proxy.stop().await;
}

/// A tools/call request as an MCP client would POST it.
fn tools_call(id: u64, tool: &str, arguments: Value, meta: Option<Value>) -> String {
    let mut params = json!({"name": tool, "arguments": arguments});
    if let Some(meta) = meta {
        params["_meta"] = meta;
    }
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params}).to_string()
}

/// POSTs a JSON-RPC body to the MCP front with `extra` headers (a name
/// given twice is sent twice); returns the HTTP status and the JSON answer.
async fn mcp_post(url: &str, extra: &[(&str, &str)], body: &str) -> (u16, Value) {
    let answer = http::post_mcp(url, extra, body).await;
    let value = json_body(&answer);
    (answer.status, value)
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn malformed_mcp_requests_get_json_rpc_codes_and_reach_neither_the_ledger_nor_the_tool(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let (scenario, proxy) = RunningProxy::serve(&db.url, POLICY).await;
    let (lease, _) = db.running_run("agent-1", 60_000).await;
    let before = ledger_rows(&db).await;
    let charge = json!({"amount": 5, "currency": "eur"});
    let lease_headers = |lease: &LeaseClaim| {
        [
            ("leasegate-run-id", lease.run_id.to_string()),
            ("leasegate-owner", lease.owner.clone()),
            ("leasegate-epoch", lease.epoch.to_string()),
        ]
    };

    // Not JSON: 400, parse error.
    let (status, answer) = mcp_post(&proxy.url, &[], "{\"jsonrpc\": \"2.0\", \"id\": 1, ").await;
    assert_eq!(
        (status, answer["error"]["code"].as_i64()),
        (400, Some(-32700)),
        "{answer}"
    );
    assert_eq!(answer["id"], Value::Null);
    // A foreign Host is refused first (DNS rebinding), malformed or not.
    let port = proxy
        .url
        .rsplit(':')
        .next()
        .unwrap()
        .split('/')
        .next()
        .unwrap();
    let rebound = format!("attacker.example:{port}");
    let answer = http::post(
        &proxy.url,
        &[
            http::MCP_HEADERS[0],
            http::MCP_HEADERS[1],
            http::MCP_HEADERS[2],
            ("host", &rebound),
        ],
        "{\"jsonrpc\": ",
    )
    .await;
    assert_eq!(answer.status, 403, "{}", answer.body);
    // JSON, but not a JSON-RPC message: 400, invalid request.
    let (status, answer) = mcp_post(&proxy.url, &[], "{\"hello\": \"world\"}").await;
    assert_eq!(
        (status, answer["error"]["code"].as_i64()),
        (400, Some(-32600)),
        "{answer}"
    );
    // Not JSON at all and not declared as JSON either: the media type is wrong.
    let answer = http::post(
        &proxy.url,
        &[
            ("content-type", "text/plain"),
            http::MCP_HEADERS[1],
            http::MCP_HEADERS[2],
        ],
        "charge 5 eur",
    )
    .await;
    assert_eq!(answer.status, 415, "{}", answer.body);

    // `arguments` of the wrong shape: invalid params, with the request's id.
    let headers = lease_headers(&lease);
    let headers: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
    for arguments in [json!("amount=5"), json!([5, "eur"]), json!(5)] {
        let (status, answer) = mcp_post(
            &proxy.url,
            &headers,
            &tools_call(7, "payments__charge", arguments.clone(), None),
        )
        .await;
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer["id"], 7, "{answer}");
        let context = format!("{arguments}: ");
        assert!(
            http::rpc_error_message(&answer, -32602, &context).contains("`arguments` an object"),
            "{answer}"
        );
    }
    // An unknown method is still "method not found".
    let (_, answer) = mcp_post(
        &proxy.url,
        &[],
        &json!({"jsonrpc": "2.0", "id": 8, "method": "tools/charge_now", "params": {}}).to_string(),
    )
    .await;
    assert_eq!(answer["error"]["code"], -32601, "{answer}");

    // A lease header given twice: which epoch counts would be a guess.
    for duplicated in ["leasegate-epoch", "leasegate-owner", "leasegate-run-id"] {
        let mut twice = headers.clone();
        let (_, value) = headers.iter().find(|(n, _)| *n == duplicated).unwrap();
        twice.push((duplicated, value));
        let (status, answer) = mcp_post(
            &proxy.url,
            &twice,
            &tools_call(9, "payments__charge", charge.clone(), None),
        )
        .await;
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer["error"]["code"], -32602, "{answer}");
        assert_eq!(
            answer["error"]["data"],
            json!({"reason": "duplicate_header", "header": duplicated, "count": 2}),
        );
    }
    let mut two_epochs = headers.clone();
    two_epochs.retain(|(n, _)| *n != "leasegate-epoch");
    let stale = (lease.epoch + 1).to_string();
    let current = lease.epoch.to_string();
    two_epochs.push(("leasegate-epoch", &current));
    two_epochs.push(("leasegate-epoch", &stale));
    let (_, answer) = mcp_post(
        &proxy.url,
        &two_epochs,
        &tools_call(10, "payments__charge", charge.clone(), None),
    )
    .await;
    assert_eq!(
        answer["error"]["data"]["reason"], "duplicate_header",
        "{answer}"
    );

    // Owners out of bounds, in _meta and in a header.
    let (agent, _) = connect_http(&proxy.url, None).await;
    for owner in [
        "o".repeat(10_240),
        "agent one".to_owned(),
        "agent\u{7f}".to_owned(),
    ] {
        let forged = LeaseClaim {
            owner: owner.clone(),
            ..lease.clone()
        };
        let (code, message) = call(
            &agent,
            "payments__charge",
            charge.clone(),
            Some(lease_meta(&forged)),
        )
        .await
        .unwrap_err();
        assert_eq!(code, -32602, "{message}");
        assert!(message.contains("owner"), "{message}");
        assert!(
            message.len() < 400,
            "the owner is not echoed: {}",
            message.len()
        );
    }
    let mut spaced = headers.clone();
    spaced.retain(|(n, _)| *n != "leasegate-owner");
    spaced.push(("leasegate-owner", "agent one"));
    let (_, answer) = mcp_post(
        &proxy.url,
        &spaced,
        &tools_call(11, "payments__charge", charge.clone(), None),
    )
    .await;
    assert!(
        http::rpc_error_message(&answer, -32602, "")
            .starts_with("header Leasegate-Owner: owner: character ' '"),
        "{answer}"
    );
    // A step id with a newline.
    let mut meta = lease_meta(&lease);
    meta.insert(
        "dev.leasegate/step".into(),
        json!({"step_id": "charge\nforged", "effect_version": 1}),
    );
    let (code, message) = call(&agent, "payments__charge", charge.clone(), Some(meta))
        .await
        .unwrap_err();
    assert_eq!(code, -32602, "{message}");
    assert!(message.contains("step_id"), "{message}");

    assert_eq!(ledger_rows(&db).await, before, "no refusal wrote anything");
    assert!(scenario.side_effects("charges.jsonl").is_empty());

    // The same call, well formed, goes through.
    let result = call(&agent, "payments__charge", charge, Some(lease_meta(&lease)))
        .await
        .unwrap();
    assert_ne!(result.is_error, Some(true), "{result:?}");
    assert_eq!(scenario.side_effects("charges.jsonl").len(), 1);
    proxy.stop().await;
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn the_database_refuses_identifiers_that_escaped_the_edges(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    // As the superuser, bypassing the functions: the table constraints hold.
    for (sql, constraint) in [
        (
            "INSERT INTO agent_tasks (tenant_id, task_id) VALUES ('tenant-a', 'line\nbreak')",
            "agent_tasks_task_id_identifier",
        ),
        (
            "INSERT INTO agent_tasks (tenant_id, task_id) VALUES ('ten ant', 't')",
            "agent_tasks_tenant_id_identifier",
        ),
    ] {
        let error = sqlx::query(sql).execute(&db.admin).await.unwrap_err();
        assert!(error.to_string().contains(constraint), "{error}");
    }
    let (lease, _) = db.running_run("agent-1", 60_000).await;
    let error = sqlx::query("UPDATE worker_leases SET owner = repeat('o', 201) WHERE run_id = $1")
        .bind(lease.run_id.as_uuid())
        .execute(&db.admin)
        .await
        .unwrap_err();
    assert!(
        error.to_string().contains("worker_leases_owner_identifier"),
        "{error}"
    );
    let (_, _, _, owner, _) = db.run_row(lease.run_id).await;
    assert_eq!(owner.as_deref(), Some("agent-1"));
}

/// While an upstream is down its tools stay known (as it listed them last):
/// a plan for them is accepted and waits in the outbox; a plan for a tool
/// it never listed is refused all the same.
#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn a_plan_for_a_down_upstreams_tools_is_accepted_and_sent_once_it_is_back(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    let db = TestDb::new(pool, connect).await;
    let (scenario, proxy) = RunningProxy::serve(&db.url, POLICY).await;
    let (lease, revision) = db.running_run("agent-1", 60_000).await;
    let checkpoint_url = format!("{}/v1/runs/{}/checkpoint", proxy.control_url, lease.run_id);

    // Every new mailer child fails to start: its pid file is a directory.
    let pid_file = scenario.dir.join("state/mailer.pid");
    let pid: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    std::fs::remove_file(&pid_file).unwrap();
    std::fs::create_dir(&pid_file).unwrap();
    kill(Pid::from_raw(pid), Signal::SIGKILL).unwrap();
    common::wait_until("the mailer to be down", || async {
        proxy
            .upstreams
            .health()
            .into_iter()
            .find(|h| h.name == "mailer")
            .and_then(|h| h.last_error)
            .is_some_and(|e| e.starts_with("restart failed"))
            .then_some(())
    })
    .await;

    let plan = |tool: &str, revision: i64| {
        json!({"owner": lease.owner, "epoch": lease.epoch, "expected_revision": revision,
               "lease_token": lease.token.as_ref().map(|t| t.expose()),
               "checkpoint": {"step": "mail"},
               "intents": [{"tool": tool, "step_id": "mail-1", "arguments": {"to": "a@b.c"}}]})
    };
    let before = ledger_rows(&db).await;
    let (status, answer) = post_json(&checkpoint_url, &plan("mailer__send_fax", revision)).await;
    assert_eq!(
        (status, answer["code"].as_str()),
        (422, Some("unknown_tool")),
        "{answer}"
    );
    assert_eq!(ledger_rows(&db).await, before);
    let (status, answer) = post_json(&checkpoint_url, &plan("mailer__send_email", revision)).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["intents"][0]["status"], "prepared", "{answer}");

    // Back: the outbox sends it, once.
    std::fs::remove_dir(&pid_file).unwrap();
    db.wait_tool_status(
        "the outbox to send the planned email",
        "mailer__send_email",
        "succeeded",
    )
    .await;
    assert_eq!(scenario.side_effects("emails.jsonl").len(), 1);
    proxy.stop().await;
}
