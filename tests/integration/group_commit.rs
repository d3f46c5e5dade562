//! Group commit against a real PostgreSQL: concurrent gated
//! calls of different runs share statements and commits, and every item
//! gets the single path's verdict (fencing, lease tokens, tenants, the
//! digest comparison, events); a refusal is its item's alone.

use crate::common;
use crate::common::intents;

use std::time::Duration;

use common::{TestDb, applied, wait_until, within};
use futures::future::join_all;
use leasegate::intent::Intent;
use leasegate::ledger::{
    AcquireOutcome, Fenced, GroupCommitSettings, InlineClaim, LeaseClaim, Ledger, LedgerOptions,
    OperationStatus, Rejection, RunId, SettleOutcome, Settlement, TokenFault,
};
use serde_json::{Value, json};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

const TENANT: &str = "tenant-a";

fn intent(run_id: RunId, step: &str, arguments: Value) -> Intent {
    intents::planned(run_id, step, "payments__charge", &arguments)
}

/// A ledger whose calls are batched; the window is wide so that calls
/// issued together land in one batch on a busy machine too.
fn batched_options() -> LedgerOptions {
    LedgerOptions {
        group_commit: Some(GroupCommitSettings {
            window: Duration::from_millis(20),
            max_batch: 64,
            in_flight: 4,
        }),
        ..LedgerOptions::default()
    }
}

async fn single_path(connect: &PgConnectOptions) -> Ledger {
    Ledger::connect_with(
        connect.clone(),
        LedgerOptions {
            group_commit: None,
            ..LedgerOptions::default()
        },
    )
    .await
    .unwrap()
}

/// Waits until a statement calling `function` waits on a row lock.
async fn waiting_on_a_lock(db: &TestDb, function: &str) {
    wait_until(&format!("{function} waiting on a row lock"), || async {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity
              WHERE wait_event_type = 'Lock' AND query LIKE '%' || $1 || '%'",
        )
        .bind(function)
        .fetch_one(&db.admin)
        .await
        .unwrap();
        (waiting > 0).then_some(())
    })
    .await;
}

/// Claims and settles one call of a fresh run through `ledger`.
async fn gated_call(ledger: &Ledger, lease: LeaseClaim) -> RunId {
    let call = intent(lease.run_id, "charge", json!({"amount": 1}));
    let claim = match applied(
        ledger
            .operation_register_claim(&lease, &call, None, "proxy-1", 30_000)
            .await
            .unwrap(),
    ) {
        InlineClaim::Claimed { claim, .. } => claim,
        other => panic!("expected a claim, got {other:?}"),
    };
    match ledger
        .operation_settle(
            &claim,
            Settlement::Succeeded,
            Some("ch_1"),
            &json!({"ok": true}),
        )
        .await
        .unwrap()
    {
        SettleOutcome::Settled(record) => assert_eq!(record.status, OperationStatus::Succeeded),
        other => panic!("expected settled, got {other:?}"),
    }
    lease.run_id
}

