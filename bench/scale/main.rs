//! Flat cost at scale and batch renewal throughput.
//!
//! ```text
//! cargo run --release --example bench_scale -- scale [--rows 10000,10000000] [--clients 8] [--seconds 15] [--repeat 3] [--ids run|hashed] [--fillfactor N] [--url ADMIN_URL] [--db leasegate_scale]
//! cargo run --release --example bench_scale -- renew [--leases 10000] [--rounds 20] [--hosts 4] [--url ADMIN_URL] [--db leasegate_renew_bench]
//! ```
//!
//! `scale`: for each row count N it (re)creates the database
//! `leasegate_scale`, migrates it, fills `tool_operations` with N settled
//! operations (10 per succeeded run, ids shaped like real operation ids:
//! `--ids run`, the default, is today's shape, the run's 12-hex-digit
//! prefix then hash-spread digits; `--ids hashed` spreads the whole id like
//! ids before 2026-12-02, for comparison; `bench_op_id` below)
//! and `ledger_events` with one event per operation and one per run, in SQL
//! (`generate_series`, as the owner role, `synchronous_commit = off` for the
//! fill only; keys, indexes and foreign keys dropped for the fill and
//! rebuilt from the catalog's definitions after it, as a restore does),
//! vacuums and analyses (the fill packs `tool_operations`' pages, as
//! pages written before migration 0010 are and as settles leave them; the
//! cells write with the table's own fillfactor, or `--fillfactor`), then
//! runs pgbench with leasegate's own
//! hot-path SQL (`bench/scale/gated_call.sql`, beside this file:
//! register-claim + settle, the two statements of a gated call) and with
//! group commit's two batch statements (`gated_batch.sql`: 16 calls of 16
//! runs per transaction; when `--clients` × 16 ≤ 256 runs) `--repeat`
//! times each and reports the median rates, the server's I/O counters per
//! call, and how many of the cells' operations landed in the fill's pages,
//! and prints the plans (`EXPLAIN
//! ANALYZE, BUFFERS`) of the background scans and the fate query. Last, the
//! ratio of the first row count's rate to each other's. The scans' SQL is
//! copied from `sql/operation.sql`, `src/ledger/operation.rs` and
//! `src/ledger/read.rs` (keep it in step).
//!
//! `renew`: creates `--leases` leased runs and renews them all `--rounds`
//! times three ways: the SQL function `lease_renew_batch` alone (one
//! statement with bound arrays, answers discarded), `Ledger::lease_renew_batch`
//! (decoded answers), and `POST /v1/leases/renew` through the control
//! router in-process (JSON in and out, no socket); then `--hosts` worker
//! hosts of `--leases` leases each post their batches at once (one
//! connection per host), the throughput of the endpoint when PostgreSQL's
//! work on one batch overlaps the JSON of another. Reports leases/s, median
//! of the rounds.
//!
//! Numbers are reported, never asserted.

#[path = "../common/mod.rs"]
mod common;

use std::path::Path;
use std::time::Instant;

use common::database::{recreate, with_database};
use common::pgbench::Pgbench;
use common::stats::upper_median;
use leasegate::control::router_for_tenant;
use leasegate::intent::IntegerPolicy;
use leasegate::ledger::{
    InitialLease, LeaseClaim, LeaseToken, Ledger, LedgerOptions, RunCreateOutcome, RunId,
};
use serde_json::json;
use sqlx::Executor;
use tower::ServiceExt;

const BENCH_RUNS: usize = 256;

/// Calls per transaction of `gated_batch.sql`.
const BATCH: usize = 16;

struct Args {
    mode: String,
    rows: Vec<i64>,
    clients: usize,
    seconds: u64,
    repeat: usize,
    leases: i64,
    rounds: usize,
    hosts: usize,
    url: String,
    /// The database (re)created on the admin URL's server.
    db: Option<String>,
    /// The operation ids' shape: `run` (prefixed by their run) or `hashed`.
    ids: String,
    /// `tool_operations`' fillfactor for the cells, when not the
    /// migrations' own (the fill always packs its pages).
    fillfactor: Option<u32>,
}

fn args() -> anyhow::Result<Args> {
    let mut it = std::env::args().skip(1);
    let mut a = Args {
        mode: it.next().unwrap_or_else(|| "scale".into()),
        rows: vec![10_000, 10_000_000],
        clients: 8,
        seconds: 15,
        repeat: 3,
        leases: 10_000,
        rounds: 20,
        hosts: 4,
        url: "postgres://postgres@127.0.0.1:5432/postgres".into(),
        db: None,
        ids: "run".into(),
        fillfactor: None,
    };
    while let Some(flag) = it.next() {
        let value = it
            .next()
            .ok_or_else(|| anyhow::anyhow!("{flag} needs a value"))?;
        match flag.as_str() {
            "--rows" => {
                a.rows = value
                    .split(',')
                    .map(|v| v.trim().replace('_', "").parse())
                    .collect::<Result<_, _>>()?
            }
            "--clients" => a.clients = value.parse()?,
            "--seconds" => a.seconds = value.parse()?,
            "--repeat" => a.repeat = value.parse()?,
            "--leases" => a.leases = value.parse()?,
            "--rounds" => a.rounds = value.parse()?,
            "--hosts" => a.hosts = value.parse::<usize>()?.max(1),
            "--url" => a.url = value,
            "--db" => a.db = Some(value),
            "--ids" if value == "run" || value == "hashed" => a.ids = value,
            "--ids" => anyhow::bail!("--ids is run or hashed, got {value}"),
            "--fillfactor" => match value.parse()? {
                f @ 10..=100 => a.fillfactor = Some(f),
                f => anyhow::bail!("--fillfactor is 10 to 100, got {f}"),
            },
            other => anyhow::bail!("unknown flag {other}"),
        }
    }
    Ok(a)
}

