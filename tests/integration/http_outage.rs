//! Streamable HTTP tool servers that go away and come back on the same
//! address, in front of a real `leasegate serve`: while their connections
//! are refused every gated call is "not sent" and nothing spends retry
//! budget; once they answer again, health returns to up on its own and
//! every intent converges with exactly one side effect.

use crate::common;

use common::proxy::{
    MAILER_ADAPTER, PAYMENTS_ADAPTER, Scenario, ServedChild, call, config_head, connect_http,
    http_tool_server, operation_note,
};
use common::{TestDb, http, prometheus, wait_until, within};
use serde_json::{Value, json};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

/// How often the agent calls the email during the outage.
const EMAIL_TRIES: i64 = 5;

const POLICY: &str = "claim_ttl = \"3s\"\ndispatch_interval = \"100ms\"\nreconcile_interval = \"200ms\"\nin_flight_wait = \"1s\"\n";

/// `upstream`'s state as `GET /v1/upstreams` shows it.
async fn state_of(control: &str, upstream: &str) -> String {
    let answer = http::get(&format!("{control}/v1/upstreams")).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    let listed: Value = serde_json::from_str(&answer.body).unwrap();
    listed["upstreams"]
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["name"] == upstream)
        .unwrap_or_else(|| panic!("{upstream} listed: {listed}"))["state"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// Waits until both upstreams are in `state` by the control API and the
/// `upstream_up` gauge (`up`: 1, anything else: 0).
async fn wait_health(control: &str, state: &str) {
    let gauge = if state == "up" { 1.0 } else { 0.0 };
    wait_until(&format!("both upstreams to be {state}"), || async {
        let metrics = http::get(&format!("{control}/metrics")).await.body;
        for upstream in ["payments", "mailer"] {
            if state_of(control, upstream).await != state
                || prometheus::sum(&metrics, "upstream_up", &[("upstream", upstream)]) != gauge
            {
                return None;
            }
        }
        Some(())
    })
    .await;
}

async fn metric(control: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    prometheus::sum(
        &http::get(&format!("{control}/metrics")).await.body,
        name,
        labels,
    )
}

/// (tool, status, reconcile attempts) of every operation, oldest first.
async fn operations(db: &TestDb) -> Vec<(String, String, i32)> {
    db.query_rows(
        "SELECT tool_name, status::text, reconcile_attempts::int FROM tool_operations ORDER BY created_at",
    )
    .await
}

/// The example payments and mailer servers over Streamable HTTP (payments
/// started with `payments_flags`), and `leasegate serve` in front of them
/// with the test adapters; waits until both upstreams are up.
struct Outage {
    scenario: Scenario,
    served: ServedChild,
    payments: (tokio::process::Child, String),
    mailer: (tokio::process::Child, String),
}

impl Outage {
    async fn start(db: &TestDb, payments_flags: &[&str]) -> Self {
        let scenario = Scenario::with_adapters(&db.url, POLICY, PAYMENTS_ADAPTER, MAILER_ADAPTER);
        let state = scenario.dir.join("state");
        let payments = http_tool_server("payments", "127.0.0.1:0", &state, payments_flags).await;
        let mailer = http_tool_server("mailer", "127.0.0.1:0", &state, &[]).await;
        std::fs::write(
            scenario.config_path(),
            format!(
                "{head}\n[upstreams.payments]\ntransport = \"streamable_http\"\nurl = \"http://{payments}/mcp\"\n\
                 [upstreams.mailer]\ntransport = \"streamable_http\"\nurl = \"http://{mailer}/mcp\"\n",
                head = config_head(&db.url, "127.0.0.1:0"),
                payments = payments.1,
                mailer = mailer.1,
            ),
        )
        .unwrap();
        let served = ServedChild::spawn(ServedChild::command(&scenario, &[])).await;
        wait_health(&served.control, "up").await;
        Self {
            scenario,
            served,
            payments,
            mailer,
        }
    }

    /// Both servers again on their addresses, without faults.
    async fn restart_tools(&mut self) {
        let state = self.scenario.dir.join("state");
        std::fs::write(state.join("calm"), "").unwrap();
        self.payments = http_tool_server("payments", &self.payments.1, &state, &[]).await;
        self.mailer = http_tool_server("mailer", &self.mailer.1, &state, &[]).await;
    }
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn http_upstreams_that_refuse_connections_get_no_calls_spend_no_budget_and_converge_on_return(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    // The payments server exits right after its first charge, before
    // answering: that charge happened and its outcome is unknown.
    let mut outage = Outage::start(&db, &["--fault-crash", "1"]).await;
    let control = outage.served.control.clone();
    let (lease, _) = db.running_run("agent", 120_000).await;
    let (agent, _) = connect_http(&outage.served.mcp, Some(&lease)).await;

    let crashed = json!({"amount": 1, "currency": "eur"});
    let answer = call(&agent, "payments__charge", crashed.clone(), None)
        .await
        .expect("an unknown outcome is an answer");
    assert_eq!(operation_note(&answer)["status"], "unknown", "{answer:?}");
    within(
        "the crashed payments server to exit",
        outage.payments.0.wait(),
    )
    .await
    .unwrap();
    outage.mailer.0.kill().await.unwrap();

    // The outage: both servers refuse connections.
    let charge = json!({"amount": 2, "currency": "eur"});
    let email = json!({"to": "ops@example.com", "subject": "during the outage"});
    // The email is called again and again: each refusal is proof that
    // nothing left, and each proof doubles its backoff (5 s, 10 s, … 80 s).
    for (tool, arguments, times) in [
        ("payments__charge", &charge, 1),
        ("mailer__send_email", &email, EMAIL_TRIES),
    ] {
        for _ in 0..times {
            let (code, message) = call(&agent, tool, arguments.clone(), None)
                .await
                .expect_err("a refused connection is not an answer");
            assert_eq!(code, -31011, "{tool} is not sent: {message}");
            assert!(
                !message.contains("leasegate::"),
                "says why without leasegate's type names: {message}"
            );
        }
    }
    let during = operations(&db).await;
    let statuses: Vec<(&str, &str)> = during
        .iter()
        .map(|(tool, status, _)| (tool.as_str(), status.as_str()))
        .collect();
    assert_eq!(
        statuses,
        vec![
            ("payments__charge", "unknown"),
            ("payments__charge", "prepared"),
            ("mailer__send_email", "prepared"),
        ],
        "the calls during the outage can still be sent"
    );
    wait_health(&control, "down").await;
    // The reconciler met the down upstream and deferred, counting nothing.
    wait_until("the reconciler to defer the unknown charge", || async {
        (metric(
            &control,
            "reconcile_total",
            &[("outcome", "upstream_unavailable")],
        )
        .await
            >= 1.0)
            .then_some(())
    })
    .await;
    let unknown = &operations(&db).await[0];
    assert_eq!(
        (unknown.1.as_str(), unknown.2),
        ("unknown", 0),
        "the retry budget is untouched"
    );

    // Back on the same addresses, without faults.
    outage.restart_tools().await;
    wait_health(&control, "up").await;

    // The unknown charge converges by a same-key retry; the charge the
    // agent made during the outage goes through when it calls again; the
    // email, never called again, is sent by the outbox at once, its backoff
    // cut short by the upstream's return.
    db.wait_tool_status(
        "the crashed charge to converge",
        "payments__charge",
        "succeeded",
    )
    .await;
    wait_until("the charge to be answered", || async {
        let answer = call(&agent, "payments__charge", charge.clone(), None)
            .await
            .ok()?;
        (operation_note(&answer)["status"] == "succeeded").then_some(())
    })
    .await;
    db.wait_tool_status(
        "the outbox to send the email the agent left",
        "mailer__send_email",
        "succeeded",
    )
    .await;
    let proofs: i64 = db
        .query_scalar(
            "SELECT count(*) FROM operation_evidence e JOIN tool_operations o USING (operation_id)
              WHERE o.tool_name = 'mailer__send_email' AND e.kind = 'not_sent'",
        )
        .await;
    assert_eq!(
        proofs, EMAIL_TRIES,
        "only the agent's own calls met the outage: the outbox left the down upstream alone"
    );
    // Each charge converges on its own path (the crashed one by the
    // reconciler's same-key retry, the agent's by its call or the outbox):
    // wait for both, not for whichever the status probe reads first.
    wait_until("every intent to converge", || async {
        let now = operations(&db).await;
        now.iter()
            .all(|(_, status, _)| status == "succeeded")
            .then_some(())
    })
    .await;
    let after = operations(&db).await;
    assert!(
        after.iter().all(|(_, status, _)| status == "succeeded"),
        "every intent converged: {after:?}"
    );
    assert_eq!(after[0].2, 1, "one same-key retry, after the return");

    let charges = outage.scenario.side_effects("charges.jsonl");
    let mut amounts: Vec<i64> = charges
        .iter()
        .map(|c| c["amount"].as_i64().unwrap())
        .collect();
    amounts.sort_unstable();
    assert_eq!(amounts, vec![1, 2], "one charge per intent: {charges:?}");
    let emails = outage.scenario.side_effects("emails.jsonl");
    assert_eq!(emails.len(), 1, "one email: {emails:?}");
    assert_eq!(emails[0]["subject"], "during the outage");

    agent.cancel().await.unwrap();
    outage.served.child.kill().await.unwrap();
}

/// Nothing but leasegate's own probe calls a down upstream: once a
/// read-only call found the servers gone, health says down, and it says up
/// again when they are back although no agent calls and nothing is queued.
#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn a_down_http_upstream_is_seen_up_again_without_any_call(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let mut outage = Outage::start(&db, &[]).await;
    let control = outage.served.control.clone();
    let (agent, _) = connect_http(&outage.served.mcp, None).await;
    outage.payments.0.kill().await.unwrap();
    outage.mailer.0.kill().await.unwrap();
    for (tool, arguments) in [
        (
            "payments__get_charge",
            json!({"idempotency_key": "nothing"}),
        ),
        ("mailer__mail_stats", json!({})),
    ] {
        let answer = call(&agent, tool, arguments, None).await;
        assert!(
            answer.is_err() || answer.as_ref().is_ok_and(|a| a.is_error == Some(true)),
            "{tool} cannot be answered: {answer:?}"
        );
    }
    wait_health(&control, "down").await;

    outage.restart_tools().await;
    wait_health(&control, "up").await;
    assert_eq!(
        db.row_count("tool_operations").await,
        0,
        "nothing was queued that could have called them"
    );
    let stats = call(&agent, "mailer__mail_stats", json!({}), None)
        .await
        .expect("the mailer answers again");
    assert_ne!(stats.is_error, Some(true), "{stats:?}");

    agent.cancel().await.unwrap();
    outage.served.child.kill().await.unwrap();
}
