//! The database is the safety boundary (seed section 12): the application
//! role can only run the protected functions and read; the event history is
//! append-only; migrations are repeatable and tolerate the shared role.

use crate::common;
use crate::common::intents;
use crate::common::operator::alice_resolves;

use common::TestDb;
use leasegate::ledger::{
    ConvergeOutcome, Fenced, Ledger, RetryResetOutcome, Settlement, UnknownCause,
};
use serde_json::json;
use sqlx::Connection;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

async fn as_app_role(db: &TestDb, statement: &'static str) -> Result<u64, String> {
    let mut tx = db.admin.begin().await.unwrap();
    sqlx::query("SET LOCAL ROLE leasegate_app")
        .execute(&mut *tx)
        .await
        .unwrap();
    let result = sqlx::query(statement).execute(&mut *tx).await;
    tx.rollback().await.unwrap();
    result.map(|done| done.rows_affected()).map_err(|error| {
        let code = error
            .as_database_error()
            .and_then(|db| db.code().map(|c| c.into_owned()))
            .unwrap_or_default();
        format!("{code}: {error}")
    })
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn application_role_cannot_write_tables_directly(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let (claim, _) = db.running_run("worker", 30_000).await;

    // The ledger itself runs as the application role.
    assert_eq!(
        db.ledger.health().await.unwrap().current_user,
        "leasegate_app"
    );

    for statement in [
        "UPDATE agent_runs SET status = 'failed'",
        "UPDATE worker_leases SET owner = 'intruder', epoch = epoch + 1",
        "DELETE FROM agent_runs",
        "INSERT INTO agent_tasks (tenant_id, task_id) VALUES ('x', 'y')",
        "INSERT INTO ledger_events (run_id, subject, to_status, actor_kind) SELECT run_id, 'run', 'failed', 'worker' FROM agent_runs",
        "UPDATE tool_operations SET status = 'succeeded'",
        "SELECT _lease_fence(run_id, 'worker', 1, NULL::bytea, false) FROM agent_runs",
        "SELECT _run_advance(run_id, 'worker', 1, NULL::bytea, 1, 'running', 'failed', NULL, NULL) FROM agent_runs",
        "UPDATE worker_leases SET token_sha256 = sha256('mine')",
    ] {
        let error = as_app_role(&db, statement).await.expect_err(statement);
        assert!(
            error.starts_with("42501"),
            "{statement}: expected permission denied, got {error}"
        );
    }
    // Reading is allowed.
    assert_eq!(as_app_role(&db, "SELECT * FROM agent_runs").await, Ok(1));
    let (status, _, _, owner, epoch) = db.run_row(claim.run_id).await;
    assert_eq!(
        (status.as_str(), owner.as_deref(), epoch),
        ("running", Some("worker"), 1)
    );
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn event_history_refuses_update_delete_and_truncate_even_for_the_owner(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let run_id = db.pending_run().await;
    for statement in [
        "UPDATE ledger_events SET to_status = 'succeeded'",
        "DELETE FROM ledger_events",
        "TRUNCATE ledger_events",
    ] {
        let error = sqlx::query(statement)
            .execute(&db.admin)
            .await
            .expect_err(statement);
        assert!(
            error.to_string().contains("append-only"),
            "{statement}: {error}"
        );
    }
    assert_eq!(db.event_count(run_id).await, 1);
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn migrating_twice_is_a_no_op_and_databases_migrate_concurrently(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect.clone()).await;
    let run_id = db.pending_run().await;
    Ledger::migrate(&db.url)
        .await
        .expect("second migration is a no-op");
    assert!(
        db.ledger.run_get(run_id).await.unwrap().is_some(),
        "data kept"
    );

    // Several fresh databases of one cluster migrate at the same time; the
    // cluster-wide role is shared by all of them.
    let names: Vec<String> = (0..4)
        .map(|i| format!("leasegate_migrate_{}_{i}", uuid::Uuid::new_v4().simple()))
        .collect();
    let mut admin = sqlx::PgConnection::connect_with(&connect).await.unwrap();
    for name in &names {
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE \"{name}\"")))
            .execute(&mut admin)
            .await
            .unwrap();
    }
    let base = db.url.rsplit_once('/').unwrap().0.to_owned();
    let migrations = names.iter().map(|name| {
        let url = format!("{base}/{name}");
        async move { (Ledger::migrate(&url).await, Ledger::migrate(&url).await) }
    });
    let results = common::within("concurrent migrations", futures_join_all(migrations)).await;
    for name in &names {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "DROP DATABASE \"{name}\" WITH (FORCE)"
        )))
        .execute(&mut admin)
        .await
        .unwrap();
    }
    for (first, second) in results {
        first.expect("concurrent migration");
        second.expect("repeated migration");
    }
    admin.close().await.unwrap();
}

/// `join_all` without pulling the futures crate for one call.
async fn futures_join_all<F>(futures: impl IntoIterator<Item = F>) -> Vec<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let handles: Vec<_> = futures.into_iter().map(tokio::spawn).collect();
    let mut outputs = Vec::new();
    for handle in handles {
        outputs.push(handle.await.unwrap());
    }
    outputs
}

