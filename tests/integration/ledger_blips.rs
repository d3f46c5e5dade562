//! A database blip never stops the process: ledger connections terminated
//! by an administrator (`pg_terminate_backend`) while `leasegate serve`
//! starts — waiting for a slow tool server, or in the middle of its
//! migrations — and under a serving proxy right before a burst of calls.
//! What a user checks: the process is alive, every call answers (none
//! refused as a durability hold), the tool's side effects and the ledger's
//! rows agree.

use std::path::Path;
use std::sync::Arc;

use crate::common;
use common::proxy::{
    EXAMPLE_TOOLS, RunningProxy, Scenario, ServedChild, charge_eur, connect_http, operation_note,
};
use common::{TestDb, replace_exactly, wait_until, within};
use serde_json::{Value, json};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

const POLICY: &str = "in_flight_wait = \"3s\"\nclaim_ttl = \"60s\"\n";

/// The proxy's sessions on this test's database: its ledger pool
/// (`leasegate`, which the test's own `TestDb::ledger` shares) and its
/// operator pool (`leasegate-operator`).
const PROXY_BACKENDS: &str = "SELECT pid FROM pg_stat_activity \
     WHERE datname = current_database() AND application_name LIKE 'leasegate%' \
       AND pid <> pg_backend_pid()";

/// Terminates every one of the proxy's sessions, waits until the server
/// has ended them all, and returns how many there were.
async fn terminate_proxy_backends(db: &TestDb) -> usize {
    let pids: Vec<i32> = sqlx::query_scalar(PROXY_BACKENDS)
        .fetch_all(&db.admin)
        .await
        .unwrap();
    for pid in &pids {
        sqlx::query("SELECT pg_terminate_backend($1)")
            .bind(pid)
            .execute(&db.admin)
            .await
            .unwrap();
    }
    wait_until("the terminated backends to end", || async {
        let left: i64 =
            sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1)")
                .bind(&pids)
                .fetch_one(&db.admin)
                .await
                .unwrap();
        (left == 0).then_some(())
    })
    .await;
    pids.len()
}

/// Makes the `payments` upstream of `scenario` slow to start: its command
/// touches `started`, then waits until `go` exists before it becomes the
/// example tool server.
fn hold_payments_start(scenario: &Scenario, gates: &Path) {
    let config = std::fs::read_to_string(scenario.config_path()).unwrap();
    let script = format!(
        "touch {dir}/started; while [ ! -e {dir}/go ]; do sleep 0.02; done; exec \"$0\" \"$@\"",
        dir = gates.display()
    );
    let config = replace_exactly(
        &config,
        &format!("command = \"{EXAMPLE_TOOLS}\"\nargs = [\"--tools\", \"payments\","),
        &format!(
            "command = \"/bin/sh\"\nargs = ['-c', '{script}', \"{EXAMPLE_TOOLS}\", \"--tools\", \"payments\","
        ),
    );
    std::fs::write(scenario.config_path(), config).unwrap();
}

/// One charge through `served` under a fresh lease: it succeeds, the tool
/// charged once, and the ledger holds the operation as succeeded.
async fn one_charge_succeeds(db: &TestDb, scenario: &Scenario, mcp: &str) {
    let (lease, _) = db.running_run("agent-1", 600_000).await;
    let (agent, _) = connect_http(mcp, Some(&lease)).await;
    let charged = charge_eur(&agent, 700, None)
        .await
        .expect("a gated call is served");
    let note = operation_note(&charged);
    assert_eq!(note["status"], "succeeded", "{charged:?}");
    assert_eq!(scenario.side_effects("charges.jsonl").len(), 1);
    let status: String =
        sqlx::query_scalar("SELECT status FROM tool_operations WHERE operation_id = $1")
            .bind(note["operation_id"].as_str().unwrap())
            .fetch_one(&db.admin)
            .await
            .unwrap();
    assert_eq!(status, "succeeded");
}

