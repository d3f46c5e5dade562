//! Schema and functions: tables in versioned migrations, every SQL function
//! in one current home.
//!
//! `migrations/` holds tables, types, indexes and grants on tables; a
//! migration never changes once released (sqlx checks each applied file's
//! checksum). The functions live in `sql/<entity>.sql` (`common`, `process`,
//! `lease`, `run`, `operation`, `durability`, `secrets`, `token`,
//! `retention`), written as `CREATE OR REPLACE` plus their grants, so
//! a function changes by editing its one definition. [`apply`] runs them
//! after the migrations, in one transaction under an advisory lock, and
//! records their SHA-256 in `ledger_functions`: a process whose files match
//! the recorded digest changes nothing, so starting many processes at once
//! does not rewrite functions under each other's feet.
//!
//! Changing a function's parameter list or result type needs a
//! `DROP FUNCTION IF EXISTS old_signature;` in its file (PostgreSQL cannot
//! `CREATE OR REPLACE` across signatures); keep such drops until the old
//! signature cannot exist in any database.
//!
//! [`MIGRATOR`] is the tables' migrations plus one last entry that installs
//! the functions and records their digest: a fresh database (the tests'
//! `#[sqlx::test(migrator = ...)]`) gets everything from the migrator alone.
//! That entry's checksum is constant, so it runs once per database and never
//! fails a checksum check when the functions change; [`apply`] keeps them
//! current afterwards.
//!
//! Crash: the transaction commits the functions and the digest together; a
//! process that dies midway leaves the previous set in place.

use std::borrow::Cow;
use std::sync::LazyLock;

use sha2::{Digest, Sha256};
use sqlx::migrate::{Migration, MigrationType, Migrator};
use sqlx::{Connection, PgConnection, SqlStr};

/// The tables' migrations (`migrations/`), embedded at build time.
static TABLES: Migrator = sqlx::migrate!("./migrations");

/// The version of the migrator's function-installing entry: after every
/// table migration this project will ever number.
const FUNCTIONS_VERSION: i64 = 1_000_000;

/// The tables' migrations, then the functions (see the module docs).
pub static MIGRATOR: LazyLock<Migrator> = LazyLock::new(|| {
    let mut migrations = TABLES.iter().cloned().collect::<Vec<_>>();
    assert!(
        migrations.iter().all(|m| m.version < FUNCTIONS_VERSION),
        "table migrations are numbered below {FUNCTIONS_VERSION}"
    );
    let install: &'static str = Box::leak(install_sql().into_boxed_str());
    let mut functions = Migration::new(
        FUNCTIONS_VERSION,
        Cow::Borrowed("functions from sql/ (kept current by ledger::schema::apply)"),
        MigrationType::Simple,
        SqlStr::from_static(install),
        false,
    );
    functions.checksum = Cow::Borrowed(b"leasegate sql/ functions");
    migrations.push(functions);
    Migrator::with_migrations(migrations)
});

/// Every function file, then the digest record.
fn install_sql() -> String {
    // As in `apply`: no "does not exist, skipping" notices in the log.
    let mut sql = String::from("SET LOCAL client_min_messages = warning;\n");
    for (_, text) in FUNCTION_FILES {
        sql.push_str(text);
        sql.push('\n');
    }
    sql.push_str(&format!(
        "INSERT INTO ledger_functions (singleton, digest) VALUES (true, '{}') \
         ON CONFLICT (singleton) DO UPDATE SET digest = EXCLUDED.digest, applied_at = clock_timestamp();\n",
        functions_digest()
    ));
    sql
}

/// The function files, in the order they are applied (helpers first).
pub const FUNCTION_FILES: [(&str, &str); 10] = [
    ("sql/common.sql", include_str!("../../sql/common.sql")),
    ("sql/process.sql", include_str!("../../sql/process.sql")),
    ("sql/lease.sql", include_str!("../../sql/lease.sql")),
    ("sql/run.sql", include_str!("../../sql/run.sql")),
    ("sql/members.sql", include_str!("../../sql/members.sql")),
    ("sql/operation.sql", include_str!("../../sql/operation.sql")),
    (
        "sql/durability.sql",
        include_str!("../../sql/durability.sql"),
    ),
    ("sql/secrets.sql", include_str!("../../sql/secrets.sql")),
    (
        "sql/access_token.sql",
        include_str!("../../sql/access_token.sql"),
    ),
    ("sql/retention.sql", include_str!("../../sql/retention.sql")),
];

/// Serializes function installs across processes (any constant; "lgfn").
const FUNCTIONS_LOCK: i64 = 0x6c67_666e;

/// Hex SHA-256 over the function files' names and contents.
pub fn functions_digest() -> String {
    let mut hasher = Sha256::new();
    for (name, text) in FUNCTION_FILES {
        hasher.update(name.as_bytes());
        hasher.update([0]);
        hasher.update(text.as_bytes());
        hasher.update([0]);
    }
    hex::encode(hasher.finalize())
}

/// Installs the function files unless the database already runs exactly
/// these. Returns whether it installed them.
pub(crate) async fn apply(conn: &mut PgConnection) -> Result<bool, sqlx::Error> {
    let digest = functions_digest();
    let mut tx = conn.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(FUNCTIONS_LOCK)
        .execute(&mut *tx)
        .await?;
    let current: Option<String> = sqlx::query_scalar("SELECT digest FROM ledger_functions")
        .fetch_optional(&mut *tx)
        .await?;
    if current.as_deref() == Some(digest.as_str()) {
        tx.commit().await?;
        return Ok(false);
    }
    // The files drop superseded signatures with `DROP … IF EXISTS`, whose
    // "does not exist, skipping" notices are noise in a first run's log.
    sqlx::query("SET LOCAL client_min_messages = warning")
        .execute(&mut *tx)
        .await?;
    for (_, text) in FUNCTION_FILES {
        sqlx::raw_sql(text).execute(&mut *tx).await?;
    }
    sqlx::query(
        "INSERT INTO ledger_functions (singleton, digest) VALUES (true, $1) \
         ON CONFLICT (singleton) DO UPDATE SET digest = EXCLUDED.digest, applied_at = clock_timestamp()",
    )
    .bind(&digest)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(true)
}