/// The names a file defines with `CREATE [OR REPLACE] FUNCTION name(` or
/// `CREATE [OR REPLACE] PROCEDURE name(`.
fn defined_functions(text: &str) -> Vec<String> {
    ["FUNCTION ", "PROCEDURE "]
        .into_iter()
        .flat_map(|kind| {
            text.match_indices(kind)
                .filter(|(at, _)| {
                    let before = &text[..*at];
                    before.ends_with("CREATE ") || before.ends_with("CREATE OR REPLACE ")
                })
                .map(move |(at, _)| {
                    let rest = &text[at + kind.len()..];
                    rest[..rest.find('(').expect("a parameter list")].to_owned()
                })
        })
        .collect()
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn every_function_has_one_home_and_the_right_grant(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    // One definition per function across sql/, none in the migrations but
    // the trigger function the tables need.
    let mut homes = std::collections::BTreeMap::<String, Vec<&str>>::new();
    for (file, text) in leasegate::ledger::FUNCTION_FILES {
        for name in defined_functions(text) {
            homes.entry(name).or_default().push(file);
        }
    }
    let copies: Vec<_> = homes.iter().filter(|(_, files)| files.len() > 1).collect();
    assert!(copies.is_empty(), "functions defined twice: {copies:?}");
    let migrations_dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
    let mut in_migrations = Vec::new();
    for entry in std::fs::read_dir(&migrations_dir).unwrap() {
        let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        in_migrations.extend(defined_functions(&text));
    }
    // (0001 defines ledger_events_refuse_change, 0009 lets operations_archive
    // delete through it; 0007 defines operation_evidence_refuse_change.)
    in_migrations.sort();
    in_migrations.dedup();
    assert_eq!(
        in_migrations,
        [
            "ledger_events_refuse_change",
            "operation_evidence_refuse_change"
        ]
    );

    // The database runs exactly those, and the application role may execute
    // the public ones (no leading underscore) but the operator acts, and
    // none of the helpers; the operator role exactly the operator acts:
    // token management, re-sealing stored bodies (`secrets rotate`),
    // resolving and retrying operations, cancelling runs, resolving
    // failovers (migrations/0007), retention (`ops archive`), taking a live
    // lease from its holder.
    let installed: Vec<(String, bool, bool)> = db
        .query_rows(
            "SELECT p.proname::text, has_function_privilege('leasegate_app', p.oid, 'EXECUTE'), \
                has_function_privilege('leasegate_operator', p.oid, 'EXECUTE') \
           FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace \
          WHERE n.nspname = 'public' AND p.prorettype <> 'trigger'::regtype ORDER BY 1",
        )
        .await;
    let names: Vec<&str> = installed.iter().map(|(name, _, _)| name.as_str()).collect();
    let expected: Vec<&str> = homes.keys().map(String::as_str).collect();
    assert_eq!(names, expected, "installed functions differ from sql/");
    let operators = [
        "access_token_create",
        "access_token_revoke",
        "evidence_reseal",
        "failover_resolve",
        "lease_takeover",
        "operation_reconcile_reset",
        "operation_reseal",
        "operation_resolve",
        "operations_archive",
        "run_cancel",
    ];
    for (name, app, operator) in &installed {
        let operators_only = operators.contains(&name.as_str());
        assert_eq!(
            *app,
            !name.starts_with('_') && !operators_only,
            "{name}: EXECUTE for leasegate_app"
        );
        assert_eq!(
            *operator, operators_only,
            "{name}: EXECUTE for leasegate_operator"
        );
    }
    let digest: String = db.query_scalar("SELECT digest FROM ledger_functions").await;
    assert_eq!(digest, leasegate::ledger::functions_digest());
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn migrate_reinstalls_functions_that_differ_from_sql_files(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    // A database whose functions are an older set: a different digest and a
    // function body that answers wrongly.
    sqlx::raw_sql(
        "UPDATE ledger_functions SET digest = 'older'; \
         CREATE OR REPLACE FUNCTION _ledger_check_ttl(p_ttl_ms bigint) RETURNS void \
         LANGUAGE plpgsql IMMUTABLE AS $$ BEGIN END $$;",
    )
    .execute(&db.admin)
    .await
    .unwrap();
    Ledger::migrate(&db.url).await.expect("migrate");
    let digest: String = db.query_scalar("SELECT digest FROM ledger_functions").await;
    assert_eq!(digest, leasegate::ledger::functions_digest());
    let error = sqlx::query("SELECT _ledger_check_ttl(0)")
        .execute(&db.admin)
        .await
        .expect_err("the current body refuses a zero ttl");
    assert_eq!(
        error.as_database_error().and_then(|e| e.code()).as_deref(),
        Some("22023")
    );
}

/// Least privilege for tokens: the proxy's role can check a presented token
/// but cannot read the hashes, mint or revoke; the operator role can.
#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn only_the_operator_role_mints_and_revokes_tokens(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let mint = "SELECT access_token_create('00112233445566aa', sha256('s'), 'tenant-a', 'admin', NULL, 'x', NULL)";
    for statement in [
        "SELECT * FROM access_tokens",
        mint,
        "SELECT access_token_revoke('00112233445566aa', 'x')",
        "INSERT INTO access_tokens (token_id, secret_hash, tenant_id, scope, created_by) VALUES ('00112233445566aa', sha256('s'), 't', 'admin', 'x')",
    ] {
        let error = as_app_role(&db, statement).await.expect_err(statement);
        assert!(error.starts_with("42501"), "{statement}: {error}");
    }
    assert_eq!(
        as_app_role(
            &db,
            "SELECT access_token_verify('00112233445566aa', sha256('s'))"
        )
        .await,
        Ok(1)
    );
    let mut tx = db.admin.begin().await.unwrap();
    sqlx::query("SET LOCAL ROLE leasegate_operator")
        .execute(&mut *tx)
        .await
        .unwrap();
    let (outcome,): (String,) = sqlx::query_as(
        "SELECT outcome FROM access_token_create('00112233445566aa', sha256('s'), 'tenant-a', \
         'admin', NULL, 'x', NULL)",
    )
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    assert_eq!(outcome, "created");
    let error = sqlx::query("UPDATE access_tokens SET scope = 'agent'")
        .execute(&mut *tx)
        .await
        .expect_err("the operator role changes tokens only through the functions");
    assert_eq!(
        error.as_database_error().and_then(|e| e.code()).as_deref(),
        Some("42501")
    );
    tx.rollback().await.unwrap();
}

/// The SQLSTATE of a ledger error (`42501`: permission denied).
fn sqlstate(error: &leasegate::ledger::LedgerError) -> String {
    use std::error::Error;
    error
        .source()
        .and_then(|e| e.downcast_ref::<sqlx::Error>())
        .and_then(|e| e.as_database_error())
        .and_then(|e| e.code().map(|c| c.into_owned()))
        .unwrap_or_else(|| format!("not a database error: {error}"))
}

/// Least privilege for operator acts (migrations/0007):
/// a compromised proxy — a session as leasegate_app — cannot resolve an
/// operation, start its retry budget over, cancel a run or resolve a lossy
/// failover: each is permission denied and nothing changes (rows, events).
/// The same calls as leasegate_operator are applied, with the caller's
/// actor in the history.
#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn only_the_operator_role_resolves_retries_cancels_and_resolves_failovers(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    // An unknown operation (a timed-out charge) on a running run, and an
    // unresolved lossy failover.
    let (lease, _) = db.running_run("agent", 60_000).await;
    let intent = intents::unplanned(lease.run_id, "payments__charge", &json!({"amount": 3}));
    let claim = db.claim(&lease, &intent, "proxy-1", 30_000).await;
    db.holder_marks_unknown(&claim, UnknownCause::TimedOut, &json!({}))
        .await;
    let (failover_id,): (i64,) = db
        .query_row(
            "INSERT INTO ledger_failovers (detected_by, system_identifier, old_timeline, \
         new_timeline, acknowledged_lsn, lossy) VALUES ('proxy-1', '42', 1, 2, '0/10', true) \
         RETURNING failover_id",
        )
        .await;
    let id = intent.operation_id.clone();
    let snapshot = || async {
        sqlx::query_as::<_, (String, i64, String, i64, bool, i64)>(
            "SELECT (SELECT status FROM tool_operations WHERE operation_id = $1), \
                    (SELECT revision FROM tool_operations WHERE operation_id = $1), \
                    (SELECT status FROM agent_runs WHERE run_id = $2), \
                    (SELECT count(*) FROM ledger_events), \
                    (SELECT resolved_at IS NULL FROM ledger_failovers WHERE failover_id = $3), \
                    (SELECT count(*) FROM operation_evidence)",
        )
        .bind(id.as_str())
        .bind(lease.run_id.as_uuid())
        .bind(failover_id)
        .fetch_one(&db.admin)
        .await
        .unwrap()
    };
    let before = snapshot().await;
    assert_eq!(
        (before.0.as_str(), before.2.as_str(), before.4),
        ("unknown", "running", true)
    );
    let resolve = |ledger: Ledger, revision: i64| {
        let id = id.clone();
        async move {
            ledger
                .operation_converge(alice_resolves(
                    &id,
                    revision,
                    Settlement::Succeeded,
                    Some("ch_1"),
                    Some("the bank shows the charge"),
                ))
                .await
        }
    };

    // As the proxy's role: every operator act is permission denied.
    let app = &db.ledger;
    let refused = [
        (
            "operation_resolve",
            resolve(app.clone(), before.1).await.map(|_| ()),
        ),
        (
            "operation_reconcile_reset",
            app.operation_reconcile_reset(&id, "alice", "upstream back")
                .await
                .map(|_| ()),
        ),
        (
            "run_cancel",
            app.run_cancel(lease.run_id, "alice", Some("stop"))
                .await
                .map(|_| ()),
        ),
        (
            "failover_resolve",
            app.failover_resolve(failover_id, "alice", "compared by hand")
                .await
                .map(|_| ()),
        ),
    ];
    for (call, outcome) in refused {
        let error = outcome.expect_err(call);
        assert_eq!(sqlstate(&error), "42501", "{call}: {error}");
    }
    // Nor can the app role reach a resolution through the reconciler's
    // function by naming the operator's kind, or call the SQL directly.
    let sneaky = as_app_role(
        &db,
        "SELECT * FROM operation_converge((SELECT operation_id FROM tool_operations), \
         (SELECT revision FROM tool_operations), 'succeeded', NULL, NULL, 'operator', 'mallory', \
         'trust me', '{}')",
    )
    .await
    .expect_err("operator kind through operation_converge");
    assert!(sneaky.starts_with("42501"), "{sneaky}");
    // The app role forges evidence without holding the reconcile claim:
    // refused, nothing settles.
    let forged = app
        .operation_converge(leasegate::ledger::Converge {
            operation_id: &id,
            expected_revision: before.1,
            settlement: Settlement::Succeeded,
            remote_id: Some("forged-remote"),
            result: Some(&json!({"forged": true})),
            kind: leasegate::ledger::ConvergeEvidence::QueryResult,
            actor: "mallory",
            note: None,
            evidence: &json!({"forged": true}),
        })
        .await
        .unwrap();
    assert!(
        matches!(forged, ConvergeOutcome::NotClaimed(_)),
        "{forged:?}"
    );
    // Nor can it read the lease token hashes the fenced functions compare.
    let hashes = as_app_role(&db, "SELECT token_sha256 FROM worker_leases")
        .await
        .expect_err("lease token hashes are not the app role's to read");
    assert!(hashes.starts_with("42501"), "{hashes}");
    assert_eq!(
        as_app_role(&db, "SELECT owner, epoch, expires_at FROM worker_leases").await,
        Ok(1)
    );
    // Nor take a live lease from its holder.
    let takeover = app
        .lease_takeover(lease.run_id, "mallory", 60_000)
        .await
        .expect_err("a takeover is an operator's act");
    assert_eq!(sqlstate(&takeover), "42501", "{takeover}");
    assert_eq!(snapshot().await, before, "nothing written by the app role");

    // As the operator role: each is applied, with the caller as the actor.
    let operator = &db.operator;
    match operator
        .operation_reconcile_reset(&id, "alice", "upstream back")
        .await
        .unwrap()
    {
        RetryResetOutcome::Reset(_) => {}
        other => panic!("expected a reset, got {other:?}"),
    }
    let revision: i64 = db
        .scalar(
            "SELECT revision FROM tool_operations WHERE operation_id = $1",
            id.as_str(),
        )
        .await;
    match resolve(operator.clone(), revision).await.unwrap() {
        ConvergeOutcome::Converged { operation, .. } => {
            assert_eq!(operation.status.as_str(), "succeeded")
        }
        other => panic!("expected a resolution, got {other:?}"),
    }
    assert!(matches!(
        operator
            .failover_resolve(failover_id, "alice", "compared by hand")
            .await
            .unwrap(),
        leasegate::ledger::FailoverResolveOutcome::Resolved
    ));
    assert!(matches!(
        operator
            .run_cancel(lease.run_id, "alice", Some("stop"))
            .await
            .unwrap(),
        Fenced::Applied(_)
    ));
    let after = snapshot().await;
    assert_eq!(
        (after.0.as_str(), after.2.as_str(), after.4),
        ("succeeded", "cancelled", false)
    );
    let actors: Vec<(String, String)> = db
        .query_rows(
            "SELECT actor_kind, actor FROM ledger_events WHERE event_id > (SELECT max(event_id) - 3 \
         FROM ledger_events) ORDER BY event_id",
        )
        .await;
    assert_eq!(
        actors,
        vec![("operator".to_owned(), "alice".to_owned()); 3],
        "reset, resolution and cancel recorded as the operator who asked"
    );
    let (by,): (String,) = db
        .row(
            "SELECT resolved_by FROM ledger_failovers WHERE failover_id = $1",
            failover_id,
        )
        .await;
    assert_eq!(by, "alice");
}