/// The database of `url` created afresh and migrated.
async fn fresh(url: &str) -> anyhow::Result<()> {
    recreate(url).await?;
    Ledger::migrate(url).await?;
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let a = args()?;
    match a.mode.as_str() {
        "scale" => scale(&a).await,
        "renew" => renew(&a).await,
        other => anyhow::bail!("unknown mode {other}: scale or renew"),
    }
}

// ---------------------------------------------------------------- scale

/// The scans whose plans are shown: (name, SQL). `$OP` is replaced by an
/// operation id that exists.
const SCANS: &[(&str, &str)] = &[
    (
        "outbox: operation_claim candidates",
        "SELECT o.operation_id FROM tool_operations o JOIN agent_runs r ON r.run_id = o.run_id
          WHERE o.status = 'prepared' AND r.status IN ('pending', 'running')
            AND (NULL::text[] IS NULL OR r.tenant_id = ANY (NULL::text[]))
            AND (o.not_before IS NULL OR o.not_before <= clock_timestamp())
          ORDER BY o.updated_at LIMIT 100 FOR UPDATE OF o SKIP LOCKED",
    ),
    (
        "reconciler: operation_reconcile_claim candidates",
        "SELECT o.operation_id FROM tool_operations o JOIN agent_runs r ON r.run_id = o.run_id
          WHERE o.status = 'unknown'
            AND (o.reconcile_until IS NULL OR o.reconcile_until <= clock_timestamp())
            AND (NULL::text[] IS NULL OR r.tenant_id = ANY (NULL::text[]))
          ORDER BY o.updated_at LIMIT 100 FOR UPDATE OF o SKIP LOCKED",
    ),
    (
        "claim expiry: operations_expired_claims",
        "SELECT o.* FROM tool_operations o JOIN agent_runs r ON r.run_id = o.run_id
          WHERE o.status = 'dispatching'
            AND (o.dispatch_until <= clock_timestamp()
                 OR EXISTS (SELECT 1 FROM leasegate_processes p
                             WHERE p.owner = o.dispatch_owner AND p.alive_until <= clock_timestamp()))
            AND (NULL::text[] IS NULL OR r.tenant_id = ANY (NULL::text[]))
          ORDER BY o.dispatch_until LIMIT 100",
    ),
    (
        "unknown listing: operations_unknown_summary",
        "WITH unknown AS (
           SELECT o.operation_id, o.updated_at FROM tool_operations o
            WHERE o.status = 'unknown'
              AND (NULL::text IS NULL OR EXISTS (SELECT 1 FROM agent_runs r
                                                  WHERE r.run_id = o.run_id AND r.tenant_id = NULL::text)))
         SELECT (SELECT count(*) FROM unknown), oldest.operation_id
           FROM (SELECT 1) one
           LEFT JOIN LATERAL (SELECT operation_id, updated_at FROM unknown ORDER BY updated_at LIMIT 1) oldest ON true",
    ),
    (
        "fate query: the operation",
        "SELECT * FROM tool_operations WHERE operation_id = '$OP'",
    ),
    (
        "fate query: its events",
        "SELECT event_id, at, run_id, operation_id, subject, from_status, to_status
           FROM ledger_events WHERE operation_id = '$OP' ORDER BY event_id",
    ),
    (
        "fate query: its evidence",
        "SELECT evidence_id FROM operation_evidence WHERE operation_id = '$OP' ORDER BY evidence_id",
    ),
    (
        "retention: operations_archive candidates",
        "SELECT r.run_id FROM agent_runs r
          WHERE r.status IN ('succeeded', 'failed', 'cancelled') AND r.archived_at IS NULL
            AND r.updated_at < clock_timestamp() - interval '30 days'
            AND NOT EXISTS (SELECT 1 FROM tool_operations o WHERE o.run_id = r.run_id
                             AND (o.status NOT IN ('succeeded', 'failed_final', 'cancelled')
                                  OR o.updated_at >= clock_timestamp() - interval '30 days'))
          ORDER BY r.updated_at LIMIT 1000 FOR UPDATE OF r SKIP LOCKED",
    ),
];

