//! The database is the safety boundary (seed section 12): the application
//! role can only run the protected functions and read; the event history is
//! append-only; migrations are repeatable and tolerate the shared role.

mod common;

use common::TestDb;
use leasegate::ledger::Ledger;
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

/// The names a file defines with `CREATE [OR REPLACE] FUNCTION name(`.
fn defined_functions(text: &str) -> Vec<String> {
    text.match_indices("FUNCTION ")
        .filter(|(at, _)| {
            let before = &text[..*at];
            before.ends_with("CREATE ") || before.ends_with("CREATE OR REPLACE ")
        })
        .map(|(at, _)| {
            let rest = &text[at + "FUNCTION ".len()..];
            rest[..rest.find('(').expect("a parameter list")].to_owned()
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
    // (0001 defines it, 0009 lets operations_archive delete through it.)
    in_migrations.sort();
    in_migrations.dedup();
    assert_eq!(in_migrations, ["ledger_events_refuse_change"]);

    // The database runs exactly those, and the application role may execute
    // the public ones (no leading underscore) but token management, and none
    // of the helpers; the operator role exactly token management,
    // re-sealing stored bodies (`secrets rotate`) and retention (`ops
    // archive`).
    let installed: Vec<(String, bool, bool)> = sqlx::query_as(
        "SELECT p.proname::text, has_function_privilege('leasegate_app', p.oid, 'EXECUTE'), \
                has_function_privilege('leasegate_operator', p.oid, 'EXECUTE') \
           FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace \
          WHERE n.nspname = 'public' AND p.prorettype <> 'trigger'::regtype ORDER BY 1",
    )
    .fetch_all(&db.admin)
    .await
    .unwrap();
    let names: Vec<&str> = installed.iter().map(|(name, _, _)| name.as_str()).collect();
    let expected: Vec<&str> = homes.keys().map(String::as_str).collect();
    assert_eq!(names, expected, "installed functions differ from sql/");
    let operators = [
        "access_token_create",
        "access_token_revoke",
        "operation_reseal",
        "operations_archive",
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
    let digest: String = sqlx::query_scalar("SELECT digest FROM ledger_functions")
        .fetch_one(&db.admin)
        .await
        .unwrap();
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
    let digest: String = sqlx::query_scalar("SELECT digest FROM ledger_functions")
        .fetch_one(&db.admin)
        .await
        .unwrap();
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
