//! The background loops: unknown outcomes converge to remote fact per
//! adapter capability; a process killed after the remote side effect is
//! recovered by the next one; several processes share the work without a
//! leader; metrics move.

use crate::common;
use crate::common::intents;
use crate::common::proxy::spawn_call;

use common::proxy::{
    LEASEGATE, MAILER_ADAPTER, RunningProxy, Scenario, ServedChild, call, connect_http,
};
use common::{TestDb, http, prometheus, replace_exactly, wait_until, within};
use leasegate::intent::Intent;
use leasegate::ledger::{MarkUnknown, OperationStatus, UnknownBy, UnknownCause};
use serde_json::{Value, json};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

const FAST: &str = "claim_ttl = \"3s\"\ndispatch_interval = \"100ms\"\nreconcile_interval = \"100ms\"\nin_flight_wait = \"1s\"\n";

fn calls_of(scenario: &Scenario, tool: &str) -> Vec<Value> {
    scenario
        .side_effects("calls.jsonl")
        .into_iter()
        .filter(|c| c["tool"] == tool)
        .collect()
}

/// `leasegate serve` as a child process; returns it with its MCP and control URLs.
async fn serve_child(scenario: &Scenario) -> (tokio::process::Child, String, String) {
    let served = ServedChild::spawn(ServedChild::command(scenario, &[])).await;
    (served.child, served.mcp, served.control)
}