/// `bench_op_id(run, salt)`: an operation id of `run` shaped as leasegate
/// makes them (`leasegate::intent::operation_id`): the first 12 hex digits
/// are the run's prefix, computed as leasegate computes it for tenant
/// `scale`/`bench` runs (SHA-256 of the canonical JSON
/// `["leasegate/operation-run/v2", tenant, run]`), the other 20 spread by
/// `salt`. `hashed` spreads all 32 digits (ids before the run prefix).
fn bench_op_id_sql(shape: &str) -> &'static str {
    if shape == "hashed" {
        "CREATE FUNCTION bench_op_id(p_run uuid, p_tenant text, p_salt text) RETURNS text
         LANGUAGE sql IMMUTABLE AS $$ SELECT md5(p_salt)::uuid::text $$"
    } else {
        "CREATE FUNCTION bench_op_id(p_run uuid, p_tenant text, p_salt text) RETURNS text
         LANGUAGE sql IMMUTABLE AS $$
           SELECT (left(encode(sha256(convert_to(
                     '[\"leasegate/operation-run/v2\",\"' || p_tenant || '\",\"' || p_run || '\"]', 'UTF8')),
                     'hex'), 12) || left(md5(p_salt), 20))::uuid::text $$"
    }
}

/// N settled operations of N/10 succeeded runs (ten each), 40 days old, one
/// settle event per operation and one completion event per run. Operation
/// ids are shaped like real ones (`bench_op_id`). In chunks of 1M
/// operations, each one statement.
const FILL: &str = "
SET synchronous_commit = off;
INSERT INTO agent_tasks (tenant_id, task_id)
  SELECT 'scale', 'fill-' || r FROM generate_series($1::bigint, $2::bigint - 1) r;
INSERT INTO agent_runs (run_id, tenant_id, task_id, attempt, status, revision, created_at, updated_at)
  SELECT md5('run' || r)::uuid, 'scale', 'fill-' || r, 1, 'succeeded', 3,
         now() - interval '40 days', now() - interval '40 days'
    FROM generate_series($1::bigint, $2::bigint - 1) r;
INSERT INTO worker_leases (run_id, owner, epoch, expires_at)
  SELECT md5('run' || r)::uuid, NULL, 1, now() - interval '40 days'
    FROM generate_series($1::bigint, $2::bigint - 1) r;
INSERT INTO tool_operations (operation_id, run_id, step_id, effect_version, tool_name, request_digest,
                             request_body, status, remote_id, result, revision, created_at, updated_at,
                             dispatch_count, first_dispatched_at)
  SELECT bench_op_id(md5('run' || (i / 10))::uuid, 'scale', 'op' || i), md5('run' || (i / 10))::uuid,
         'step-' || (i % 10), 1, 'payments__charge',
         md5('d' || i) || md5('e' || i), jsonb_build_object('amount', i % 1000, 'currency', 'eur'),
         'succeeded', 'ch_' || i, '{\"content\": [{\"type\": \"text\", \"text\": \"ok\"}]}'::jsonb, 2,
         now() - interval '40 days', now() - interval '40 days', 1, now() - interval '40 days'
    FROM generate_series($1::bigint * 10, $2::bigint * 10 - 1) i;
INSERT INTO ledger_events (at, run_id, operation_id, subject, from_status, to_status, actor_kind, actor, epoch, revision)
  SELECT now() - interval '40 days', md5('run' || (i / 10))::uuid,
         bench_op_id(md5('run' || (i / 10))::uuid, 'scale', 'op' || i), 'operation',
         'dispatching', 'succeeded', 'dispatcher', 'fill', 1, 2
    FROM generate_series($1::bigint * 10, $2::bigint * 10 - 1) i;
INSERT INTO ledger_events (at, run_id, subject, from_status, to_status, actor_kind, actor, epoch, revision)
  SELECT now() - interval '40 days', md5('run' || r)::uuid, 'run', 'running', 'succeeded', 'worker', 'fill', 1, 3
    FROM generate_series($1::bigint, $2::bigint - 1) r;
";

/// The tables the fill writes.
const FILLED: &str =
    "'agent_tasks', 'agent_runs', 'worker_leases', 'tool_operations', 'ledger_events'";

