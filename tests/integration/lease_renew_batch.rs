//! Batch lease renewal: `Ledger::lease_renew_batch`, the
//! control route `POST /v1/leases/renew` and the worker's `BatchHeartbeat`,
//! against a real PostgreSQL. Each lease of a batch is fenced like a single
//! renew and answered on its own; the lost ones have nothing written.

use crate::common;

use std::time::Duration;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use common::{TestDb, applied, wait_until};
use leasegate::control::router_for_tenant;
use leasegate::intent::IntegerPolicy;
use leasegate::ledger::{
    Fenced, LeaseClaim, LeaseToken, Ledger, MAX_RENEW_BATCH, Rejection, RunId, RunStatus,
};
use leasegate::worker::{BatchHeartbeat, HeartbeatConfig, StopCause, WorkerCancellation};
use serde_json::{Value, json};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

type Row = (
    Option<String>,
    i64,
    chrono::DateTime<chrono::Utc>,
    chrono::DateTime<chrono::Utc>,
);

/// (owner, epoch, expires_at, updated_at) of a run's lease row.
async fn lease_row(db: &TestDb, run: RunId) -> Row {
    db.row(
        "SELECT owner, epoch, expires_at, updated_at FROM worker_leases WHERE run_id = $1",
        run.as_uuid(),
    )
    .await
}

/// The control API of a process serving `tenant-a`, driven without a socket.
async fn post(ledger: &Ledger, path: &str, body: String) -> (StatusCode, Value) {
    let request = Request::builder()
        .method(Method::POST)
        .uri(path)
        .header("content-type", "application/json")
        .body(Body::from(body))
        .unwrap();
    let router = router_for_tenant(
        ledger.clone(),
        IntegerPolicy::Reject,
        Some("tenant-a".into()),
    );
    common::router::answer(router, request).await
}

fn entry(claim: &LeaseClaim) -> Value {
    json!({"run_id": claim.run_id, "owner": claim.owner, "epoch": claim.epoch,
           "lease_token": claim.token.as_ref().map(LeaseToken::expose)})
}

