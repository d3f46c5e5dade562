//! Secrets at rest (policy `request_body`, `result_body`): masked values
//! reach no table and no log line, `RUST_LOG=debug` included, and are never
//! sent to a tool as `"***"`; encrypted bodies are sealed in every table,
//! opened by the reconciler for a same-key retry that sends the original
//! arguments, re-sealed by `leasegate secrets rotate`, and a missing or
//! wrong key is a clear error, never plaintext.

use crate::common;
use crate::common::intents;
use crate::common::proxy::spawn_call;

use std::sync::{Arc, Mutex};

use common::proxy::{LEASEGATE, Scenario, ServedChild, call, connect_http};
use common::{TestDb, http, wait_until, within};
use leasegate::intent::{Intent, OperationId};
use leasegate::ledger::{Ledger, LedgerError, LedgerOptions};
use leasegate::policy::{Bodies, Keyring, RequestBodyPolicy, ResultBodyPolicy};
use serde_json::{Value, json};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

const FAST: &str = "claim_ttl = \"3s\"\ndispatch_interval = \"100ms\"\nreconcile_interval = \"100ms\"\nin_flight_wait = \"1s\"\n";

const SECRET_TO: &str = "ceo-private-7f3a@example.com";
const SECRET_CARD: &str = "4000-0566-5566-5556-zq81";

/// Two 32-byte keys, as the policy reads them (hex).
const KEY_1: &str = "1111111111111111111111111111111111111111111111111111111111111111";
const KEY_2: &str = "2222222222222222222222222222222222222222222222222222222222222222";

struct Served {
    child: tokio::process::Child,
    mcp: String,
    control: String,
    /// Everything the child wrote to stderr so far.
    log: Arc<Mutex<Vec<String>>>,
}

impl Served {
    fn log(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }
}

/// `leasegate serve` as a child at `RUST_LOG=debug`, its stderr kept.
async fn serve(scenario: &Scenario, env: &[(&str, &str)]) -> Served {
    let mut command = ServedChild::command(scenario, env);
    command
        .env("RUST_LOG", "debug")
        .env_remove("LEASEGATE_LOG_BODIES");
    let served = ServedChild::spawn(command).await;
    Served {
        child: served.child,
        mcp: served.mcp,
        control: served.control,
        log: served.log,
    }
}

/// Every row of every table of the test database, as text.
async fn dump(db: &TestDb) -> String {
    let tables: Vec<String> = db
        .query_scalars(
            "SELECT quote_ident(table_name) FROM information_schema.tables
          WHERE table_schema = 'public' AND table_type = 'BASE TABLE'",
        )
        .await;
    assert!(tables.len() >= 6, "found the ledger's tables: {tables:?}");
    let mut text = String::new();
    for table in tables {
        // Table names from the catalog, quoted by PostgreSQL.
        let rows = db.rows_as_text(&table).await;
        text.push_str(&format!("{table}: {}\n", rows.join("\n")));
    }
    text
}

fn charge_calls(scenario: &Scenario) -> Vec<Value> {
    scenario
        .side_effects("calls.jsonl")
        .into_iter()
        .filter(|c| c["tool"] == "charge")
        .collect()
}

fn text_of(result: &rmcp::model::CallToolResult) -> String {
    serde_json::to_string(result).unwrap()
}

async fn ledger_with(db: &TestDb, bodies: Bodies) -> Ledger {
    Ledger::connect(
        &db.url,
        LedgerOptions {
            max_connections: 2,
            bodies,
            ..LedgerOptions::default()
        },
    )
    .await
    .unwrap()
}