/// A bulk load's recipe (what pg_dump's restore does): drops every
/// foreign key touching the filled tables and every index and key of
/// `tool_operations` and `ledger_events`, and answers the statements that
/// put them back, read from the catalog (`pg_get_constraintdef`,
/// `pg_get_indexdef`) so they are exactly the migrations' definitions:
/// keys and indexes first, foreign keys last (validated once each).
/// Random inserts into multi-GB B-trees are what made the fill slow
/// (~6 min per million operations); a sort per index after it is not.
async fn drop_for_bulk_load(admin: &sqlx::PgPool) -> anyhow::Result<Vec<String>> {
    let foreign_keys: Vec<(String, String)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT format('ALTER TABLE %s DROP CONSTRAINT %I', c.conrelid::regclass, c.conname),
                format('ALTER TABLE %s ADD CONSTRAINT %I %s', c.conrelid::regclass, c.conname,
                       pg_get_constraintdef(c.oid))
           FROM pg_constraint c
          WHERE c.contype = 'f'
            AND (c.conrelid::regclass::text IN ({FILLED}) OR c.confrelid::regclass::text IN ({FILLED}))
          ORDER BY c.conname"
    )))
    .fetch_all(admin)
    .await?;
    let keys: Vec<(String, String)> = sqlx::query_as(
        "SELECT format('ALTER TABLE %s DROP CONSTRAINT %I', c.conrelid::regclass, c.conname),
                format('ALTER TABLE %s ADD CONSTRAINT %I %s', c.conrelid::regclass, c.conname,
                       pg_get_constraintdef(c.oid))
           FROM pg_constraint c
          WHERE c.contype IN ('p', 'u')
            AND c.conrelid::regclass::text IN ('tool_operations', 'ledger_events')
          ORDER BY c.conname",
    )
    .fetch_all(admin)
    .await?;
    let indexes: Vec<(String, String)> = sqlx::query_as(
        "SELECT format('DROP INDEX %s', i.indexrelid::regclass), pg_get_indexdef(i.indexrelid)
           FROM pg_index i
          WHERE i.indrelid::regclass::text IN ('tool_operations', 'ledger_events')
            AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = i.indexrelid)
          ORDER BY 1",
    )
    .fetch_all(admin)
    .await?;
    for (drop, _) in foreign_keys.iter().chain(&keys).chain(&indexes) {
        sqlx::query(sqlx::AssertSqlSafe(drop.clone()))
            .execute(admin)
            .await?;
    }
    Ok(keys
        .into_iter()
        .chain(indexes)
        .chain(foreign_keys)
        .map(|(_, create)| create)
        .collect())
}