/// The proxy still retires a run it holds the lease of (lease mode `key`
/// past retention): `run_retire` is fenced by the lease token, so the app
/// role needs no operator right for it, and a stale holder cannot.
#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn the_lease_holder_retires_its_run_and_a_stale_holder_cannot(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let (lease, _) = db.running_run("worker", 60_000).await;
    let mut forged = lease.clone();
    forged.epoch += 1;
    // The stale holder first (refused, the run stays), then the holder.
    for (holder, applies, status) in [(&forged, false, "running"), (&lease, true, "cancelled")] {
        let retired = db
            .ledger
            .run_retire(holder, "retention passed")
            .await
            .unwrap();
        assert_eq!(
            matches!(retired, Fenced::Applied(_)),
            applies,
            "epoch {}: {retired:?}",
            holder.epoch
        );
        assert_eq!(db.run_row(lease.run_id).await.0, status);
    }
    let (kind, actor): (String, String) = db
        .row(
            "SELECT actor_kind, actor FROM ledger_events WHERE run_id = $1 AND to_status = 'cancelled'",
            lease.run_id.as_uuid(),
        )
        .await;
    assert_eq!((kind.as_str(), actor.as_str()), ("worker", "worker"));
}

/// How a forged call's answer is read: the statement's one text column, or
/// the `verdicts` of the settle batch procedure (each item's outcome).
enum Answer {
    Text,
    Verdicts,
}

