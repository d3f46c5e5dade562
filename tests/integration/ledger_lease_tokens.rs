//! The SQL fence's lease token: every fenced
//! function refuses the current owner and epoch without the lease's token
//! (`lease_token_invalid`, nothing written), keeps `lease_lost` for stale
//! owners and epochs whatever token they send, stores only the token's
//! SHA-256, and refuses leases taken before migration 0005 (no token) until
//! they are taken again.

use crate::common;
use crate::common::intents;

use common::{TestDb, applied};
use leasegate::intent::Intent;
use leasegate::ledger::{
    Fenced, LeaseClaim, LeaseToken, PlannedCheckpoint, Rejection, RunId, TokenFault,
};
use serde_json::json;
use sha2::{Digest, Sha256};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

fn intent(run: RunId, step: &str, version: i32, amount: i64) -> Intent {
    intents::planned_version(
        run,
        step,
        version,
        "payments__charge",
        &json!({"amount": amount}),
    )
}

/// Everything a fenced write could change, as the superuser reads it.
async fn snapshot(db: &TestDb, run: RunId) -> (String, i64, i64, Vec<u8>) {
    let (row, events, operations, hash): (String, i64, i64, Option<Vec<u8>>) = db
        .row(
            "SELECT (SELECT row_to_json(r)::text || row_to_json(l)::text
                   FROM agent_runs r JOIN worker_leases l USING (run_id) WHERE run_id = $1),
                (SELECT count(*) FROM ledger_events WHERE run_id = $1),
                (SELECT count(*) FROM tool_operations WHERE run_id = $1),
                (SELECT token_sha256 FROM worker_leases WHERE run_id = $1)",
            run.as_uuid(),
        )
        .await;
    (row, events, operations, hash.unwrap_or_default())
}