async fn scale(a: &Args) -> anyhow::Result<()> {
    let url = with_database(&a.url, a.db.as_deref().unwrap_or("leasegate_scale"));
    let mut rates: Vec<(i64, f64, f64, Option<f64>)> = Vec::new();
    let mut io_rows: Vec<(i64, PerCall, Option<PerCall>)> = Vec::new();
    for &rows in &a.rows {
        println!(
            "\n=== {rows} settled operations ({} operation ids) ===",
            a.ids
        );
        fresh(&url).await?;
        let admin = sqlx::postgres::PgPoolOptions::new()
            .max_connections(1)
            .connect(&url)
            .await?;
        let began = Instant::now();
        admin.execute(bench_op_id_sql(&a.ids)).await?;
        // The fill packs its pages (fillfactor 100), as pages written
        // before migration 0010 are, and as settles leave them; the cells
        // then write with the table's own setting, or `--fillfactor`.
        let fillfactor: String = match a.fillfactor {
            Some(f) => f.to_string(),
            None => sqlx::query_scalar(
                "SELECT coalesce((SELECT split_part(o, '=', 2) FROM pg_class c, unnest(c.reloptions) o
                                   WHERE c.oid = 'tool_operations'::regclass AND o LIKE 'fillfactor=%'),
                                 '100')",
            )
            .fetch_one(&admin)
            .await?,
        };
        admin
            .execute("ALTER TABLE tool_operations SET (fillfactor = 100)")
            .await?;
        let rebuild = drop_for_bulk_load(&admin).await?;
        let runs = (rows / 10).max(1);
        let chunk = 100_000i64; // runs per chunk: 1M operations
        let mut from = 0i64;
        while from < runs {
            let to = (from + chunk).min(runs);
            let mut conn = admin.acquire().await?;
            for statement in FILL.split(";\n").map(str::trim).filter(|s| !s.is_empty()) {
                if statement.starts_with("SET") {
                    conn.execute(statement).await?;
                    continue;
                }
                sqlx::query(statement)
                    .bind(from)
                    .bind(to)
                    .execute(&mut *conn)
                    .await?;
            }
            from = to;
            eprintln!(
                "  filled {} operations ({:.0} s)",
                from * 10,
                began.elapsed().as_secs_f64()
            );
        }
        let rebuilding = Instant::now();
        let mut conn = admin.acquire().await?;
        conn.execute("SET maintenance_work_mem = '1GB'").await?;
        for statement in &rebuild {
            sqlx::query(sqlx::AssertSqlSafe(statement.clone()))
                .execute(&mut *conn)
                .await?;
        }
        drop(conn);
        eprintln!(
            "  rebuilt {} indexes and constraints ({:.0} s)",
            rebuild.len(),
            rebuilding.elapsed().as_secs_f64()
        );
        // A number: checked to be 10..=100, or read from the catalog.
        let fillfactor: u32 = fillfactor.parse()?;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "ALTER TABLE tool_operations SET (fillfactor = {fillfactor})"
        )))
        .execute(&admin)
        .await?;
        admin.execute("VACUUM (ANALYZE) tool_operations").await?;
        admin.execute("VACUUM (ANALYZE) ledger_events").await?;
        admin.execute("VACUUM (ANALYZE) agent_runs").await?;
        admin.execute("CHECKPOINT").await?;
        let fill_pages: i64 = sqlx::query_scalar(
            "SELECT pg_relation_size('tool_operations') / current_setting('block_size')::bigint",
        )
        .fetch_one(&admin)
        .await?;
        let sizes: (i64, i64, String, String) = sqlx::query_as(
            "SELECT (SELECT count(*) FROM tool_operations), (SELECT count(*) FROM ledger_events),
                    pg_size_pretty(pg_total_relation_size('tool_operations')),
                    pg_size_pretty(pg_total_relation_size('ledger_events'))",
        )
        .fetch_one(&admin)
        .await?;
        println!(
            "filled in {:.0} s: tool_operations {} rows ({}), ledger_events {} rows ({}); \
             the cells write tool_operations with fillfactor {fillfactor}",
            began.elapsed().as_secs_f64(),
            sizes.0,
            sizes.2,
            sizes.1,
            sizes.3
        );

        // Live work for the scans to find: a few prepared, dispatching and
        // unknown operations of one running run.
        bench_runs(&url).await?;
        sqlx::query(
            "INSERT INTO tool_operations (operation_id, run_id, step_id, effect_version, tool_name,
                                          request_digest, request_body, status, dispatch_owner, dispatch_until)
             SELECT 'live-' || s || '-' || i, '00000000-0000-7000-8000-000000000000'::uuid,
                    'live-' || s || '-' || i, 1, 'payments__charge', md5('l' || i) || md5('m' || i), '{}'::jsonb,
                    s, CASE WHEN s = 'dispatching' THEN 'nobody' END,
                    CASE WHEN s = 'dispatching' THEN now() + interval '1 hour' END
               FROM unnest(ARRAY['prepared', 'dispatching', 'unknown']) s, generate_series(1, 20) i",
        )
        .execute(&admin)
        .await?;
        admin.execute("ANALYZE tool_operations").await?;

        let op: String = sqlx::query_scalar(
            "SELECT bench_op_id(md5('run' || ($1::bigint / 2 / 10))::uuid, 'scale', 'op' || ($1::bigint / 2))",
        )
            .bind(rows)
            .fetch_one(&admin)
            .await?;
        for (name, sql) in SCANS {
            let sql = sql.replace("$OP", &op);
            // The bench's own constant SQL.
            let plan: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) {sql}"
            )))
            .fetch_all(&admin)
            .await?;
            println!("-- {name}");
            for line in plan {
                println!("   {line}");
            }
        }
        admin.close().await;

        let mut tps = Vec::new();
        let mut latency = Vec::new();
        let mut batched = Vec::new();
        let (mut io, mut batched_io) = (Vec::new(), Vec::new());
        for _ in 0..a.repeat.max(1) {
            let (rate, ms, per_call) = measured(&url, a, "gated_call.sql", 1).await?;
            println!(
                "pgbench register-claim + settle, {} clients, {} s: {rate:.0} calls/s, {ms:.2} ms per call; \
                 per call: {per_call}",
                a.clients, a.seconds
            );
            tps.push(rate);
            latency.push(ms);
            io.push(per_call);
            if a.clients * BATCH <= BENCH_RUNS {
                let (rate, ms, per_call) =
                    measured(&url, a, "gated_batch.sql", BATCH as u64).await?;
                let calls = rate * BATCH as f64;
                println!(
                    "pgbench group commit ({BATCH} calls per batch), {} clients, {} s: {calls:.0} calls/s, \
                     {ms:.2} ms per batch; per call: {per_call}",
                    a.clients, a.seconds
                );
                batched.push(calls);
                batched_io.push(per_call);
            }
        }
        placement(&url, fill_pages).await?;
        let batched = upper_median(&batched);
        rates.push((
            rows,
            upper_median(&tps).expect("at least one cell"),
            upper_median(&latency).expect("at least one cell"),
            batched,
        ));
        let single_io = PerCall::median(io).expect("at least one cell");
        io_rows.push((rows, single_io, PerCall::median(batched_io)));
    }
    println!(
        "\nper gated call, median of the cells (blocks read: from outside PostgreSQL's shared buffers):"
    );
    for (rows, single, group) in &io_rows {
        println!("{rows:>12}  single: {single}");
        if let Some(group) = group {
            println!("{:>12}  group:  {group}", "");
        }
    }
    println!(
        "\n{:>12} {:>14} {:>12} {:>10} {:>20} {:>12}",
        "operations", "calls/s (med)", "ms/call", "ratio", "batched calls/s", "ratio"
    );
    let base = rates.first().map(|r| r.2).unwrap_or(1.0);
    let batched_base = rates.first().and_then(|r| r.3);
    for (rows, rate, ms, batched) in &rates {
        let (batched, batched_ratio) = match (batched, batched_base) {
            // Cost per call is the inverse of the rate.
            (Some(b), Some(first)) => (format!("{b:.0}"), format!("{:.2}", first / b)),
            _ => ("-".to_owned(), "-".to_owned()),
        };
        println!(
            "{rows:>12} {rate:>14.0} {ms:>12.2} {:>10.2} {batched:>20} {batched_ratio:>12}",
            ms / base
        );
    }
    println!(
        "(ratio: cost per gated call relative to the first row count, single path and group commit; \
         goal <= 1.2)"
    );
    Ok(())
}