/// One forged call of a function the application role may execute, and
/// what the ledger must answer: `Ok` the rendered answer, `Err` the
/// SQLSTATE of the refusal.
struct Forged {
    function: &'static str,
    sql: String,
    answer: Answer,
    expect: Result<&'static str, &'static str>,
}

fn forged(
    function: &'static str,
    sql: String,
    expect: Result<&'static str, &'static str>,
) -> Forged {
    Forged {
        function,
        sql,
        answer: Answer::Text,
        expect,
    }
}

/// A byte string as a SQL literal.
fn bytea(bytes: &[u8]) -> String {
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("'\\x{hex}'::bytea")
}

/// An intent as the `operation_intent` row the register functions take.
fn intent_row(intent: &leasegate::intent::Intent) -> String {
    format!(
        "ROW('{}', '{}', {}, '{}', '{}', '{{}}'::jsonb, NULL, NULL)::operation_intent",
        intent.operation_id.as_str(),
        intent.step_id,
        intent.effect_version,
        intent.tool_name,
        intent.request_digest.as_str()
    )
}

/// The ledger as a compromised proxy sees it: a session as `leasegate_app`
/// calls every function that role may execute (enumerated from the
/// catalog, so a function added later fails this test until the sweep
/// covers it) with forged inputs — another holder's lease without its
/// token (a forged, an all-zero, another lease's or no hash), a wrong
/// epoch or owner,
/// another tenant's run, a dispatch or reconcile claim it does not hold,
/// random operation ids — and each call is refused. Read afterwards as the
/// superuser, no row of any ledger table moved: nothing settled, no
/// checkpoint, lease, run, operation, evidence or event written.
#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn forged_inputs_as_the_app_role_move_nothing(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    use leasegate::ledger::{TaskKind, TaskRef};
    let db = TestDb::new(pool, connect).await;
    // tenant-a: a running run with a dispatching, an unknown and a prepared
    // operation, and a shared lease (lease mode session); tenant-b: a
    // running run of its own; one access token.
    let (a, revision) = db.running_run("worker", 60_000).await;
    let charge = intents::unplanned_charge(a.run_id, 5, "eur");
    let dispatching = db.claim(&a, &charge, "proxy-1", 60_000).await;
    let refund = intents::unplanned(a.run_id, "payments__refund", &json!({"charge": "ch_1"}));
    let unknown = db.claim(&a, &refund, "proxy-1", 60_000).await;
    db.holder_marks_unknown(&unknown, UnknownCause::TimedOut, &json!({}))
        .await;
    let unknown_revision = unknown.revision + 1;
    let planned = intents::planned(a.run_id, "mail", "mailer__send", &json!({"to": "x"}));
    assert!(matches!(
        db.ledger
            .operation_register(&a, std::slice::from_ref(&planned), None)
            .await
            .unwrap(),
        Fenced::Applied(_)
    ));
    let shared = db
        .ledger
        .lease_member_join(
            &TaskRef {
                tenant: "tenant-a",
                kind: TaskKind::Session,
                principal: "alice",
                task: "chat-1",
            },
            "proc-1",
            60_000,
            None,
        )
        .await
        .unwrap();
    let b = db.pending_run_in("tenant-b").await;
    let grant_b = db.acquire(b, "worker-b", 60_000).await;
    assert!(matches!(
        db.ledger
            .run_start(&grant_b.claim, grant_b.revision)
            .await
            .unwrap(),
        Fenced::Applied(_)
    ));
    sqlx::query(
        "SELECT access_token_create('00112233445566aa', sha256('s'), 'tenant-a', 'agent', NULL, \
         'x', NULL)",
    )
    .execute(&db.admin)
    .await
    .unwrap();

    let real = bytea(&a.token.as_ref().unwrap().sha256());
    // A stored hash, of another lease's token.
    let stored = bytea(&grant_b.claim.token.as_ref().unwrap().sha256());
    let forged_hash = "sha256('forged')";
    let zeros = "decode(repeat('00', 32), 'hex')";
    let (a_run, b_run, epoch) = (a.run_id, b, a.epoch);
    let (d, d_rev, d_dig) = (
        dispatching.operation_id.as_str(),
        dispatching.revision,
        dispatching.request_digest.as_str(),
    );
    let u = unknown.operation_id.as_str();
    let u_rev = unknown_revision;
    let u_dig = unknown.request_digest.as_str();
    let nobody = "op_0000000000000000000000000000000000000000000000000000000000000000";
    let (s_run, s_epoch) = (shared.claim.run_id, shared.claim.epoch);
    let fresh = intent_row(&intents::planned(
        a_run,
        "forged-step",
        "payments__charge",
        &json!({"amount": 9}),
    ));
    let superseding = intent_row(&intents::planned_version(
        a_run,
        "mail",
        2,
        "mailer__send",
        &json!({"to": "y"}),
    ));
    let planned_id = planned.operation_id.as_str();
    let settle_args = |id: &str, owner: &str, rev: i64, digest: &str| {
        format!(
            "'{id}', '{owner}', {rev}, '{digest}', 'succeeded', 'forged', '{{\"forged\": true}}'"
        )
    };
    let batch_args = format!(
        "ARRAY['{d}', '{u}'], ARRAY['mallory', 'mallory'], ARRAY[{d_rev}, {u_rev}]::bigint[], \
         ARRAY['{d_dig}', '{u_dig}'], ARRAY['succeeded', 'succeeded'], ARRAY['f', 'f'], \
         ARRAY['{{}}', '{{}}']::jsonb[]"
    );
    let fenced = |function: &'static str, tail: &str| -> Vec<Forged> {
        [
            (forged_hash, epoch, "worker", Ok("lease_token_invalid")),
            (zeros, epoch, "worker", Ok("lease_token_invalid")),
            (stored.as_str(), epoch, "worker", Ok("lease_token_invalid")),
            ("NULL", epoch, "worker", Ok("lease_token_invalid")),
            (real.as_str(), epoch + 1, "worker", Ok("lease_lost")),
            (real.as_str(), epoch, "mallory", Ok("lease_lost")),
        ]
        .into_iter()
        .map(|(hash, epoch, owner, expect)| {
            forged(
                function,
                format!(
                    "SELECT outcome FROM {function}('{a_run}', '{owner}', {epoch}, {hash}{tail})"
                ),
                expect,
            )
        })
        .collect()
    };

    let mut sweep: Vec<Forged> = vec![
        forged(
            "access_token_verify",
            "SELECT outcome FROM access_token_verify('00112233445566aa', sha256('forged'))".into(),
            Ok("unknown"),
        ),
        forged(
            "access_token_verify",
            "SELECT outcome FROM access_token_verify('ffffffffffffffff', sha256('s'))".into(),
            Ok("unknown"),
        ),
        forged(
            "failover_record",
            "SELECT failover_id::text FROM failover_record('', '1', NULL, 1, 2, NULL, '0/10')".into(),
            Err("22023"),
        ),
        forged(
            "lease_acquire",
            format!("SELECT outcome FROM lease_acquire('{a_run}', 'mallory', 60000, {forged_hash})"),
            Ok("busy"),
        ),
        forged(
            "lease_acquire",
            format!("SELECT outcome FROM lease_acquire('{b_run}', 'mallory', 60000, {forged_hash})"),
            Ok("busy"),
        ),
        forged(
            "lease_acquire",
            format!(
                "SELECT outcome FROM lease_acquire(gen_random_uuid(), 'mallory', 60000, {forged_hash})"
            ),
            Ok("not_found"),
        ),
        forged(
            "lease_member_join",
            format!(
                "SELECT outcome FROM lease_member_join('tenant-a', 'worker', 'alice', 'chat-1', \
                 gen_random_uuid(), 'mallory', 60000, {forged_hash}, NULL)"
            ),
            Err("22023"),
        ),
        forged(
            "lease_member_join",
            "SELECT outcome FROM lease_member_join('tenant-a', 'session', 'alice', 'chat-1', \
             gen_random_uuid(), 'mallory', 60000, sha256('forged')::bytea || '\\x00'::bytea, NULL)"
                .into(),
            Err("22023"),
        ),
        // A session-mode task has no retention: a join naming one cannot
        // cancel the principal's live run.
        forged(
            "lease_member_join",
            format!(
                "SELECT outcome FROM lease_member_join('tenant-a', 'session', 'alice', 'chat-1', \
                 gen_random_uuid(), 'mallory', 60000, {forged_hash}, 0)"
            ),
            Err("22023"),
        ),
        // A task without a live run gets a new one, but not under an id
        // another run (of another tenant) has.
        forged(
            "lease_member_join",
            format!(
                "SELECT outcome FROM lease_member_join('tenant-a', 'key', 'mallory', 'k-1', \
                 '{b_run}', 'mallory', 60000, {forged_hash}, NULL)"
            ),
            Err("23505"),
        ),
        forged(
            "ledger_durability",
            "SELECT in_recovery::text FROM ledger_durability()".into(),
            Ok("false"),
        ),
        forged(
            "ledger_timeline_switch",
            "SELECT coalesce(ledger_timeline_switch(1, 999)::text, 'none')".into(),
            Ok("none"),
        ),
        forged(
            "ledger_wal_position",
            "SELECT (wal_lsn > 0)::text FROM ledger_wal_position()".into(),
            Ok("true"),
        ),
        forged(
            "lease_renew",
            format!(
                "SELECT outcome FROM lease_renew('{a_run}', 'worker', {epoch}, {real}, 60000, 'tenant-b')"
            ),
            Ok("not_found"),
        ),
        forged(
            "lease_renew_batch",
            format!(
                "SELECT string_agg(outcome, ',' ORDER BY outcome) FROM lease_renew_batch(\
                 ARRAY['{a_run}', '{b_run}']::uuid[], ARRAY['worker', 'worker-b'], ARRAY[{epoch}, 1]::bigint[], \
                 ARRAY[{forged_hash}, {zeros}], 60000, 'tenant-a')"
            ),
            Ok("lease_token_invalid,not_found"),
        ),
        forged(
            "operation_claim",
            "SELECT count(*)::text FROM operation_claim('mallory', 60000, 10, ARRAY['tenant-b'], NULL)"
                .into(),
            Ok("0"),
        ),
        forged(
            "operation_claim",
            "SELECT count(*)::text FROM operation_claim('mallory', 60000, 0, NULL, NULL)".into(),
            Err("22023"),
        ),
        forged(
            "operation_converge",
            format!(
                "SELECT outcome FROM operation_converge('{u}', {u_rev}, 'succeeded', 'forged', '{{}}', \
                 'query_result', 'mallory', NULL, '{{}}')"
            ),
            Ok("stale_claim"),
        ),
        forged(
            "operation_converge",
            format!(
                "SELECT outcome FROM operation_converge('{u}', {u_rev}, 'succeeded', 'forged', '{{}}', \
                 'operator', 'mallory', 'trust me', '{{}}')"
            ),
            Err("42501"),
        ),
        forged(
            "operation_converge",
            format!(
                "SELECT outcome FROM operation_converge('{nobody}', 1, 'succeeded', NULL, '{{}}', \
                 'late_response', 'mallory', NULL, '{{}}')"
            ),
            Ok("not_found"),
        ),
        forged(
            "operation_mark_unknown",
            format!(
                "SELECT outcome FROM operation_mark_unknown('{d}', 'mallory', {d_rev}, true, 'mallory', \
                 'timeout', '{{}}')"
            ),
            Ok("stale_claim"),
        ),
        forged(
            "operation_mark_unknown",
            format!(
                "SELECT outcome FROM operation_mark_unknown('{d}', 'proxy-1', {}, true, 'mallory', \
                 'timeout', '{{}}')",
                d_rev + 1
            ),
            Ok("stale_claim"),
        ),
        // As the reconciler: the claim is live and its holder alive.
        forged(
            "operation_mark_unknown",
            format!(
                "SELECT outcome FROM operation_mark_unknown('{d}', 'proxy-1', {d_rev}, false, 'mallory', \
                 'timeout', '{{}}')"
            ),
            Ok("claim_live"),
        ),
        forged(
            "operation_note_round",
            format!("SELECT operation_note_round('{d}', 'mallory', {d_rev}, '{{}}')::text"),
            Ok("false"),
        ),
        forged(
            "operation_follow_task",
            format!(
                "SELECT operation_follow_task('{d}', 'mallory', {d_rev}, '{{\"task_id\": \"t\"}}', 3600000)::text"
            ),
            Ok("false"),
        ),
        forged(
            "operation_reconcile_attempt",
            format!(
                "SELECT outcome FROM operation_reconcile_attempt('{u}', 'mallory', {u_rev}, 86400000, 3)"
            ),
            Ok("stale_claim"),
        ),
        forged(
            "operation_reconcile_claim",
            "SELECT count(*)::text FROM operation_reconcile_claim('mallory', 60000, 10, ARRAY['tenant-b'])"
                .into(),
            Ok("0"),
        ),
        forged(
            "operation_reconcile_claim",
            "SELECT count(*)::text FROM operation_reconcile_claim('mallory', 0, 10, NULL)".into(),
            Err("22023"),
        ),
        forged(
            "operation_reconcile_refund",
            format!("SELECT outcome FROM operation_reconcile_refund('{u}', 'mallory', {u_rev})"),
            Ok("stale_claim"),
        ),
        forged(
            "operation_reconcile_release",
            format!("SELECT outcome FROM operation_reconcile_release('{u}', 'mallory', 0)"),
            Ok("stale_claim"),
        ),
        forged(
            "operation_reconcile_resend",
            format!(
                "SELECT outcome FROM operation_reconcile_resend('{u}', 'mallory', {u_rev}, 0, 3, '{{}}')"
            ),
            Ok("stale_claim"),
        ),
        forged(
            "operation_register_claim",
            format!(
                "SELECT outcome FROM operation_register_claim('{a_run}', 'worker', {epoch}, {real}, \
                 {fresh}, 'mallory', 60000, 'tenant-b')"
            ),
            Ok("not_found"),
        ),
        forged(
            "operation_register_claim_batch",
            format!(
                "SELECT string_agg(coalesce(outcome, error_sqlstate), ',' ORDER BY item) FROM \
                 operation_register_claim_batch(ARRAY['{a_run}', '{a_run}']::uuid[], ARRAY['worker', 'worker'], \
                 ARRAY[{epoch}, {}]::bigint[], ARRAY[{forged_hash}, {real}], ARRAY[{fresh}, {fresh}], \
                 ARRAY['mallory', 'mallory'], ARRAY[60000, 60000]::bigint[], ARRAY['tenant-a', 'tenant-a'])",
                epoch + 1
            ),
            Ok("lease_token_invalid,lease_lost"),
        ),
        forged(
            "operation_release_unsent",
            format!("SELECT outcome FROM operation_release_unsent('{d}', 'mallory', {d_rev}, '{{}}')"),
            Ok("stale_claim"),
        ),
        // A settle by a claim the operation never had: no late_response
        // evidence either, which the reconciler would converge from.
        forged(
            "operation_settle",
            format!("SELECT outcome FROM operation_settle({})", settle_args(d, "mallory", d_rev, d_dig)),
            Ok("not_claimed"),
        ),
        forged(
            "operation_settle",
            format!("SELECT outcome FROM operation_settle({})", settle_args(u, "mallory", u_rev, u_dig)),
            Ok("not_claimed"),
        ),
        forged(
            "operation_settle",
            format!(
                "SELECT outcome FROM operation_settle({})",
                settle_args(u, "proxy-1", u_rev, u_dig)
            ),
            Ok("not_claimed"),
        ),
        forged(
            "operation_settle",
            format!(
                "SELECT outcome FROM operation_settle({})",
                settle_args(nobody, "proxy-1", 1, u_dig)
            ),
            Ok("not_found"),
        ),
        forged(
            "operation_settle_acknowledged",
            format!(
                "CALL operation_settle_acknowledged({}, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, \
                 NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)",
                settle_args(u, "mallory", u_rev, u_dig)
            ),
            Ok("not_claimed"),
        ),
        forged(
            "operation_settle_batch",
            format!(
                "SELECT string_agg(e->>'outcome', ',') FROM \
                 jsonb_array_elements(operation_settle_batch({batch_args})) e"
            ),
            Ok("not_claimed,not_claimed"),
        ),
        Forged {
            function: "operation_settle_acknowledged_batch",
            sql: format!("CALL operation_settle_acknowledged_batch({batch_args}, NULL, NULL, NULL, NULL)"),
            answer: Answer::Verdicts,
            expect: Ok("not_claimed,not_claimed"),
        },
        forged(
            "operation_wake_prepared",
            "SELECT operation_wake_prepared('payments', ARRAY['tenant-b'])::text".into(),
            Ok("0"),
        ),
        forged(
            "process_heartbeat",
            "SELECT process_heartbeat('', 60000)::text".into(),
            Err("22023"),
        ),
        forged(
            "process_heartbeat",
            "SELECT process_heartbeat('proxy-1', 0)::text".into(),
            Err("22023"),
        ),
        forged(
            "process_retire",
            "SELECT process_retire('no-such-process')::text".into(),
            Ok(""),
        ),
        forged(
            "run_create",
            format!(
                "SELECT outcome FROM run_create('tenant-a', 'task-{a_run}', gen_random_uuid(), 'mallory', \
                 60000, {forged_hash})"
            ),
            Ok("active_run_live"),
        ),
        forged(
            "run_create",
            format!(
                "SELECT outcome FROM run_create('tenant-a', 'mallory-task', '{b_run}', 'mallory', 60000, \
                 {forged_hash})"
            ),
            Ok("run_id_taken"),
        ),
    ];
    for (function, tail) in [
        (
            "checkpoint_save",
            format!(", {revision}, '{{\"forged\": true}}'"),
        ),
        ("lease_release", String::new()),
        ("lease_renew", ", 60000, 'tenant-a'".to_owned()),
        (
            "operation_register",
            format!(", ARRAY[{fresh}], {revision}, '{{\"forged\": true}}'"),
        ),
        (
            "operation_supersede",
            format!(", '{planned_id}', {superseding}"),
        ),
        (
            "run_complete",
            format!(", {revision}, '{{\"forged\": true}}'"),
        ),
        ("run_fail", format!(", {revision}, '{{\"forged\": true}}'")),
        ("run_retire", ", 'forged'".to_owned()),
        ("run_start", format!(", {revision}")),
    ] {
        sweep.extend(fenced(function, &tail));
    }
    for function in [
        "lease_member_leave",
        "lease_member_ready",
        "lease_member_renew",
    ] {
        let tail = if function == "lease_member_renew" {
            ", 60000"
        } else {
            ""
        };
        for (run, member, epoch, hash, expect) in [
            (s_run, "proc-1", s_epoch, forged_hash, "lease_token_invalid"),
            (s_run, "proc-1", s_epoch, zeros, "lease_token_invalid"),
            (s_run, "proc-1", s_epoch, "NULL", "lease_token_invalid"),
            (s_run, "proc-1", s_epoch + 1, forged_hash, "lease_lost"),
            (s_run, "mallory", s_epoch, forged_hash, "lease_lost"),
            (a_run, "worker", epoch, real.as_str(), "not_found"),
        ] {
            sweep.push(forged(
                function,
                format!(
                    "SELECT outcome FROM {function}('{run}', '{member}', {epoch}, {hash}{tail})"
                ),
                Ok(expect),
            ));
        }
    }

    // Every function the role may execute has forged calls, and every
    // function swept is one it may execute.
    let executable: std::collections::BTreeSet<String> = db
        .query_scalars::<String>(
            "SELECT p.proname::text FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace \
              WHERE n.nspname = 'public' AND has_function_privilege('leasegate_app', p.oid, 'EXECUTE')",
        )
        .await
        .into_iter()
        .collect();
    let swept: std::collections::BTreeSet<String> =
        sweep.iter().map(|call| call.function.to_owned()).collect();
    let missing: Vec<_> = executable.difference(&swept).collect();
    assert!(
        missing.is_empty(),
        "functions leasegate_app may execute without forged calls in this sweep: {missing:?}"
    );
    let stale: Vec<_> = swept.difference(&executable).collect();
    assert!(
        stale.is_empty(),
        "swept but not executable by leasegate_app: {stale:?}"
    );

    let tables: Vec<String> = db
        .query_scalars::<String>(
            "SELECT tablename::text FROM pg_tables WHERE schemaname = 'public' \
                AND tablename NOT IN ('_sqlx_migrations', 'ledger_functions') ORDER BY 1",
        )
        .await;
    let tables: Vec<&str> = tables.iter().map(String::as_str).collect();
    let before = db.tables_digest(&tables).await;

    let mut app = db.admin.acquire().await.unwrap();
    sqlx::query("SET ROLE leasegate_app")
        .execute(&mut *app)
        .await
        .unwrap();
    let mut wrong = Vec::new();
    for call in &sweep {
        let found = match sqlx::query(sqlx::AssertSqlSafe(call.sql.clone()))
            .fetch_one(&mut *app)
            .await
        {
            Ok(row) => Ok(match call.answer {
                Answer::Text => sqlx::Row::get::<Option<String>, _>(&row, 0).unwrap_or_default(),
                Answer::Verdicts => sqlx::Row::get::<serde_json::Value, _>(&row, "verdicts")
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|item| item["outcome"].as_str().unwrap_or("?").to_owned())
                    .collect::<Vec<_>>()
                    .join(","),
            }),
            Err(error) => Err(error
                .as_database_error()
                .and_then(|e| e.code().map(|c| c.into_owned()))
                .unwrap_or_else(|| error.to_string())),
        };
        let expected = call.expect.map(str::to_owned).map_err(str::to_owned);
        if found != expected {
            wrong.push(format!(
                "{}: expected {expected:?}, found {found:?}",
                call.sql
            ));
        }
    }
    sqlx::query("RESET ROLE").execute(&mut *app).await.unwrap();
    drop(app);
    assert!(
        wrong.is_empty(),
        "forged calls answered otherwise:\n{}",
        wrong.join("\n")
    );
    assert_eq!(
        db.tables_digest(&tables).await,
        before,
        "a forged call as leasegate_app wrote to the ledger"
    );
}
