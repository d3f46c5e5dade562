//! Least privilege in the database, end to end: the
//! deployment where the proxy's login is a member of `leasegate_app` only
//! and operators act with a login of their own that is a member of
//! `leasegate_operator` only.
//!
//! * `leasegate serve` as the app-only login serves tool calls and the
//!   agent routes, and answers every operator route (resolve, retry,
//!   cancel, failover resolve) 503 `role_not_granted`, writing nothing;
//! * the operator CLI as the operator-only login resolves, retries and
//!   cancels (the actor recorded is the CLI's `--actor`), and as the
//!   app-only login is refused with exit 15;
//! * `database_operator_url` gives `serve` the operator's login: the same
//!   routes then work through the control API.

use crate::common;
use crate::common::intents;
use crate::common::proxy::charge_eur;

use common::proxy::{LEASEGATE, RunningProxy, Scenario, connect_http};
use common::{TestDb, http};
use leasegate::ledger::UnknownCause;
use serde_json::{Value, json};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

const POLICY: &str = "background = false\n";
const J: (&str, &str) = ("content-type", "application/json");

/// A login role of the cluster (roles are cluster-wide: unique names,
/// dropped at the end) that is a member of `role` only.
async fn login_member_of(db: &TestDb, role: &str) -> String {
    let name = format!(
        "lg_{}_{}",
        role.trim_start_matches("leasegate_"),
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    );
    for statement in [
        format!("CREATE ROLE {name} LOGIN"),
        format!("GRANT {role} TO {name}"),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(statement))
            .execute(&db.admin)
            .await
            .unwrap();
    }
    name
}

async fn drop_login(db: &TestDb, name: &str) {
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP ROLE IF EXISTS {name}")))
        .execute(&db.admin)
        .await
        .unwrap();
}

/// The test database's URL with another login.
fn url_as(db: &TestDb, login: &str) -> String {
    let rest = db.url.split_once('@').unwrap().1;
    format!("postgres://{login}@{rest}")
}

/// An unknown charge on a running run of tenant-a: (run id, operation id).
async fn unknown_operation(db: &TestDb) -> (String, String) {
    let (lease, _) = db.running_run("agent", 60_000).await;
    let intent = intents::unplanned_charge(lease.run_id, 7, "eur");
    let claim = db.claim(&lease, &intent, "proxy-0", 30_000).await;
    db.holder_marks_unknown(&claim, UnknownCause::TimedOut, &json!({}))
        .await;
    (
        lease.run_id.to_string(),
        intent.operation_id.as_str().to_owned(),
    )
}

/// (operation status, revision, run status, events, unresolved failovers).
async fn state(db: &TestDb, run: &str, operation: &str) -> (String, i64, String, i64, i64) {
    db.row_with(
        "SELECT (SELECT status FROM tool_operations WHERE operation_id = $1), \
                (SELECT revision FROM tool_operations WHERE operation_id = $1), \
                (SELECT status FROM agent_runs WHERE run_id = $2::uuid), \
                (SELECT count(*) FROM ledger_events), \
                (SELECT count(*) FROM ledger_failovers WHERE resolved_at IS NULL)",
        (operation, run),
    )
    .await
}

async fn lossy_failover(db: &TestDb) -> i64 {
    db.query_scalar(
        "INSERT INTO ledger_failovers (detected_by, system_identifier, old_timeline, \
         new_timeline, acknowledged_lsn, lossy) VALUES ('proxy-0', '42', 1, 2, '0/10', true) \
         RETURNING failover_id",
    )
    .await
}