/// Where the heap put the cells' operations: how many of their rows (the
/// current version, settled) sit in one of the `fill_pages` pages the fill
/// wrote, rather than in pages added after it. A row in an old page is a
/// page PostgreSQL may have to read, and dirties a page that was clean.
async fn placement(url: &str, fill_pages: i64) -> anyhow::Result<()> {
    use sqlx::Connection;
    let mut conn = sqlx::PgConnection::connect(url).await?;
    let rows: Vec<(String, i64, i64)> = sqlx::query_as(
        "SELECT CASE WHEN step_id ~ '^pgbench-[0-9]+$' THEN 'single' ELSE 'group' END,
                count(*) FILTER (WHERE (ctid::text::point)[0] < $1), count(*)
           FROM tool_operations
          WHERE run_id BETWEEN '00000000-0000-7000-8000-000000000000' AND '00000000-0000-7000-8000-999999999999'
            AND step_id LIKE 'pgbench-%'
          GROUP BY 1 ORDER BY 1 DESC",
    )
    .bind(fill_pages)
    .fetch_all(&mut conn)
    .await?;
    for (path, old, all) in rows {
        println!(
            "placement, {path} path: {old} of {all} operations ({:.1} %) in the fill's {fill_pages} heap pages",
            100.0 * old as f64 / all.max(1) as f64
        );
    }
    conn.close().await?;
    Ok(())
}

/// The running runs pgbench's clients use: client N's are N (`gated_call.sql`)
/// and 16N..16N+15 (`gated_batch.sql`).
async fn bench_runs(url: &str) -> anyhow::Result<()> {
    let ledger = Ledger::connect(url, LedgerOptions::default()).await?;
    for client in 0..BENCH_RUNS {
        let run: RunId = format!("00000000-0000-7000-8000-{client:012}").parse()?;
        let owner = format!("bench-{client}");
        let created = ledger
            .run_create(
                run,
                "bench",
                &format!("task-{client}"),
                Some(InitialLease {
                    owner: &owner,
                    ttl_ms: 600_000,
                }),
            )
            .await?;
        let RunCreateOutcome::Created(_) = created else {
            anyhow::bail!("run {client}: {created:?}");
        };
    }
    ledger.close().await;
    Ok(())
}

/// [`pgbench`] with `a`'s clients and seconds, and the server's
/// [`IoCounters`] around it per call (`calls_per_transaction` calls in each
/// of the script's transactions).
async fn measured(
    url: &str,
    a: &Args,
    script: &str,
    calls_per_transaction: u64,
) -> anyhow::Result<(f64, f64, PerCall)> {
    let before = IoCounters::read(url).await?;
    let (rate, ms, transactions) = pgbench(url, a.clients, a.seconds, script)?;
    let per_call = IoCounters::read(url)
        .await?
        .per_call_since(&before, transactions * calls_per_transaction);
    Ok((rate, ms, per_call))
}

/// The server's counters that show where a call's cost grows with the
/// tables: blocks read into shared buffers (`pg_stat_database`, this
/// database) and WAL written (`pg_stat_wal`). Read on a fresh connection
/// each time (a session caches its statistics snapshot), after pgbench's
/// clients exited (a backend flushes its counters on exit).
struct IoCounters {
    blocks_read: i64,
    blocks_hit: i64,
    wal_fpi: i64,
    wal_bytes: f64,
}

impl IoCounters {
    async fn read(url: &str) -> anyhow::Result<Self> {
        use sqlx::Connection;
        let mut conn = sqlx::PgConnection::connect(url).await?;
        let (blocks_read, blocks_hit, wal_fpi, wal_bytes): (i64, i64, i64, f64) = sqlx::query_as(
            "SELECT d.blks_read, d.blks_hit, w.wal_fpi, w.wal_bytes::float8
               FROM pg_stat_database d, pg_stat_wal w WHERE d.datname = current_database()",
        )
        .fetch_one(&mut conn)
        .await?;
        conn.close().await?;
        Ok(Self {
            blocks_read,
            blocks_hit,
            wal_fpi,
            wal_bytes,
        })
    }

    fn per_call_since(&self, before: &Self, calls: u64) -> PerCall {
        let calls = calls.max(1) as f64;
        PerCall {
            blocks_read: (self.blocks_read - before.blocks_read) as f64 / calls,
            blocks_hit: (self.blocks_hit - before.blocks_hit) as f64 / calls,
            wal_fpi: (self.wal_fpi - before.wal_fpi) as f64 / calls,
            wal_kib: (self.wal_bytes - before.wal_bytes) / 1024.0 / calls,
        }
    }
}

/// [`IoCounters`] per gated call over one pgbench cell.
#[derive(Clone, Copy)]
struct PerCall {
    blocks_read: f64,
    blocks_hit: f64,
    wal_fpi: f64,
    wal_kib: f64,
}