/// `n` runs of `tenant-a`, each leased by `owner-<i>` at epoch 1 for a
/// minute with the token `lgl_test_<prefix>_<i>`, made in one statement as
/// the superuser (10,000 acquires one by one would test the loop, not the
/// batch).
async fn many_leases(db: &TestDb, prefix: &str, n: i64) -> Vec<LeaseClaim> {
    let rows: Vec<(uuid::Uuid, i64)> = sqlx::query_as(
        "WITH g AS (SELECT i, gen_random_uuid() AS run_id FROM generate_series(1, $2::bigint) i),
              t AS (INSERT INTO agent_tasks (tenant_id, task_id)
                    SELECT 'tenant-a', $1 || '-' || i FROM g),
              r AS (INSERT INTO agent_runs (run_id, tenant_id, task_id, attempt, status)
                    SELECT run_id, 'tenant-a', $1 || '-' || i, 1, 'running' FROM g)
         INSERT INTO worker_leases (run_id, owner, epoch, expires_at, token_sha256)
         SELECT run_id, 'owner-' || i, 1, clock_timestamp() + interval '1 minute',
                sha256(convert_to('lgl_test_' || $1 || '_' || i, 'UTF8'))
           FROM g RETURNING run_id, (substring(owner FROM 7))::bigint",
    )
    .bind(prefix)
    .bind(n)
    .fetch_all(&db.admin)
    .await
    .expect("insert leases");
    rows.into_iter()
        .map(|(run, i)| LeaseClaim {
            run_id: RunId::from_uuid(run),
            owner: format!("owner-{i}"),
            epoch: 1,
            token: Some(LeaseToken::presented(&format!("lgl_test_{prefix}_{i}"))),
        })
        .collect()
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn a_batch_renews_the_held_leases_and_reports_each_lost_one_with_nothing_written_for_it(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let (held_a, _) = db.running_run("w-a", 30_000).await;
    let (held_b, _) = db.running_run("w-b", 30_000).await;
    // A stale epoch: the claim the worker had before someone else took over.
    let (current, _) = db.running_run("w-c", 30_000).await;
    let taken = db
        .operator
        .lease_takeover(current.run_id, "w-c2", 30_000)
        .await
        .unwrap();
    assert!(matches!(
        taken,
        leasegate::ledger::AcquireOutcome::Acquired(_)
    ));
    let stale = current.clone();
    // The current owner and epoch with a wrong token, and with none.
    let (genuine, _) = db.running_run("w-d", 30_000).await;
    let forged = LeaseClaim {
        token: Some(LeaseToken::presented("lgl_forged")),
        ..genuine.clone()
    };
    let (genuine_e, _) = db.running_run("w-e", 30_000).await;
    let tokenless = LeaseClaim {
        token: None,
        ..genuine_e.clone()
    };
    // A run an operator cancelled.
    let (cancelled, _) = db.running_run("w-f", 30_000).await;
    db.operator_cancels(cancelled.run_id, "ops", Some("stop"))
        .await;
    // Another tenant's run, with its genuine lease.
    let other_run = db.pending_run_in("tenant-b").await;
    let other = db.acquire(other_run, "w-g", 30_000).await.claim;
    // A run that does not exist.
    let ghost = LeaseClaim {
        run_id: RunId::generate(),
        owner: "w-h".into(),
        epoch: 1,
        token: Some(LeaseToken::generate()),
    };

    let untouched = [
        stale.run_id,
        forged.run_id,
        tokenless.run_id,
        cancelled.run_id,
        other.run_id,
    ];
    let mut before = Vec::new();
    for run in untouched {
        before.push(lease_row(&db, run).await);
    }
    let held_before = lease_row(&db, held_a.run_id).await;
    let events_before = db.row_count("ledger_events").await;

    let claims = [
        &held_a, &stale, &forged, &tokenless, &cancelled, &other, &ghost, &held_b,
    ];
    let body =
        json!({"ttl_ms": 120_000, "leases": claims.iter().map(|c| entry(c)).collect::<Vec<_>>()});
    let (status, answer) = post(&db.ledger, "/v1/leases/renew", body.to_string()).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["renewed"], 2, "{answer}");
    assert_eq!(answer["lost"], 6, "{answer}");
    let leases = answer["leases"].as_array().unwrap();
    // In the order given, each with its own verdict.
    let got: Vec<(String, &str, &str)> = leases
        .iter()
        .map(|l| {
            (
                l["run_id"].as_str().unwrap().to_owned(),
                l["outcome"].as_str().unwrap(),
                l["code"].as_str().unwrap_or(""),
            )
        })
        .collect();
    let want = [
        (held_a.run_id, "renewed", ""),
        (stale.run_id, "lost", "lease_lost"),
        (forged.run_id, "lost", "lease_token_invalid"),
        (tokenless.run_id, "lost", "lease_token_invalid"),
        (cancelled.run_id, "lost", "terminal_run"),
        (other.run_id, "lost", "not_found"),
        (ghost.run_id, "lost", "not_found"),
        (held_b.run_id, "renewed", ""),
    ];
    for ((run, outcome, code), (got_run, got_outcome, got_code)) in want.iter().zip(&got) {
        assert_eq!(
            (run.to_string().as_str(), *outcome, *code),
            (got_run.as_str(), *got_outcome, *got_code)
        );
    }
    assert_eq!(leases[1]["detail"]["found"]["epoch"], 2, "{}", leases[1]);
    assert_eq!(leases[2]["detail"]["fault"], "wrong");
    assert_eq!(leases[3]["detail"]["fault"], "missing");
    assert_eq!(leases[4]["detail"]["run_status"], "cancelled");
    // Another tenant's lease is answered like a ghost: nothing of it shown.
    assert_eq!(leases[5].get("detail"), None, "{}", leases[5]);
    assert_eq!(leases[5]["message"], leases[6]["message"]);
    // No token in the answer.
    for claim in claims {
        if let Some(token) = &claim.token {
            assert!(!answer.to_string().contains(token.expose()));
        }
    }

    // The renewed rows carry the answered expiry, two minutes out.
    let held_after = lease_row(&db, held_a.run_id).await;
    assert!(held_after.2 > held_before.2 + chrono::Duration::seconds(60));
    let answered: chrono::DateTime<chrono::Utc> =
        serde_json::from_value(leases[0]["expires_at"].clone()).unwrap();
    assert_eq!(answered, held_after.2);
    assert_eq!((held_after.0.as_deref(), held_after.1), (Some("w-a"), 1));
    // Nothing written for the lost ones, no event for anyone (a renewal,
    // single or batched, records none).
    for (run, row) in untouched.iter().zip(before) {
        assert_eq!(lease_row(&db, *run).await, row, "lease of {run} changed");
    }
    assert_eq!(db.row_count("ledger_events").await, events_before);

    // The ledger call with no tenant (a worker's own) reaches any tenant's
    // lease; an expired lease is lost, never resurrected.
    let answers = db
        .ledger
        .lease_renew_batch(&[other.clone(), held_b.clone()], 200, None)
        .await
        .unwrap();
    assert!(
        answers
            .iter()
            .all(|a| matches!(a.outcome, Fenced::Applied(_))),
        "{answers:?}"
    );
    db.wait_lease_expired(held_b.run_id).await;
    let answers = db
        .ledger
        .lease_renew_batch(&[held_b.clone(), held_a.clone()], 30_000, None)
        .await
        .unwrap();
    assert!(
        matches!(
            answers[0].outcome,
            Fenced::Rejected(Rejection::LeaseLost { .. })
        ),
        "{answers:?}"
    );
    assert!(
        matches!(answers[1].outcome, Fenced::Applied(_)),
        "{answers:?}"
    );
    assert!(lease_row(&db, held_b.run_id).await.2 <= chrono::Utc::now());
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn ten_thousand_leases_renew_in_one_call_and_bad_batches_write_nothing(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let claims = many_leases(&db, "big", MAX_RENEW_BATCH as i64).await;
    let max_before: chrono::DateTime<chrono::Utc> = db
        .query_scalar("SELECT max(expires_at) FROM worker_leases")
        .await;
    let body = json!({"ttl_ms": 300_000, "leases": claims.iter().map(entry).collect::<Vec<_>>()});
    let text = body.to_string();
    assert!(
        text.len() > leasegate::control::MAX_BODY_BYTES,
        "the batch route takes larger bodies"
    );
    let (status, answer) = post(&db.ledger, "/v1/leases/renew", text).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "{}",
        &answer.to_string()[..500.min(answer.to_string().len())]
    );
    assert_eq!(answer["renewed"], 10_000);
    assert_eq!(answer["lost"], 0);
    let renewed: i64 = db
        .scalar(
            "SELECT count(*) FROM worker_leases WHERE expires_at > $1",
            max_before,
        )
        .await;
    assert_eq!(renewed, 10_000);

    let snapshot = || async {
        db
            .query_scalar::<String>(
                "SELECT md5(string_agg(run_id::text || expires_at::text || updated_at::text, ',' ORDER BY run_id))
               FROM worker_leases",
            )
            .await
    };
    let before = snapshot().await;

    // One lease over the cap: 413, nothing written.
    let mut over: Vec<Value> = claims.iter().map(entry).collect();
    over.push(
        json!({"run_id": RunId::generate(), "owner": "x", "epoch": 1, "lease_token": "lgl_x"}),
    );
    let (status, error) = post(
        &db.ledger,
        "/v1/leases/renew",
        json!({"ttl_ms": 300_000, "leases": over}).to_string(),
    )
    .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{error}");
    assert_eq!(error["code"], "body_too_large");
    assert_eq!(error["detail"]["max_leases"], 10_000);
    assert_eq!(error["detail"]["found"], 10_001);

    // A run named twice, a malformed run id, a malformed owner, a bad ttl:
    // 422 naming the entry, nothing written (the valid entries included).
    let dup = json!({"ttl_ms": 300_000, "leases": [entry(&claims[0]), entry(&claims[1]), entry(&claims[0])]});
    let (status, error) = post(&db.ledger, "/v1/leases/renew", dup.to_string()).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{error}");
    assert_eq!(error["code"], "invalid_input");
    assert_eq!(error["detail"]["index"], 2);
    assert!(
        error["message"].as_str().unwrap().contains("leases[2]"),
        "{error}"
    );

    let bad_id = json!({"ttl_ms": 300_000, "leases": [entry(&claims[0]),
        {"run_id": "not-a-uuid", "owner": "o", "epoch": 1, "lease_token": "lgl_x"}]});
    let (status, error) = post(&db.ledger, "/v1/leases/renew", bad_id.to_string()).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{error}");
    assert_eq!(error["code"], "invalid_run_id");
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .starts_with("leases[1].run_id"),
        "{error}"
    );

    let bad_owner = json!({"ttl_ms": 300_000, "leases": [entry(&claims[0]),
        {"run_id": RunId::generate(), "owner": "two words", "epoch": 1, "lease_token": "lgl_x"}]});
    let (status, error) = post(&db.ledger, "/v1/leases/renew", bad_owner.to_string()).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{error}");
    assert_eq!(error["code"], "invalid_input");
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .starts_with("leases[1].owner"),
        "{error}"
    );

    let bad_ttl = json!({"ttl_ms": 0, "leases": [entry(&claims[0])]});
    let (status, error) = post(&db.ledger, "/v1/leases/renew", bad_ttl.to_string()).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{error}");
    assert_eq!(error["code"], "invalid_ttl");

    assert_eq!(snapshot().await, before, "a refused batch wrote nothing");

    // The SQL function refuses what the Rust layer never sends.
    let refused = sqlx::query(
        "SELECT * FROM lease_renew_batch(ARRAY[$1, $1]::uuid[], ARRAY['a','a'], ARRAY[1,1]::bigint[],
                                         ARRAY[NULL, NULL]::bytea[], 1000, NULL)",
    )
    .bind(claims[0].run_id.as_uuid())
    .execute(&db.admin)
    .await
    .unwrap_err();
    assert!(refused.to_string().contains("appears twice"), "{refused}");
    assert_eq!(snapshot().await, before);
}

