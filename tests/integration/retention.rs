//! Retention: `leasegate ops archive` and the ledger's
//! `operations_archive` move the settled history of terminal runs older
//! than the window out of the live tables, in bounded batches; nothing
//! live moves, and the fate query still answers for archived operations.

use crate::common;
use crate::common::intents;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use common::TestDb;
use leasegate::control::router;
use leasegate::intent::{IntegerPolicy, Intent, OperationId};
use leasegate::ledger::{LeaseClaim, Ledger, LedgerOptions, OPERATOR_ROLE, RunId, UnknownCause};
use serde_json::{Value, json};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

fn intent(run_id: RunId, step: &str) -> Intent {
    intents::planned(
        run_id,
        step,
        "payments__charge",
        &json!({"amount": 500, "step": step}),
    )
}

/// A running run with two settled operations (one of them with late
/// evidence); `finish`: the run completed. Returns the lease and the
/// operations.
async fn run_with_settled_operations(
    db: &TestDb,
    owner: &str,
    finish: bool,
) -> (LeaseClaim, Vec<OperationId>) {
    let (lease, revision) = db.running_run(owner, 30_000).await;
    let mut ops = Vec::new();
    for step in ["charge", "email"] {
        let claim = db
            .claim(&lease, &intent(lease.run_id, step), "proxy-1", 60_000)
            .await;
        db.settle_succeeded(&claim, Some("remote-1"), &json!({"ok": step}))
            .await;
        if step == "charge" {
            // A late answer under the same claim: kept as evidence.
            db.settle_succeeded(&claim, Some("remote-1"), &json!({"late": true}))
                .await;
        }
        ops.push(claim.operation_id);
    }
    if finish {
        db.complete_run(&lease, revision, None).await;
    }
    (lease, ops)
}

/// Moves a run and its operations `days` into the past (as the superuser:
/// the window is on the database clock).
async fn age(db: &TestDb, run: RunId, days: i32) {
    db.execute_with(
        "UPDATE agent_runs SET updated_at = now() - make_interval(days => $2) WHERE run_id = $1",
        (run.as_uuid(), days),
    )
    .await;
    db
        .execute_with(
            "UPDATE tool_operations SET updated_at = now() - make_interval(days => $2) WHERE run_id = $1",
            (run.as_uuid(), days),
        )
        .await;
}

/// (live operations, live events, live evidence, archived operations,
/// archived events, archived evidence) of a run.
async fn counts(db: &TestDb, run: RunId) -> [i64; 6] {
    sqlx::query_as::<_, (i64, i64, i64, i64, i64, i64)>(
        "SELECT (SELECT count(*) FROM tool_operations WHERE run_id = $1),
                (SELECT count(*) FROM ledger_events WHERE run_id = $1),
                (SELECT count(*) FROM operation_evidence v JOIN tool_operations o USING (operation_id)
                  WHERE o.run_id = $1),
                (SELECT count(*) FROM tool_operations_archive WHERE run_id = $1),
                (SELECT count(*) FROM ledger_events_archive WHERE run_id = $1),
                (SELECT count(*) FROM operation_evidence_archive v
                   JOIN tool_operations_archive o USING (operation_id) WHERE o.run_id = $1)",
    )
    .bind(run.as_uuid())
    .fetch_one(&db.admin)
    .await
    .map(|(a, b, c, d, e, f)| [a, b, c, d, e, f])
    .unwrap()
}

async fn operator(db: &TestDb) -> Ledger {
    Ledger::connect(
        &db.url,
        LedgerOptions {
            max_connections: 1,
            session_role: Some(OPERATOR_ROLE.to_owned()),
            ..LedgerOptions::default()
        },
    )
    .await
    .expect("connect as the operator role")
}

async fn get(ledger: &Ledger, path: &str) -> (StatusCode, Value) {
    let request = Request::builder()
        .method(Method::GET)
        .uri(path)
        .body(Body::empty())
        .unwrap();
    common::router::answer(router(ledger.clone(), IntegerPolicy::Reject), request).await
}

