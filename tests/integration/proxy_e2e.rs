//! The proxy end to end: an rmcp client over Streamable HTTP → leasegate →
//! the example tool server as stdio children, with a real PostgreSQL.
//! Side effects are counted in the tool server's own state files.

use crate::common;
use crate::common::proxy::charge_eur;
use crate::common::proxy::send_email;

use common::proxy::{
    RunningProxy, Scenario, call, connect_http, lease_meta, operation_note, tool_fields,
};
use common::{TestDb, http, replace_exactly};
use leasegate::intent::OperationId;
use leasegate::ledger::{LeaseClaim, OperationStatus};
use serde_json::{Value, json};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

const POLICY: &str = "in_flight_wait = \"3s\"\nclaim_ttl = \"60s\"\n";

fn operation_id(result: &rmcp::model::CallToolResult) -> OperationId {
    OperationId::from_string(
        operation_note(result)["operation_id"]
            .as_str()
            .expect("an operation id")
            .to_owned(),
    )
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn the_same_call_twice_and_from_two_concurrent_agents_has_one_side_effect(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let (scenario, proxy) = RunningProxy::serve(&db.url, POLICY).await;
    let (lease, _) = db.running_run("agent-1", 60_000).await;

    // Lease on the connection (headers).
    let (agent, _) = connect_http(&proxy.url, Some(&lease)).await;
    let first = charge_eur(&agent, 500, None).await.unwrap();
    let again = call(
        &agent,
        "payments__charge",
        json!({"currency": "eur", "amount": 500}),
        None,
    )
    .await
    .unwrap();
    assert_eq!(
        scenario.side_effects("charges.jsonl").len(),
        1,
        "one charge for the same call"
    );
    assert_eq!(operation_note(&first)["replayed"], false);
    assert_eq!(operation_note(&again)["replayed"], true);
    assert_eq!(
        tool_fields(first.structured_content.as_ref()),
        tool_fields(again.structured_content.as_ref()),
        "the recorded answer is replayed"
    );
    // What a client that reads only the structured content sees of it.
    let said = &again.structured_content.as_ref().unwrap()[leasegate::mcp::convert::OUTCOME_KEY];
    assert!(
        said.as_str()
            .is_some_and(|s| s.starts_with("[leasegate] replayed")),
        "{again:?}"
    );
    assert!(
        first.structured_content.as_ref().unwrap()[leasegate::mcp::convert::OUTCOME_KEY].is_null(),
        "a fresh answer is the tool's own: {first:?}"
    );
    // The operation id reached the tool as its idempotency key.
    let charge = &scenario.side_effects("charges.jsonl")[0];
    assert_eq!(
        charge["idempotency_key"],
        json!(operation_id(&first).as_str())
    );

    // Two agents of the same run send the same email at the same time.
    let (a, _) = connect_http(&proxy.url, None).await;
    let (b, _) = connect_http(&proxy.url, None).await;
    let email = json!({"to": "ops@example.com", "subject": "deploy done"});
    let (ra, rb) = tokio::join!(
        call(
            &a,
            "mailer__send_email",
            email.clone(),
            Some(lease_meta(&lease))
        ),
        call(
            &b,
            "mailer__send_email",
            email.clone(),
            Some(lease_meta(&lease))
        ),
    );
    let (ra, rb) = (ra.unwrap(), rb.unwrap());
    assert_eq!(
        scenario.side_effects("emails.jsonl").len(),
        1,
        "one email although two agents called"
    );
    assert_eq!(
        tool_fields(ra.structured_content.as_ref()),
        tool_fields(rb.structured_content.as_ref())
    );
    let replays = [&ra, &rb]
        .iter()
        .filter(|r| operation_note(r)["replayed"] == true)
        .count();
    assert_eq!(
        replays, 1,
        "one answer is fresh, the other the recorded one"
    );

    // The ledger says what the agents were told.
    for result in [&first, &ra] {
        let view = db.operation_view(&operation_id(result)).await;
        assert_eq!(view.operation.status, OperationStatus::Succeeded);
        assert_eq!(
            view.operation
                .result
                .as_ref()
                .and_then(|r| r.get("structuredContent"))
                .cloned(),
            tool_fields(result.structured_content.as_ref())
        );
    }
    assert_eq!(
        db.operation_view(&operation_id(&first))
            .await
            .operation
            .remote_id
            .as_deref(),
        Some("ch_1")
    );
    proxy.stop().await;
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn an_old_owner_is_refused_before_the_upstream_after_a_takeover(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let (scenario, proxy) = RunningProxy::serve(&db.url, POLICY).await;
    let (old, _) = db.running_run("old-worker", 300).await;
    db.wait_lease_expired(old.run_id).await;
    let new = db.acquire(old.run_id, "new-worker", 60_000).await;

    let (agent, _) = connect_http(&proxy.url, None).await;
    let refused = send_email(&agent, "a@b.c", Some(lease_meta(&old))).await;
    let (code, message) = refused.expect_err("a stale lease is refused");
    assert_eq!(code, -31002, "{message}");
    assert!(
        message.starts_with(
            "lease lost: this write holds owner old-worker epoch 1, but the lease is now owner new-worker epoch 2"
        ),
        "{message}"
    );
    assert!(
        scenario.side_effects("emails.jsonl").is_empty(),
        "nothing reached the tool"
    );
    assert_eq!(
        db.row_count("tool_operations").await,
        0,
        "nothing registered"
    );

    // No lease at all: its own error, also before the upstream, saying how
    // to get a lease over HTTP and how to mark the tool read-only.
    let (code, message) = send_email(&agent, "a@b.c", None).await.unwrap_err();
    assert_eq!(code, -31001, "{message}");
    for needle in [
        "tool \"mailer__send_email\" has side effects and needs a lease",
        "leasegate runs create --task <task> --owner <owner> --ttl-ms 60000",
        "POST /v1/runs",
        "Leasegate-Run-Id, Leasegate-Owner, Leasegate-Epoch and Leasegate-Lease-Token headers",
        "_meta \"dev.leasegate/lease\" {run_id, owner, epoch, token}",
        "set read_only = true under [tools.send_email] in the adapter file of upstream \"mailer\"",
    ] {
        assert!(
            message.contains(needle),
            "{needle:?} missing from {message}"
        );
    }
    // The same as structured hints in error.data (raw JSON-RPC over HTTP).
    let response = http::post_mcp(
        &proxy.url,
        &[],
        &json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                "params": {"name": "mailer__send_email", "arguments": {"to": "a@b.c"}}})
        .to_string(),
    )
    .await;
    let answer = response.json_rpc();
    assert_eq!(answer["error"]["code"], -31001, "{answer}");
    let data = &answer["error"]["data"];
    assert_eq!(
        (&data["tool"], &data["upstream"], &data["upstream_tool"]),
        (
            &json!("mailer__send_email"),
            &json!("mailer"),
            &json!("send_email")
        ),
        "{data}"
    );
    assert_eq!(data["how"]["lease"]["meta"]["key"], "dev.leasegate/lease");
    assert_eq!(
        data["how"]["lease"]["headers"],
        json!([
            "Leasegate-Run-Id",
            "Leasegate-Owner",
            "Leasegate-Epoch",
            "Leasegate-Lease-Token"
        ])
    );
    assert_eq!(
        data["how"]["read_only"]["set"],
        "[tools.send_email] read_only = true"
    );
    assert_eq!(
        db.row_count("tool_operations").await,
        0,
        "nothing registered"
    );
    // The new owner's call goes through.
    send_email(&agent, "a@b.c", Some(lease_meta(&new.claim)))
        .await
        .unwrap();
    assert_eq!(scenario.side_effects("emails.jsonl").len(), 1);
    proxy.stop().await;
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn an_upstream_that_hangs_past_its_timeout_leaves_the_call_unknown_and_nothing_is_resent(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let (scenario, proxy) = RunningProxy::serve(&db.url, POLICY).await;
    let (lease, _) = db.running_run("agent", 60_000).await;
    let (agent, _) = connect_http(&proxy.url, Some(&lease)).await;

    let email = json!({"to": "c@d.e", "hang_ms": 5000});
    let first = call(&agent, "mailer__send_email", email.clone(), None)
        .await
        .unwrap();
    assert_eq!(first.is_error, Some(true));
    assert_eq!(
        first.structured_content.as_ref().unwrap()["status"],
        "unknown",
        "{first:?}"
    );
    assert_eq!(
        scenario.side_effects("emails.jsonl").len(),
        1,
        "the tool sent it before hanging"
    );

    let second = call(&agent, "mailer__send_email", email, None)
        .await
        .unwrap();
    assert_eq!(
        second.structured_content.as_ref().unwrap()["status"],
        "unknown"
    );
    assert_eq!(
        scenario.side_effects("emails.jsonl").len(),
        1,
        "a `none` tool is never re-sent"
    );

    let view = db.operation_view(&operation_id(&first)).await;
    assert_eq!(
        view.operation.status,
        OperationStatus::Unknown,
        "timeout is never failure"
    );
    assert_eq!(
        view.evidence
            .iter()
            .map(|e| e.kind.as_str())
            .collect::<Vec<_>>(),
        vec!["timeout"]
    );
    proxy.stop().await;
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn read_only_tools_pass_through_with_progress_and_leave_no_ledger_row(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let (_scenario, proxy) = RunningProxy::serve(&db.url, POLICY).await;
    // No lease needed for reads.
    let (agent, recorder) = connect_http(&proxy.url, None).await;
    let found = call(
        &agent,
        "payments__get_charge",
        json!({"idempotency_key": "nope"}),
        None,
    )
    .await
    .unwrap();
    assert_eq!(found.structured_content, Some(json!({"found": false})));
    let stats = call(&agent, "mailer__mail_stats", json!({}), None)
        .await
        .unwrap();
    assert_eq!(stats.structured_content, Some(json!({"emails_sent": 0})));
    assert_eq!(db.row_count("tool_operations").await, 0);
    assert!(operation_note(&stats).is_null());
    common::wait_until("progress from the upstream to reach the agent", || async {
        (recorder.progress.lock().unwrap().len() >= 2).then_some(())
    })
    .await;
    let last = recorder.progress.lock().unwrap().last().cloned().unwrap();
    assert_eq!((last.progress, last.total), (2.0, Some(2.0)));
    proxy.stop().await;
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn tools_are_namespaced_with_annotations_intact(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let scenario = Scenario::new(&db.url, POLICY);
    // One tool per page, so that the agent must follow leasegate's cursors too.
    let paged = replace_exactly(
        &std::fs::read_to_string(scenario.config_path()).unwrap(),
        "migrate = false",
        "migrate = false\ntools_page_size = 1",
    );
    std::fs::write(scenario.config_path(), paged).unwrap();
    let proxy = RunningProxy::start(&scenario.config_path()).await;
    let (agent, _) = connect_http(&proxy.url, None).await;
    let first_page = agent.peer().list_tools(None).await.unwrap();
    assert_eq!(
        (first_page.tools.len(), first_page.next_cursor.as_deref()),
        (1, Some("1"))
    );
    let tools = agent.peer().list_all_tools().await.unwrap();
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    // The upstreams page one tool at a time; every page was followed.
    assert_eq!(
        names,
        vec![
            "mailer__mail_stats",
            "mailer__send_email",
            "payments__charge",
            "payments__get_charge"
        ]
    );
    let charge = tools.iter().find(|t| t.name == "payments__charge").unwrap();
    let annotations = charge.annotations.as_ref().unwrap();
    assert_eq!(
        (annotations.read_only_hint, annotations.idempotent_hint),
        (Some(false), Some(true))
    );
    assert_eq!(
        charge.input_schema["required"],
        json!(["amount", "currency"])
    );
    proxy.stop().await;

    // Two upstreams exposing the same names without a prefix cannot start.
    let config = std::fs::read_to_string(scenario.config_path()).unwrap();
    let colliding = replace_exactly(
        &config,
        "migrate = false",
        "migrate = false\nunprefixed = [\"payments\", \"payments2\"]",
    ) + &format!(
        "\n[upstreams.payments2]\ntransport = \"stdio\"\ncommand = \"{}\"\nargs = [\"--tools\", \"payments\", \"--state-dir\", \"{}\"]\n",
        common::proxy::EXAMPLE_TOOLS,
        scenario.dir.join("state2").display()
    );
    let path = scenario.dir.join("colliding.toml");
    std::fs::write(&path, colliding).unwrap();
    let config = leasegate::config::Config::load(&path).unwrap();
    let error = leasegate::app::Proxy::start(config)
        .await
        .err()
        .expect("a collision stops startup");
    assert_eq!(
        error.to_string(),
        "tool name collision: \"charge\" is exposed by both payments/charge and payments2/charge; \
         change namespace_separator or rename an upstream"
    );
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn bad_input_gets_a_precise_error_and_the_ledger_stays_consistent(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let (scenario, proxy) = RunningProxy::serve(&db.url, "max_arguments_bytes = 1048576\n").await;
    let (lease, _) = db.running_run("agent", 60_000).await;
    let (agent, _) = connect_http(&proxy.url, Some(&lease)).await;

    let (code, message) = call(&agent, "payments__refund", json!({}), None)
        .await
        .unwrap_err();
    assert_eq!(
        (code, message.as_str()),
        (-32602, "unknown tool \"payments__refund\": see tools/list")
    );

    let huge = "x".repeat(1024 * 1024 + 10);
    let (code, message) = call(
        &agent,
        "mailer__send_email",
        json!({"to": "a@b.c", "body": huge}),
        None,
    )
    .await
    .unwrap_err();
    assert_eq!(code, -32602);
    assert!(message.starts_with("arguments are 1048"), "{message}");
    assert!(
        message.contains("bytes, above the policy limit of 1048576 (policy max_arguments_bytes"),
        "{message}"
    );

    let (code, message) = call(
        &agent,
        "payments__charge",
        json!({"amount": 9007199254740993u64, "currency": "eur"}),
        None,
    )
    .await
    .unwrap_err();
    assert_eq!(code, -32602);
    assert!(
        message.starts_with("integer 9007199254740993 at $.amount is beyond ±2^53"),
        "{message}"
    );
    // 2^64 arrives as a double, already rounded: refused too, never sent.
    let (code, message) = call(
        &agent,
        "payments__charge",
        json!({"amount": 18446744073709551616.0, "currency": "eur"}),
        None,
    )
    .await
    .unwrap_err();
    assert_eq!(code, -32602);
    assert!(message.contains("beyond ±2^53"), "{message}");

    let mut bad = lease_meta(&lease);
    bad.insert(
        "dev.leasegate/lease".into(),
        json!({"run_id": "nope", "owner": "agent", "epoch": 1}),
    );
    let (code, message) = send_email(&agent, "a@b.c", Some(bad)).await.unwrap_err();
    assert_eq!(code, -32602);
    assert!(message.contains("invalid run id \"nope\""), "{message}");

    // Malformed JSON-RPC over the wire.
    let response = http::post_mcp(
        &proxy.url,
        &[],
        "{\"jsonrpc\": \"2.0\", \"id\": 1, \"method\": ",
    )
    .await;
    // JSON-RPC's parse error, with HTTP 400 (`mcp::malformed`; rmcp alone
    // would answer 415 and plain text).
    assert_eq!(response.status, 400, "{}", response.body);
    let body: Value = serde_json::from_str(&response.body).unwrap();
    assert_eq!(body["error"]["code"], -32700, "{body}");
    assert_eq!(body["id"], Value::Null, "{body}");

    assert!(scenario.side_effects("emails.jsonl").is_empty());
    assert!(scenario.side_effects("charges.jsonl").is_empty());
    assert_eq!(
        db.row_count("tool_operations").await,
        0,
        "no refused call left a row"
    );

    // A business failure (isError) is final, recorded and replayed.
    let failed = send_email(&agent, "nobody", None).await.unwrap();
    assert_eq!(failed.is_error, Some(true));
    assert_eq!(operation_note(&failed)["status"], "failed_final");
    let replayed = send_email(&agent, "nobody", None).await.unwrap();
    assert_eq!(
        (
            replayed.is_error,
            operation_note(&replayed)["replayed"].clone()
        ),
        (Some(true), json!(true))
    );
    proxy.stop().await;
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn a_lease_lost_mid_run_never_reads_as_a_tool_failure(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let (scenario, proxy) = RunningProxy::serve(&db.url, POLICY).await;
    let (lease, revision) = db.running_run("agent", 60_000).await;
    let (agent, _) = connect_http(&proxy.url, None).await;
    charge_eur(&agent, 1, Some(lease_meta(&lease)))
        .await
        .unwrap();
    db.complete_run(&lease, revision, None).await;
    let (code, message) = charge_eur(&agent, 2, Some(lease_meta(&lease)))
        .await
        .unwrap_err();
    assert_eq!(code, -31004, "{message}");
    assert!(message.contains("run is succeeded"), "{message}");
    let stale = LeaseClaim {
        epoch: 7,
        ..lease.clone()
    };
    let (code, _) = charge_eur(&agent, 1, Some(lease_meta(&stale)))
        .await
        .unwrap_err();
    assert_eq!(code, -31002);
    assert_eq!(scenario.side_effects("charges.jsonl").len(), 1);
    let _: Value = json!(null);
    proxy.stop().await;
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn policy_can_require_explicit_steps_and_mask_stored_requests(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let policy =
        "step_identity = \"explicit\"\nrequest_body = \"masked\"\nmasked_fields = [\"to\"]\n";
    let (scenario, proxy) = RunningProxy::serve(&db.url, policy).await;
    let (lease, _) = db.running_run("agent", 60_000).await;
    let (agent, _) = connect_http(&proxy.url, Some(&lease)).await;

    let email = json!({"to": "secret@example.com", "subject": "hi"});
    let (code, message) = call(&agent, "mailer__send_email", email.clone(), None)
        .await
        .unwrap_err();
    assert_eq!(code, -32602);
    assert!(
        message.starts_with("policy requires an explicit step"),
        "{message}"
    );
    assert!(scenario.side_effects("emails.jsonl").is_empty());

    let mut meta = serde_json::Map::new();
    meta.insert(
        "dev.leasegate/step".into(),
        json!({"step_id": "notify-customer", "effect_version": 1}),
    );
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    meta.insert("traceparent".into(), json!(traceparent));
    let sent = call(&agent, "mailer__send_email", email, Some(meta))
        .await
        .unwrap();
    let view = db.operation_view(&operation_id(&sent)).await;
    assert_eq!(view.operation.step_id, "notify-customer");
    assert_eq!(
        view.request_body,
        json!({"to": "***", "subject": "hi"}),
        "the address is not stored"
    );
    assert_eq!(
        scenario.side_effects("emails.jsonl")[0]["to"],
        "secret@example.com",
        "the tool got it"
    );
    let calls = scenario.side_effects("calls.jsonl");
    let upstream_call = calls
        .iter()
        .find(|c| c["tool"] == "send_email" && c["to"] == "secret@example.com")
        .unwrap();
    assert_eq!(
        upstream_call["traceparent"], traceparent,
        "W3C trace context reaches the upstream"
    );
    proxy.stop().await;
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn the_answer_is_recorded_even_when_the_agent_goes_away(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let (scenario, proxy) = RunningProxy::serve(&db.url, POLICY).await;
    let (lease, _) = db.running_run("agent", 60_000).await;
    let (agent, _) = connect_http(&proxy.url, Some(&lease)).await;

    // The tool answers after 300 ms; the agent disconnects before that.
    let pending = tokio::spawn(async move {
        let _ = call(
            &agent,
            "mailer__send_email",
            json!({"to": "x@y.z", "hang_ms": 300}),
            None,
        )
        .await;
    });
    common::wait_until("the call to be claimed", || async {
        (db.row_count("tool_operations").await == 1).then_some(())
    })
    .await;
    pending.abort();
    let status: String =
        common::wait_until("the answer to be settled without the agent", || async {
            let status: String = db.query_scalar("SELECT status FROM tool_operations").await;
            (status != "dispatching").then_some(status)
        })
        .await;
    assert_eq!(status, "succeeded");
    assert_eq!(scenario.side_effects("emails.jsonl").len(), 1);
    proxy.stop().await;
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn an_upstream_that_is_gone_before_the_send_leaves_the_operation_pending_never_failed(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let (scenario, proxy) = RunningProxy::serve(&db.url, POLICY).await;
    let (lease, _) = db.running_run("agent", 60_000).await;
    let (agent, _) = connect_http(&proxy.url, Some(&lease)).await;

    // The mailer child dies; leasegate's client of it notices its stdout close.
    let pid: i32 = std::fs::read_to_string(scenario.dir.join("state/mailer.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // And it stays gone: a directory where the pid file goes makes every
    // restart of it fail (tests/integration/upstream_supervision.rs covers the restart).
    std::fs::remove_file(scenario.dir.join("state/mailer.pid")).unwrap();
    std::fs::create_dir(scenario.dir.join("state/mailer.pid")).unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    common::wait_until("the mailer process to be gone", || async {
        let alive = std::path::Path::new(&format!("/proc/{pid}/status"))
            .exists()
            .then(|| std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default())
            .is_some_and(|status| !status.contains("State:\tZ"));
        (!alive).then_some(())
    })
    .await;

    let step = |id: &str| {
        let mut meta = serde_json::Map::new();
        meta.insert(
            "dev.leasegate/step".into(),
            json!({"step_id": id, "effect_version": 1}),
        );
        meta
    };
    let (code, message) = send_email(&agent, "a@b.c", Some(step("mail-1")))
        .await
        .expect_err("nothing was sent: an error, not a result");
    assert_eq!(code, -31011, "{message}");
    assert!(message.contains("was not sent"), "{message}");
    let row: (String, String) = db
        .query_row("SELECT operation_id, status FROM tool_operations WHERE step_id = 'mail-1'")
        .await;
    let view = db
        .ledger
        .operation_get(&OperationId::from_string(row.0.clone()))
        .await
        .unwrap()
        .unwrap();
    // Proven not sent: never failed_final, never unknown, pending under the
    // same operation id.
    assert_eq!(view.operation.status, OperationStatus::Prepared);
    let evidence = &view.evidence[0];
    assert_eq!(
        (evidence.kind.as_str(), evidence.outcome.as_deref()),
        ("not_sent", Some("not_sent"))
    );
    assert!(
        evidence.body["attempts"].as_u64().unwrap() >= 1,
        "{evidence:?}"
    );
    // The agent's re-call of the same step claims the same operation again
    // (and, the mailer still gone, is refused the same way).
    let (code, _) = send_email(&agent, "a@b.c", Some(step("mail-1")))
        .await
        .expect_err("still not sent");
    assert_eq!(code, -31011);
    let again = db.operation_view(&OperationId::from_string(row.0)).await;
    assert_eq!(
        (again.operation.status, again.operation.dispatch_count),
        (OperationStatus::Prepared, 2)
    );
    assert!(scenario.side_effects("emails.jsonl").is_empty());
    proxy.stop().await;
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn an_unprefixed_upstream_is_called_by_its_own_tool_names(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let scenario = Scenario::new(&db.url, POLICY);
    let config = replace_exactly(
        &std::fs::read_to_string(scenario.config_path()).unwrap(),
        "migrate = false",
        "migrate = false\nunprefixed = [\"payments\"]",
    );
    std::fs::write(scenario.config_path(), config).unwrap();
    let proxy = RunningProxy::start(&scenario.config_path()).await;
    let (lease, _) = db.running_run("agent", 60_000).await;
    let (agent, _) = connect_http(&proxy.url, Some(&lease)).await;
    let names = common::proxy::tool_names(&agent).await;
    assert_eq!(
        names,
        vec![
            "charge",
            "get_charge",
            "mailer__mail_stats",
            "mailer__send_email"
        ]
    );
    let charged = call(
        &agent,
        "charge",
        json!({"amount": 1, "currency": "eur"}),
        None,
    )
    .await
    .unwrap();
    assert_eq!(operation_note(&charged)["status"], "succeeded");
    let found = call(
        &agent,
        "get_charge",
        json!({"idempotency_key": operation_id(&charged).as_str()}),
        None,
    )
    .await
    .unwrap();
    assert_eq!(found.structured_content.unwrap()["found"], true);
    proxy.stop().await;
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn a_sessionless_2026_07_28_client_lists_and_calls_through_leasegate(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    use rmcp::model::ProtocolVersion;
    use rmcp::transport::StreamableHttpClientTransport;
    use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
    use rmcp::{ClientLifecycleMode, ClientServiceExt};

    let db = TestDb::new(pool, connect).await;
    let (scenario, proxy) = RunningProxy::serve(&db.url, POLICY).await;
    let (lease, _) = db.running_run("agent", 60_000).await;
    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(proxy.url.as_str()),
    );
    let agent = common::proxy::Agent::default()
        .serve_with_lifecycle(
            transport,
            ClientLifecycleMode::Discover {
                preferred_versions: vec![ProtocolVersion::V_2026_07_28],
            },
        )
        .await
        .expect("server/discover succeeds");
    let tools = agent.peer().list_all_tools().await.unwrap();
    assert_eq!(tools.len(), 4);
    let charged = charge_eur(&agent, 8, Some(lease_meta(&lease)))
        .await
        .unwrap();
    assert_eq!(operation_note(&charged)["status"], "succeeded");
    assert_eq!(scenario.side_effects("charges.jsonl").len(), 1);
    proxy.stop().await;
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn an_error_the_provider_documents_as_nothing_done_leaves_the_operation_sendable(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let payments = replace_exactly(
        common::proxy::PAYMENTS_ADAPTER,
        "key_retention = \"24h\"",
        "key_retention = \"24h\"\nnot_done_errors = [{ pointer = \"/error/code\", values = [\"unavailable\"] }]",
    );
    let scenario =
        Scenario::with_adapters(&db.url, POLICY, &payments, common::proxy::MAILER_ADAPTER);
    // Every charge answers "temporarily unavailable, nothing was done"
    // until the state directory has a `calm` file.
    let config = std::fs::read_to_string(scenario.config_path()).unwrap();
    std::fs::write(
        scenario.config_path(),
        replace_exactly(
            &config,
            r#"args = ["--tools", "payments","#,
            r#"args = ["--fault-transient", "1", "--tools", "payments","#,
        ),
    )
    .unwrap();
    let proxy = RunningProxy::start(&scenario.config_path()).await;
    let (lease, _) = db.running_run("agent", 60_000).await;
    let (agent, _) = connect_http(&proxy.url, Some(&lease)).await;
    let arguments = json!({"amount": 12, "currency": "eur"});

    let first = call(&agent, "payments__charge", arguments.clone(), None)
        .await
        .unwrap();
    assert_eq!(first.is_error, Some(true), "{first:?}");
    let note = operation_note(&first);
    assert_eq!(note["status"], "prepared", "{first:?}");
    let id = OperationId::from_string(note["operation_id"].as_str().unwrap().to_owned());
    let view = db.operation_view(&id).await;
    assert_eq!(view.operation.status, OperationStatus::Prepared);
    assert_eq!(view.evidence[0].kind.as_str(), "not_sent");
    assert!(scenario.side_effects("charges.jsonl").is_empty());

    // The provider recovers; the same call sends the same operation once.
    std::fs::write(scenario.dir.join("state/calm"), "").unwrap();
    let second = call(&agent, "payments__charge", arguments, None)
        .await
        .unwrap();
    assert_ne!(second.is_error, Some(true), "{second:?}");
    let note = operation_note(&second);
    assert_eq!(
        (note["status"].as_str(), note["operation_id"].as_str()),
        (Some("succeeded"), Some(id.as_str()))
    );
    let charges = scenario.side_effects("charges.jsonl");
    assert_eq!(charges.len(), 1, "{charges:?}");
    assert_eq!(charges[0]["idempotency_key"], id.as_str());
    proxy.stop().await;
}

/// Every agent call is counted by how it ended, over which front, for
/// which tool and under which lease, and the console's calls per second
/// reads that count: a first call, its replay, a refusal (with its reason)
/// and a read-only call each move their own series.
#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn every_agent_call_is_counted_by_outcome(pool: PgPoolOptions, connect: PgConnectOptions) {
    let db = TestDb::new(pool, connect).await;
    let (_scenario, proxy) = RunningProxy::serve(&db.url, POLICY).await;
    let (lease, _) = db.running_run("counted-agent", 60_000).await;
    let (agent, _) = connect_http(&proxy.url, None).await;
    let gated = [
        ("front", "http_stateless"),
        ("path", "gated"),
        ("tool", "payments__charge"),
    ];
    let series = [
        [
            gated[0],
            gated[1],
            gated[2],
            ("mode", "explicit"),
            ("outcome", "succeeded"),
            ("replayed", "false"),
        ],
        [
            gated[0],
            gated[1],
            gated[2],
            ("mode", "explicit"),
            ("outcome", "succeeded"),
            ("replayed", "true"),
        ],
        [
            gated[0],
            gated[1],
            gated[2],
            ("mode", "none"),
            ("outcome", "refused"),
            ("reason", "lease_missing"),
        ],
        [
            gated[0],
            ("path", "read_only"),
            ("tool", "payments__get_charge"),
            ("mode", "none"),
            ("outcome", "answered"),
            ("replayed", "false"),
        ],
    ];
    // The recorder is the process's: other tests count too, so deltas.
    let read = || async {
        let text = http::get(&format!("{}/metrics", proxy.control_url))
            .await
            .body;
        series.map(|labels| common::prometheus::sum(&text, "leasegate_agent_calls_total", &labels))
    };
    let before = read().await;
    let charged = charge_eur(&agent, 3, Some(lease_meta(&lease)))
        .await
        .unwrap();
    charge_eur(&agent, 3, Some(lease_meta(&lease)))
        .await
        .unwrap();
    let refused = charge_eur(&agent, 4, None).await.unwrap_err();
    assert_eq!(refused.0, -31001, "{refused:?}");
    call(
        &agent,
        "payments__get_charge",
        json!({"idempotency_key": operation_id(&charged).as_str()}),
        None,
    )
    .await
    .unwrap();
    let after = read().await;
    common::prometheus::assert_each_grew(&series, &before, &after);
    proxy.stop().await;
}