/// The outcome of each lease of `claims`, in the order given, from
/// `lease_renew_batch` called on `conn`.
async fn renew_outcomes(conn: &mut sqlx::PgConnection, claims: &[LeaseClaim]) -> Vec<String> {
    sqlx::query_scalar("SELECT outcome FROM lease_renew_batch($1, $2, $3, $4, 60000, NULL)")
        .bind(
            claims
                .iter()
                .map(|c| c.run_id.as_uuid())
                .collect::<Vec<_>>(),
        )
        .bind(claims.iter().map(|c| c.owner.clone()).collect::<Vec<_>>())
        .bind(claims.iter().map(|c| c.epoch).collect::<Vec<_>>())
        .bind(
            claims
                .iter()
                .map(|c| c.token.as_ref().map(LeaseToken::sha256))
                .collect::<Vec<_>>(),
        )
        .fetch_all(conn)
        .await
        .unwrap()
}

/// Cancels `run` in a transaction left open (the cancel holds the run's
/// lease row), starts `renew`, commits the cancel once a statement LIKE
/// `waiting_statement` waits on a lock, and returns what `renew` answered.
async fn renew_racing_a_cancel<T: Send + 'static>(
    db: &TestDb,
    run: RunId,
    waiting_statement: &str,
    renew: impl std::future::Future<Output = T> + Send + 'static,
) -> T {
    let mut cancel = db.admin.begin().await.unwrap();
    let cancelled: String =
        sqlx::query_scalar("SELECT outcome FROM run_cancel($1, 'operator-1', 'race')")
            .bind(run.as_uuid())
            .fetch_one(&mut *cancel)
            .await
            .unwrap();
    assert_eq!(cancelled, "applied");
    let renew = tokio::spawn(renew);
    wait_until("the renew to wait for the cancelled run's lease row", || async {
        let waiting: i64 = db
            .scalar(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE $1",
                waiting_statement,
            )
            .await;
        (waiting > 0).then_some(())
    })
    .await;
    cancel.commit().await.unwrap();
    tokio::time::timeout(Duration::from_secs(30), renew)
        .await
        .expect("the renew finishes once the cancel commits")
        .unwrap()
}