const DAY_MS: i64 = 24 * 3600 * 1000;

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn old_settled_history_moves_to_the_archive_and_stays_answerable_while_live_work_stays(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    // Old and done: archived.
    let (old, old_ops) = run_with_settled_operations(&db, "w-old", true).await;
    age(&db, old.run_id, 40).await;
    // Old and done but with an unknown operation: stays whole.
    let (stuck, _) = run_with_settled_operations(&db, "w-stuck", false).await;
    let claim = db
        .claim(&stuck, &intent(stuck.run_id, "lost"), "proxy-1", 60_000)
        .await;
    db.holder_marks_unknown(&claim, UnknownCause::TimedOut, &json!({"error": "timeout"}))
        .await;
    db.operator_cancels(stuck.run_id, "ops", None).await;
    age(&db, stuck.run_id, 40).await;
    // Old but still running: stays.
    let (running, _) = run_with_settled_operations(&db, "w-running", false).await;
    age(&db, running.run_id, 40).await;
    // Done but recent: stays.
    let (recent, _) = run_with_settled_operations(&db, "w-recent", true).await;

    let before_old = counts(&db, old.run_id).await;
    assert_eq!(before_old, [2, before_old[1], 1, 0, 0, 0]);
    assert!(before_old[1] >= 6, "{before_old:?}");
    let fate_before = db.operation_view(&old_ops[0]).await;
    let untouched = [stuck.run_id, running.run_id, recent.run_id];
    let mut before = Vec::new();
    for run in untouched {
        before.push(counts(&db, run).await);
    }

    // The application role may not archive, nor delete events itself.
    let refused = db
        .ledger
        .operations_archive(30 * DAY_MS, 100, false, None)
        .await;
    assert!(refused.is_err(), "the proxy's role archived: {refused:?}");
    let mut app = db.admin.acquire().await.unwrap();
    sqlx::query("SET ROLE leasegate_app")
        .execute(&mut *app)
        .await
        .unwrap();
    sqlx::query("SET leasegate.archiving = 'on'")
        .execute(&mut *app)
        .await
        .unwrap();
    let denied = sqlx::query("DELETE FROM ledger_events")
        .execute(&mut *app)
        .await
        .unwrap_err();
    assert!(denied.to_string().contains("permission denied"), "{denied}");
    // Not back into the admin pool as the application role.
    app.detach();
    // Nor may the owner outside the archive function.
    let denied = sqlx::query("DELETE FROM ledger_events WHERE run_id = $1")
        .bind(old.run_id.as_uuid())
        .execute(&db.admin)
        .await
        .unwrap_err();
    assert!(denied.to_string().contains("append-only"), "{denied}");

    // One batch of one run at a time: bounded.
    let ops_role = operator(&db).await;
    let batch = ops_role
        .operations_archive(30 * DAY_MS, 1, false, None)
        .await
        .unwrap();
    assert_eq!(
        (batch.runs, batch.operations, batch.evidence, batch.events),
        (1, 2, 1, before_old[1])
    );
    assert_eq!(
        counts(&db, old.run_id).await,
        [0, 0, 0, 2, before_old[1], 1]
    );
    let again = ops_role
        .operations_archive(30 * DAY_MS, 100, false, None)
        .await
        .unwrap();
    assert_eq!(
        again.runs, 0,
        "nothing else is old, done and settled: {again:?}"
    );
    for (run, counted) in untouched.iter().zip(before) {
        assert_eq!(counts(&db, *run).await, counted, "run {run} was touched");
    }
    let archived_runs: Vec<uuid::Uuid> = db
        .query_scalars("SELECT run_id FROM agent_runs WHERE archived_at IS NOT NULL")
        .await;
    assert_eq!(archived_runs, vec![old.run_id.as_uuid()]);

    // The fate query answers from the archive: the same operation, history
    // and evidence, marked archived.
    let fate = db.operation_view(&old_ops[0]).await;
    assert!(fate.archived && !fate_before.archived);
    assert_eq!(fate.operation, fate_before.operation);
    assert_eq!(fate.request_body, fate_before.request_body);
    assert_eq!(fate.events, fate_before.events);
    assert_eq!(fate.evidence, fate_before.evidence);
    assert_eq!(fate.created_at, fate_before.created_at);
    let (status, shown) = get(&db.ledger, &format!("/v1/operations/{}", old_ops[0])).await;
    assert_eq!(status, StatusCode::OK, "{shown}");
    assert_eq!(shown["archived"], true, "{shown}");
    assert_eq!(shown["operation"]["status"], "succeeded", "{shown}");
    // The run itself is still there.
    let (status, run) = get(&db.ledger, &format!("/v1/runs/{}", old.run_id)).await;
    assert_eq!(
        (status, run["status"].as_str()),
        (StatusCode::OK, Some("succeeded")),
        "{run}"
    );

    // --delete through the CLI, as the operator would run it: the recent
    // run once it is old, gone for good.
    age(&db, recent.run_id, 40).await;
    let recent_op = OperationId::from_string(
        db.scalar::<String>(
            "SELECT operation_id FROM tool_operations WHERE run_id = $1 LIMIT 1",
            recent.run_id.as_uuid(),
        )
        .await,
    );
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_leasegate"))
        .args([
            "ops",
            "archive",
            "--older-than",
            "30d",
            "--delete",
            "--json",
            "--database-url",
            &db.url,
        ])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let totals: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(totals["runs"], 1, "{totals}");
    assert_eq!(totals["operations"], 2, "{totals}");
    assert_eq!(totals["deleted"], true, "{totals}");
    assert_eq!(counts(&db, recent.run_id).await, [0, 0, 0, 0, 0, 0]);
    assert!(db.ledger.operation_get(&recent_op).await.unwrap().is_none());
    let (status, _) = get(&db.ledger, &format!("/v1/operations/{recent_op}")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    // The stuck and running runs are still whole.
    assert_eq!(counts(&db, stuck.run_id).await[0], 3);
    assert_eq!(counts(&db, running.run_id).await[0], 2);

    // Bad windows are refused before anything is done (exit 2).
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_leasegate"))
        .args([
            "ops",
            "archive",
            "--older-than",
            "soon",
            "--database-url",
            &db.url,
        ])
        .output()
        .unwrap();
    assert_eq!(
        output.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(String::from_utf8_lossy(&output.stderr).contains("--older-than"));
    // The events left behind name live rows: the archive moved each
    // archived operation's events with it.
    assert!(db.assert_events_name_ledger_rows().await > 0);
}