fn planned_charge(run: leasegate::ledger::RunId, step: &str, arguments: Value) -> Intent {
    intents::planned(run, step, "payments__charge", &arguments)
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn masked_values_reach_no_table_no_log_and_no_tool_as_placeholders(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let policy = format!(
        "{FAST}request_body = \"masked\"\nmasked_fields = [\"to\", \"card\"]\n\
         result_body = \"masked\"\nresult_masked_fields = [\"to\"]\n"
    );
    let scenario = Scenario::new(&db.url, &policy);
    let (lease, revision) = db.running_run("agent", 120_000).await;

    let mut first = serve(&scenario, &[]).await;
    let (agent, _) = connect_http(&first.mcp, Some(&lease)).await;
    let email = json!({"to": SECRET_TO, "subject": "quarterly numbers"});
    let sent = call(&agent, "mailer__send_email", email.clone(), None)
        .await
        .unwrap();
    assert!(
        text_of(&sent).contains(SECRET_TO),
        "the live answer reaches the agent whole"
    );
    // A replay answers from the ledger: the result as stored, masked.
    let replay = call(&agent, "mailer__send_email", email, None)
        .await
        .unwrap();
    assert!(!text_of(&replay).contains(SECRET_TO), "{replay:?}");
    assert!(text_of(&replay).contains("***"));
    assert_eq!(scenario.side_effects("emails.jsonl").len(), 1);

    // A planned intent naming a masked field is refused: the outbox could
    // only ever send its placeholder. One without masked fields is kept.
    let masked = Bodies {
        request: RequestBodyPolicy::Masked(vec!["to".into(), "card".into()]),
        result: ResultBodyPolicy::Masked(vec!["to".into()]),
        keyring: None,
    };
    let planner = ledger_with(&db, masked).await;
    let refused = planner
        .operation_register(
            &lease,
            &[planned_charge(
                lease.run_id,
                "planned-card",
                json!({"amount": 5, "currency": "eur", "card": SECRET_CARD}),
            )],
            None,
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&refused, LedgerError::InvalidInput(_)) && refused.to_string().contains("masked"),
        "{refused}"
    );
    common::applied(
        planner
            .operation_register(
                &lease,
                &[planned_charge(
                    lease.run_id,
                    "planned-plain",
                    json!({"amount": 6, "currency": "eur"}),
                )],
                None,
            )
            .await
            .unwrap(),
    );
    // Through the control API too (same ledger path): 422 invalid_input.
    let answer = http::post(
        &format!("{}/v1/runs/{}/checkpoint", first.control, lease.run_id),
        &[("content-type", "application/json")],
        &json!({"owner": lease.owner, "epoch": lease.epoch, "expected_revision": revision,
                "checkpoint": {}, "intents": [{"step_id": "api-card", "effect_version": 1,
                "tool": "payments__charge", "arguments": {"amount": 7, "card": SECRET_CARD}}]})
        .to_string(),
    )
    .await;
    assert_eq!(answer.status, 422, "{}", answer.body);
    assert!(answer.body.contains("invalid_input"), "{}", answer.body);
    wait_until("the outbox to send the plain planned charge", || async {
        (charge_calls(&scenario).len() == 1).then_some(())
    })
    .await;

    // A charge whose answer is lost, then the process is killed: the new
    // process cannot retry with the masked card, so it hands the operation
    // to an operator instead of sending "***".
    let charge = spawn_call(
        &Arc::new(agent),
        "payments__charge",
        json!({"amount": 9, "currency": "eur", "card": SECRET_CARD, "hang_ms": 20000}),
    );
    wait_until("the charge to happen at the tool", || async {
        (charge_calls(&scenario).len() == 2).then_some(())
    })
    .await;
    first.child.kill().await.unwrap();
    charge.abort();

    let mut second = serve(&scenario, &[]).await;
    wait_until(
        "the reconciler to hand the charge to an operator",
        || async { second.log().contains("arguments_masked").then_some(()) },
    )
    .await;
    let calls = charge_calls(&scenario);
    assert_eq!(calls.len(), 2, "no retry reached the tool: {calls:?}");
    assert_eq!(calls[1]["arguments"]["card"], SECRET_CARD);
    assert!(
        !serde_json::to_string(&calls).unwrap().contains("***"),
        "no placeholder was ever sent: {calls:?}"
    );
    let charge_status: Vec<String> = db
        .query_scalars(
            "SELECT status FROM tool_operations WHERE tool_name = 'payments__charge' ORDER BY created_at",
        )
        .await;
    assert_eq!(charge_status, ["succeeded", "unknown"]);

    let tables = dump(&db).await;
    for secret in [SECRET_TO, SECRET_CARD] {
        assert!(!tables.contains(secret), "{secret} stored:\n{tables}");
    }
    assert!(tables.contains("***"), "the masked copies are there");
    second.child.kill().await.unwrap();
    let (first_log, second_log) = (first.log(), second.log());
    assert!(
        first_log.contains("DEBUG"),
        "the child logged at debug: {first_log}"
    );
    for secret in [SECRET_TO, SECRET_CARD] {
        assert!(!first_log.contains(secret), "{secret} logged:\n{first_log}");
        assert!(
            !second_log.contains(secret),
            "{secret} logged:\n{second_log}"
        );
    }
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn encrypted_bodies_are_sealed_retried_with_the_original_and_rotated(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let sealed = "request_body = \"encrypted\"\nresult_body = \"encrypted\"\n";
    let policy = format!(
        "{FAST}{sealed}encryption_key_id = \"k1\"\nencryption_keys = {{ k1 = \"env:LG_TEST_KEY_1\" }}\n"
    );
    let scenario = Scenario::new(&db.url, &policy);

    // No key in the environment: a clear startup error, nothing served.
    let check = tokio::process::Command::new(LEASEGATE)
        .arg("check-config")
        .arg(scenario.config_path())
        .env_remove("LG_TEST_KEY_1")
        .output()
        .await
        .unwrap();
    let said = String::from_utf8_lossy(&check.stderr).into_owned()
        + &String::from_utf8_lossy(&check.stdout);
    assert!(!check.status.success(), "{said}");
    assert!(
        said.contains("encryption_keys.k1") && said.contains("LG_TEST_KEY_1"),
        "{said}"
    );

    let (lease, _) = db.running_run("agent", 120_000).await;
    let key_1 = [("LG_TEST_KEY_1", KEY_1)];
    let mut first = serve(&scenario, &key_1).await;
    let (agent, _) = connect_http(&first.mcp, Some(&lease)).await;
    let agent = Arc::new(agent);
    let charge = spawn_call(
        &agent,
        "payments__charge",
        json!({"amount": 9, "currency": "eur", "card": SECRET_CARD, "hang_ms": 20000}),
    );
    wait_until("the charge to happen at the tool", || async {
        (scenario.side_effects("charges.jsonl").len() == 1).then_some(())
    })
    .await;
    // Killed after the effect, before anything is recorded.
    first.child.kill().await.unwrap();
    charge.abort();
    assert_eq!(
        db.status_of_tool("payments__charge").await.as_deref(),
        Some("dispatching")
    );

    // A planned charge, sealed by a planner with the same key: the outbox
    // opens it and sends the original.
    let k1 = Keyring::from_keys(Some("k1"), &[("k1", [0x11; 32])]);
    let bodies = Bodies {
        request: RequestBodyPolicy::Encrypted,
        result: ResultBodyPolicy::Encrypted,
        keyring: Some(k1.clone()),
    };
    let planner = ledger_with(&db, bodies.clone()).await;
    let planned = planned_charge(
        lease.run_id,
        "planned-card",
        json!({"amount": 4, "currency": "eur", "card": SECRET_CARD}),
    );
    common::applied(
        planner
            .operation_register(&lease, std::slice::from_ref(&planned), None)
            .await
            .unwrap(),
    );

    let mut second = serve(&scenario, &key_1).await;
    wait_until(
        "the unknown charge to converge by a same-key retry",
        || async {
            let statuses: Vec<String> = db
                .query_scalars("SELECT status FROM tool_operations WHERE status <> 'succeeded'")
                .await;
            statuses.is_empty().then_some(())
        },
    )
    .await;
    let calls = charge_calls(&scenario);
    assert_eq!(calls.len(), 3, "{calls:?}");
    for call in &calls {
        assert_eq!(call["arguments"]["card"], SECRET_CARD, "{call}");
    }
    assert_eq!(
        scenario.side_effects("charges.jsonl").len(),
        2,
        "one charge per operation: the retry was a replay"
    );
    let tables = dump(&db).await;
    assert!(!tables.contains(SECRET_CARD), "stored in clear:\n{tables}");
    let clear_results: i64 = db
        .query_scalar("SELECT count(*) FROM tool_operations WHERE result::text LIKE '%amount%'")
        .await;
    assert_eq!(clear_results, 0, "results are sealed:\n{tables}");
    assert!(tables.contains("dev.leasegate/sealed"));

    // Readers get the opened body (control API).
    let retried = sqlx::query_scalar::<_, String>(
        "SELECT operation_id FROM tool_operations WHERE operation_id <> $1",
    )
    .bind(planned.operation_id.as_str())
    .fetch_one(&db.admin)
    .await
    .map(OperationId::from_string)
    .unwrap();
    let shown = http::get(&format!("{}/v1/operations/{retried}", second.control)).await;
    assert_eq!(shown.status, 200, "{}", shown.body);
    assert!(shown.body.contains(SECRET_CARD), "{}", shown.body);
    second.child.kill().await.unwrap();
    assert!(!second.log().contains(SECRET_CARD), "{}", second.log());

    // Rotation: k2 becomes current, k1 stays readable; every operation and
    // every evidence row is sealed under k2 afterwards.
    let evidence_kids = || async {
        let bodies: Vec<Value> = db
            .query_scalars("SELECT body FROM operation_evidence")
            .await;
        let mut kids = Vec::new();
        for body in &bodies {
            leasegate::policy::secrets::sealed_key_ids(body, &mut kids);
        }
        kids
    };
    let before = evidence_kids().await;
    assert!(
        !before.is_empty() && before.iter().all(|kid| kid == "k1"),
        "the retry's evidence is sealed under k1: {before:?}"
    );
    let evidence_rows = db.row_count("operation_evidence").await;
    let rotated = format!(
        "{FAST}{sealed}encryption_key_id = \"k2\"\n\
         encryption_keys = {{ k1 = \"env:LG_TEST_KEY_1\", k2 = \"file:k2.key\" }}\n"
    );
    std::fs::write(scenario.dir.join("policies/test.toml"), rotated).unwrap();
    let key_file = scenario.dir.join("policies/k2.key");
    std::fs::write(&key_file, format!("{KEY_2}\n")).unwrap();
    // A key file others can read is refused, and nothing is re-sealed.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let readable = tokio::process::Command::new(LEASEGATE)
        .args(["secrets", "rotate", "--config"])
        .arg(scenario.config_path())
        .env("LG_TEST_KEY_1", KEY_1)
        .output()
        .await
        .unwrap();
    assert!(!readable.status.success());
    let refusal = String::from_utf8_lossy(&readable.stderr);
    assert!(
        refusal.contains("readable by others") && refusal.contains("chmod 600"),
        "{refusal}"
    );
    std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let rotate = tokio::process::Command::new(LEASEGATE)
        .args(["secrets", "rotate", "--config"])
        .arg(scenario.config_path())
        .env("LG_TEST_KEY_1", KEY_1)
        .output()
        .await
        .unwrap();
    let said = String::from_utf8_lossy(&rotate.stdout).into_owned()
        + &String::from_utf8_lossy(&rotate.stderr);
    assert!(rotate.status.success(), "{said}");
    assert!(
        said.contains("re-sealed 2 operations under key k2"),
        "{said}"
    );
    let kids: Vec<Option<String>> = db
        .query_scalars(
            "SELECT request_body -> 'dev.leasegate/sealed' ->> 'kid' FROM tool_operations
         UNION ALL SELECT result -> 'dev.leasegate/sealed' ->> 'kid' FROM tool_operations",
        )
        .await;
    assert_eq!(kids, vec![Some("k2".to_owned()); 4]);
    let after = evidence_kids().await;
    assert_eq!(
        after,
        vec!["k2".to_owned(); before.len()],
        "every sealed evidence value re-sealed under k2"
    );
    let resealed = said
        .lines()
        .find_map(|line| {
            line.strip_prefix("re-sealed ")?
                .strip_suffix(" evidence rows under key k2")?
                .parse::<i64>()
                .ok()
        })
        .unwrap_or_else(|| panic!("no evidence count in: {said}"));
    assert!(resealed > 0, "{said}");
    // Re-sealing changed bodies only: no evidence row added or removed.
    let rows_after = db.row_count("operation_evidence").await;
    assert_eq!(rows_after, evidence_rows);
    assert!(!dump(&db).await.contains(SECRET_CARD));

    // k2 alone opens the operations now; k1 alone is a clear per-row error;
    // a different key under the id k2 too. Never plaintext or a placeholder.
    let k2 = Keyring::from_keys(Some("k2"), &[("k2", [0x22; 32])]);
    let reader = |keyring| {
        ledger_with(
            &db,
            Bodies {
                keyring: Some(keyring),
                ..bodies.clone()
            },
        )
    };
    let record = reader(k2)
        .await
        .operation_record(&planned.operation_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.result.unwrap()["structuredContent"]["amount"], 4);
    let error = reader(k1)
        .await
        .operation_record(&planned.operation_id)
        .await
        .unwrap_err();
    assert!(
        matches!(error, LedgerError::Sealed { .. })
            && error.to_string().contains(planned.operation_id.as_str())
            && error
                .to_string()
                .contains("\"k2\", which is not configured"),
        "{error}"
    );
    let wrong = Keyring::from_keys(Some("k2"), &[("k2", [0x33; 32])]);
    let error = reader(wrong)
        .await
        .operation_record(&planned.operation_id)
        .await
        .unwrap_err();
    assert!(error.to_string().contains("does not open it"), "{error}");
}

/// `LEASEGATE_LOG_BODIES=1`, the one documented debug setting that lets
/// bodies into the log: two `leasegate serve` processes at `RUST_LOG=debug`
/// make the same calls (a read-only call and a gated charge) with a marker
/// in their arguments; only the one with the setting logs the marker (and
/// says so at start), the other logs neither marker nor warning.
#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn bodies_reach_the_log_only_with_leasegate_log_bodies(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let scenario = Scenario::new(&db.url, FAST);
    let mut logs = Vec::new();
    for with_bodies in [false, true] {
        let marker = format!("body-marker-{}", uuid::Uuid::new_v4().simple());
        let mut command = ServedChild::command(&scenario, &[("RUST_LOG", "debug")]);
        if with_bodies {
            command.env("LEASEGATE_LOG_BODIES", "1");
        } else {
            command.env_remove("LEASEGATE_LOG_BODIES");
        }
        let mut served = ServedChild::spawn(command).await;
        let (agent, _) = connect_http(&served.mcp, None).await;
        let read = call(
            &agent,
            "payments__get_charge",
            json!({"charge_id": marker}),
            None,
        )
        .await;
        assert!(read.is_ok(), "{read:?}");
        let (lease, _) = db
            .running_run(&format!("agent-{with_bodies}"), 60_000)
            .await;
        let (gated, _) = connect_http(&served.mcp, Some(&lease)).await;
        let charged = call(
            &gated,
            "payments__charge",
            json!({"amount": 3, "currency": "eur", "card": marker}),
            None,
        )
        .await;
        assert!(charged.is_ok(), "{charged:?}");
        drop((agent, gated));
        served.child.kill().await.unwrap();
        let log = served.log.clone();
        let _ = within("its stderr to be read to the end", served.drained).await;
        let text = log.lock().unwrap().join("\n");
        logs.push((with_bodies, marker, text));
    }
    for (with_bodies, marker, log) in logs {
        assert_eq!(
            log.contains(&marker),
            with_bodies,
            "LEASEGATE_LOG_BODIES={with_bodies}: the marker in the log:\n{log}"
        );
        assert_eq!(
            log.contains("LEASEGATE_LOG_BODIES is set"),
            with_bodies,
            "{log}"
        );
        // Debug logging was on in both: the difference is the setting.
        assert!(log.contains("DEBUG"), "{log}");
    }
}
