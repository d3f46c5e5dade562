//! Room on `tool_operations`' pages (migration 0010): a gated
//! call's rows go to pages with room, not into the leftover tail of old,
//! packed pages of settled history. Each old page holds some bytes no
//! settled row fits in; with fillfactor 100 the free space map hands those
//! tails to new, smaller rows one row per page, so at millions of rows
//! every call read and dirtied old pages (`bench/scale`). With the
//! migration's fillfactor an insert, or a settle's version moved off its
//! page, asks for its length plus a tenth of a page, which no packed page
//! has.
//!
//! The test packs pages so that their tails fit a call's rows, then makes
//! gated calls under fillfactor 100, which must land some there (the
//! control: the scenario is real and the assertion after it could fail),
//! and again, after packing more pages, under the migration's setting:
//! none may land in a packed page.

use crate::common;
use crate::common::intents;

use common::TestDb;
use leasegate::intent::Intent;
use leasegate::ledger::{LeaseClaim, RunId};
use serde_json::json;
use sqlx::Executor;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

/// Settled rows of old history per packed page.
const ROWS_PER_PAGE: i64 = 5;
/// Packed pages per fill.
const PACKED_PAGES: i64 = 40;
/// Gated calls per phase.
const CALLS: usize = 20;
/// Usable bytes of an 8 kB page: the block less its header (24) and one
/// line pointer (4), as `PageGetHeapFreeSpace` counts it.
const PAGE_ROOM: i64 = 8192 - 24 - 4;

fn intent(run_id: RunId, step: &str) -> Intent {
    intents::planned(
        run_id,
        step,
        "payments__charge",
        &json!({"amount": 500, "currency": "eur", "step": step}),
    )
}

fn maxalign(len: i64) -> i64 {
    (len + 7) / 8 * 8
}

/// One gated call as the hot path makes it: register-and-claim, then
/// settle. Answers the row's length while dispatching and once settled.
async fn gated_call(db: &TestDb, lease: &LeaseClaim, step: &str) -> (i64, i64) {
    let claim = db
        .claim(lease, &intent(lease.run_id, step), "proxy-1", 60_000)
        .await;
    let length = || {
        sqlx::query_scalar::<_, i32>(
            "SELECT pg_column_size(o.*) FROM tool_operations o WHERE operation_id = $1",
        )
        .bind(claim.operation_id.as_str())
    };
    let dispatching = length().fetch_one(&db.admin).await.unwrap();
    db.settle_succeeded(
        &claim,
        Some("ch_1"),
        &json!({"content": [{"type": "text", "text": "charged"}]}),
    )
    .await;
    let settled = length().fetch_one(&db.admin).await.unwrap();
    (dispatching.into(), settled.into())
}

/// Packs about `PACKED_PAGES` new pages with `ROWS_PER_PAGE` settled rows
/// each (fillfactor 100 for the fill, as pages written before migration
/// 0010 are), sized so that each page's tail has `tail` bytes left, then
/// sets `fillfactor` for what follows and vacuums, so the free space map
/// knows those tails.
async fn pack_pages(db: &TestDb, run: RunId, batch: &str, tail: i64, fillfactor: &str) {
    db.admin
        .execute("ALTER TABLE tool_operations SET (fillfactor = 100)")
        .await
        .unwrap();
    // Each old row's length: the page's room less the tail, shared by
    // ROWS_PER_PAGE rows with their line pointers, aligned down to 8.
    let row = ((PAGE_ROOM - tail) / ROWS_PER_PAGE - 4) / 8 * 8;
    let insert = |pad: i64, count: i64, step: String| {
        sqlx::query(
            "INSERT INTO tool_operations (operation_id, run_id, step_id, effect_version, tool_name,
                                          request_digest, request_body, status, remote_id, result,
                                          revision, dispatch_count)
             SELECT gen_random_uuid()::text, $1, $2 || '-' || i, 1, 'payments__charge', repeat('a', 64),
                    '{\"amount\": 500}'::jsonb, 'succeeded', repeat('x', $3::int),
                    '{\"ok\": true}'::jsonb, 2, 1
               FROM generate_series(1, $4::bigint) i
             RETURNING pg_column_size(tool_operations.*)",
        )
        .bind(run.as_uuid())
        .bind(step)
        .bind(pad)
        .bind(count)
    };
    // A row's length with a 1,000-byte remote id, measured on a row that
    // is rolled back; the padding then makes each row exactly `row`.
    let mut probe = db.admin.begin().await.unwrap();
    let probed: i32 = insert(1_000, 1, format!("{batch}-probe"))
        .fetch_one(&mut *probe)
        .await
        .map(|r| sqlx::Row::get(&r, 0))
        .unwrap();
    probe.rollback().await.unwrap();
    let pad = 1_000 + row - i64::from(probed);
    assert!(
        pad > 200 && row < 2_000,
        "rows of {row} bytes (pad {pad}) stay untoasted"
    );
    let inserted = insert(
        pad,
        ROWS_PER_PAGE * (PACKED_PAGES + 1),
        format!("old-{batch}"),
    )
    .fetch_all(&db.admin)
    .await
    .unwrap();
    assert!(
        inserted
            .iter()
            .all(|r| i64::from(sqlx::Row::get::<i32, _>(r, 0)) == row),
        "every old row is {row} bytes"
    );
    db.admin
        .execute(sqlx::AssertSqlSafe(format!(
            "ALTER TABLE tool_operations SET (fillfactor = {fillfactor})"
        )))
        .await
        .unwrap();
    db.admin.execute("VACUUM tool_operations").await.unwrap();
}

