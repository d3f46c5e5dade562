//! Upstream supervision: a stdio tool server that dies is restarted and
//! serves calls again; one that cannot be restarted fails calls as not sent;
//! stopping leasegate ends every tool server, a hung one included. The
//! example tool server runs as real stdio children (killed with real
//! signals), with a real PostgreSQL ledger; side effects are counted in its
//! own state files.

use crate::common;
use crate::common::proxy::charge_eur;
use crate::common::proxy::send_email;

use common::proxy::{RunningProxy, Scenario, call, connect_http, lease_meta};
use common::{TestDb, http, prometheus, wait_until};
use leasegate::mcp::upstream::{UpstreamHealth, UpstreamState};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::json;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

const POLICY: &str = "in_flight_wait = \"3s\"\nclaim_ttl = \"60s\"\n";

/// The pid the example tool server `tools` (`payments`, `mailer`) wrote.
fn pid_of(scenario: &Scenario, tools: &str) -> i32 {
    std::fs::read_to_string(scenario.dir.join("state").join(format!("{tools}.pid")))
        .expect("the tool server wrote its pid file")
        .trim()
        .parse()
        .expect("a pid")
}

/// Whether process `pid` is gone: not even a zombie (it was reaped).
fn gone(pid: i32) -> bool {
    kill(Pid::from_raw(pid), None) == Err(nix::errno::Errno::ESRCH)
}