/// `leasegate <args>` with `--database-url url`: (exit code, stdout, stderr).
fn cli(url: &str, args: &[&str]) -> (i32, String, String) {
    let output = std::process::Command::new(LEASEGATE)
        .args(args)
        .args(["--database-url", url])
        .env_remove("LEASEGATE_DATABASE_URL")
        .output()
        .expect("run leasegate");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

fn json_of(answer: &http::Answer) -> Value {
    serde_json::from_str(&answer.body).unwrap_or(Value::Null)
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn a_proxy_login_without_the_operator_role_serves_calls_and_refuses_operator_acts(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let app_login = login_member_of(&db, "leasegate_app").await;
    let ops_login = login_member_of(&db, "leasegate_operator").await;
    let (run, operation) = unknown_operation(&db).await;

    // `leasegate serve` as the app-only login.
    let scenario = Scenario::new(&url_as(&db, &app_login), POLICY);
    let proxy = RunningProxy::start(&scenario.config_path()).await;
    // Tool calls and the agent routes work: a run and a gated charge.
    let created = http::post(
        &format!("{}/v1/runs", proxy.control_url),
        &[J],
        r#"{"task_id": "order-1", "owner": "agent-1", "ttl_ms": 60000}"#,
    )
    .await;
    assert_eq!(created.status, 201, "{}", created.body);
    let (lease, _) = db.running_run("agent-2", 60_000).await;
    let (agent, _) = connect_http(&proxy.url, Some(&lease)).await;
    let charged = charge_eur(&agent, 500, None)
        .await
        .expect("a gated call through a proxy whose login has leasegate_app only");
    assert_ne!(charged.is_error, Some(true), "{charged:?}");
    assert_eq!(scenario.side_effects("charges.jsonl").len(), 1);
    drop(agent);
    // A lossy failover to resolve (recorded after the call: it holds
    // dispatch until an operator resolves it).
    let failover = lossy_failover(&db).await;

    // Every operator route: 503 role_not_granted, nothing written.
    let before = state(&db, &run, &operation).await;
    assert_eq!(
        (before.0.as_str(), before.2.as_str(), before.4),
        ("unknown", "running", 1)
    );
    for (path, body) in [
        (
            format!("/v1/operations/{operation}/resolve"),
            json!({"outcome": "succeeded", "actor": "mallory", "note": "trust me"}),
        ),
        (
            format!("/v1/operations/{operation}/retry"),
            json!({"actor": "mallory", "note": "again"}),
        ),
        (
            format!("/v1/runs/{run}/cancel"),
            json!({"actor": "mallory"}),
        ),
        (
            format!("/v1/failovers/{failover}/resolve"),
            json!({"by": "mallory", "reason": "nothing lost"}),
        ),
    ] {
        let answer = http::post(
            &format!("{}{path}", proxy.control_url),
            &[J],
            &body.to_string(),
        )
        .await;
        let answer_json = json_of(&answer);
        assert_eq!(
            (answer.status, answer_json["code"].as_str()),
            (503, Some("role_not_granted")),
            "{path}: {}",
            answer.body
        );
        let message = answer_json["message"].as_str().unwrap();
        assert!(
            message.contains("leasegate_operator") && message.contains(&app_login),
            "{path}: the message names the role and the login: {message}"
        );
    }
    assert_eq!(
        state(&db, &run, &operation).await,
        before,
        "nothing written"
    );
    // Reads still work for the operator scope's routes.
    let shown = http::get(&format!("{}/v1/operations/{operation}", proxy.control_url)).await;
    assert_eq!(shown.status, 200, "{}", shown.body);
    proxy.stop().await;

    // The CLI as the app-only login cannot act as an operator: exit 15,
    // saying which role and login, nothing written.
    let (code, _, stderr) = cli(
        &url_as(&db, &app_login),
        &[
            "ops", "retry", &operation, "--note", "again", "--actor", "mallory",
        ],
    );
    assert_eq!(code, 15, "{stderr}");
    assert!(
        stderr.contains("role_not_granted")
            && stderr.contains("leasegate_operator")
            && stderr.contains(&app_login),
        "{stderr}"
    );
    // Its reads still work as leasegate_app.
    let (code, stdout, stderr) = cli(&url_as(&db, &app_login), &["ops", "show", &operation]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert_eq!(
        state(&db, &run, &operation).await,
        before,
        "nothing written"
    );

    // The operator's own login (leasegate_operator only) does each act; the
    // history names the CLI's actor.
    let ops_url = url_as(&db, &ops_login);
    // It reads too (as leasegate_operator, which reads every ledger table).
    let (code, stdout, stderr) = cli(&ops_url, &["ops", "show", &operation]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(stdout.contains(&operation), "{stdout}");
    let (code, stdout, stderr) = cli(
        &ops_url,
        &[
            "ops",
            "retry",
            &operation,
            "--note",
            "bank API back",
            "--actor",
            "alice",
        ],
    );
    assert_eq!(code, 0, "{stdout}{stderr}");
    let (code, stdout, stderr) = cli(
        &ops_url,
        &[
            "ops",
            "resolve",
            &operation,
            "--succeeded",
            "--note",
            "the bank shows it",
            "--remote-id",
            "ch_9",
            "--actor",
            "alice",
        ],
    );
    assert_eq!(code, 0, "{stdout}{stderr}");
    let (code, stdout, stderr) = cli(
        &ops_url,
        &[
            "runs",
            "cancel",
            &run,
            "--reason",
            "customer asked",
            "--actor",
            "alice",
        ],
    );
    assert_eq!(code, 0, "{stdout}{stderr}");
    let (code, stdout, stderr) = cli(
        &ops_url,
        &[
            "ops",
            "failover-resolve",
            &failover.to_string(),
            "--reason",
            "compared with the bank",
            "--by",
            "alice",
        ],
    );
    assert_eq!(code, 0, "{stdout}{stderr}");
    let after = state(&db, &run, &operation).await;
    assert_eq!(
        (after.0.as_str(), after.2.as_str(), after.4),
        ("succeeded", "cancelled", 0)
    );
    let actors: Vec<(String, String, String)> = db
        .rows_with(
            "SELECT actor_kind, actor, to_status FROM ledger_events \
          WHERE (operation_id = $1 OR (run_id = $2::uuid AND subject = 'run')) AND event_id > \
                (SELECT max(event_id) FROM ledger_events WHERE operation_id = $1 \
                   AND to_status = 'unknown' AND actor = 'proxy-0') \
          ORDER BY event_id",
            (&operation, &run),
        )
        .await;
    let who: Vec<(&str, &str, &str)> = actors
        .iter()
        .map(|(k, a, s)| (k.as_str(), a.as_str(), s.as_str()))
        .collect();
    assert_eq!(
        who,
        [
            ("operator", "alice", "unknown"),
            ("operator", "alice", "succeeded"),
            ("operator", "alice", "cancelled"),
        ]
    );

    drop_login(&db, &app_login).await;
    drop_login(&db, &ops_login).await;
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn database_operator_url_gives_serve_the_operators_login_for_the_operator_routes(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let app_login = login_member_of(&db, "leasegate_app").await;
    let ops_login = login_member_of(&db, "leasegate_operator").await;
    let (run, operation) = unknown_operation(&db).await;

    let scenario = Scenario::new(&url_as(&db, &app_login), POLICY);
    scenario.prepend_config(&format!(
        "database_operator_url = \"{}\"",
        url_as(&db, &ops_login)
    ));
    let proxy = RunningProxy::start(&scenario.config_path()).await;
    let resolved = http::post(
        &format!("{}/v1/operations/{operation}/resolve", proxy.control_url),
        &[J],
        r#"{"outcome": "failed_final", "actor": "bob", "note": "the bank has no such charge"}"#,
    )
    .await;
    assert_eq!(resolved.status, 200, "{}", resolved.body);
    let cancelled = http::post(
        &format!("{}/v1/runs/{run}/cancel", proxy.control_url),
        &[J],
        r#"{"actor": "bob", "reason": "done"}"#,
    )
    .await;
    assert_eq!(cancelled.status, 200, "{}", cancelled.body);
    let after = state(&db, &run, &operation).await;
    assert_eq!(
        (after.0.as_str(), after.2.as_str()),
        ("failed_final", "cancelled")
    );
    let (kind, actor): (String, String) = db
        .row(
            "SELECT actor_kind, actor FROM ledger_events WHERE operation_id = $1 \
         AND to_status = 'failed_final'",
            &operation,
        )
        .await;
    assert_eq!((kind.as_str(), actor.as_str()), ("operator", "bob"));
    proxy.stop().await;

    // A database_operator_url whose login is not a member of
    // leasegate_operator is a mistake: serve refuses to start, saying so.
    std::fs::write(
        scenario.config_path(),
        std::fs::read_to_string(scenario.config_path())
            .unwrap()
            .replace(&ops_login, &app_login),
    )
    .unwrap();
    let config = leasegate::config::Config::load(&scenario.config_path()).unwrap();
    let error = match leasegate::app::Proxy::start(config).await {
        Ok(_) => panic!("serve started with an operator login that is not one"),
        Err(error) => format!("{error:#}"),
    };
    assert!(
        error.contains("database_operator_url")
            && error.contains(&app_login)
            && error.contains("leasegate_operator"),
        "{error}"
    );

    drop_login(&db, &app_login).await;
    drop_login(&db, &ops_login).await;
}