/// A run cancelled while the batch waits for that run's lease row (the
/// cancel holds it FOR UPDATE, as every status change of a run does) is
/// answered `terminal` and its lease is not written, exactly as a single
/// renew queued behind the cancel; the batch's other leases are renewed.
/// (A batch that judged runs from a view taken before it had its locks
/// would renew this lease and answer `applied`.)
#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn a_run_cancelled_while_the_batch_waits_for_its_lease_is_answered_terminal_and_not_renewed(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let claims = many_leases(&db, "race", 3).await;
    let mut conn = db.admin.acquire().await.unwrap().detach();
    assert_eq!(
        renew_outcomes(&mut conn, &claims).await,
        ["applied", "applied", "applied"]
    );

    let victim = claims[1].run_id;
    let before = lease_row(&db, victim).await;
    let claims_sent = claims.clone();
    let outcomes = renew_racing_a_cancel(&db, victim, "%lease_renew_batch(%", async move {
        renew_outcomes(&mut conn, &claims_sent).await
    })
    .await;
    assert_eq!(outcomes, ["applied", "terminal", "applied"]);
    let after = lease_row(&db, victim).await;
    assert_eq!(
        (after.2, after.3),
        (before.2, before.3),
        "the cancelled run's lease keeps its expiry and was not written"
    );
    let status: String = db
        .scalar(
            "SELECT status FROM agent_runs WHERE run_id = $1",
            victim.as_uuid(),
        )
        .await;
    assert_eq!(status, "cancelled");
}