/// The rows and events of a run, without ids and times.
async fn footprint(db: &TestDb, run_id: RunId) -> Value {
    db
        .scalar(
            "SELECT jsonb_build_object(
           'ops', (SELECT jsonb_agg(jsonb_build_array(status, revision, dispatch_count, remote_id,
                                                     dispatch_owner))
                     FROM tool_operations WHERE run_id = $1),
           'events', (SELECT jsonb_agg(jsonb_build_array(subject, from_status, to_status, actor_kind,
                                                        actor, revision,
                                                        (SELECT coalesce(jsonb_agg(k ORDER BY k), '[]')
                                                           FROM jsonb_object_keys(detail) k))
                                       ORDER BY event_id)
                        FROM ledger_events WHERE run_id = $1 AND subject = 'operation'))",
            run_id.as_uuid(),
        )
        .await
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn concurrent_calls_of_different_runs_share_statements_and_write_what_the_single_path_writes(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::with_options(pool, connect.clone(), batched_options()).await;
    let single = single_path(&connect).await;
    const RUNS: usize = 24;
    let mut batched_leases = Vec::new();
    let mut single_leases = Vec::new();
    for _ in 0..RUNS {
        batched_leases.push(db.running_run("agent-1", 30_000).await.0);
        single_leases.push(db.running_run("agent-1", 30_000).await.0);
    }
    let before = db.ledger.group_commit_counts().expect("group commit is on");
    let batched = within(
        "the batched calls",
        join_all(
            batched_leases
                .into_iter()
                .map(|l| gated_call(&db.ledger, l)),
        ),
    )
    .await;
    let after = db.ledger.group_commit_counts().unwrap();
    let registers = after.register_batches - before.register_batches;
    let settles = after.settle_batches - before.settle_batches;
    // Every call was answered by a batch statement, none sent again alone.
    assert_eq!(after.register_items - before.register_items, RUNS as u64);
    assert_eq!(after.settle_items - before.settle_items, RUNS as u64);
    assert_eq!((after.register_alone, after.settle_alone), (0, 0));
    assert!(
        registers < RUNS as u64 && settles < RUNS as u64,
        "{RUNS} concurrent calls were sent in {registers} register and {settles} settle statements"
    );
    let alone = within(
        "the single-path calls",
        join_all(single_leases.into_iter().map(|l| gated_call(&single, l))),
    )
    .await;
    let expected = footprint(&db, alone[0]).await;
    for run_id in alone.iter().chain(&batched) {
        assert_eq!(footprint(&db, *run_id).await, expected, "run {run_id}");
    }
    assert!(db.assert_events_name_ledger_rows().await > 0);
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn a_refused_item_is_refused_alone_and_the_others_in_its_batch_are_claimed(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::with_options(pool, connect.clone(), batched_options()).await;
    let single = single_path(&connect).await;
    let (ok_a, _) = db.running_run("agent-1", 30_000).await;
    let (ok_b, _) = db.running_run("agent-1", 30_000).await;
    let (stale, _) = db.running_run("agent-1", 30_000).await;
    let (tokenless, _) = db.running_run("agent-1", 30_000).await;
    let (foreign, _) = db.running_run("agent-1", 30_000).await;
    let (conflicting, _) = db.running_run("agent-1", 30_000).await;
    // The conflicting run already holds its step with other arguments.
    db.claim(
        &conflicting,
        &intent(conflicting.run_id, "charge", json!({"amount": 1})),
        "proxy-1",
        30_000,
    )
    .await;
    let stale_claim = LeaseClaim {
        epoch: stale.epoch - 1,
        ..stale.clone()
    };
    let tokenless_claim = LeaseClaim {
        token: None,
        ..tokenless.clone()
    };
    let calls: Vec<(Option<&str>, LeaseClaim, Intent)> = vec![
        (
            None,
            ok_a.clone(),
            intent(ok_a.run_id, "charge", json!({"amount": 1})),
        ),
        (
            None,
            stale_claim,
            intent(stale.run_id, "charge", json!({"amount": 1})),
        ),
        (
            None,
            tokenless_claim,
            intent(tokenless.run_id, "charge", json!({"amount": 1})),
        ),
        (
            Some("tenant-b"),
            foreign.clone(),
            intent(foreign.run_id, "charge", json!({"amount": 1})),
        ),
        (
            None,
            conflicting.clone(),
            intent(conflicting.run_id, "charge", json!({"amount": 2})),
        ),
        (
            None,
            ok_b.clone(),
            intent(ok_b.run_id, "charge", json!({"amount": 1})),
        ),
    ];
    let answers = |ledger: Ledger| {
        let calls = calls.clone();
        async move {
            join_all(calls.iter().map(|(tenant, lease, call)| {
                let ledger = ledger.clone();
                async move {
                    ledger
                        .operation_register_claim_in(*tenant, lease, call, None, "proxy-1", 30_000)
                        .await
                        .unwrap()
                        .0
                }
            }))
            .await
        }
    };
    let before = db.ledger.group_commit_counts().unwrap();
    let batched = within("the batch", answers(db.ledger.clone())).await;
    let after = db.ledger.group_commit_counts().unwrap();
    assert!(
        after.register_batches - before.register_batches < calls.len() as u64
            && after.register_items - before.register_items == calls.len() as u64
            && after.register_alone == 0,
        "the calls were not batched: {before:?} -> {after:?}"
    );
    let kind = |outcome: &Fenced<InlineClaim>| match outcome {
        Fenced::Applied(InlineClaim::Claimed { .. }) => "claimed",
        Fenced::Applied(InlineClaim::Existing(_)) => "existing",
        Fenced::Rejected(Rejection::LeaseLost { .. }) => "lease_lost",
        Fenced::Rejected(Rejection::LeaseTokenInvalid { .. }) => "lease_token_invalid",
        Fenced::Rejected(Rejection::NotFound) => "not_found",
        Fenced::Rejected(Rejection::IntentConflict { .. }) => "intent_conflict",
        Fenced::Rejected(other) => panic!("unexpected rejection {other:?}"),
    };
    let kinds: Vec<&str> = batched.iter().map(kind).collect();
    assert_eq!(
        kinds,
        [
            "claimed",
            "lease_lost",
            "lease_token_invalid",
            "not_found",
            "intent_conflict",
            "claimed"
        ]
    );
    // The single path refuses the same calls with the same verdicts (the
    // claimed ones are now replays of in-flight calls).
    let alone = within("the single calls", answers(single)).await;
    let mut kinds_alone: Vec<&str> = alone.iter().map(kind).collect();
    kinds_alone[0] = "claimed";
    kinds_alone[5] = "claimed";
    assert_eq!(kinds_alone, kinds);
    for (batched, alone) in batched.iter().zip(&alone).skip(1).take(4) {
        assert_eq!(format!("{batched:?}"), format!("{alone:?}"));
    }
    let rows = db.row_count("tool_operations").await;
    assert_eq!(
        rows, 3,
        "the two claimed calls and the earlier conflicting one"
    );
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn the_same_step_twice_in_one_batch_is_one_operation_and_an_in_flight_answer(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::with_options(pool, connect, batched_options()).await;
    let (lease, _) = db.running_run("agent-1", 30_000).await;
    let call = intent(lease.run_id, "charge", json!({"amount": 1}));
    // A lone caller on an idle committer sends its call itself; to put the
    // two calls in one batch, another run's call goes first and waits on
    // its lease row, locked here, so that both queue behind it.
    let (blocker, _) = db.running_run("agent-2", 30_000).await;
    let blocker_call = intent(blocker.run_id, "charge", json!({"amount": 2}));
    let lock = db.hold_lease_row(blocker.run_id).await;
    let before = db.ledger.group_commit_counts().unwrap();
    let release = async {
        waiting_on_a_lock(&db, "operation_register_claim").await;
        lock.commit().await.unwrap();
    };
    let first =
        db.ledger
            .operation_register_claim(&blocker, &blocker_call, None, "proxy-1", 30_000);
    let pair = join_all((0..2).map(|_| {
        db.ledger
            .operation_register_claim(&lease, &call, None, "proxy-1", 30_000)
    }));
    let (first, answers, ()) = within("two calls of one step behind a third", async {
        tokio::join!(first, pair, release)
    })
    .await;
    let InlineClaim::Claimed {
        claim: first_claim, ..
    } = applied(first.unwrap())
    else {
        panic!("the first call is claimed");
    };
    let after = db.ledger.group_commit_counts().unwrap();
    assert_eq!(
        after.register_batches - before.register_batches,
        2,
        "the first call alone, then the two calls of one step in one batch"
    );
    let mut claims = Vec::new();
    let mut existing = Vec::new();
    for answer in answers {
        match applied(answer.unwrap()) {
            InlineClaim::Claimed { claim, .. } => claims.push(claim),
            InlineClaim::Existing(found) => existing.push(found),
        }
    }
    assert_eq!((claims.len(), existing.len()), (1, 1));
    // What the second of two concurrent single calls answers: in flight.
    assert_eq!(existing[0].status, OperationStatus::Dispatching);
    assert_eq!(existing[0].operation_id, call.operation_id);
    let rows = db.row_count("tool_operations").await;
    assert_eq!(rows, 2, "the step's one operation and the first call's");
    // Settled twice in one batch (behind the first call's settle, waiting
    // on its operation row): the second is stale evidence.
    let result = json!({"ok": 1});
    let mut lock = db.admin.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM tool_operations WHERE operation_id = $1 FOR UPDATE")
        .bind(first_claim.operation_id.as_str())
        .execute(&mut *lock)
        .await
        .unwrap();
    let before = db.ledger.group_commit_counts().unwrap();
    let release = async {
        waiting_on_a_lock(&db, "operation_settle").await;
        lock.commit().await.unwrap();
    };
    let first = db
        .ledger
        .operation_settle(&first_claim, Settlement::Succeeded, None, &result);
    let pair = join_all((0..2).map(|_| {
        db.ledger
            .operation_settle(&claims[0], Settlement::Succeeded, None, &result)
    }));
    let (first, settles, ()) = within("two settles of one claim behind a third", async {
        tokio::join!(first, pair, release)
    })
    .await;
    assert!(matches!(first.unwrap(), SettleOutcome::Settled(_)));
    let after = db.ledger.group_commit_counts().unwrap();
    assert_eq!(
        after.settle_batches - before.settle_batches,
        2,
        "the first settle alone, then the two settles of one claim in one batch"
    );
    let mut settled = 0;
    let mut evidence = 0;
    for settle in settles {
        match settle.unwrap() {
            SettleOutcome::Settled(_) => settled += 1,
            SettleOutcome::KeptAsEvidence { .. } => evidence += 1,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!((settled, evidence), (1, 1));
    let counts = db.ledger.group_commit_counts().unwrap();
    assert_eq!((counts.settle_items, counts.settle_alone), (3, 0));
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn a_batch_racing_a_takeover_never_claims_for_the_stale_holder(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::with_options(pool, connect, batched_options()).await;
    let (old, _) = db.running_run("agent-old", 30_000).await;
    let ledger = db.ledger.clone();
    let admin = db.admin.clone();
    let old_for_calls = old.clone();
    // The stale holder keeps calling new steps, in batches of 8.
    let calls = tokio::spawn(async move {
        let mut claimed = Vec::new();
        for round in 0.. {
            let answers = join_all((0..8).map(|i| {
                let ledger = ledger.clone();
                let lease = old_for_calls.clone();
                async move {
                    let call = intent(lease.run_id, &format!("step-{round}-{i}"), json!({}));
                    ledger
                        .operation_register_claim(&lease, &call, None, "proxy-old", 30_000)
                        .await
                        .unwrap()
                }
            }))
            .await;
            let mut lost = false;
            for answer in answers {
                match answer {
                    Fenced::Applied(InlineClaim::Claimed { claim, .. }) => claimed.push(claim),
                    Fenced::Rejected(Rejection::LeaseLost { .. }) => lost = true,
                    other => panic!("unexpected {other:?}"),
                }
            }
            if lost {
                return claimed;
            }
        }
        unreachable!()
    });
    // Meanwhile the lease expires and another worker takes the run over.
    common::wait_until("three rounds of the stale holder's calls", || {
        let admin = admin.clone();
        async move {
            let rows: i64 =
                sqlx::query_scalar("SELECT count(*) FROM tool_operations WHERE run_id = $1")
                    .bind(old.run_id.as_uuid())
                    .fetch_one(&admin)
                    .await
                    .unwrap();
            (rows >= 24).then_some(())
        }
    })
    .await;
    sqlx::query("UPDATE worker_leases SET expires_at = clock_timestamp() - interval '1 ms' WHERE run_id = $1")
        .bind(old.run_id.as_uuid())
        .execute(&admin)
        .await
        .unwrap();
    let new = match db
        .ledger
        .lease_acquire(old.run_id, "agent-new", 30_000)
        .await
        .unwrap()
    {
        AcquireOutcome::Acquired(grant) => grant,
        other => panic!("takeover failed: {other:?}"),
    };
    assert!(new.claim.epoch > old.epoch);
    let taken_over_at: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar("SELECT updated_at FROM worker_leases WHERE run_id = $1")
            .bind(old.run_id.as_uuid())
            .fetch_one(&admin)
            .await
            .unwrap();
    let claimed = within("the stale holder's calls", calls).await.unwrap();
    assert!(!claimed.is_empty());
    // Every claim the stale holder got was granted before the takeover.
    let late: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM tool_operations WHERE run_id = $1 AND first_dispatched_at >= $2",
    )
    .bind(old.run_id.as_uuid())
    .bind(taken_over_at)
    .fetch_one(&admin)
    .await
    .unwrap();
    assert_eq!(
        late, 0,
        "a claim was granted to the stale holder after the takeover"
    );
    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM tool_operations WHERE run_id = $1")
        .bind(old.run_id.as_uuid())
        .fetch_one(&admin)
        .await
        .unwrap();
    assert_eq!(
        count as usize,
        claimed.len(),
        "every row is a claim its caller was told of"
    );
}

/// `operation_register_claim_batch` of two items (lease, call, the digest
/// sent, claim ttl ms) on step "s": (item, error_sqlstate, outcome).
async fn batch_of_two(
    db: &TestDb,
    items: [(&LeaseClaim, &Intent, &str, i64); 2],
) -> Vec<(i32, Option<String>, String)> {
    let [(a, call_a, digest_a, ttl_a), (b, call_b, digest_b, ttl_b)] = items;
    let hash = |lease: &LeaseClaim| lease.token.as_ref().map(|t| t.sha256());
    sqlx::query_as(
        "SELECT item, error_sqlstate, outcome FROM operation_register_claim_batch(
           $1, ARRAY['agent-1', 'agent-1'], $2, $3,
           ARRAY[ROW($4, 's', 1, 't', $5, '{}'::jsonb, NULL, NULL)::operation_intent,
                 ROW($6, 's', 1, 't', $7, '{}'::jsonb, NULL, NULL)::operation_intent],
           ARRAY['proxy-1', 'proxy-1'], $8, ARRAY[NULL, NULL]::text[])
         ORDER BY item",
    )
    .bind(vec![a.run_id.as_uuid(), b.run_id.as_uuid()])
    .bind(vec![a.epoch, b.epoch])
    .bind(vec![hash(a), hash(b)])
    .bind(call_a.operation_id.as_str())
    .bind(digest_a)
    .bind(call_b.operation_id.as_str())
    .bind(digest_b)
    .bind(vec![ttl_a, ttl_b])
    .fetch_all(&db.admin)
    .await
    .unwrap()
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn an_item_that_raises_is_rolled_back_alone_and_the_batch_commits_the_others(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::with_options(pool, connect, batched_options()).await;
    let (a, _) = db.running_run("agent-1", 30_000).await;
    let (b, _) = db.running_run("agent-1", 30_000).await;
    // Item 2's claim ttl of 0 raises 22023 in operation_register_claim.
    let call_a = intent(a.run_id, "s", json!({}));
    let call_b = intent(b.run_id, "s", json!({}));
    let rows = batch_of_two(
        &db,
        [
            (&a, &call_a, call_a.request_digest.as_str(), 30_000),
            (&b, &call_b, call_b.request_digest.as_str(), 0),
        ],
    )
    .await;
    assert_eq!(
        rows,
        [
            (1, None, "claimed".to_owned()),
            (2, Some("22023".to_owned()), "item_error".to_owned())
        ]
    );
    let ops: Vec<String> = db
        .query_scalars("SELECT operation_id FROM tool_operations")
        .await;
    assert_eq!(ops, [call_a.operation_id.as_str()]);
    // The settle batch: a bad status raises for its item only.
    let (verdicts,): (Value,) = db
        .row_with(
            "CALL operation_settle_acknowledged_batch(ARRAY[$1, $1], ARRAY['proxy-1', 'proxy-1'],
           ARRAY[1, 1]::bigint[], ARRAY[$2, $2], ARRAY['bogus', 'succeeded'], ARRAY[NULL, 'r']::text[],
           ARRAY['{}', '{}']::jsonb[])",
            (call_a.operation_id.as_str(), call_a.request_digest.as_str()),
        )
        .await;
    assert_eq!(verdicts[0]["error_sqlstate"], "22023");
    assert_eq!(verdicts[1]["outcome"], "settled");
    let status: String = db.query_scalar("SELECT status FROM tool_operations").await;
    assert_eq!(status, "succeeded");

    // An item that passes every fence but breaks a table constraint (a
    // digest of the wrong shape) makes the set-based phase raise: that
    // phase is rolled back whole, every item goes through the single
    // function, and only the bad one fails.
    let (c, _) = db.running_run("agent-1", 30_000).await;
    let (d, _) = db.running_run("agent-1", 30_000).await;
    let call_c = intent(c.run_id, "s", json!({}));
    let call_d = intent(d.run_id, "s", json!({}));
    let rows = batch_of_two(
        &db,
        [
            (&c, &call_c, call_c.request_digest.as_str(), 30_000),
            (&d, &call_d, "not-a-digest", 30_000),
        ],
    )
    .await;
    assert_eq!(
        rows,
        [
            (1, None, "claimed".to_owned()),
            (2, Some("23514".to_owned()), "item_error".to_owned())
        ]
    );
    let written: Vec<(String, Option<i64>, i64)> = sqlx::query_as(
        "SELECT o.operation_id, o.claim_epoch,
                (SELECT count(*) FROM ledger_events e WHERE e.operation_id = o.operation_id)
           FROM tool_operations o WHERE o.run_id = ANY ($1) ORDER BY 1",
    )
    .bind(vec![c.run_id.as_uuid(), d.run_id.as_uuid()])
    .fetch_all(&db.admin)
    .await
    .unwrap();
    assert_eq!(
        written,
        [(call_c.operation_id.as_str().to_owned(), Some(c.epoch), 0)],
        "the good item's row under its claim (a claim writes no event), once; nothing of the bad one"
    );
    // Two settles of one claim in one batch: the first settles (set-based),
    // the repeat goes through operation_settle and is kept as evidence.
    let (verdicts,): (Value,) = db
        .row_with(
            "CALL operation_settle_acknowledged_batch(ARRAY[$1, $1], ARRAY['proxy-1', 'proxy-1'],
           ARRAY[1, 1]::bigint[], ARRAY[$2, $2], ARRAY['succeeded', 'succeeded'],
           ARRAY['r1', 'r2']::text[], ARRAY['{}', '{}']::jsonb[])",
            (call_c.operation_id.as_str(), call_c.request_digest.as_str()),
        )
        .await;
    assert_eq!(verdicts[0]["outcome"], "settled");
    assert_eq!(verdicts[0]["remote_id"], "r1");
    assert_eq!(verdicts[1]["outcome"], "stale_claim");
    let evidence: Vec<(String, Option<String>)> = db
        .rows(
            "SELECT kind, remote_id FROM operation_evidence WHERE operation_id = $1",
            call_c.operation_id.as_str(),
        )
        .await;
    assert_eq!(
        evidence,
        [("late_response".to_owned(), Some("r2".to_owned()))]
    );
    assert!(db.assert_events_name_ledger_rows().await > 0);
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn the_common_case_is_answered_set_based_and_writes_the_single_functions_rows(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::with_options(pool, connect, batched_options()).await;
    let (a, _) = db.running_run("agent-1", 30_000).await;
    let (b, _) = db.running_run("agent-1", 30_000).await;
    let (c, _) = db.running_run("agent-1", 30_000).await;
    let hash = |lease: &LeaseClaim| lease.token.as_ref().map(|t| t.sha256());
    let calls: Vec<Intent> = [&a, &b, &c]
        .iter()
        .map(|lease| intent(lease.run_id, "s", json!({"n": 1})))
        .collect();
    let mut tx = db.admin.begin().await.unwrap();
    // This transaction's own function-call counts (pg_stat_xact_user_functions).
    sqlx::query("SET LOCAL track_functions = 'pl'")
        .execute(&mut *tx)
        .await
        .unwrap();
    let batched: Vec<(i32, String)> = sqlx::query_as(
        "SELECT item, outcome FROM operation_register_claim_batch(
           $1, ARRAY['agent-1', 'agent-1'], $2, $3,
           ARRAY[ROW($4, 's', 1, 't', $5, '{\"n\": 1}'::jsonb, 'up', 'tool')::operation_intent,
                 ROW($6, 's', 1, 't', $7, '{\"n\": 1}'::jsonb, 'up', 'tool')::operation_intent],
           ARRAY['proxy-1', 'proxy-1'], ARRAY[30000, 30000]::bigint[], ARRAY[NULL, $8]::text[])
         ORDER BY item",
    )
    .bind(vec![a.run_id.as_uuid(), b.run_id.as_uuid()])
    .bind(vec![a.epoch, b.epoch])
    .bind(vec![hash(&a), hash(&b)])
    .bind(calls[0].operation_id.as_str())
    .bind(calls[0].request_digest.as_str())
    .bind(calls[1].operation_id.as_str())
    .bind(calls[1].request_digest.as_str())
    .bind(TENANT)
    .fetch_all(&mut *tx)
    .await
    .unwrap();
    assert_eq!(
        batched,
        [(1, "claimed".to_owned()), (2, "claimed".to_owned())]
    );
    let verdicts: Value = sqlx::query_scalar(
        "SELECT operation_settle_batch(ARRAY[$1, $2], ARRAY['proxy-1', 'proxy-1'], ARRAY[1, 1]::bigint[],
           ARRAY[$3, $4], ARRAY['succeeded', 'failed_final'], ARRAY['r-1', NULL]::text[],
           ARRAY['{\"ok\": true}', '{\"ok\": false}']::jsonb[])",
    )
    .bind(calls[0].operation_id.as_str())
    .bind(calls[1].operation_id.as_str())
    .bind(calls[0].request_digest.as_str())
    .bind(calls[1].request_digest.as_str())
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    assert_eq!(verdicts[0]["outcome"], "settled");
    assert_eq!(verdicts[0]["revision"], 2);
    assert_eq!(verdicts[1]["outcome"], "settled");
    assert_eq!(verdicts[1]["status"], "failed_final");
    let per_item: Vec<(String, i64)> = sqlx::query_as(
        "SELECT funcname::text, calls FROM pg_stat_xact_user_functions
          WHERE funcname IN ('operation_register_claim', 'operation_settle')",
    )
    .fetch_all(&mut *tx)
    .await
    .unwrap();
    assert_eq!(
        per_item,
        [],
        "new intents of fenced runs and live claims are answered set-based, with no per-item call"
    );
    // The reference: the same call through the single functions.
    let single: String = sqlx::query_scalar(
        "SELECT outcome FROM operation_register_claim($1, 'agent-1', $2, $3,
           ROW($4, 's', 1, 't', $5, '{\"n\": 1}'::jsonb, 'up', 'tool')::operation_intent,
           'proxy-1', 30000, NULL)",
    )
    .bind(c.run_id.as_uuid())
    .bind(c.epoch)
    .bind(hash(&c))
    .bind(calls[2].operation_id.as_str())
    .bind(calls[2].request_digest.as_str())
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    assert_eq!(single, "claimed");
    let settled: String = sqlx::query_scalar(
        "SELECT (operation_settle($1, 'proxy-1', 1, $2, 'succeeded', 'r-1', '{\"ok\": true}')).outcome",
    )
    .bind(calls[2].operation_id.as_str())
    .bind(calls[2].request_digest.as_str())
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    assert_eq!(settled, "settled");
    tx.commit().await.unwrap();

    // Everything but ids, digests and clock readings, row for row.
    let rows = |run_id: RunId| {
        let admin = db.admin.clone();
        async move {
            sqlx::query_scalar::<_, Value>(
                "SELECT jsonb_build_object(
                   'op', (SELECT to_jsonb(o) - 'operation_id' - 'run_id' - 'request_digest' - 'created_at'
                                 - 'updated_at' - 'first_dispatched_at' - 'claimed_at'
                                 || jsonb_build_object('has_claimed_at', o.claimed_at IS NOT NULL)
                            FROM tool_operations o WHERE o.run_id = $1),
                   'events', (SELECT jsonb_agg(jsonb_set(to_jsonb(e) - 'event_id' - 'at' - 'run_id' - 'operation_id',
                                                         '{detail}', (e.detail - 'dispatch_until' - 'claim')
                                                           || jsonb_build_object('has_until', e.detail ? 'dispatch_until',
                                                                                 'claim', (e.detail->'claim') - 'at',
                                                                                 'has_claim_at', e.detail->'claim'->'at' <> 'null'))
                                               ORDER BY e.event_id)
                                FROM ledger_events e WHERE e.run_id = $1 AND e.subject = 'operation'))",
            )
            .bind(run_id.as_uuid())
            .fetch_one(&admin)
            .await
            .unwrap()
        }
    };
    let reference = rows(c.run_id).await;
    assert_eq!(rows(a.run_id).await, reference);
    let mut failed = reference.clone();
    failed["op"]["status"] = json!("failed_final");
    failed["op"]["remote_id"] = Value::Null;
    failed["op"]["result"] = json!({"ok": false});
    // One event per call, the settle's, with the claim's facts.
    assert_eq!(reference["events"].as_array().map(Vec::len), Some(1));
    assert_eq!(reference["events"][0]["epoch"], json!(c.epoch));
    assert_eq!(
        reference["events"][0]["detail"],
        json!({"claim": {"dispatch_owner": "proxy-1", "worker": "agent-1", "epoch": c.epoch,
                         "dispatch_count": 1, "revision": 1, "inline": true},
               "has_claim_at": true, "has_until": false, "remote_id": "r-1"})
    );
    assert_eq!(reference["op"]["has_claimed_at"], json!(true));
    assert_eq!(reference["op"]["claim_worker"], json!("agent-1"));
    failed["events"][0]["to_status"] = json!("failed_final");
    failed["events"][0]["detail"]
        .as_object_mut()
        .unwrap()
        .remove("remote_id");
    assert_eq!(rows(b.run_id).await, failed);
}