/// Whether the serving process's liveness row is alive on the database's
/// clock (it renews it every few seconds).
async fn liveness_alive(db: &TestDb) -> bool {
    sqlx::query_scalar(
        "SELECT bool_and(alive_until > clock_timestamp()) FROM leasegate_processes \
          WHERE alive_until > clock_timestamp() - interval '1 hour'",
    )
    .fetch_one(&db.admin)
    .await
    .unwrap_or(false)
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn connections_terminated_while_serve_starts_are_replaced_and_it_serves(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let (_one_at_a_time, db) = TestDb::new_exclusive(pool, connect).await;
    let scenario = Scenario::new(&db.url, POLICY);
    let gates = scenario.dir.join("gates");
    std::fs::create_dir_all(&gates).unwrap();
    hold_payments_start(&scenario, &gates);

    let starting = tokio::spawn(ServedChild::spawn(ServedChild::command(&scenario, &[])));
    // The ledger is open and checked; the proxy waits for its upstream.
    wait_until("the payments upstream to be started", || async {
        gates.join("started").exists().then_some(())
    })
    .await;
    let terminated = terminate_proxy_backends(&db).await;
    assert!(
        terminated >= 1,
        "the starting proxy holds ledger sessions to kill"
    );
    std::fs::write(gates.join("go"), "").unwrap();
    let mut served = within("leasegate serve to start", starting)
        .await
        .expect("leasegate serve starts after its connections were terminated");

    one_charge_succeeds(&db, &scenario, &served.mcp).await;
    assert!(
        served.child.try_wait().unwrap().is_none(),
        "the process is still serving:\n{}",
        served.log_text()
    );
    assert!(liveness_alive(&db).await, "its liveness row is renewed");
    assert!(
        served.log_text().contains("trying again"),
        "the dead connection was met and the call repeated:\n{}",
        served.log_text()
    );
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn a_connection_terminated_during_migrations_is_replaced_and_serve_starts(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let (_one_at_a_time, db) = TestDb::new_exclusive(pool, connect).await;
    let scenario = Scenario::new(&db.url, POLICY);
    let config = std::fs::read_to_string(scenario.config_path()).unwrap();
    std::fs::write(
        scenario.config_path(),
        replace_exactly(&config, "migrate = false", "migrate = true"),
    )
    .unwrap();

    // The migrations read their table first: holding it makes them wait.
    let mut holder = db.admin.begin().await.unwrap();
    sqlx::query("LOCK TABLE _sqlx_migrations IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *holder)
        .await
        .unwrap();
    let holder_pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut *holder)
        .await
        .unwrap();

    let starting = tokio::spawn(ServedChild::spawn(ServedChild::command(&scenario, &[])));
    let migrating: Vec<i32> = wait_until("the migrations to wait on the held table", || async {
        let waiting: Vec<i32> = sqlx::query_scalar(
            "SELECT pid FROM pg_stat_activity \
              WHERE datname = current_database() AND $1 = ANY(pg_blocking_pids(pid))",
        )
        .bind(holder_pid)
        .fetch_all(&db.admin)
        .await
        .unwrap();
        (!waiting.is_empty()).then_some(waiting)
    })
    .await;
    for pid in &migrating {
        sqlx::query("SELECT pg_terminate_backend($1)")
            .bind(pid)
            .execute(&db.admin)
            .await
            .unwrap();
    }
    holder.rollback().await.unwrap();

    let mut served = within("leasegate serve to start", starting)
        .await
        .expect("leasegate serve starts after its migration connection was terminated");
    one_charge_succeeds(&db, &scenario, &served.mcp).await;
    assert!(
        served.child.try_wait().unwrap().is_none(),
        "the process is still serving:\n{}",
        served.log_text()
    );
    assert!(
        served.log_text().contains("trying again"),
        "the migrations met the terminated connection and ran again:\n{}",
        served.log_text()
    );
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn after_every_ledger_connection_is_terminated_a_burst_of_calls_is_served(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let (scenario, proxy) = RunningProxy::serve(&db.url, POLICY).await;
    let (lease, _) = db.running_run("agent-1", 600_000).await;
    let (agent, _) = connect_http(&proxy.url, Some(&lease)).await;
    let agent = Arc::new(agent);

    // Several sessions open and idle in the pool.
    let burst = |amounts: std::ops::Range<i64>| {
        let calls: Vec<_> = amounts
            .map(|amount| {
                let agent = agent.clone();
                tokio::spawn(async move { (amount, charge_eur(&agent, amount, None).await) })
            })
            .collect();
        async move {
            let mut answers = Vec::new();
            for call in calls {
                answers.push(call.await.unwrap());
            }
            answers
        }
    };
    for (amount, answer) in burst(1..9).await {
        answer.unwrap_or_else(|e| panic!("warm-up charge {amount}: {e:?}"));
    }

    let terminated = terminate_proxy_backends(&db).await;
    assert!(terminated >= 2, "the pool held sessions: {terminated}");

    let answers = within("the burst to be answered", burst(100..140)).await;
    let mut refused = Vec::new();
    for (amount, answer) in &answers {
        match answer {
            Ok(result) => assert_eq!(
                operation_note(result)["status"],
                "succeeded",
                "charge {amount}: {result:?}"
            ),
            Err((code, message)) => {
                assert!(
                    !message.contains("durability"),
                    "charge {amount} blamed durability: {code} {message}"
                );
                refused.push(format!("{amount}: {code} {message}"));
            }
        }
    }
    assert!(
        refused.is_empty(),
        "a lone dead connection refuses no call:\n{}",
        refused.join("\n")
    );

    // What the tool did and what the ledger says agree.
    assert_eq!(scenario.side_effects("charges.jsonl").len(), 48);
    let succeeded: i64 =
        sqlx::query_scalar("SELECT count(*) FROM tool_operations WHERE status = 'succeeded'")
            .fetch_one(&db.admin)
            .await
            .unwrap();
    assert_eq!(succeeded, 48);
    assert!(!proxy.task.is_finished(), "the proxy still serves");
    let durability = common::http::get(&format!("{}/v1/durability", proxy.control_url)).await;
    let report: Value = serde_json::from_str(&durability.body).unwrap();
    assert_eq!(report["ok"], json!(true), "{report}");
    assert!(liveness_alive(&db).await, "its liveness row is renewed");
    proxy.stop().await;
}