/// The sum of one metric's samples with these labels, as the control listener serves it.
async fn metric(control: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    let answer = http::get(&format!("{control}/metrics")).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    prometheus::sum(&answer.body, name, labels)
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn acceptance_e_killed_after_the_remote_side_effect_idempotent_converges_and_none_stays_unknown(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let mailer = replace_exactly(MAILER_ADAPTER, "700ms", "2s");
    let payments = common::proxy::PAYMENTS_ADAPTER;
    let scenario = Scenario::with_adapters(&db.url, FAST, payments, &mailer);
    let (lease, _) = db.running_run("agent", 120_000).await;

    let (mut first, mcp, _) = serve_child(&scenario).await;
    let (agent, _) = connect_http(&mcp, Some(&lease)).await;
    let agent = std::sync::Arc::new(agent);
    // Both tools perform their side effect, then hang: the answer never comes.
    let charge = spawn_call(
        &agent,
        "payments__charge",
        json!({"amount": 9, "currency": "eur", "hang_ms": 20000}),
    );
    let email = spawn_call(
        &agent,
        "mailer__send_email",
        json!({"to": "e@x.y", "hang_ms": 20000}),
    );
    wait_until("both side effects to happen at the tools", || async {
        (scenario.side_effects("charges.jsonl").len() == 1
            && scenario.side_effects("emails.jsonl").len() == 1)
            .then_some(())
    })
    .await;
    // Killed before it records anything.
    first.kill().await.unwrap();
    charge.abort();
    email.abort();
    assert_eq!(
        db.status_of_tool("payments__charge").await.as_deref(),
        Some("dispatching")
    );
    assert_eq!(
        db.status_of_tool("mailer__send_email").await.as_deref(),
        Some("dispatching")
    );

    // A new process: claims expire into unknown, then converge per capability.
    let (mut second, second_mcp, control) = serve_child(&scenario).await;
    db.wait_tool_status(
        "the idempotent charge to converge",
        "payments__charge",
        "succeeded",
    )
    .await;
    wait_until(
        "the reconciler to have judged the mail unrecoverable",
        || async {
            (metric(
                &control,
                "reconcile_total",
                &[("outcome", "needs_operator")],
            )
            .await
                >= 1.0)
                .then_some(())
        },
    )
    .await;
    assert_eq!(
        scenario.side_effects("charges.jsonl").len(),
        1,
        "exactly one charge exists"
    );
    assert_eq!(
        calls_of(&scenario, "charge").len(),
        2,
        "the original call and one same-key retry"
    );
    let charges = scenario.side_effects("charges.jsonl");
    assert_eq!(
        calls_of(&scenario, "charge")[1]["idempotency_key"],
        charges[0]["idempotency_key"]
    );
    assert_eq!(
        db.status_of_tool("mailer__send_email").await.as_deref(),
        Some("unknown")
    );
    assert_eq!(
        calls_of(&scenario, "send_email").len(),
        1,
        "a `none` tool is never re-sent"
    );
    let remote: Option<String> = db
        .query_scalar("SELECT remote_id FROM tool_operations WHERE tool_name = 'payments__charge'")
        .await;
    assert_eq!(remote.as_deref(), Some("ch_1"));

    // A retry can do nothing for a `none` tool: refused with nothing
    // written, by the serving process's control API and by the CLI that
    // reads the same config.
    let email: String = db
        .query_scalar(
            "SELECT operation_id FROM tool_operations WHERE tool_name = 'mailer__send_email'",
        )
        .await;
    let events_before: i64 = db
        .query_scalar("SELECT count(*) FROM ledger_events WHERE operation_id = (SELECT operation_id FROM tool_operations WHERE tool_name = 'mailer__send_email')")
        .await;
    let refused = http::post(
        &format!("{control}/v1/operations/{email}/retry"),
        &[("content-type", "application/json")],
        &json!({"actor": "alice", "note": "try again"}).to_string(),
    )
    .await;
    assert_eq!(refused.status, 409, "{}", refused.body);
    let refused: Value = serde_json::from_str(&refused.body).unwrap();
    assert_eq!(refused["code"], "nothing_to_retry", "{refused}");
    assert!(
        refused["message"].as_str().unwrap().contains("`none`")
            && refused["message"].as_str().unwrap().contains("ops resolve"),
        "the refusal says why and what to do instead: {refused}"
    );
    let cli = std::process::Command::new(LEASEGATE)
        .args(["ops", "retry", &email, "--note", "try again", "--config"])
        .arg(scenario.config_path())
        .env_remove("LEASEGATE_DATABASE_URL")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&cli.stderr);
    assert_eq!(cli.status.code(), Some(4), "{stderr}");
    assert!(stderr.contains("nothing_to_retry"), "{stderr}");
    let events_after: i64 = db
        .query_scalar("SELECT count(*) FROM ledger_events WHERE operation_id = (SELECT operation_id FROM tool_operations WHERE tool_name = 'mailer__send_email')")
        .await;
    assert_eq!(events_after, events_before, "nothing written");

    // An operator who checked the mail log resolves it; the agent's repeat
    // of the call then hears the resolution: who, why, the remote id.
    let resolved = std::process::Command::new(LEASEGATE)
        .args([
            "ops",
            "resolve",
            &email,
            "--succeeded",
            "--note",
            "delivered: in the mail log",
        ])
        .args(["--remote-id", "msg_1", "--actor", "alice", "--config"])
        .arg(scenario.config_path())
        .env_remove("LEASEGATE_DATABASE_URL")
        .output()
        .unwrap();
    assert!(
        resolved.status.success(),
        "{}",
        String::from_utf8_lossy(&resolved.stderr)
    );
    let (agent, _) = connect_http(&second_mcp, Some(&lease)).await;
    let again = call(
        &agent,
        "mailer__send_email",
        json!({"to": "e@x.y", "hang_ms": 20000}),
        None,
    )
    .await
    .unwrap();
    let note = common::proxy::operation_note(&again);
    assert_eq!(
        (note["status"].as_str(), note["replayed"].as_bool()),
        (Some("succeeded"), Some(true))
    );
    let resolution = &again.structured_content.as_ref().unwrap()["resolution"];
    assert_eq!(
        (
            resolution["by"].as_str(),
            resolution["note"].as_str(),
            resolution["remote_id"].as_str()
        ),
        (
            Some("alice"),
            Some("delivered: in the mail log"),
            Some("msg_1")
        ),
        "{again:?}"
    );
    let text = again.content[0].as_text().unwrap().text.clone();
    assert!(
        text.contains("operator alice resolved") && text.contains("delivered"),
        "{text}"
    );
    assert_eq!(
        calls_of(&scenario, "send_email").len(),
        1,
        "the repeat sent nothing"
    );
    second.kill().await.unwrap();
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn an_unknown_outcome_is_reconciled_by_query_without_a_second_create(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let payments = r#"upstream = "payments"
timeout = "2s"
[tools.charge]
capability = "operation_query"
operation_id_argument = "idempotency_key"
query_tool = "get_charge"
query_argument = "idempotency_key"
query_remote_id_pointer = "/charge/charge_id"
query_resource_pointer = "/charge"
timeout = "500ms"
[tools.get_charge]
read_only = true
"#;
    let scenario = Scenario::with_adapters(&db.url, FAST, payments, MAILER_ADAPTER);
    let proxy = RunningProxy::start(&scenario.config_path()).await;
    let (lease, _) = db.running_run("agent", 60_000).await;
    let (agent, _) = connect_http(&proxy.url, Some(&lease)).await;
    let first = call(
        &agent,
        "payments__charge",
        json!({"amount": 3, "currency": "eur", "hang_ms": 3000}),
        None,
    )
    .await
    .unwrap();
    assert_eq!(
        first.structured_content.as_ref().unwrap()["status"],
        "unknown"
    );

    db.wait_tool_status(
        "the query to converge the operation",
        "payments__charge",
        "succeeded",
    )
    .await;
    assert_eq!(calls_of(&scenario, "charge").len(), 1, "no second create");
    let id = leasegate::intent::OperationId::from_string(
        first.structured_content.as_ref().unwrap()["operation_id"]
            .as_str()
            .unwrap()
            .to_owned(),
    );
    let view = db.operation_view(&id).await;
    assert_eq!(view.operation.remote_id.as_deref(), Some("ch_1"));
    assert_eq!(view.events.last().unwrap().actor_kind, "reconciler");
    // The agent asking again now gets the converged fact.
    let again = call(
        &agent,
        "payments__charge",
        json!({"amount": 3, "currency": "eur", "hang_ms": 3000}),
        None,
    )
    .await
    .unwrap();
    assert_eq!(common::proxy::operation_note(&again)["status"], "succeeded");
    proxy.stop().await;
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn a_retry_past_the_key_retention_window_is_refused(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let payments = replace_exactly(common::proxy::PAYMENTS_ADAPTER, "24h", "100ms");
    // The charge times out well before its 2 s hang (this edit never
    // applied while the pattern named a line order the fixture does not have).
    let payments = replace_exactly(
        &payments,
        "remote_id_pointer = \"/charge_id\"\ntimeout = \"2s\"",
        "remote_id_pointer = \"/charge_id\"\ntimeout = \"500ms\"",
    );
    let scenario = Scenario::with_adapters(&db.url, FAST, &payments, MAILER_ADAPTER);
    let proxy = RunningProxy::start(&scenario.config_path()).await;
    let signals = proxy_signals(&proxy).await;
    let (lease, _) = db.running_run("agent", 60_000).await;
    let (agent, _) = connect_http(&proxy.url, Some(&lease)).await;
    let first = call(
        &agent,
        "payments__charge",
        json!({"amount": 4, "currency": "eur", "hang_ms": 2000}),
        None,
    )
    .await
    .unwrap();
    assert_eq!(
        first.structured_content.as_ref().unwrap()["status"],
        "unknown"
    );

    // Let the reconciler look at it several times after the window closed.
    let passes = signals.reconcile.passes();
    common::within(
        "three reconciler passes",
        signals.reconcile.reached(passes + 3),
    )
    .await;
    assert_eq!(
        db.status_of_tool("payments__charge").await.as_deref(),
        Some("unknown")
    );
    assert_eq!(
        calls_of(&scenario, "charge").len(),
        1,
        "never retried past the window"
    );
    let attempts: i32 = db
        .query_scalar("SELECT reconcile_attempts FROM tool_operations")
        .await;
    assert_eq!(attempts, 0);
    proxy.stop().await;
}

async fn proxy_signals(proxy: &RunningProxy) -> std::sync::Arc<leasegate::reconcile::Signals> {
    proxy.signals.clone().expect("the background loops run")
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn two_processes_reconcile_each_unknown_operation_once(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let scenario = Scenario::new(&db.url, FAST);
    let (lease, _) = db.running_run("agent", 60_000).await;
    // Six unknown charges that never reached the tool.
    let mut ids = Vec::new();
    for n in 0..6 {
        let intent = intents::planned(
            lease.run_id,
            &format!("charge-{n}"),
            "payments__charge",
            &json!({"amount": n, "currency": "eur"}),
        );
        let claim = db.claim(&lease, &intent, "crashed-proxy", 60_000).await;
        db.holder_marks_unknown(&claim, UnknownCause::SendError, &json!({"error": "reset"}))
            .await;
        ids.push(intent.operation_id);
    }
    let a = RunningProxy::start(&scenario.config_path()).await;
    let b = RunningProxy::start(&scenario.config_path()).await;
    wait_until("every unknown charge to converge", || async {
        let left: i64 = db
            .query_scalar("SELECT count(*) FROM tool_operations WHERE status <> 'succeeded'")
            .await;
        (left == 0).then_some(())
    })
    .await;
    let calls = calls_of(&scenario, "charge");
    for id in &ids {
        let count = calls
            .iter()
            .filter(|c| c["idempotency_key"] == id.as_str())
            .count();
        assert_eq!(count, 1, "operation {id} was retried {count} times");
    }
    assert_eq!(scenario.side_effects("charges.jsonl").len(), 6);
    a.stop().await;
    b.stop().await;
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn operators_resolve_only_unknown_operations_once_with_a_note(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let (lease, _) = db.running_run("agent", 60_000).await;
    let intent = intents::unplanned(lease.run_id, "mailer__send_email", &json!({"to": "a@b.c"}));
    let claim = db.claim(&lease, &intent, "p", 60_000).await;
    let cli = |args: &[&str]| {
        std::process::Command::new(LEASEGATE)
            .args(args)
            .args(["--database-url", &db.url])
            .output()
            .unwrap()
    };
    let id = intent.operation_id.as_str();
    // Not unknown yet: refused.
    assert_eq!(
        cli(&[
            "ops",
            "resolve",
            id,
            "--succeeded",
            "--note",
            "saw it",
            "--actor",
            "alice"
        ])
        .status
        .code(),
        Some(4)
    );
    db.holder_marks_unknown(&claim, UnknownCause::TimedOut, &json!({}))
        .await;
    let resolved = cli(&[
        "ops",
        "resolve",
        id,
        "--failed-final",
        "--note",
        "provider says never delivered",
        "--actor",
        "alice",
    ]);
    assert_eq!(
        resolved.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&resolved.stderr)
    );
    assert_eq!(
        cli(&[
            "ops",
            "resolve",
            id,
            "--succeeded",
            "--note",
            "again",
            "--actor",
            "bob"
        ])
        .status
        .code(),
        Some(4)
    );
    let view = db.operation_view(&intent.operation_id).await;
    assert_eq!(view.operation.status, OperationStatus::FailedFinal);
    let last = view.events.last().unwrap();
    assert_eq!(
        (last.actor_kind.as_str(), last.actor.as_deref()),
        ("operator", Some("alice"))
    );
    assert_eq!(last.detail["note"], "provider says never delivered");
    // A note is required.
    assert_eq!(
        cli(&[
            "ops",
            "resolve",
            id,
            "--succeeded",
            "--note",
            " ",
            "--actor",
            "bob"
        ])
        .status
        .code(),
        Some(2)
    );
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn metrics_expose_the_ledger_and_reconciler_after_a_scenario(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let handle = leasegate::app::metrics_handle();
    let db = TestDb::new(pool, connect).await;
    let (_scenario, proxy) = RunningProxy::serve(&db.url, FAST).await;
    handle.run_upkeep();
    let before = handle.render();

    // Leases: acquire, busy, takeover after expiry, renew ok and lost, a rejected save.
    let (old, revision) = db.running_run("old", 200).await;
    assert!(matches!(
        db.ledger
            .lease_acquire(old.run_id, "rival", 1000)
            .await
            .unwrap(),
        leasegate::ledger::AcquireOutcome::Busy { .. }
    ));
    db.wait_lease_expired(old.run_id).await;
    let new = db.acquire(old.run_id, "new", 60_000).await;
    db.ledger
        .lease_renew(&new.claim, 60_000)
        .await
        .unwrap()
        .into_result()
        .unwrap();
    assert!(
        !db.ledger
            .lease_renew(&old, 60_000)
            .await
            .unwrap()
            .is_applied()
    );
    assert!(
        !db.ledger
            .checkpoint_save(&old, revision, &json!({}))
            .await
            .unwrap()
            .is_applied()
    );
    // A call whose outcome is unknown (mailer hangs), left for an operator.
    let (agent, _) = connect_http(&proxy.url, Some(&new.claim)).await;
    call(
        &agent,
        "mailer__send_email",
        json!({"to": "m@x.y", "hang_ms": 3000}),
        None,
    )
    .await
    .unwrap();
    let signals = proxy_signals(&proxy).await;
    let passes = signals.reconcile.passes();
    common::within(
        "two reconciler passes",
        signals.reconcile.reached(passes + 2),
    )
    .await;
    handle.run_upkeep();
    let after = handle.render();

    for (name, at_least) in [
        ("lease_acquire_total", 3.0),
        ("lease_renew_total", 2.0),
        ("protected_write_rejected_total", 2.0),
        ("lease_row_lock_wait_seconds_count", 3.0),
        ("workflow_takeover_duration_seconds_count", 1.0),
        ("reconcile_total", 1.0),
        ("tool_operation_unknown_total", 1.0),
        ("upstream_call_duration_seconds_count", 1.0),
    ] {
        let moved = prometheus::sum(&after, name, &[]) - prometheus::sum(&before, name, &[]);
        assert!(
            moved >= at_least,
            "{name} moved by {moved}, expected at least {at_least}\n{after}"
        );
    }
    assert!(
        prometheus::has(&after, "lease_acquire_total", &[("outcome", "taken_over")]),
        "{after}"
    );
    assert!(
        prometheus::has(&after, "lease_renew_total", &[("outcome", "lost")]),
        "{after}"
    );
    assert!(
        prometheus::has(
            &after,
            "protected_write_rejected_total",
            &[("reason", "lease_lost")]
        ),
        "{after}"
    );
    // Gauges are process-wide and other tests' loops set them too: only
    // their presence is checked; the counter shows this test's unknown.
    assert!(after.contains("tool_operation_unknown_count"), "{after}");
    assert!(
        after.contains("tool_operation_unknown_oldest_age_seconds"),
        "{after}"
    );
    // No high-cardinality ids as labels.
    for id in [old.run_id.to_string(), "tenant-a".to_owned()] {
        assert!(!after.contains(&id), "{id} must not be a label");
    }
    // The control listener serves the same text.
    let served = http::get(&format!("{}/metrics", proxy.control_url)).await;
    assert_eq!(served.status, 200);
    assert!(
        prometheus::sum(&served.body, "lease_acquire_total", &[]) >= 3.0,
        "{}",
        served.body
    );
    proxy.stop().await;
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn the_dispatcher_sends_planned_intents_without_any_agent_call(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let scenario = Scenario::new(&db.url, FAST);
    let (lease, revision) = db.running_run("planner", 60_000).await;
    let plan: Vec<Intent> = (0..3)
        .map(|n| {
            intents::planned(
                lease.run_id,
                &format!("pay-{n}"),
                "payments__charge",
                &json!({"amount": 10 + n, "currency": "eur"}),
            )
        })
        .collect();
    let checkpoint = json!({"plan": "three payments"});
    common::applied(
        db.ledger
            .operation_register(
                &lease,
                &plan,
                Some(leasegate::ledger::PlannedCheckpoint {
                    expected_revision: revision,
                    checkpoint: &checkpoint,
                }),
            )
            .await
            .unwrap(),
    );

    let proxy = RunningProxy::start(&scenario.config_path()).await;
    wait_until("the dispatcher to settle every planned intent", || async {
        let settled: i64 = db
            .query_scalar("SELECT count(*) FROM tool_operations WHERE status = 'succeeded'")
            .await;
        (settled == 3).then_some(())
    })
    .await;
    let charges = scenario.side_effects("charges.jsonl");
    assert_eq!(charges.len(), 3);
    for intent in &plan {
        assert_eq!(
            charges
                .iter()
                .filter(|c| c["idempotency_key"] == intent.operation_id.as_str())
                .count(),
            1
        );
        let view = db.operation_view(&intent.operation_id).await;
        assert_eq!(view.events.last().unwrap().actor_kind, "dispatcher");
        // Sent by the outbox: one claim, holding no lease (no worker, no
        // epoch), told by the settle that ended it.
        let claims: Vec<_> = view
            .claims
            .iter()
            .map(|c| {
                (
                    c.worker.as_deref(),
                    c.epoch,
                    c.dispatch_count,
                    c.ended.as_deref(),
                )
            })
            .collect();
        assert_eq!(claims, [(None, None, Some(1), Some("succeeded"))]);
    }
    proxy.stop().await;
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn a_resource_id_tool_converges_when_the_found_resource_matches_the_intent(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let payments = r#"upstream = "payments"
timeout = "2s"
[tools.charge]
capability = "resource_id"
operation_id_argument = "idempotency_key"
query_tool = "get_charge"
query_argument = "idempotency_key"
query_resource_pointer = "/charge"
query_remote_id_pointer = "/charge/charge_id"
match_fields = ["amount", "currency"]
timeout = "500ms"
[tools.get_charge]
read_only = true
"#;
    let scenario = Scenario::with_adapters(&db.url, FAST, payments, MAILER_ADAPTER);
    let proxy = RunningProxy::start(&scenario.config_path()).await;
    let (lease, _) = db.running_run("agent", 60_000).await;
    let (agent, _) = connect_http(&proxy.url, Some(&lease)).await;
    let first = call(
        &agent,
        "payments__charge",
        json!({"amount": 77, "currency": "usd", "hang_ms": 2000}),
        None,
    )
    .await
    .unwrap();
    assert_eq!(
        first.structured_content.as_ref().unwrap()["status"],
        "unknown"
    );
    db.wait_tool_status(
        "the resource check to converge it",
        "payments__charge",
        "succeeded",
    )
    .await;
    assert_eq!(calls_of(&scenario, "charge").len(), 1);
    let remote: Option<String> = db
        .query_scalar("SELECT remote_id FROM tool_operations")
        .await;
    assert_eq!(remote.as_deref(), Some("ch_1"));
    proxy.stop().await;
}

/// An upstream that must not be reached.
struct Unreachable;

impl leasegate::adapter::Upstream for Unreachable {
    async fn call(
        &self,
        call: leasegate::adapter::UpstreamCall,
    ) -> Result<leasegate::adapter::ToolReply, leasegate::adapter::UpstreamError> {
        panic!(
            "the reconciler called {} although a late response was on record",
            call.tool
        );
    }
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn a_late_response_converges_through_the_reconciler_never_directly(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let (lease, _) = db.running_run("agent", 60_000).await;
    let intent = intents::unplanned(lease.run_id, "mailer__send_email", &json!({"to": "a@b.c"}));
    let claim = db.claim(&lease, &intent, "paused-proxy", 200).await;
    // The claim lapses and becomes unknown; then the paused holder's answer arrives.
    wait_until("the claim to lapse", || async {
        let outcome = db
            .ledger
            .operation_mark_unknown(MarkUnknown {
                claim: &claim,
                by: UnknownBy::Reconciler,
                actor: "reconciler",
                cause: UnknownCause::TimedOut,
                evidence: &json!({}),
            })
            .await
            .unwrap();
        matches!(
            outcome,
            leasegate::ledger::MarkUnknownOutcome::MarkedUnknown { .. }
        )
        .then_some(())
    })
    .await;
    let late = db
        .settle_succeeded(
            &claim,
            Some("msg_9"),
            &json!({"structuredContent": {"message_id": "msg_9"}}),
        )
        .await;
    assert!(matches!(
        late,
        leasegate::ledger::SettleOutcome::KeptAsEvidence { .. }
    ));
    assert_eq!(
        db.status_of_tool("mailer__send_email").await.as_deref(),
        Some("unknown"),
        "evidence never settles directly"
    );

    let mut directory = leasegate::adapter::ToolDirectory::new();
    directory.insert(
        "mailer__send_email".into(),
        leasegate::adapter::ResolvedTool {
            upstream: "mailer".into(),
            tool: "send_email".into(),
            adapter: leasegate::adapter::ToolAdapter::unknown(std::time::Duration::from_secs(1)),
        },
    );
    let background = leasegate::reconcile::Background::new(
        db.ledger.clone(),
        std::sync::Arc::new(Unreachable),
        std::sync::Arc::new(leasegate::adapter::SharedDirectory::new(directory)),
        leasegate::policy::Policy::default(),
        "tenant-a",
        "reconciler-test".to_owned(),
    );
    assert_eq!(background.reconciler.once().await.unwrap(), 1);
    let view = db.operation_view(&intent.operation_id).await;
    assert_eq!(
        (view.operation.status, view.operation.remote_id.as_deref()),
        (OperationStatus::Succeeded, Some("msg_9"))
    );
    assert_eq!(view.events.last().unwrap().detail["kind"], "late_response");
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn a_resource_that_does_not_match_the_intent_is_not_taken_as_its_outcome(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let payments = r#"upstream = "payments"
timeout = "2s"
[tools.charge]
capability = "resource_id"
operation_id_argument = "idempotency_key"
query_tool = "get_charge"
query_argument = "idempotency_key"
query_resource_pointer = "/charge"
match_fields = ["amount", "currency"]
timeout = "500ms"
[tools.get_charge]
read_only = true
"#;
    let scenario = Scenario::with_adapters(&db.url, FAST, payments, MAILER_ADAPTER);
    let (lease, _) = db.running_run("agent", 60_000).await;
    let intent = intents::unplanned_charge(lease.run_id, 5, "eur");
    let claim = db.claim(&lease, &intent, "crashed-proxy", 60_000).await;
    db.holder_marks_unknown(&claim, UnknownCause::SendError, &json!({"error": "reset"}))
        .await;
    // Someone else made a resource under the same deterministic id, with another spec.
    std::fs::create_dir_all(scenario.dir.join("state")).unwrap();
    std::fs::write(
        scenario.dir.join("state/charges.jsonl"),
        format!("{}\n", json!({"charge_id": "ch_1", "amount": 6, "currency": "eur", "idempotency_key": intent.operation_id.as_str()})),
    )
    .unwrap();

    let handle = leasegate::app::metrics_handle();
    let mismatches =
        |text: &str| prometheus::sum(text, "reconcile_total", &[("outcome", "resource_mismatch")]);
    let before = mismatches(&handle.render());
    let proxy = RunningProxy::start(&scenario.config_path()).await;
    let signals = proxy_signals(&proxy).await;
    let passes = signals.reconcile.passes();
    common::within(
        "the reconciler to look at it",
        signals.reconcile.reached(passes + 2),
    )
    .await;
    assert_eq!(
        db.status_of_tool("payments__charge").await.as_deref(),
        Some("unknown"),
        "a mismatching resource settles nothing"
    );
    assert_eq!(
        calls_of(&scenario, "charge").len(),
        0,
        "and nothing was created"
    );
    assert!(
        mismatches(&handle.render()) > before,
        "the reconciler found the resource and refused it"
    );
    proxy.stop().await;
}

/// Whether process `pid` is gone (or only a zombie awaiting its parent).
#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn sigterm_stops_leasegate_serve_and_ends_its_tool_servers(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let scenario = Scenario::new(&db.url, FAST);
    let (mut child, _, control) = serve_child(&scenario).await;
    let answer = http::get(&format!("{control}/metrics")).await;
    assert_eq!(answer.status, 200);
    let pids: Vec<i32> = ["payments.pid", "mailer.pid"]
        .iter()
        .map(|file| {
            std::fs::read_to_string(scenario.dir.join("state").join(file))
                .expect("the tool servers wrote their pid files")
                .trim()
                .parse()
                .unwrap()
        })
        .collect();
    assert!(
        pids.iter().all(|pid| !common::process_exited(*pid)),
        "{pids:?} run"
    );

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id().unwrap() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = within("leasegate serve to exit", child.wait())
        .await
        .unwrap();
    assert_eq!(status.code(), Some(0), "a clean shutdown");
    wait_until("the tool servers to end", || async {
        pids.iter()
            .all(|pid| common::process_exited(*pid))
            .then_some(())
    })
    .await;
    // Both listeners stopped accepting.
    let address = control.trim_start_matches("http://");
    assert_eq!(
        tokio::net::TcpStream::connect(address)
            .await
            .unwrap_err()
            .kind(),
        std::io::ErrorKind::ConnectionRefused
    );
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn background_work_touches_only_the_tenant_the_process_serves(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    // Tenant "tenant-a" has a planned intent, an unknown operation and a
    // claim that lapsed.
    let (lease, revision) = db.running_run("agent-1", 60_000).await;
    let intent = |id: &str, amount: u64| {
        intents::planned(
            lease.run_id,
            id,
            "payments__charge",
            &json!({"amount": amount, "currency": "eur"}),
        )
    };
    let planned = intent("planned", 1);
    common::applied(
        db.ledger
            .operation_register(
                &lease,
                std::slice::from_ref(&planned),
                Some(leasegate::ledger::PlannedCheckpoint {
                    expected_revision: revision,
                    checkpoint: &json!({}),
                }),
            )
            .await
            .unwrap(),
    );
    let unknown = intent("unknown", 2);
    let claim = db.claim(&lease, &unknown, "gone-proxy", 60_000).await;
    db.holder_marks_unknown(&claim, UnknownCause::TimedOut, &json!({}))
        .await;
    let lapsed = intent("lapsed", 3);
    db.claim(&lease, &lapsed, "gone-proxy", 1).await;

    // A process serving tenant "other" on the same database.
    let scenario = Scenario::new(&db.url, FAST);
    let config = std::fs::read_to_string(scenario.config_path()).unwrap();
    std::fs::write(
        scenario.config_path(),
        replace_exactly(&config, "tenant = \"tenant-a\"", "tenant = \"other\""),
    )
    .unwrap();
    let other = RunningProxy::start(&scenario.config_path()).await;
    let signals = other.signals.clone().expect("the background loops run");
    let (dispatch, expiry, reconcile) = (
        signals.dispatch.passes(),
        signals.expiry.passes(),
        signals.reconcile.passes(),
    );
    within("three passes of every service", async {
        signals.dispatch.reached(dispatch + 3).await;
        signals.expiry.reached(expiry + 3).await;
        signals.reconcile.reached(reconcile + 3).await;
    })
    .await;
    let row = |intent: &Intent| {
        let id = intent.operation_id.as_str().to_owned();
        let admin = db.admin.clone();
        async move {
            sqlx::query_as::<_, (String, i32, i32)>(
                "SELECT status, dispatch_count, reconcile_attempts FROM tool_operations WHERE operation_id = $1",
            )
            .bind(id)
            .fetch_one(&admin)
            .await
            .unwrap()
        }
    };
    assert_eq!(row(&planned).await, ("prepared".into(), 0, 0));
    assert_eq!(row(&unknown).await, ("unknown".into(), 1, 0));
    assert_eq!(row(&lapsed).await, ("dispatching".into(), 1, 0));
    assert!(scenario.side_effects("charges.jsonl").is_empty());
    other.stop().await;

    // The process serving tenant-a does all three.
    let own = Scenario::new(&db.url, FAST);
    let proxy = RunningProxy::start(&own.config_path()).await;
    wait_until("tenant-a's process to send the planned intent", || async {
        (row(&planned).await.0 == "succeeded").then_some(())
    })
    .await;
    wait_until(
        "tenant-a's process to settle the unknown and the lapsed claim",
        || async {
            let (unknown, lapsed) = (row(&unknown).await, row(&lapsed).await);
            (unknown.0 == "succeeded" && lapsed.0 == "succeeded").then_some(())
        },
    )
    .await;
    proxy.stop().await;
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn an_operation_recorded_with_its_route_survives_a_renamed_namespace(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let (lease, _) = db.running_run("agent-1", 60_000).await;
    // Recorded when the payments tools were exposed as "pay.charge"; the
    // claim's holder died, so the claim lapses into unknown.
    let intent = |step: &str| {
        intents::planned(
            lease.run_id,
            step,
            "pay.charge",
            &json!({"amount": 5, "currency": "eur"}),
        )
    };
    let routed = intent("routed");
    let route = leasegate::ledger::ToolRoute {
        upstream: "payments".into(),
        tool: "charge".into(),
    };
    let claim = leasegate::ledger::Ledger::operation_register_claim(
        &db.ledger,
        &lease,
        &routed,
        Some(&route),
        "gone-proxy",
        1,
    )
    .await
    .unwrap();
    assert!(claim.is_applied());
    // The same, recorded without a route (planned through the control API
    // by a name that no longer exists).
    let unrouted = intent("unrouted");
    db.claim(&lease, &unrouted, "gone-proxy", 1).await;

    // Now served with the default separator: "payments__charge".
    let (scenario, proxy) = RunningProxy::serve(&db.url, FAST).await;
    let status = |intent: &Intent| {
        let id = intent.operation_id.as_str().to_owned();
        let admin = db.admin.clone();
        async move {
            sqlx::query_scalar::<_, String>(
                "SELECT status FROM tool_operations WHERE operation_id = $1",
            )
            .bind(id)
            .fetch_one(&admin)
            .await
            .unwrap()
        }
    };
    wait_until("the routed operation to converge by its route", || async {
        (status(&routed).await == "succeeded").then_some(())
    })
    .await;
    let charges = scenario.side_effects("charges.jsonl");
    assert_eq!(charges.len(), 1, "{charges:?}");
    assert_eq!(
        charges[0]["idempotency_key"],
        routed.operation_id.as_str(),
        "{charges:?}"
    );
    // The unrouted one waits for an operator: its name resolves to nothing.
    let signals = proxy.signals.clone().expect("the background loops run");
    let passes = signals.reconcile.passes();
    within(
        "two more reconciler passes",
        signals.reconcile.reached(passes + 2),
    )
    .await;
    assert_eq!(status(&unrouted).await, "unknown");
    proxy.stop().await;
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn a_claim_whose_holder_is_killed_expires_with_the_holder_not_the_claim_ttl(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    // Claims live two minutes; the test's deadline is 30 s.
    let policy = "claim_ttl = \"120s\"\nin_flight_wait = \"1s\"\nreconcile_interval = \"100ms\"\n";
    let mailer = replace_exactly(MAILER_ADAPTER, "700ms", "60s");
    let scenario =
        Scenario::with_adapters(&db.url, policy, common::proxy::PAYMENTS_ADAPTER, &mailer);
    let (lease, _) = db.running_run("agent", 120_000).await;
    let step = || {
        let mut meta = serde_json::Map::new();
        meta.insert(
            "dev.leasegate/step".into(),
            json!({"step_id": "notify", "effect_version": 1}),
        );
        Some(meta)
    };
    let arguments = json!({"to": "k@x.y", "hang_ms": 60000});

    // Process A sends, the tool acts and hangs, A is killed.
    let (mut first, mcp, _) = serve_child(&scenario).await;
    let (agent, _) = connect_http(&mcp, Some(&lease)).await;
    let pending = tokio::spawn({
        let arguments = arguments.clone();
        async move { call(&agent, "mailer__send_email", arguments, step()).await }
    });
    wait_until("the email to be sent", || async {
        (scenario.side_effects("emails.jsonl").len() == 1).then_some(())
    })
    .await;
    first.kill().await.unwrap();
    pending.abort();
    assert_eq!(
        db.status_of_tool("mailer__send_email").await.as_deref(),
        Some("dispatching")
    );

    // Process B: the agent's re-call learns the fate as soon as A's
    // liveness lapses, long before A's claim would expire.
    let second = RunningProxy::start(&scenario.config_path()).await;
    let (agent, _) = connect_http(&second.url, Some(&lease)).await;
    let answer = wait_until("the re-call to report the outcome unknown", || async {
        match call(&agent, "mailer__send_email", arguments.clone(), step()).await {
            Ok(answer) => Some(answer),
            Err((code, message)) => {
                assert_eq!(
                    code, -31006,
                    "in progress until the holder is gone: {message}"
                );
                None
            }
        }
    })
    .await;
    assert_eq!(
        answer.structured_content.as_ref().unwrap()["status"],
        "unknown",
        "{answer:?}"
    );
    assert_eq!(
        db.status_of_tool("mailer__send_email").await.as_deref(),
        Some("unknown")
    );
    let until: bool = db
        .query_scalar(
            "SELECT e.detail->>'dispatch_until' IS NOT NULL
           AND (e.detail->>'dispatch_until')::timestamptz > e.at
           FROM ledger_events e
          WHERE e.to_status = 'unknown' AND e.subject = 'operation'",
        )
        .await;
    assert!(until, "marked unknown before its claim would have expired");
    // Never sent again: the tool promises nothing.
    assert_eq!(scenario.side_effects("emails.jsonl").len(), 1);
    second.stop().await;
}

/// `tool` called through `proxy` with `arguments` (which make it act, then
/// answer a second later: `hang_ms`); returned once its effect is in
/// `effects`, with the operation's row locked FOR UPDATE by the returned
/// transaction (its settle waits on it).
async fn call_then_lock_its_row(
    db: &TestDb,
    scenario: &Scenario,
    proxy: &RunningProxy,
    (tool, arguments, effects): (&'static str, Value, &'static str),
) -> (
    tokio::task::JoinHandle<Result<rmcp::model::CallToolResult, (i32, String)>>,
    sqlx::Transaction<'static, sqlx::Postgres>,
) {
    let (lease, _) = db.running_run("agent", 120_000).await;
    let (agent, _) = connect_http(&proxy.url, Some(&lease)).await;
    let pending = tokio::spawn(async move { call(&agent, tool, arguments, None).await });
    wait_until(&format!("{tool} to act at the tool"), || async {
        (scenario.side_effects(effects).len() == 1).then_some(())
    })
    .await;
    let mut holder = db.admin.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM tool_operations WHERE tool_name = $1 FOR UPDATE")
        .bind(tool)
        .execute(&mut *holder)
        .await
        .unwrap();
    (pending, holder)
}

/// A charge of `amount` for [`call_then_lock_its_row`].
fn slow_charge(amount: i64) -> (&'static str, Value, &'static str) {
    (
        "payments__charge",
        json!({"amount": amount, "currency": "eur", "hang_ms": 1000}),
        "charges.jsonl",
    )
}

/// A settle whose connection is cut (the tool has answered) is written
/// again on a fresh connection: the agent gets the tool's answer, recorded,
/// and never "not sent".
#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn a_settle_whose_connection_is_cut_after_the_tool_answered_is_written_again(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let (scenario, proxy) = RunningProxy::serve(&db.url, FAST).await;
    // The charge acts, then answers a second later, while its row is held;
    // the settle waiting for it loses its connection.
    let (pending, holder) = call_then_lock_its_row(&db, &scenario, &proxy, slow_charge(11)).await;
    let waiting = db.wait_lock_waiters("operation_settle", 1).await;
    for pid in waiting {
        sqlx::query("SELECT pg_terminate_backend($1)")
            .bind(pid)
            .execute(&db.admin)
            .await
            .unwrap();
    }
    holder.commit().await.unwrap();

    let answer = within("the agent's answer", pending)
        .await
        .unwrap()
        .expect("a tool result, not an error that says nothing was sent");
    let charges = scenario.side_effects("charges.jsonl");
    assert_eq!(charges.len(), 1);
    assert_eq!(
        answer.structured_content.as_ref().unwrap()["charge_id"],
        charges[0]["charge_id"],
        "the tool's own answer: {answer:?}"
    );
    assert_eq!(
        db.status_of_tool("payments__charge").await.as_deref(),
        Some("succeeded")
    );
    assert_eq!(calls_of(&scenario, "charge").len(), 1, "sent once");
    proxy.stop().await;
}

/// A provisioner whose buckets the agent names: leasegate finds a bucket by
/// the name in the request (`resource_id_pointer`), and sends a create the
/// tool never saw again under the same operation id.
const NAMED_BUCKETS: &str = r#"upstream = "provisioner"
timeout = "2s"
[tools.create_bucket]
capability = "resource_id"
resource_id_pointer = "/name"
query_tool = "get_bucket"
query_argument = "name"
query_resource_pointer = "/bucket"
query_remote_id_pointer = "/bucket/bucket_id"
match_fields = ["region"]
resend_after_not_found = "3s"
timeout = "500ms"
[tools.get_bucket]
read_only = true
"#;

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn a_resource_the_agent_named_is_found_by_that_name_and_one_the_tool_never_saw_is_sent_again(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let scenario = Scenario::new(&db.url, FAST);
    scenario.add_upstream("provisioner", "provisioner", NAMED_BUCKETS);
    let (lease, _) = db.running_run("agent", 60_000).await;
    // Two creates whose outcome a crashed proxy never learned: the first
    // reached the tool (the bucket exists), the second did not.
    let mut unknown = Vec::new();
    for name in ["invoices-2026", "payroll-2026"] {
        let intent = intents::unplanned(
            lease.run_id,
            "provisioner__create_bucket",
            &json!({"name": name, "region": "eu"}),
        );
        let claim = db.claim(&lease, &intent, "crashed-proxy", 60_000).await;
        db.holder_marks_unknown(&claim, UnknownCause::TimedOut, &json!({}))
            .await;
        unknown.push(intent);
    }
    std::fs::write(
        scenario.dir.join("state/buckets.jsonl"),
        format!(
            "{}\n",
            json!({"bucket_id": "bk_1", "name": "invoices-2026", "region": "eu", "size": null})
        ),
    )
    .unwrap();

    let proxy = RunningProxy::start(&scenario.config_path()).await;
    let status = |intent: &Intent| {
        let (db, id) = (&db, intent.operation_id.clone());
        async move {
            sqlx::query_as::<_, (String, Option<String>, i32)>(
                "SELECT status, remote_id, dispatch_count FROM tool_operations WHERE operation_id = $1",
            )
            .bind(id.as_str())
            .fetch_one(&db.admin)
            .await
            .unwrap()
        }
    };
    wait_until("both creates to converge", || async {
        let (first, second) = (status(&unknown[0]).await, status(&unknown[1]).await);
        (first.0 == "succeeded" && second.0 == "succeeded").then_some(())
    })
    .await;
    let buckets = scenario.side_effects("buckets.jsonl");
    let named = |name: &str| buckets.iter().filter(|b| b["name"] == name).count();
    assert_eq!(
        (named("invoices-2026"), named("payroll-2026"), buckets.len()),
        (1, 1, 2),
        "each bucket exists once, under the agent's name: {buckets:?}"
    );
    let creates = calls_of(&scenario, "create_bucket");
    assert_eq!(
        creates,
        vec![json!({"tool": "create_bucket", "name": "payroll-2026"})],
        "only the create the tool never saw was sent, with the agent's name"
    );
    let (_, remote, dispatched) = status(&unknown[0]).await;
    assert_eq!(
        (remote.as_deref(), dispatched),
        (Some("bk_1"), 1),
        "found by name"
    );
    let (_, _, dispatched) = status(&unknown[1]).await;
    assert_eq!(dispatched, 2, "sent again under the same operation id");
    let view = db.operation_view(&unknown[1].operation_id).await;
    assert!(
        view.events
            .iter()
            .any(|e| e.from_status.as_deref() == Some("unknown")
                && e.to_status == "prepared"
                && e.actor_kind == "reconciler"),
        "the resend is in the history: {:?}",
        view.events
    );
    proxy.stop().await;
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn a_process_paused_past_its_claim_before_sending_sends_nothing_and_the_operation_is_prepared_again(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    use leasegate::adapter::{Capability, OperationIdPlacement, ResolvedTool, ToolAdapter};
    use leasegate::dispatch::{CallContext, CallError, Claimed, execute_claim};

    let db = TestDb::new(pool, connect).await;
    let (lease, _) = db.running_run("agent", 60_000).await;
    let arguments = json!({"amount": 5, "currency": "eur"});
    let intent = intents::unplanned(lease.run_id, "payments__charge", &arguments);
    let claim = db.claim(&lease, &intent, "paused-proxy", 200).await;
    // The process "wakes up" after its claim lapsed (no other process has
    // expired it yet: the row still says dispatching under this claim).
    wait_until("the claim to lapse", || async {
        (chrono::Utc::now() > claim.until).then_some(())
    })
    .await;
    let tool = ResolvedTool {
        upstream: "payments".into(),
        tool: "charge".into(),
        adapter: ToolAdapter {
            capability: Capability::IdempotencyKey,
            placement: OperationIdPlacement::Argument("idempotency_key".into()),
            ..ToolAdapter::unknown(std::time::Duration::from_secs(1))
        },
    };
    let Value::Object(arguments) = arguments else {
        unreachable!()
    };
    let reply = execute_claim(
        db.ledger.clone(),
        std::sync::Arc::new(Unreachable),
        "paused-proxy".into(),
        claim,
        Claimed {
            tool,
            arguments,
            context: CallContext::default(),
        },
    )
    .await;
    assert!(matches!(reply, Err(CallError::NotSent { .. })), "{reply:?}");
    assert_eq!(
        db.status_of_tool("payments__charge").await.as_deref(),
        Some("prepared"),
        "nothing left: the same operation id may be sent again"
    );
    let evidence: Vec<(String, Option<String>)> = db
        .rows(
            "SELECT kind, outcome FROM operation_evidence WHERE operation_id = $1",
            intent.operation_id.as_str(),
        )
        .await;
    assert_eq!(
        evidence,
        vec![("not_sent".to_owned(), Some("not_sent".to_owned()))]
    );
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn a_settle_that_hits_the_statement_timeout_on_a_locked_row_is_unknown_never_not_sent(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let scenario = Scenario::new(&db.url, FAST);
    scenario.prepend_config("database_statement_timeout = \"1s\"");
    let proxy = RunningProxy::start(&scenario.config_path()).await;
    // Someone holds the operation row longer than leasegate's statements
    // may wait: the settle times out (57014) instead of committing.
    let (pending, holder) = call_then_lock_its_row(&db, &scenario, &proxy, slow_charge(12)).await;
    let answer = within("the agent's answer", pending)
        .await
        .unwrap()
        .expect("a tool result, not an error that says nothing was sent");
    holder.commit().await.unwrap();
    assert_eq!(
        answer.structured_content.clone().unwrap()["status"],
        "unknown",
        "{answer:?}"
    );
    db.wait_tool_status(
        "the reconciler to converge the charge",
        "payments__charge",
        "succeeded",
    )
    .await;
    assert_eq!(scenario.side_effects("charges.jsonl").len(), 1);
    proxy.stop().await;
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn a_result_carrying_u0000_settles_and_replays_exactly(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let (scenario, proxy) = RunningProxy::serve(&db.url, FAST).await;
    let (lease, _) = db.running_run("agent", 120_000).await;
    let (agent, _) = connect_http(&proxy.url, Some(&lease)).await;
    // jsonb cannot hold U+0000; the example charge echoes the currency.
    let arguments = json!({"amount": 13, "currency": "e\u{0}ur"});
    let first = call(&agent, "payments__charge", arguments.clone(), None)
        .await
        .unwrap();
    let second = call(&agent, "payments__charge", arguments, None)
        .await
        .unwrap();
    assert_eq!(
        db.status_of_tool("payments__charge").await.as_deref(),
        Some("succeeded")
    );
    for answer in [&first, &second] {
        let body = answer.structured_content.clone().unwrap();
        assert_eq!(body["currency"], "e\u{0}ur", "{answer:?}");
        assert_eq!(body["replayed"], false, "the tool's own answer, kept");
    }
    assert_eq!(scenario.side_effects("charges.jsonl").len(), 1);
    proxy.stop().await;
}

/// An email (capability `none`: no query or retry could ever settle it)
/// whose tool answered while its row was locked and every settle's
/// connection was cut: the agent hears `unknown`, the process keeps the
/// answer, and once the ledger takes writes again the operation ends
/// `succeeded` with the tool's own answer — without an operator.
#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn an_answer_the_ledger_could_not_take_is_kept_and_settles_a_none_tool_without_an_operator(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    // The email answers a second after it is sent, well within its timeout.
    let mailer = replace_exactly(MAILER_ADAPTER, "700ms", "2s");
    let scenario = Scenario::with_adapters(&db.url, FAST, common::proxy::PAYMENTS_ADAPTER, &mailer);
    let proxy = RunningProxy::start(&scenario.config_path()).await;
    let email = (
        "mailer__send_email",
        json!({"to": "kept@x.y", "hang_ms": 1000}),
        "emails.jsonl",
    );
    let (pending, holder) = call_then_lock_its_row(&db, &scenario, &proxy, email).await;
    // Every settle that waits on the row loses its connection, until the
    // agent has its answer.
    let answer = within("the agent's answer while every settle fails", async {
        loop {
            if pending.is_finished() {
                break pending.await.unwrap();
            }
            let waiting: Vec<i32> = sqlx::query_scalar(
                "SELECT pid FROM pg_stat_activity
                  WHERE datname = current_database() AND wait_event_type = 'Lock'
                    AND query LIKE '%operation_settle%' AND pid <> pg_backend_pid()",
            )
            .fetch_all(&db.admin)
            .await
            .unwrap();
            for pid in waiting {
                sqlx::query("SELECT pg_terminate_backend($1)")
                    .bind(pid)
                    .execute(&db.admin)
                    .await
                    .unwrap();
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("a tool result, not an error that says nothing was sent");
    let reply = answer.structured_content.clone().unwrap();
    assert_eq!(reply["status"], "unknown", "{answer:?}");
    assert!(
        reply["reason"]
            .as_str()
            .unwrap()
            .contains("keeps the answer"),
        "the agent is told the answer is kept: {reply}"
    );
    // The ledger takes writes again: the kept answer lands.
    holder.commit().await.unwrap();
    db.wait_tool_status(
        "the kept answer to settle the email",
        "mailer__send_email",
        "succeeded",
    )
    .await;
    let remote: Option<String> = db
        .query_scalar(
            "SELECT remote_id FROM tool_operations WHERE tool_name = 'mailer__send_email'",
        )
        .await;
    let sent = scenario.side_effects("emails.jsonl");
    assert_eq!(sent.len(), 1, "one email");
    assert_eq!(
        remote.as_deref(),
        sent[0]["message_id"].as_str(),
        "settled with the tool's own answer"
    );
    assert_eq!(calls_of(&scenario, "send_email").len(), 1, "never re-sent");
    let by_operator: i64 = db
        .query_scalar("SELECT count(*) FROM ledger_events WHERE actor_kind = 'operator'")
        .await;
    assert_eq!(by_operator, 0, "no operator was needed");
    proxy.stop().await;
}