fn health_of(proxy: &RunningProxy, upstream: &str) -> UpstreamHealth {
    proxy
        .upstreams
        .health()
        .into_iter()
        .find(|h| h.name == upstream)
        .expect("the upstream is configured")
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn a_killed_stdio_upstream_is_restarted_and_its_tools_work_again(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let (scenario, proxy) = RunningProxy::serve(&db.url, POLICY).await;
    let (lease, _) = db.running_run("agent", 60_000).await;
    let (agent, _) = connect_http(&proxy.url, None).await;
    let before = health_of(&proxy, "mailer");
    assert_eq!((before.state, before.restarts), (UpstreamState::Up, 0));
    assert_eq!(before.transport, "stdio");

    // What the mailer answered to `initialize`: the front merges it into
    // its own answer and keeps that while this very answer stands.
    let info_before = proxy
        .upstreams
        .server_info("mailer")
        .expect("the mailer answered initialize");

    let first = pid_of(&scenario, "mailer");
    kill(Pid::from_raw(first), Signal::SIGKILL).expect("SIGKILL the mailer");

    // A read-only call works again once a new child serves.
    let stats = wait_until(
        "a read-only call to the mailer to succeed again",
        || async {
            match call(&agent, "mailer__mail_stats", json!({}), None).await {
                Ok(result) if result.is_error != Some(true) => Some(result),
                _ => None,
            }
        },
    )
    .await;
    assert_eq!(stats.structured_content.as_ref().unwrap()["emails_sent"], 0);
    let second = pid_of(&scenario, "mailer");
    assert_ne!(second, first, "a new child serves");
    assert!(gone(first), "the killed child was reaped");

    // A side-effecting call under a lease goes through, once.
    let sent = call(
        &agent,
        "mailer__send_email",
        json!({"to": "ops@example.com", "subject": "after restart"}),
        Some(lease_meta(&lease)),
    )
    .await
    .expect("the call is answered");
    assert_ne!(sent.is_error, Some(true), "{sent:?}");
    let emails = scenario.side_effects("emails.jsonl");
    assert_eq!(emails.len(), 1, "exactly one email: {emails:?}");
    assert_eq!(emails[0]["subject"], "after restart");

    // The catalog still (again) lists the restarted upstream's tools.
    let tools = agent.peer().list_all_tools().await.expect("tools/list");
    assert!(tools.iter().any(|t| t.name == "mailer__send_email"));

    // The new child's session answered a new `initialize`: a new answer,
    // so the front's merged server info is built again (it is cached on
    // the identity of each upstream's answer), and a new agent's
    // initialize gets it.
    let info_after = proxy
        .upstreams
        .server_info("mailer")
        .expect("the restarted mailer answered initialize");
    assert!(
        !std::sync::Arc::ptr_eq(&info_before, &info_after),
        "a new session brings a new initialize answer"
    );
    let (late_agent, _) = connect_http(&proxy.url, None).await;
    let info = late_agent
        .peer()
        .peer_info()
        .expect("leasegate's server info");
    assert!(
        info.instructions
            .as_deref()
            .is_some_and(|text| text.starts_with("leasegate fronts these MCP servers")),
        "{info:?}"
    );
    assert!(
        info.capabilities.tools.is_some(),
        "tools are announced: {info:?}"
    );
    let listed = late_agent
        .peer()
        .list_all_tools()
        .await
        .expect("tools/list");
    assert!(listed.iter().any(|t| t.name == "mailer__send_email"));

    let health = health_of(&proxy, "mailer");
    assert_eq!(health.state, UpstreamState::Up, "{health:?}");
    assert!(health.restarts >= 1, "{health:?}");
    let why = health.last_error.clone().unwrap_or_default();
    assert!(why.contains("signal: 9"), "the death is on record: {why}");
    let untouched = health_of(&proxy, "payments");
    assert_eq!(
        (untouched.state, untouched.restarts),
        (UpstreamState::Up, 0)
    );

    let metrics = http::get(&format!("{}/metrics", proxy.control_url)).await;
    assert!(
        prometheus::sum(
            &metrics.body,
            "upstream_restarts_total",
            &[("upstream", "mailer")]
        ) >= 1.0,
        "{}",
        metrics.body
    );
    assert!(prometheus::has(
        &metrics.body,
        "upstream_up",
        &[("upstream", "payments")]
    ));
    // The operator sees the same through the control API.
    let answer = http::get(&format!("{}/v1/upstreams", proxy.control_url)).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    let listed: serde_json::Value = serde_json::from_str(&answer.body).unwrap();
    let mailer = listed["upstreams"]
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["name"] == "mailer")
        .cloned()
        .unwrap_or_else(|| panic!("mailer listed: {listed}"));
    assert_eq!(
        (&mailer["state"], &mailer["transport"]),
        (&json!("up"), &json!("stdio")),
        "{mailer}"
    );
    assert!(mailer["restarts"].as_u64() >= Some(1), "{mailer}");
    proxy.stop().await;
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn calls_to_a_stdio_upstream_that_cannot_restart_fail_as_not_sent_and_stay_pending(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let (scenario, proxy) = RunningProxy::serve(&db.url, POLICY).await;
    let (lease, _) = db.running_run("agent", 60_000).await;
    let (agent, _) = connect_http(&proxy.url, None).await;

    // A directory where the pid file goes: every new mailer child fails to
    // start.
    let pid = pid_of(&scenario, "mailer");
    let pid_file = scenario.dir.join("state/mailer.pid");
    std::fs::remove_file(&pid_file).unwrap();
    std::fs::create_dir(&pid_file).unwrap();
    kill(Pid::from_raw(pid), Signal::SIGKILL).expect("SIGKILL the mailer");

    let health = wait_until("a restart of the mailer to fail", || async {
        let health = health_of(&proxy, "mailer");
        health
            .last_error
            .as_deref()
            .is_some_and(|e| e.starts_with("restart failed"))
            .then_some(health)
    })
    .await;
    assert_eq!(
        (health.state, health.restarts),
        (UpstreamState::Restarting, 0)
    );

    let (_, message) = call(&agent, "mailer__mail_stats", json!({}), None)
        .await
        .expect_err("no mailer to answer");
    assert!(
        message.contains("upstream mailer is restarting"),
        "{message}"
    );

    let (code, message) = send_email(&agent, "a@b.c", Some(lease_meta(&lease)))
        .await
        .expect_err("nothing can be sent");
    assert_eq!(code, -31011, "{message}");
    let (kind, status): (String, String) = db
        .query_row(
            "SELECT e.kind, o.status FROM operation_evidence e JOIN tool_operations o USING (operation_id) \
          ORDER BY e.evidence_id LIMIT 1",
        )
        .await;
    assert_eq!((kind.as_str(), status.as_str()), ("not_sent", "prepared"));
    assert!(scenario.side_effects("emails.jsonl").is_empty());
    let pid_file = scenario.dir.join("state/mailer.pid");

    // The other upstream is untouched.
    let charge = charge_eur(&agent, 1, Some(lease_meta(&lease)))
        .await
        .expect("the call is answered");
    assert_ne!(charge.is_error, Some(true), "{charge:?}");
    assert_eq!(scenario.side_effects("charges.jsonl").len(), 1);

    // The mailer can start again: the pending email goes out once, by the
    // outbox, under the same operation id.
    std::fs::remove_dir(&pid_file).unwrap();
    db.wait_tool_status(
        "the outbox to send the pending email",
        "mailer__send_email",
        "succeeded",
    )
    .await;
    assert_eq!(scenario.side_effects("emails.jsonl").len(), 1);
    proxy.stop().await;
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn stopping_leasegate_ends_its_tool_servers_even_a_hung_one(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let (scenario, proxy) = RunningProxy::serve(&db.url, POLICY).await;
    let pids = [pid_of(&scenario, "payments"), pid_of(&scenario, "mailer")];
    assert!(
        pids.iter().all(|pid| !common::process_exited(*pid)),
        "{pids:?} run"
    );

    // A hung tool server: it will not exit when its stdin closes.
    kill(Pid::from_raw(pids[0]), Signal::SIGSTOP).expect("SIGSTOP payments");
    let upstreams = proxy.upstreams.clone();
    proxy.stop().await;

    wait_until("both tool servers to be gone and reaped", || async {
        pids.iter().all(|pid| gone(*pid)).then_some(())
    })
    .await;
    for health in upstreams.health() {
        assert_eq!(health.state, UpstreamState::Down, "{health:?}");
        assert_eq!(health.restarts, 0, "nothing restarted at shutdown");
    }
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn the_reconciler_defers_while_an_upstream_restarts_and_spends_no_retry_budget(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let scenario = Scenario::new(
        &db.url,
        "claim_ttl = \"60s\"\ndispatch_interval = \"100ms\"\nreconcile_interval = \"100ms\"\nreconcile_retries = 1\n",
    );
    let proxy = RunningProxy::start(&scenario.config_path()).await;
    // Payments dies and cannot come back (its pid file path is a directory).
    let pid = pid_of(&scenario, "payments");
    let pid_file = scenario.dir.join("state/payments.pid");
    std::fs::remove_file(&pid_file).unwrap();
    std::fs::create_dir(&pid_file).unwrap();
    kill(Pid::from_raw(pid), Signal::SIGKILL).expect("SIGKILL payments");
    wait_until("payments to be restarting", || async {
        (health_of(&proxy, "payments").state == UpstreamState::Restarting).then_some(())
    })
    .await;

    // An unknown charge (its claim's holder died before answering).
    let (lease, _) = db.running_run("agent-1", 60_000).await;
    let intent = crate::common::intents::planned(
        lease.run_id,
        "charge",
        "payments__charge",
        &json!({"amount": 7, "currency": "eur"}),
    );
    db.claim(&lease, &intent, "gone-proxy", 1).await;
    let row = || async {
        db.row::<(String, i32)>(
            "SELECT status, reconcile_attempts FROM tool_operations WHERE operation_id = $1",
            intent.operation_id.as_str(),
        )
        .await
    };
    wait_until("the lapsed claim to turn unknown", || async {
        (row().await.0 == "unknown").then_some(())
    })
    .await;
    let signals = proxy.signals.clone().expect("the background loops run");
    let passes = signals.reconcile.passes();
    common::within(
        "five reconciler passes",
        signals.reconcile.reached(passes + 5),
    )
    .await;
    // Deferred every time, nothing counted: the budget of one is intact.
    assert_eq!(row().await, ("unknown".into(), 0));

    // Payments can start again: the retry goes out and converges.
    std::fs::remove_dir(&pid_file).unwrap();
    wait_until("the charge to converge after payments is back", || async {
        (row().await == ("succeeded".into(), 1)).then_some(())
    })
    .await;
    let charges = scenario.side_effects("charges.jsonl");
    assert_eq!(charges.len(), 1, "{charges:?}");
    proxy.stop().await;
}