impl PerCall {
    /// Field by field.
    fn median(cells: Vec<PerCall>) -> Option<PerCall> {
        let field = |f: fn(&PerCall) -> f64| {
            upper_median(&cells.iter().map(f).collect::<Vec<_>>()).expect("at least one cell")
        };
        (!cells.is_empty()).then(|| PerCall {
            blocks_read: field(|c| c.blocks_read),
            blocks_hit: field(|c| c.blocks_hit),
            wal_fpi: field(|c| c.wal_fpi),
            wal_kib: field(|c| c.wal_kib),
        })
    }
}

impl std::fmt::Display for PerCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:.2} blocks read, {:.1} buffer hits, {:.2} WAL full-page images, {:.2} KiB WAL",
            self.blocks_read, self.blocks_hit, self.wal_fpi, self.wal_kib
        )
    }
}

/// pgbench running `script` (beside this file): transactions per second,
/// mean ms per transaction and the number of transactions it completed.
fn pgbench(
    url: &str,
    clients: usize,
    seconds: u64,
    script: &str,
) -> anyhow::Result<(f64, f64, u64)> {
    let script = format!("{}/bench/scale/{script}", env!("CARGO_MANIFEST_DIR"));
    let report = Pgbench {
        program: Path::new("pgbench"),
        url,
        script: Path::new(&script),
        clients,
        seconds,
        log_dir: None,
    }
    .run()?;
    let ms = report.latency_average_ms.unwrap_or(f64::NAN);
    let done = report
        .transactions
        .ok_or_else(|| anyhow::anyhow!("no transaction count in: {}", report.stdout))?;
    Ok((report.tps, ms, done))
}

// ---------------------------------------------------------------- renew

/// `POST /v1/leases/renew` with `body` through `router`, in-process: the
/// answer's status and bytes.
async fn post_renew(
    router: axum::Router,
    body: String,
) -> anyhow::Result<(axum::http::StatusCode, axum::body::Bytes)> {
    let request = axum::http::Request::builder()
        .method("POST")
        .uri("/v1/leases/renew")
        .header("content-type", "application/json")
        .body(axum::body::Body::from(body))?;
    let response = router.oneshot(request).await?;
    let status = response.status();
    Ok((
        status,
        axum::body::to_bytes(response.into_body(), usize::MAX).await?,
    ))
}