/// The same race for the single renew (`lease_renew` judges the run's
/// status in a statement of its own, after it holds the lease row): a run
/// cancelled while the renew waits for its lease row is answered
/// `Terminal` and its lease is not written. (A renew that read the run in
/// the statement that waited for the lock would see it from before the
/// cancel and renew it.)
#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn a_run_cancelled_while_a_single_renew_waits_for_its_lease_is_answered_terminal_and_not_renewed(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let claims = many_leases(&db, "race-one", 1).await;
    let claim = claims[0].clone();
    applied(db.ledger.lease_renew(&claim, 60_000).await.unwrap());
    let before = lease_row(&db, claim.run_id).await;
    let ledger = db.ledger.clone();
    let claim_sent = claim.clone();
    let answer = renew_racing_a_cancel(&db, claim.run_id, "%FROM lease_renew($1%", async move {
        ledger.lease_renew(&claim_sent, 60_000).await.unwrap()
    })
    .await;
    assert!(
        matches!(answer, Fenced::Rejected(Rejection::Terminal { .. })),
        "{answer:?}"
    );
    assert_eq!(
        lease_row(&db, claim.run_id).await,
        before,
        "the cancelled run's lease was not written"
    );
}

/// The single renew scoped to a tenant (the control API's renew route: the
/// tenant check rides in the renew's statement) answers another tenant's
/// run `NotFound`, as a run that does not exist, and writes nothing; its
/// own tenant's renew applies.
#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn a_single_renew_scoped_to_another_tenant_is_not_found_and_writes_nothing(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let claims = many_leases(&db, "scope", 1).await;
    let before = lease_row(&db, claims[0].run_id).await;
    let other = db
        .ledger
        .lease_renew_for_tenant(&claims[0], 60_000, Some("tenant-b"))
        .await
        .unwrap();
    assert_eq!(other, Fenced::Rejected(Rejection::NotFound));
    assert_eq!(lease_row(&db, claims[0].run_id).await, before);
    let own = db
        .ledger
        .lease_renew_for_tenant(&claims[0], 60_000, Some("tenant-a"))
        .await
        .unwrap();
    let renewed = applied(own);
    assert!(renewed.lease_expires_at > before.2);
    assert_eq!(
        lease_row(&db, claims[0].run_id).await.2,
        renewed.lease_expires_at
    );
}