/// Every fenced call under `claim`; the rejection each one answered.
async fn every_fenced_write(
    db: &TestDb,
    claim: &LeaseClaim,
    revision: i64,
    prepared: &Intent,
) -> Vec<(&'static str, Rejection)> {
    let l = &db.ledger;
    let run = claim.run_id;
    let fresh = intent(run, "other", 1, 7);
    let revised = intent(run, "planned", 2, 9);
    let rejection = |call: &'static str, fenced: Fenced<()>| match fenced {
        Fenced::Rejected(rejection) => (call, rejection),
        Fenced::Applied(()) => panic!("{call} applied under {claim:?}"),
    };
    fn unit<T>(fenced: Fenced<T>) -> Fenced<()> {
        match fenced {
            Fenced::Applied(_) => Fenced::Applied(()),
            Fenced::Rejected(rejection) => Fenced::Rejected(rejection),
        }
    }
    let checkpoint = json!({"forged": true});
    vec![
        rejection(
            "lease_renew",
            unit(l.lease_renew(claim, 60_000).await.unwrap()),
        ),
        rejection(
            "checkpoint_save",
            unit(
                l.checkpoint_save(claim, revision, &checkpoint)
                    .await
                    .unwrap(),
            ),
        ),
        rejection(
            "run_start",
            unit(l.run_start(claim, revision).await.unwrap()),
        ),
        rejection(
            "run_complete",
            unit(l.run_complete(claim, revision, None).await.unwrap()),
        ),
        rejection(
            "run_fail",
            unit(l.run_fail(claim, revision, &json!("x")).await.unwrap()),
        ),
        rejection(
            "operation_register",
            unit(
                l.operation_register(claim, std::slice::from_ref(&fresh), None)
                    .await
                    .unwrap(),
            ),
        ),
        rejection(
            "operation_register (with checkpoint)",
            unit(
                l.operation_register(
                    claim,
                    std::slice::from_ref(&fresh),
                    Some(PlannedCheckpoint {
                        expected_revision: revision,
                        checkpoint: &checkpoint,
                    }),
                )
                .await
                .unwrap(),
            ),
        ),
        rejection(
            "operation_register_claim",
            unit(
                l.operation_register_claim(claim, &fresh, None, "proxy-forger", 30_000)
                    .await
                    .unwrap(),
            ),
        ),
        rejection(
            "operation_supersede",
            unit(
                l.operation_supersede(claim, &prepared.operation_id, &revised)
                    .await
                    .unwrap(),
            ),
        ),
        rejection("lease_release", unit(l.lease_release(claim).await.unwrap())),
    ]
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn the_current_owner_and_epoch_without_the_token_write_nothing(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let (holder, revision) = db.running_run("holder", 60_000).await;
    let token = holder.token.clone().expect("an acquired lease has a token");
    let planned = intent(holder.run_id, "planned", 1, 5);
    applied(
        db.ledger
            .operation_register(&holder, std::slice::from_ref(&planned), None)
            .await
            .unwrap(),
    );
    let before = snapshot(&db, holder.run_id).await;
    // Only the SHA-256 of the token is stored, never the token.
    assert_eq!(before.3, Sha256::digest(token.expose().as_bytes()).to_vec());

    for (presented, fault) in [
        (None, TokenFault::Missing),
        (Some(LeaseToken::presented("lgl_forged")), TokenFault::Wrong),
        (Some(LeaseToken::generate()), TokenFault::Wrong),
        // A hash of the right token is not the token.
        (
            Some(LeaseToken::presented(&hex::encode(&before.3))),
            TokenFault::Wrong,
        ),
    ] {
        let forged = LeaseClaim {
            token: presented,
            ..holder.clone()
        };
        for (call, rejection) in every_fenced_write(&db, &forged, revision, &planned).await {
            assert_eq!(rejection.reason(), "lease_token_invalid", "{call}");
            match &rejection {
                Rejection::LeaseTokenInvalid { claim, fault: got } => {
                    assert_eq!(
                        (claim.owner.as_str(), claim.epoch),
                        ("holder", holder.epoch)
                    );
                    assert_eq!(*got, fault, "{call}");
                }
                other => panic!("{call}: {other:?}"),
            }
            let message = rejection.to_string();
            assert!(message.contains("lease token invalid"), "{message}");
            assert!(!message.contains(token.expose()), "{message}");
        }
        assert_eq!(
            snapshot(&db, holder.run_id).await,
            before,
            "nothing written"
        );
    }

    // The holder with its token still writes.
    let saved = db
        .save_checkpoint(&holder, revision, &json!({"by": "holder"}))
        .await;
    assert_eq!(saved.revision, revision + 1);
    applied(db.ledger.lease_release(&holder).await.unwrap());
    // A released lease keeps no token.
    assert!(snapshot(&db, holder.run_id).await.3.is_empty());
    // No row of the database holds the token's text.
    let found: i64 = sqlx::query_scalar(
        "SELECT (SELECT count(*) FROM ledger_events WHERE row_to_json(ledger_events)::text LIKE $1)
              + (SELECT count(*) FROM agent_runs WHERE row_to_json(agent_runs)::text LIKE $1)
              + (SELECT count(*) FROM worker_leases WHERE row_to_json(worker_leases)::text LIKE $1)
              + (SELECT count(*) FROM tool_operations WHERE row_to_json(tool_operations)::text LIKE $1)",
    )
    .bind(format!("%{}%", &token.expose()[4..]))
    .fetch_one(&db.admin)
    .await
    .unwrap();
    assert_eq!(found, 0);
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn a_stale_epoch_is_lease_lost_even_with_its_own_token(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let (old, revision) = db.running_run("old", 60_000).await;
    let planned = intent(old.run_id, "planned", 1, 5);
    applied(
        db.ledger
            .operation_register(&old, std::slice::from_ref(&planned), None)
            .await
            .unwrap(),
    );
    let new = match db
        .operator
        .lease_takeover(old.run_id, "new", 60_000)
        .await
        .unwrap()
    {
        leasegate::ledger::AcquireOutcome::Acquired(grant) => grant.claim,
        other => panic!("{other:?}"),
    };
    assert_ne!(new.token, old.token);
    let before = snapshot(&db, old.run_id).await;
    for claim in [
        old.clone(),
        // The new token with the old epoch, or the new owner with the old one's.
        LeaseClaim {
            token: new.token.clone(),
            ..old.clone()
        },
    ] {
        for (call, rejection) in every_fenced_write(&db, &claim, revision, &planned).await {
            assert!(
                matches!(rejection, Rejection::LeaseLost { .. }),
                "{call}: {rejection:?}"
            );
        }
    }
    let wrong_token_for_new = LeaseClaim {
        token: old.token.clone(),
        ..new.clone()
    };
    for (call, rejection) in every_fenced_write(&db, &wrong_token_for_new, revision, &planned).await
    {
        assert!(
            matches!(
                rejection,
                Rejection::LeaseTokenInvalid {
                    fault: TokenFault::Wrong,
                    ..
                }
            ),
            "{call}: {rejection:?}"
        );
    }
    assert_eq!(snapshot(&db, old.run_id).await, before);
    applied(db.ledger.lease_renew(&new, 60_000).await.unwrap());
}

/// Migration 0005 leaves leases held before it without a token: their
/// writes are refused (`unset`) until the lease is taken again.
#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn a_lease_from_before_lease_tokens_is_refused_until_taken_again(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let (holder, revision) = db.running_run("legacy-worker", 60_000).await;
    let planned = intent(holder.run_id, "planned", 1, 5);
    applied(
        db.ledger
            .operation_register(&holder, std::slice::from_ref(&planned), None)
            .await
            .unwrap(),
    );
    // What 0005 leaves behind for a lease taken before it.
    sqlx::query("UPDATE worker_leases SET token_sha256 = NULL WHERE run_id = $1")
        .bind(holder.run_id.as_uuid())
        .execute(&db.admin)
        .await
        .unwrap();
    let before = snapshot(&db, holder.run_id).await;
    for claim in [
        holder.clone(),
        LeaseClaim {
            token: None,
            ..holder.clone()
        },
    ] {
        for (call, rejection) in every_fenced_write(&db, &claim, revision, &planned).await {
            assert!(
                matches!(
                    rejection,
                    Rejection::LeaseTokenInvalid {
                        fault: TokenFault::Unset,
                        ..
                    }
                ),
                "{call}: {rejection:?}"
            );
            assert!(
                rejection.to_string().contains("take it over"),
                "{rejection}"
            );
        }
    }
    assert_eq!(snapshot(&db, holder.run_id).await, before);
    // Taken over (or acquired once expired), the lease has a token again.
    let taken = match db
        .operator
        .lease_takeover(holder.run_id, "legacy-worker", 60_000)
        .await
        .unwrap()
    {
        leasegate::ledger::AcquireOutcome::Acquired(grant) => grant.claim,
        other => panic!("{other:?}"),
    };
    assert_eq!(taken.epoch, holder.epoch + 1);
    db.save_checkpoint(&taken, revision, &json!({"resumed": true}))
        .await;
}