/// The heap pages holding exactly `ROWS_PER_PAGE` old rows of fill `batch`
/// and nothing else: the packed pages.
async fn packed_pages(db: &TestDb, batch: &str) -> Vec<i64> {
    db.scalars_with(
        "SELECT (ctid::text::point)[0]::bigint AS page FROM tool_operations
          GROUP BY 1
         HAVING count(*) FILTER (WHERE step_id LIKE 'old-' || $1 || '-%') = $2 AND count(*) = $2
          ORDER BY 1",
        (batch, ROWS_PER_PAGE),
    )
    .await
}

/// Of the operations whose step starts with `prefix`, how many sit (their
/// current version) in one of `pages`.
async fn landed_in(db: &TestDb, prefix: &str, pages: &[i64]) -> i64 {
    db.scalar_with(
        "SELECT count(*) FROM tool_operations
          WHERE step_id LIKE $1 || '%' AND (ctid::text::point)[0]::bigint = ANY ($2)",
        (prefix, pages),
    )
    .await
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn new_operations_stay_out_of_the_packed_tails_of_old_pages(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let fillfactor: String = sqlx::query_scalar(
        "SELECT split_part(o, '=', 2) FROM pg_class c, unnest(c.reloptions) o
          WHERE c.oid = 'tool_operations'::regclass AND o LIKE 'fillfactor=%'",
    )
    .fetch_one(&db.admin)
    .await
    .expect("migration 0010 sets tool_operations' fillfactor");
    let reserve = 8192 * (100 - fillfactor.parse::<i64>().unwrap()) / 100;

    let (lease, _) = db.running_run("worker-1", 600_000).await;
    let (dispatching, settled) = gated_call(&db, &lease, "first").await;
    // Tails that fit either version of a call's row with room to spare
    // (the free space map counts in 32-byte steps), and that are smaller
    // than a row plus the reserve.
    let tail = maxalign(dispatching.max(settled)) + 160;
    assert!(
        tail + 40 < maxalign(dispatching.min(settled)) + reserve,
        "a tail of {tail} bytes fits no row plus the {reserve}-byte reserve"
    );

    // The control, under fillfactor 100 (as before migration 0010): the
    // tails take new rows.
    pack_pages(&db, lease.run_id, "a", tail, "100").await;
    let packed = packed_pages(&db, "a").await;
    assert!(
        packed.len() as i64 >= PACKED_PAGES - 1,
        "{} packed pages",
        packed.len()
    );
    for i in 0..CALLS {
        gated_call(&db, &lease, &format!("before-{i}")).await;
    }
    let landed = landed_in(&db, "before-", &packed).await;
    assert!(
        landed > 0,
        "with fillfactor 100 new operations land in the packed pages' tails ({landed} of {CALLS})"
    );

    // Under the migration's setting: more packed pages, and the ones the
    // control left untouched.
    let untouched = packed_pages(&db, "a").await;
    pack_pages(&db, lease.run_id, "b", tail, &fillfactor).await;
    let packed = [untouched, packed_pages(&db, "b").await].concat();
    assert!(
        packed.len() as i64 >= PACKED_PAGES,
        "{} packed pages",
        packed.len()
    );
    for i in 0..CALLS {
        gated_call(&db, &lease, &format!("now-{i}")).await;
    }
    assert_eq!(
        landed_in(&db, "now-", &packed).await,
        0,
        "with the migration's fillfactor {fillfactor} no new operation lands in a packed page's tail"
    );
}