/// What a renew answered, without times.
fn renew_kind(outcome: &Fenced<leasegate::ledger::Applied>) -> &'static str {
    match outcome {
        Fenced::Applied(_) => "applied",
        Fenced::Rejected(Rejection::LeaseLost { .. }) => "lease_lost",
        Fenced::Rejected(Rejection::LeaseTokenInvalid { fault, .. }) => match fault {
            TokenFault::Unset => "lease_token_unset",
            TokenFault::Missing | TokenFault::Wrong => "lease_token_invalid",
        },
        Fenced::Rejected(Rejection::Terminal { .. }) => "terminal",
        Fenced::Rejected(Rejection::NotFound) => "not_found",
        Fenced::Rejected(other) => panic!("unexpected rejection {other:?}"),
    }
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn concurrent_single_renews_share_a_statement_and_each_gets_the_single_renews_verdict(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::with_options(pool, connect.clone(), batched_options()).await;
    let single = single_path(&connect).await;
    let (ok_a, _) = db.running_run("agent-1", 30_000).await;
    let (ok_b, _) = db.running_run("agent-1", 30_000).await;
    let (stale, _) = db.running_run("agent-1", 30_000).await;
    let (tokenless, _) = db.running_run("agent-1", 30_000).await;
    // A running run of another tenant, renewed as this tenant's.
    let foreign = db
        .acquire(db.pending_run_in("tenant-b").await, "agent-1", 30_000)
        .await;
    applied(
        db.ledger
            .run_start(&foreign.claim, foreign.revision)
            .await
            .unwrap(),
    );
    let foreign = foreign.claim;
    let (finished, revision) = db.running_run("agent-1", 30_000).await;
    db.complete_run(&finished, revision, None).await;
    let (expired, _) = db.running_run("agent-1", 30_000).await;
    let (unset, _) = db.running_run("agent-1", 30_000).await;
    // An expired lease, and one taken before leases had tokens.
    db.execute_with(
        "UPDATE worker_leases SET expires_at = clock_timestamp() WHERE run_id = $1",
        (expired.run_id.as_uuid(),),
    )
    .await;
    db.execute_with(
        "UPDATE worker_leases SET token_sha256 = NULL WHERE run_id = $1",
        (unset.run_id.as_uuid(),),
    )
    .await;
    db.wait_lease_expired(expired.run_id).await;
    let missing = LeaseClaim {
        run_id: RunId::generate(),
        ..ok_a.clone()
    };
    // (tenant, claim, ttl): the last two have another ttl than the rest,
    // and repeat a run, so they go alone.
    let renews: Vec<(Option<&str>, LeaseClaim, i64)> = vec![
        (Some(TENANT), ok_a.clone(), 30_000),
        (
            Some(TENANT),
            LeaseClaim {
                epoch: stale.epoch - 1,
                ..stale.clone()
            },
            30_000,
        ),
        (
            Some(TENANT),
            LeaseClaim {
                token: None,
                ..tokenless.clone()
            },
            30_000,
        ),
        (Some(TENANT), foreign.clone(), 30_000),
        (Some(TENANT), finished.clone(), 30_000),
        (Some(TENANT), expired.clone(), 30_000),
        (Some(TENANT), unset.clone(), 30_000),
        (Some(TENANT), missing, 30_000),
        (Some(TENANT), ok_b.clone(), 30_000),
        (Some(TENANT), ok_b.clone(), 45_000),
        (Some(TENANT), ok_a.clone(), 30_000),
    ];
    let expected = [
        "applied",
        "lease_lost",
        "lease_token_invalid",
        "not_found",
        "terminal",
        "lease_lost",
        "lease_token_unset",
        "not_found",
        "applied",
        "applied",
        "applied",
    ];
    let refused: Vec<uuid::Uuid> = [&stale, &tokenless, &foreign, &finished, &expired, &unset]
        .iter()
        .map(|c| c.run_id.as_uuid())
        .collect();
    let refused_leases = || async {
        db.scalar::<Value>(
            "SELECT jsonb_agg(to_jsonb(l) ORDER BY run_id) FROM worker_leases l
              WHERE run_id = ANY ($1)",
            refused.clone(),
        )
        .await
    };
    let untouched = refused_leases().await;
    let before_a = db.lease_expiry(ok_a.run_id).await;
    let before_b = db.lease_expiry(ok_b.run_id).await;

    // A lone renew on an idle committer is sent by its caller; to put the
    // others in one batch, a renew of another run goes first and waits on
    // its lease row, locked here, so that they all queue behind it.
    let (blocker, _) = db.running_run("agent-2", 30_000).await;
    let lock = db.hold_lease_row(blocker.run_id).await;
    let before = db.ledger.group_commit_counts().unwrap();
    let first = db.ledger.lease_renew(&blocker, 30_000);
    let answers = |ledger: Ledger| {
        let renews = renews.clone();
        async move {
            join_all(renews.into_iter().map(|(tenant, claim, ttl)| {
                let ledger = ledger.clone();
                async move {
                    ledger
                        .lease_renew_for_tenant(&claim, ttl, tenant)
                        .await
                        .unwrap()
                }
            }))
            .await
        }
    };
    let batch = async {
        waiting_on_a_lock(&db, "lease_renew").await;
        let answers = answers(db.ledger.clone()).await;
        lock.commit().await.unwrap();
        answers
    };
    let (first, batched) = within("renews behind a blocked one", async {
        tokio::join!(first, batch)
    })
    .await;
    assert_eq!(renew_kind(&first.unwrap()), "applied");
    let after = db.ledger.group_commit_counts().unwrap();
    let kinds: Vec<&str> = batched.iter().map(renew_kind).collect();
    assert_eq!(kinds, expected);
    assert_eq!(
        (
            after.renew_batches - before.renew_batches,
            after.renew_items - before.renew_items,
            after.renew_alone - before.renew_alone,
        ),
        (2, 1 + 9, 2),
        "the blocked renew alone, then one statement for nine renews; the other ttl and \
         the repeated run sent alone"
    );
    // Nothing of a refused lease was written.
    assert_eq!(refused_leases().await, untouched);
    // The batch renewed its two leases: each answer's expiry is later than
    // the lease's before, and the one the repeated renews found.
    let Fenced::Applied(a) = &batched[0] else {
        unreachable!()
    };
    let Fenced::Applied(b) = &batched[8] else {
        unreachable!()
    };
    assert!(a.lease_expires_at > before_a && b.lease_expires_at > before_b);
    let (Fenced::Applied(b_again), Fenced::Applied(a_again)) = (&batched[9], &batched[10]) else {
        unreachable!()
    };
    assert!(b_again.lease_expires_at > b.lease_expires_at);
    assert!(a_again.lease_expires_at > a.lease_expires_at);
    assert_eq!(db.lease_expiry(ok_a.run_id).await, a_again.lease_expires_at);
    assert_eq!(db.lease_expiry(ok_b.run_id).await, b_again.lease_expires_at);
    // The single path answers the same renews with the same verdicts, and
    // the refusals with the same lease found.
    let alone = within("the single renews", answers(single)).await;
    let kinds_alone: Vec<&str> = alone.iter().map(renew_kind).collect();
    assert_eq!(kinds_alone, expected);
    for (batched, alone) in batched.iter().zip(&alone) {
        if let (Fenced::Rejected(b), Fenced::Rejected(a)) = (batched, alone) {
            assert_eq!(b, a);
        }
    }
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn a_renew_left_out_of_a_batch_lost_in_flight_is_still_sent_and_the_batchs_are_unknown(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::with_options(pool, connect, batched_options()).await;
    let (a, _) = db.running_run("agent-1", 30_000).await;
    let (b, _) = db.running_run("agent-1", 30_000).await;
    // Another ttl than the other two: left out of their statement.
    let (c, _) = db.running_run("agent-1", 30_000).await;
    let (blocker, _) = db.running_run("agent-2", 30_000).await;
    let (a_before, b_before) = (
        db.lease_expiry(a.run_id).await,
        db.lease_expiry(b.run_id).await,
    );
    // The blocker's renew waits on its lease (so the others queue behind it
    // into one batch), and the batch statement then waits on b's.
    let blocked = db.hold_lease_row(blocker.run_id).await;
    let b_locked = db.hold_lease_row(b.run_id).await;
    let first = db.ledger.lease_renew(&blocker, 30_000);
    let queued = async {
        waiting_on_a_lock(&db, "lease_renew").await;
        let renews = join_all(
            [(&a, 30_000), (&b, 30_000), (&c, 45_000)].map(|(claim, ttl)| {
                let ledger = db.ledger.clone();
                async move { ledger.lease_renew(claim, ttl).await }
            }),
        );
        let kill = async {
            // The batch statement's connection is lost while it waits.
            let pids = db.wait_lock_waiters("lease_renew_batch", 1).await;
            sqlx::query("SELECT pg_terminate_backend($1)")
                .bind(pids[0])
                .execute(&db.admin)
                .await
                .unwrap();
        };
        let (answers, ()) = tokio::join!(renews, kill);
        blocked.commit().await.unwrap();
        b_locked.commit().await.unwrap();
        answers
    };
    let (first, answers) = within("a batch lost in flight", async {
        tokio::join!(first, queued)
    })
    .await;
    assert!(matches!(first.unwrap(), Fenced::Applied(_)));
    let Ok([a_answer, b_answer, c_answer]) = <[_; 3]>::try_from(answers) else {
        unreachable!("three renews, three answers")
    };
    for answer in [a_answer, b_answer] {
        match answer {
            Err(error) => assert_eq!(
                error.delivery(),
                leasegate::ledger::Delivery::Unknown,
                "{error}"
            ),
            Ok(outcome) => panic!("a renew of the lost statement answered {outcome:?}"),
        }
    }
    // The renew left out of the statement was sent alone and renewed.
    let Fenced::Applied(renewed) = c_answer.unwrap() else {
        panic!("the left-out renew was not renewed");
    };
    assert_eq!(db.lease_expiry(c.run_id).await, renewed.lease_expires_at);
    // The lost statement committed nothing.
    assert_eq!(
        (
            db.lease_expiry(a.run_id).await,
            db.lease_expiry(b.run_id).await
        ),
        (a_before, b_before)
    );
}

/// A lone call is the single statement, sent once, whether it found the
/// committer idle (sent from its own task) or queued behind a batch in
/// flight (sent by the drainer as a batch of one): when the database
/// refuses it, its caller gets that refusal, and the statement is not sent
/// a second time.
#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn a_lone_call_the_database_refuses_is_sent_once_and_its_caller_gets_the_refusal(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::with_options(pool, connect, batched_options()).await;
    let (lease, _) = db.running_run("agent-1", 30_000).await;
    // Every insert of an operation of step "refused" counts itself (a
    // sequence is not rolled back) and is refused.
    sqlx::raw_sql(
        "CREATE SEQUENCE insert_attempts;
         GRANT USAGE ON SEQUENCE insert_attempts TO PUBLIC;
         CREATE FUNCTION refuse_operation_insert() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
           IF NEW.step_id = 'refused' THEN
             PERFORM nextval('insert_attempts');
             RAISE EXCEPTION 'operation inserts of step refused are refused by this test';
           END IF;
           RETURN NEW;
         END $$;
         CREATE TRIGGER refuse_operation_insert BEFORE INSERT ON tool_operations
           FOR EACH ROW EXECUTE FUNCTION refuse_operation_insert();",
    )
    .execute(&db.admin)
    .await
    .unwrap();
    let attempts = || async {
        db.query_scalar::<i64>(
            "SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM insert_attempts",
        )
        .await
    };
    let refused_call = intent(lease.run_id, "refused", json!({"amount": 1}));

    // Idle: the caller sends it itself.
    let before = db.ledger.group_commit_counts().unwrap();
    let error = db
        .ledger
        .operation_register_claim(&lease, &refused_call, None, "proxy-1", 30_000)
        .await
        .expect_err("the insert is refused");
    assert_refused(&error);
    assert_eq!(attempts().await, 1, "the refused statement was sent again");
    let after = db.ledger.group_commit_counts().unwrap();
    assert_eq!(after, before, "a refused lone call answers no batch");

    // Queued: another run's call is in flight, waiting on its lease row
    // (locked here), so the refused call queues and the drainer sends it
    // as a batch of one.
    let (blocker, _) = db.running_run("agent-2", 30_000).await;
    let blocker_call = intent(blocker.run_id, "charge", json!({"amount": 2}));
    let lock = db.hold_lease_row(blocker.run_id).await;
    let before = db.ledger.group_commit_counts().unwrap();
    let first =
        db.ledger
            .operation_register_claim(&blocker, &blocker_call, None, "proxy-1", 30_000);
    let queued = async {
        waiting_on_a_lock(&db, "operation_register_claim").await;
        let refused = db
            .ledger
            .operation_register_claim(&lease, &refused_call, None, "proxy-1", 30_000)
            .await;
        lock.commit().await.unwrap();
        refused
    };
    let (first, refused) = within("a refused call queued behind another", async {
        tokio::join!(first, queued)
    })
    .await;
    assert!(
        matches!(applied(first.unwrap()), InlineClaim::Claimed { .. }),
        "the call in flight is claimed"
    );
    assert_refused(&refused.expect_err("the insert is refused"));
    assert_eq!(
        attempts().await,
        2,
        "the queued refused statement was sent again"
    );
    let after = db.ledger.group_commit_counts().unwrap();
    assert_eq!(
        (
            after.register_batches - before.register_batches,
            after.register_alone - before.register_alone
        ),
        (1, 0),
        "the call in flight answered; the refused one neither answered nor sent again alone"
    );
    let operations: Vec<String> = db
        .query_scalars("SELECT step_id FROM tool_operations")
        .await;
    assert_eq!(operations, ["charge"]);
}

/// `error` is the test trigger's refusal (`P0001`), as the single path
/// reports it.
fn assert_refused(error: &leasegate::ledger::LedgerError) {
    let sqlstate = match error {
        leasegate::ledger::LedgerError::Database { source, .. } => source
            .as_database_error()
            .and_then(|e| e.code())
            .map(|code| code.into_owned()),
        other => panic!("expected the database's refusal, got {other:?}"),
    };
    assert_eq!(sqlstate.as_deref(), Some("P0001"), "{error}");
}