const FAST: HeartbeatConfig = HeartbeatConfig {
    ttl_ms: 3_000,
    interval: Duration::from_millis(100),
    renew_timeout: Duration::from_millis(1_000),
};

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn the_batch_heartbeat_renews_every_lease_and_stops_only_the_holders_that_lost_theirs(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let heartbeat = BatchHeartbeat::spawn(db.ledger.clone(), FAST).unwrap();
    let mut held = Vec::new();
    for i in 0..4 {
        let (claim, _) = db.running_run(&format!("host-1/{i}"), FAST.ttl_ms).await;
        let cancel = WorkerCancellation::new();
        heartbeat.add(claim.clone(), cancel.clone());
        held.push((claim, cancel));
    }
    assert_eq!(heartbeat.len(), 4);
    let granted: Vec<_> = {
        let mut v = Vec::new();
        for (claim, _) in &held {
            v.push(lease_row(&db, claim.run_id).await.2);
        }
        v
    };
    wait_until("every lease renewed by a batch", || async {
        for ((claim, _), granted) in held.iter().zip(&granted) {
            if lease_row(&db, claim.run_id).await.2 <= *granted {
                return None;
            }
        }
        Some(())
    })
    .await;
    assert!(held.iter().all(|(_, cancel)| !cancel.is_cancelled()));

    // Lease 0 taken over by another host, run 1 cancelled by an operator,
    // lease 3's holder stops on its own.
    let _ = db
        .operator
        .lease_takeover(held[0].0.run_id, "host-2", 30_000)
        .await
        .unwrap();
    db.operator_cancels(held[1].0.run_id, "ops", None).await;
    held[3].1.cancel_with(StopCause::Stopped("done".into()));

    wait_until(
        "the taken-over and the cancelled holders stopped",
        || async { (held[0].1.is_cancelled() && held[1].1.is_cancelled()).then_some(()) },
    )
    .await;
    assert!(
        matches!(
            held[0].1.cause(),
            Some(StopCause::LeaseLost(Rejection::LeaseLost { .. }))
        ),
        "{:?}",
        held[0].1.cause()
    );
    assert_eq!(
        held[1].1.cause(),
        Some(&StopCause::RunTerminal(RunStatus::Cancelled))
    );
    assert!(matches!(held[3].1.cause(), Some(StopCause::Stopped(_))));
    wait_until("only lease 2 left in the set", || async {
        (heartbeat.len() == 1).then_some(())
    })
    .await;

    // Lease 2 keeps being renewed, its holder running.
    let seen = lease_row(&db, held[2].0.run_id).await.2;
    wait_until("lease 2 renewed again", || async {
        (lease_row(&db, held[2].0.run_id).await.2 > seen).then_some(())
    })
    .await;
    assert!(!held[2].1.is_cancelled());
    // The stopped holder's lease is no longer renewed: it lapses.
    db.wait_lease_expired(held[3].0.run_id).await;
    // The taken-over lease belongs to host-2 at epoch 2, untouched by host-1.
    let row = lease_row(&db, held[0].0.run_id).await;
    assert_eq!((row.0.as_deref(), row.1), (Some("host-2"), 2));
    heartbeat.stop().await;
}