async fn renew(a: &Args) -> anyhow::Result<()> {
    let url = with_database(&a.url, a.db.as_deref().unwrap_or("leasegate_renew_bench"));
    fresh(&url).await?;
    let admin = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(&url)
        .await?;
    // `--hosts` × `--leases` leased runs; host-1 holds the first `--leases`.
    let rows: Vec<(uuid::Uuid, String)> = sqlx::query_as(
        "WITH g AS (SELECT i, gen_random_uuid() AS run_id FROM generate_series(1, $1::bigint * $2) i),
              t AS (INSERT INTO agent_tasks (tenant_id, task_id) SELECT 'bench', 'renew-' || i FROM g),
              r AS (INSERT INTO agent_runs (run_id, tenant_id, task_id, attempt, status)
                    SELECT run_id, 'bench', 'renew-' || i, 1, 'running' FROM g)
         INSERT INTO worker_leases (run_id, owner, epoch, expires_at, token_sha256)
         SELECT run_id, 'host-' || ((i - 1) / $1 + 1), 1, clock_timestamp() + interval '1 hour',
                sha256(convert_to('lgl_bench_' || run_id::text, 'UTF8'))
           FROM g RETURNING run_id, owner",
    )
    .bind(a.leases)
    .bind(a.hosts as i64)
    .fetch_all(&admin)
    .await?;
    admin.execute("VACUUM (ANALYZE) worker_leases").await?;
    admin.execute("VACUUM (ANALYZE) agent_runs").await?;
    let claim = |(run, owner): &(uuid::Uuid, String)| LeaseClaim {
        run_id: RunId::from_uuid(*run),
        owner: owner.clone(),
        epoch: 1,
        token: Some(LeaseToken::presented(&format!("lgl_bench_{run}"))),
    };
    let batch_body = |claims: &[LeaseClaim]| {
        json!({"ttl_ms": 600_000,
            "leases": claims.iter().map(|c| json!({"run_id": c.run_id, "owner": c.owner, "epoch": c.epoch,
                "lease_token": c.token.as_ref().map(LeaseToken::expose)})).collect::<Vec<_>>()})
        .to_string()
    };
    let host_bodies: Vec<String> = (1..=a.hosts)
        .map(|host| {
            let owner = format!("host-{host}");
            let claims: Vec<LeaseClaim> = rows.iter().filter(|r| r.1 == owner).map(claim).collect();
            batch_body(&claims)
        })
        .collect();
    let rows: Vec<(uuid::Uuid, String)> = rows.into_iter().filter(|r| r.1 == "host-1").collect();
    let claims: Vec<LeaseClaim> = rows.iter().map(claim).collect();
    let ids: Vec<uuid::Uuid> = rows.iter().map(|(r, _)| *r).collect();
    let owners: Vec<&str> = claims.iter().map(|c| c.owner.as_str()).collect();
    let epochs: Vec<i64> = claims.iter().map(|c| c.epoch).collect();
    let hashes: Vec<Vec<u8>> = claims
        .iter()
        .map(|c| c.token.as_ref().map(LeaseToken::sha256).unwrap_or_default())
        .collect();
    let ledger = Ledger::connect(
        &url,
        LedgerOptions {
            max_connections: 1,
            ..LedgerOptions::default()
        },
    )
    .await?;
    let app = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .after_connect(|conn, _| {
            Box::pin(async move {
                conn.execute("SET ROLE leasegate_app").await?;
                Ok(())
            })
        })
        .connect(&url)
        .await?;
    let n = claims.len() as f64;
    let (mut sql_rates, mut ledger_rates, mut http_rates) = (Vec::new(), Vec::new(), Vec::new());
    let mut bare_rates = Vec::new();
    let body = batch_body(&claims);
    let router = router_for_tenant(ledger.clone(), IntegerPolicy::Reject, Some("bench".into()));
    for _ in 0..a.rounds.max(1) {
        // The minimal shape for reference: one UPDATE of the same rows with
        // owner and epoch checked, no token, no run status, no answer per
        // lease (as /work/shared/bench/ceiling/renew_batch.sql).
        let began = Instant::now();
        sqlx::query(
            "UPDATE worker_leases SET expires_at = clock_timestamp() + interval '10 min',
                    updated_at = clock_timestamp()
              WHERE run_id = ANY ($1) AND owner = 'host-1' AND epoch = 1
                AND expires_at > clock_timestamp()",
        )
        .bind(&ids)
        .execute(&admin)
        .await?;
        bare_rates.push(n / began.elapsed().as_secs_f64());

        let began = Instant::now();
        let renewed: i64 = sqlx::query_scalar(
            "SELECT count(*) FILTER (WHERE outcome = 'applied')
               FROM lease_renew_batch($1, $2, $3, $4, 600000, NULL)",
        )
        .bind(&ids)
        .bind(&owners)
        .bind(&epochs)
        .bind(&hashes)
        .fetch_one(&app)
        .await?;
        sql_rates.push(n / began.elapsed().as_secs_f64());
        anyhow::ensure!(renewed as usize == claims.len(), "sql: {renewed} renewed");

        let began = Instant::now();
        let answers = ledger.lease_renew_batch(&claims, 600_000, None).await?;
        ledger_rates.push(n / began.elapsed().as_secs_f64());
        anyhow::ensure!(answers.len() == claims.len());

        let began = Instant::now();
        let (status, bytes) = post_renew(router.clone(), body.clone()).await?;
        http_rates.push(n / began.elapsed().as_secs_f64());
        let answer: serde_json::Value = serde_json::from_slice(&bytes)?;
        anyhow::ensure!(
            status == 200 && answer["renewed"] == claims.len(),
            "http: {status} {}",
            &answer.to_string()[..200.min(answer.to_string().len())]
        );
    }
    println!(
        "{} leases per batch, {} rounds, median leases/s:",
        claims.len(),
        a.rounds
    );
    for (label, rates) in [
        ("bare UPDATE, owner + epoch only:      ", &bare_rates),
        ("SQL function lease_renew_batch alone: ", &sql_rates),
        ("Ledger::lease_renew_batch:            ", &ledger_rates),
        ("POST /v1/leases/renew (in-process):   ", &http_rates),
    ] {
        let median = upper_median(rates).expect("at least one round");
        println!("  {label}{median:>10.0}");
    }

    // Several hosts at once, each with its own connection.
    let shared = Ledger::connect(
        &url,
        LedgerOptions {
            max_connections: a.hosts as u32,
            ..LedgerOptions::default()
        },
    )
    .await?;
    let router = router_for_tenant(shared, IntegerPolicy::Reject, Some("bench".into()));
    let mut hosts_rates = Vec::new();
    for _ in 0..a.rounds.max(1) {
        let began = Instant::now();
        let posts: Vec<_> = host_bodies
            .iter()
            .map(|body| {
                let (router, body) = (router.clone(), body.clone());
                tokio::spawn(async move {
                    let (status, bytes) = post_renew(router, body).await?;
                    let answer: serde_json::Value = serde_json::from_slice(&bytes)?;
                    anyhow::ensure!(status == 200, "http: {status}");
                    Ok(answer["renewed"].as_u64().unwrap_or(0))
                })
            })
            .collect();
        let mut renewed = 0u64;
        for post in posts {
            renewed += post.await??;
        }
        anyhow::ensure!(
            renewed as usize == claims.len() * a.hosts,
            "hosts: {renewed} renewed"
        );
        hosts_rates.push(renewed as f64 / began.elapsed().as_secs_f64());
    }
    println!(
        "  POST /v1/leases/renew, {} hosts at once: {:>8.0}",
        a.hosts,
        upper_median(&hosts_rates).expect("at least one round")
    );
    Ok(())
}
