//! The operations ledger against a real PostgreSQL: registration under the
//! lease, conflicts on every path, claims, settlement, unknown outcomes and
//! evidence, cancellation and retries (seed 8–9, experiments E, F, G at the
//! ledger level).

use crate::common;
use crate::common::intents;
use crate::common::operator::alice_resolves;

use std::collections::HashMap;

use common::{TestDb, applied, wait_until, within};
use leasegate::intent::{IntegerPolicy, Intent};
use leasegate::ledger::{
    Converge, ConvergeEvidence, ConvergeOutcome, DispatchClaim, Fenced, InlineClaim, LeaseClaim,
    LedgerOptions, MarkUnknown, MarkUnknownOutcome, OperationStatus, PlannedCheckpoint, Rejection,
    ResendVerdict, RunCreateOutcome, RunId, RunStatus, SettleOutcome, Settlement, StaleReason,
    SupersedeOutcome, UnknownBy, UnknownCause,
};
use serde_json::{Value, json};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

const TENANT: &str = "tenant-a";

fn intent(run_id: RunId, step: &str, arguments: Value) -> Intent {
    intents::planned(run_id, step, "payments__charge", &arguments)
}

async fn claim_inline(
    db: &TestDb,
    lease: &LeaseClaim,
    intent: &Intent,
    ttl_ms: i64,
) -> DispatchClaim {
    db.claim(lease, intent, "proxy-1", ttl_ms).await
}

async fn op_row(db: &TestDb, intent: &Intent) -> (String, i64, i32, Option<String>) {
    db
        .row(
            "SELECT status, revision, dispatch_count, remote_id FROM tool_operations WHERE operation_id = $1",
            intent.operation_id.as_str(),
        )
        .await
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn inline_call_is_claimed_settled_and_then_replayed_without_a_new_claim(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let (lease, _) = db.running_run("agent-1", 30_000).await;
    let charge = intent(
        lease.run_id,
        "charge",
        json!({"amount": 500, "currency": "eur"}),
    );

    let claim = claim_inline(&db, &lease, &charge, 30_000).await;
    assert_eq!(
        (claim.dispatch_owner.as_str(), claim.revision),
        ("proxy-1", 1)
    );
    // In flight, the claim wrote no event: the row is its record, and the
    // fate query reads who, which epoch and which dispatch from it.
    let in_flight = db.operation_view(&charge.operation_id).await;
    assert!(in_flight.events.is_empty(), "{:?}", in_flight.events);
    let facts = |c: &leasegate::ledger::OperationClaim| {
        (
            c.dispatch_owner.clone(),
            c.worker.clone(),
            c.epoch,
            c.dispatch_count,
            c.revision,
            c.ended.clone(),
        )
    };
    // Who, for whom, which epoch, which dispatch, under which revision, how it ended.
    let expected = |ended: Option<&str>| {
        vec![(
            Some("proxy-1".to_owned()),
            Some("agent-1".to_owned()),
            Some(lease.epoch),
            Some(1),
            Some(1),
            ended.map(str::to_owned),
        )]
    };
    assert_eq!(
        in_flight.claims.iter().map(facts).collect::<Vec<_>>(),
        expected(None)
    );
    let claimed_at = in_flight.claims[0].at.expect("claimed at");
    let settled = match db
        .settle_succeeded(
            &claim,
            Some("ch_1"),
            &json!({"content": [{"type": "text", "text": "ok"}]}),
        )
        .await
    {
        SettleOutcome::Settled(record) => record,
        other => panic!("expected settled, got {other:?}"),
    };
    assert_eq!(
        (settled.status, settled.remote_id.as_deref()),
        (OperationStatus::Succeeded, Some("ch_1"))
    );

    // The agent retries the same call: the recorded result, no new claim.
    let again = intent(
        lease.run_id,
        "charge",
        json!({"currency": "eur", "amount": 500.0}),
    );
    match applied(
        db.ledger
            .operation_register_claim(&lease, &again, None, "proxy-2", 30_000)
            .await
            .unwrap(),
    ) {
        InlineClaim::Existing(record) => {
            assert_eq!(record.status, OperationStatus::Succeeded);
            assert_eq!(
                record.result,
                Some(json!({"content": [{"type": "text", "text": "ok"}]}))
            );
        }
        other => panic!("expected a replay, got {other:?}"),
    }
    assert_eq!(
        op_row(&db, &charge).await,
        ("succeeded".into(), 2, 1, Some("ch_1".into()))
    );

    let view = db.operation_view(&charge.operation_id).await;
    let history: Vec<(Option<&str>, &str, &str)> = view
        .events
        .iter()
        .map(|e| {
            (
                e.from_status.as_deref(),
                e.to_status.as_str(),
                e.actor_kind.as_str(),
            )
        })
        .collect();
    assert_eq!(
        history,
        // An inline call is registered and claimed in one row (its
        // 'prepared' state never existed outside that transaction) and
        // writes one event, the settle's, which carries the claim's facts.
        vec![(Some("dispatching"), "succeeded", "dispatcher")]
    );
    let settle = &view.events[0];
    assert_eq!(
        (settle.actor.as_deref(), settle.epoch, settle.revision),
        (Some("proxy-1"), Some(lease.epoch), Some(2))
    );
    assert_eq!(settle.detail["remote_id"], "ch_1");
    assert_eq!(
        view.claims.iter().map(facts).collect::<Vec<_>>(),
        expected(Some("succeeded"))
    );
    assert_eq!(view.claims[0].at, Some(claimed_at));
    assert_eq!(view.claims[0].ended_by_event, Some(settle.event_id));
    assert!(claimed_at <= settle.at);
    assert_eq!(view.request_body, json!({"amount": 500, "currency": "eur"}));
    assert!(view.evidence.is_empty());
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn intent_conflict_is_detected_whatever_the_existing_operation_status(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;

    // One operation per status, each in its own run.
    let mut originals = Vec::new();
    for status in OperationStatus::ALL {
        let (lease, original, _) = operation_in(&db, status).await;
        originals.push((status, lease, original));
    }

    for (status, lease, original) in &originals {
        let changed = intent(lease.run_id, &original.step_id, json!({"amount": 999}));
        assert_eq!(
            changed.operation_id, original.operation_id,
            "same step, same identity"
        );
        let before = (
            op_row(&db, original).await,
            db.row_count("tool_operations").await,
            db.event_count(lease.run_id).await,
        );
        let expected = Rejection::IntentConflict {
            operation_id: original.operation_id.clone(),
            expected_digest: Some(changed.request_digest.clone()),
            found_digest: original.request_digest.clone(),
            found_tool: "payments__charge".into(),
            found_step: original.step_id.clone(),
            found_effect_version: 1,
        };
        // The inline path ...
        let inline = db
            .ledger
            .operation_register_claim(lease, &changed, None, "proxy-9", 30_000)
            .await
            .unwrap();
        assert_eq!(
            inline,
            Fenced::Rejected(expected.clone()),
            "inline, existing {status}"
        );
        // ... and the planning path, with another intent that must not be written either.
        let bystander = intent(lease.run_id, &format!("bystander-{status}"), json!({}));
        let planned = db
            .ledger
            .operation_register(lease, &[bystander.clone(), changed.clone()], None)
            .await
            .unwrap();
        assert_eq!(
            planned,
            Fenced::Rejected(expected),
            "planned, existing {status}"
        );
        assert_eq!(
            (
                op_row(&db, original).await,
                db.row_count("tool_operations").await,
                db.event_count(lease.run_id).await
            ),
            before,
            "nothing written for {status}"
        );
        assert!(
            db.ledger
                .operation_get(&bystander.operation_id)
                .await
                .unwrap()
                .is_none()
        );
    }
}

/// The id an earlier leasegate gave (run, step, version): all 16 bytes from
/// the tuple (`leasegate/operation/v1`), no run prefix.
fn v1_operation_id(run_id: RunId, step: &str) -> String {
    use sha2::Digest;
    let input = json!([
        "leasegate/operation/v1",
        TENANT,
        run_id.to_string(),
        step,
        1
    ]);
    let bytes = leasegate::intent::canonical_bytes(&input, IntegerPolicy::Reject).unwrap();
    let hash = sha2::Sha256::digest(&bytes);
    uuid::Uuid::new_v8(hash[..16].try_into().unwrap()).to_string()
}

/// Operations an earlier leasegate stored (before operation ids carried
/// their run's prefix) are found by (run, step, version) and keep their
/// stored id: a replay, a claim of a planned one, a plan and a conflict all
/// answer with it, and nothing is written twice.
#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn operations_stored_under_the_earlier_id_shape_keep_their_ids(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let (lease, _) = db.running_run("agent-1", 60_000).await;
    let settled = intent(lease.run_id, "charge", json!({"amount": 1}));
    let planned = intent(lease.run_id, "refund", json!({"amount": 1}));
    let (settled_v1, planned_v1) = (
        v1_operation_id(lease.run_id, "charge"),
        v1_operation_id(lease.run_id, "refund"),
    );
    assert_ne!(settled_v1, settled.operation_id.as_str());
    for (intent, id, status) in [
        (&settled, &settled_v1, "succeeded"),
        (&planned, &planned_v1, "prepared"),
    ] {
        sqlx::query(
            "INSERT INTO tool_operations (operation_id, run_id, step_id, effect_version, tool_name,
                                          request_digest, request_body, status, result, revision)
             VALUES ($1, $2, $3, 1, 'payments__charge', $4, '{\"amount\": 1}', $5,
                     CASE WHEN $5 = 'succeeded' THEN '{\"ok\": true}'::jsonb END,
                     CASE WHEN $5 = 'succeeded' THEN 2 ELSE 0 END)",
        )
        .bind(id)
        .bind(lease.run_id.as_uuid())
        .bind(&intent.step_id)
        .bind(intent.request_digest.as_str())
        .bind(status)
        .execute(&db.admin)
        .await
        .unwrap();
    }
    let count = db.row_count("tool_operations").await;

    // A replay of the settled one: its stored result, under its stored id.
    match applied(
        db.ledger
            .operation_register_claim(&lease, &settled, None, "proxy-1", 30_000)
            .await
            .unwrap(),
    ) {
        InlineClaim::Existing(record) => {
            assert_eq!(record.operation_id.as_str(), settled_v1);
            assert_eq!(record.status, OperationStatus::Succeeded);
            assert_eq!(record.result, Some(json!({"ok": true})));
        }
        other => panic!("expected a replay, got {other:?}"),
    }
    // Planning both again: found, not registered anew.
    let again = applied(
        db.ledger
            .operation_register(&lease, &[settled.clone(), planned.clone()], None)
            .await
            .unwrap(),
    );
    let ids: Vec<(&str, bool)> = again
        .iter()
        .map(|r| (r.operation.operation_id.as_str(), r.newly_registered))
        .collect();
    assert_eq!(
        ids,
        [(settled_v1.as_str(), false), (planned_v1.as_str(), false)]
    );
    // The planned one is claimed under its stored id (the id the upstream
    // sees) and settles there.
    let claim = claim_inline(&db, &lease, &planned, 30_000).await;
    assert_eq!(claim.operation_id.as_str(), planned_v1);
    match db.settle_succeeded(&claim, Some("re_1"), &json!({})).await {
        SettleOutcome::Settled(record) => assert_eq!(record.operation_id.as_str(), planned_v1),
        other => panic!("expected settled, got {other:?}"),
    }
    // A changed request for the same step is still a conflict, named by the stored id.
    let changed = intent(lease.run_id, "charge", json!({"amount": 2}));
    match db
        .ledger
        .operation_register_claim(&lease, &changed, None, "proxy-1", 30_000)
        .await
        .unwrap()
    {
        Fenced::Rejected(Rejection::IntentConflict { operation_id, .. }) => {
            assert_eq!(operation_id.as_str(), settled_v1)
        }
        other => panic!("expected a conflict, got {other:?}"),
    }
    assert_eq!(
        db.row_count("tool_operations").await,
        count,
        "no second row for either intent"
    );
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn sixteen_concurrent_claimers_claim_each_of_a_thousand_intents_exactly_once(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let options = LedgerOptions {
        max_connections: 16,
        ..LedgerOptions::default()
    };
    let db = TestDb::with_options(pool, connect, options).await;
    let (lease, _) = db.running_run("planner", 30_000).await;
    let intents: Vec<Intent> = (0..1_000)
        .map(|i| intent(lease.run_id, &format!("step-{i}"), json!({"i": i})))
        .collect();
    let registered = applied(
        db.ledger
            .operation_register(&lease, &intents, None)
            .await
            .unwrap(),
    );
    assert!(
        registered
            .iter()
            .all(|r| r.newly_registered && r.operation.status == OperationStatus::Prepared)
    );

    let claimers: Vec<_> = (0..16)
        .map(|n| {
            let ledger = db.ledger.clone();
            tokio::spawn(async move {
                let owner = format!("dispatcher-{n}");
                let mut mine = Vec::new();
                loop {
                    let batch = ledger
                        .operation_claim(&owner, 60_000, 7, None, &[])
                        .await
                        .unwrap();
                    if batch.is_empty() {
                        return (owner, mine);
                    }
                    assert!(batch.len() <= 7, "a claim never takes more than its limit");
                    for claimed in batch {
                        assert_eq!(claimed.claim.dispatch_owner, owner);
                        mine.push(claimed.operation.operation_id);
                    }
                }
            })
        })
        .collect();
    let mut claimed_by = HashMap::new();
    for claimer in claimers {
        let (owner, ids) = within("a claimer to drain the queue", claimer)
            .await
            .unwrap();
        for id in ids {
            assert!(
                claimed_by.insert(id.clone(), owner.clone()).is_none(),
                "{id} claimed twice"
            );
        }
    }
    assert_eq!(claimed_by.len(), 1_000);
    let rows: Vec<(String, String, i32, String)> = db
        .query_rows(
            "SELECT operation_id, status, dispatch_count, dispatch_owner FROM tool_operations",
        )
        .await;
    assert_eq!(rows.len(), 1_000);
    for (id, status, count, owner) in rows {
        assert_eq!((status.as_str(), count), ("dispatching", 1), "{id}");
        assert_eq!(
            claimed_by.get(&leasegate::intent::OperationId::from_string(id)),
            Some(&owner)
        );
    }
    // A claim writes no event; its facts are on the row, once per claim.
    let (claim_events, claims_on_rows): (i64, i64) = db
        .query_row(
            "SELECT (SELECT count(*) FROM ledger_events WHERE subject = 'operation'
                       AND to_status = 'dispatching'),
                    (SELECT count(*) FROM tool_operations WHERE claimed_at IS NOT NULL
                       AND claim_epoch IS NULL AND claim_worker IS NULL)",
        )
        .await;
    assert_eq!((claim_events, claims_on_rows), (0, 1_000));
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn acceptance_e_late_success_after_claim_expiry_is_evidence_until_converged(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let (lease, _) = db.running_run("agent-1", 30_000).await;
    let create = intent(lease.run_id, "create-vm", json!({"size": "small"}));
    let claim = claim_inline(&db, &lease, &create, 300).await;

    // The reconciler may not touch a live claim.
    assert!(matches!(
        db.ledger
            .operation_mark_unknown(MarkUnknown {
                claim: &claim,
                by: UnknownBy::Reconciler,
                actor: "reconciler-1",
                cause: UnknownCause::TimedOut,
                evidence: &json!({})
            })
            .await
            .unwrap(),
        MarkUnknownOutcome::ClaimStillLive(_)
    ));
    wait_until("the claim to expire on the database clock", || async {
        let expired: bool = db
            .scalar(
                "SELECT dispatch_until <= clock_timestamp() FROM tool_operations WHERE operation_id = $1",
                create.operation_id.as_str(),
            )
            .await;
        expired.then_some(())
    })
    .await;
    let unknown = match db
        .ledger
        .operation_mark_unknown(MarkUnknown {
            claim: &claim,
            by: UnknownBy::Reconciler,
            actor: "reconciler-1",
            cause: UnknownCause::TimedOut,
            evidence: &json!({"reason": "claim expired"}),
        })
        .await
        .unwrap()
    {
        MarkUnknownOutcome::MarkedUnknown { operation, .. } => operation,
        other => panic!("expected unknown, got {other:?}"),
    };
    assert_eq!(
        (unknown.status, unknown.dispatch_owner.clone()),
        (OperationStatus::Unknown, None)
    );

    // The remote success arrives late, under the expired claim.
    match db
        .settle_succeeded(&claim, Some("vm-42"), &json!({"id": "vm-42"}))
        .await
    {
        SettleOutcome::KeptAsEvidence { reason, found, .. } => {
            assert_eq!(reason, StaleReason::StaleClaim);
            assert_eq!(found.status, OperationStatus::Unknown);
        }
        other => panic!("a late response must not settle, got {other:?}"),
    }
    assert_eq!(
        op_row(&db, &create).await,
        ("unknown".into(), unknown.revision, 1, None)
    );
    // Nor may the expired claim give up what it no longer holds.
    assert!(matches!(
        db.holder_marks_unknown(&claim, UnknownCause::TimedOut, &json!({}))
            .await,
        MarkUnknownOutcome::StaleClaim(_)
    ));

    // A query of the remote by operation id converges it, in the hands of
    // the reconciler that claimed it.
    let claimed = db
        .ledger
        .operation_reconcile_claim("reconciler-1", 60_000, 10, None)
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1);
    let converged = match db
        .ledger
        .operation_converge(Converge {
            operation_id: &create.operation_id,
            expected_revision: claimed[0].operation.revision,
            settlement: Settlement::Succeeded,
            remote_id: Some("vm-42"),
            result: Some(&json!({"id": "vm-42"})),
            kind: ConvergeEvidence::QueryResult,
            actor: "reconciler-1",
            note: None,
            evidence: &json!({"queried": "GET /vms?operation_id"}),
        })
        .await
        .unwrap()
    {
        ConvergeOutcome::Converged { operation, .. } => operation,
        other => panic!("expected converged, got {other:?}"),
    };
    assert_eq!(
        (converged.status, converged.remote_id.as_deref()),
        (OperationStatus::Succeeded, Some("vm-42"))
    );

    let view = db.operation_view(&create.operation_id).await;
    let kinds: Vec<(&str, Option<&str>, Option<&str>)> = view
        .evidence
        .iter()
        .map(|e| {
            (
                e.kind.as_str(),
                e.outcome.as_deref(),
                e.remote_id.as_deref(),
            )
        })
        .collect();
    assert_eq!(
        kinds,
        vec![
            ("timeout", Some("unknown"), None),
            ("late_response", Some("succeeded"), Some("vm-42")),
            ("query_result", Some("succeeded"), Some("vm-42")),
        ]
    );
    let statuses: Vec<&str> = view.events.iter().map(|e| e.to_status.as_str()).collect();
    assert_eq!(statuses, vec!["unknown", "succeeded"]);
    // The claim that lapsed is told by the event that ended it.
    let lapsed = &view.claims[..];
    assert_eq!(lapsed.len(), 1, "{lapsed:?}");
    assert_eq!(
        (
            lapsed[0].epoch,
            lapsed[0].dispatch_count,
            lapsed[0].ended.as_deref(),
            lapsed[0].ended_by_event
        ),
        (
            Some(lease.epoch),
            Some(1),
            Some("unknown"),
            Some(view.events[0].event_id)
        )
    );
    assert_eq!(view.events[0].epoch, Some(lease.epoch));
    // The run itself was never advanced by any of this.
    let (status, _, _, _, _) = db.run_row(lease.run_id).await;
    assert_eq!(status, "running");
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn acceptance_f_cancel_stops_prepared_intents_and_keeps_in_flight_ones(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let (lease, _) = db.running_run("agent-1", 30_000).await;
    let prepared = intent(lease.run_id, "prepared", json!({}));
    let dispatching = intent(lease.run_id, "dispatching", json!({}));
    let unknown = intent(lease.run_id, "unknown", json!({}));
    applied(
        db.ledger
            .operation_register(&lease, std::slice::from_ref(&prepared), None)
            .await
            .unwrap(),
    );
    claim_inline(&db, &lease, &dispatching, 30_000).await;
    let claim = claim_inline(&db, &lease, &unknown, 30_000).await;
    db.holder_marks_unknown(&claim, UnknownCause::SendError, &json!({"error": "reset"}))
        .await;

    db.operator_cancels(lease.run_id, "ops@example", Some("stop"))
        .await;

    assert_eq!(op_row(&db, &prepared).await.0, "cancelled");
    assert_eq!(
        op_row(&db, &dispatching).await.0,
        "dispatching",
        "in flight: not claimed unexecuted"
    );
    assert_eq!(op_row(&db, &unknown).await.0, "unknown");
    assert!(
        db.ledger
            .operation_claim("dispatcher", 30_000, 100, None, &[])
            .await
            .unwrap()
            .is_empty(),
        "nothing claimable"
    );
    assert_eq!(
        db.ledger
            .operation_register_claim(
                &lease,
                &intent(lease.run_id, "late", json!({})),
                None,
                "proxy-1",
                30_000
            )
            .await
            .unwrap(),
        Fenced::Rejected(Rejection::Terminal {
            status: RunStatus::Cancelled
        })
    );
    let cancelled = db
        .ledger
        .operations_list(lease.run_id, Some(OperationStatus::Cancelled))
        .await
        .unwrap();
    assert_eq!(
        cancelled
            .iter()
            .map(|o| &o.operation_id)
            .collect::<Vec<_>>(),
        vec![&prepared.operation_id]
    );
    let view = db.operation_view(&prepared.operation_id).await;
    let last = view.events.last().unwrap();
    assert_eq!(
        (last.to_status.as_str(), last.actor.as_deref()),
        ("cancelled", Some("ops@example"))
    );
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn acceptance_g_old_run_operations_and_late_responses_cannot_advance_the_retry(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let first = RunId::generate();
    db.ledger
        .run_create(first, TENANT, "nightly-invoice", None)
        .await
        .unwrap();
    let old = db.acquire(first, "worker-old", 30_000).await;
    let revision = applied(db.ledger.run_start(&old.claim, old.revision).await.unwrap()).revision;
    let old_intent = intent(first, "send-invoice", json!({"to": "c@x"}));
    let old_claim = claim_inline(&db, &old.claim, &old_intent, 30_000).await;
    applied(
        db.ledger
            .run_fail(&old.claim, revision, &json!("gateway down"))
            .await
            .unwrap(),
    );

    let second = RunId::generate();
    assert!(matches!(
        db.ledger
            .run_create(second, TENANT, "nightly-invoice", None)
            .await
            .unwrap(),
        RunCreateOutcome::Created(_)
    ));
    let new = db.acquire(second, "worker-new", 30_000).await;
    let new_revision =
        applied(db.ledger.run_start(&new.claim, new.revision).await.unwrap()).revision;
    let new_intent = intent(second, "send-invoice", json!({"to": "c@x"}));
    assert_ne!(
        new_intent.operation_id, old_intent.operation_id,
        "a new run has new operation ids"
    );
    applied(
        db.ledger
            .operation_register(&new.claim, std::slice::from_ref(&new_intent), None)
            .await
            .unwrap(),
    );
    let new_state = (
        db.run_row(second).await,
        db.event_count(second).await,
        op_row(&db, &new_intent).await,
    );

    // The old run's late response records the old run's fact only.
    assert!(matches!(
        db.settle_succeeded(&old_claim, Some("inv-1"), &json!({})).await,
        SettleOutcome::Settled(record) if record.run_id == first
    ));
    // The old worker, aiming at the new run, is not its lease holder.
    let stray = LeaseClaim {
        run_id: second,
        ..old.claim.clone()
    };
    let stray_intent = intent(second, "send-invoice-again", json!({}));
    assert!(matches!(
        db.ledger
            .operation_register_claim(&stray, &stray_intent, None, "proxy-old", 30_000)
            .await
            .unwrap(),
        Fenced::Rejected(Rejection::LeaseLost { .. })
    ));
    assert!(matches!(
        db.ledger
            .checkpoint_save(&stray, new_revision, &json!({"from": "old"}))
            .await
            .unwrap(),
        Fenced::Rejected(Rejection::LeaseLost { .. })
    ));
    assert_eq!(
        (
            db.run_row(second).await,
            db.event_count(second).await,
            op_row(&db, &new_intent).await
        ),
        new_state,
        "the new run is untouched"
    );
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn stale_owner_cannot_register_intents_after_takeover(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let (old, _) = db.running_run("old", 200).await;
    db.wait_lease_expired(old.run_id).await;
    let new = db.acquire(old.run_id, "new", 30_000).await;
    let planned = intent(old.run_id, "charge", json!({"amount": 1}));

    for outcome in [
        db.ledger
            .operation_register(&old, std::slice::from_ref(&planned), None)
            .await
            .unwrap()
            .map_applied(),
        db.ledger
            .operation_register_claim(&old, &planned, None, "proxy", 30_000)
            .await
            .unwrap()
            .map_applied(),
    ] {
        match outcome {
            Some(Rejection::LeaseLost { found, .. }) => {
                assert_eq!(
                    (found.owner.as_deref(), found.epoch),
                    (Some("new"), new.claim.epoch)
                )
            }
            other => panic!("expected lease lost, got {other:?}"),
        }
    }
    assert_eq!(db.row_count("tool_operations").await, 0);
}

trait RejectionOf {
    fn map_applied(self) -> Option<Rejection>;
}

impl<T> RejectionOf for Fenced<T> {
    fn map_applied(self) -> Option<Rejection> {
        self.into_result().err()
    }
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn planned_step_commits_intents_and_checkpoint_together_or_not_at_all(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let (lease, revision) = db.running_run("planner", 30_000).await;
    let a = intent(lease.run_id, "a", json!({"n": 1}));
    let b = intent(lease.run_id, "b", json!({"n": 2}));
    let plan = json!({"next": ["a", "b"]});

    // A stale revision: neither checkpoint nor intents.
    let stale = db
        .ledger
        .operation_register(
            &lease,
            &[a.clone(), b.clone()],
            Some(PlannedCheckpoint {
                expected_revision: revision + 7,
                checkpoint: &plan,
            }),
        )
        .await
        .unwrap();
    assert_eq!(
        stale,
        Fenced::Rejected(Rejection::Conflict {
            expected_revision: revision + 7,
            found: revision
        })
    );
    assert_eq!(db.row_count("tool_operations").await, 0);

    let registered = applied(
        db.ledger
            .operation_register(
                &lease,
                &[a.clone(), b.clone()],
                Some(PlannedCheckpoint {
                    expected_revision: revision,
                    checkpoint: &plan,
                }),
            )
            .await
            .unwrap(),
    );
    assert_eq!(registered.len(), 2);
    let (_, stored_revision, checkpoint, _, _) = db.run_row(lease.run_id).await;
    assert_eq!((stored_revision, checkpoint), (revision + 1, plan.clone()));

    // A takeover worker resumes the same plan: same ids, nothing new.
    let replay = applied(
        db.ledger
            .operation_register(&lease, &[a.clone(), b.clone()], None)
            .await
            .unwrap(),
    );
    assert!(replay.iter().all(|r| !r.newly_registered));
    assert_eq!(db.row_count("tool_operations").await, 2);

    // The dispatcher can now claim them.
    let claimed = db
        .ledger
        .operation_claim("dispatcher", 30_000, 10, None, &[])
        .await
        .unwrap();
    let mut ids: Vec<_> = claimed
        .iter()
        .map(|c| c.operation.operation_id.clone())
        .collect();
    ids.sort();
    let mut expected = vec![a.operation_id.clone(), b.operation_id.clone()];
    expected.sort();
    assert_eq!(ids, expected);
    assert_eq!(
        claimed[0].request_body,
        json!({"n": if claimed[0].operation.operation_id == a.operation_id { 1 } else { 2 }})
    );
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn changing_a_planned_intent_keeps_the_old_one_for_audit(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let (lease, _) = db.running_run("planner", 30_000).await;
    let original = intent(lease.run_id, "email", json!({"to": "a@x"}));
    applied(
        db.ledger
            .operation_register(&lease, std::slice::from_ref(&original), None)
            .await
            .unwrap(),
    );
    let revised = original
        .revise(
            TENANT,
            lease.run_id,
            "payments__charge",
            &json!({"to": "b@x"}),
            IntegerPolicy::Reject,
        )
        .unwrap();
    let new = match applied(
        db.ledger
            .operation_supersede(&lease, &original.operation_id, &revised)
            .await
            .unwrap(),
    ) {
        SupersedeOutcome::Superseded(record) => record,
        other => panic!("expected superseded, got {other:?}"),
    };
    assert_eq!(
        (new.effect_version, new.status),
        (2, OperationStatus::Prepared)
    );
    let old = db.operation_view(&original.operation_id).await;
    assert_eq!(old.operation.status, OperationStatus::Cancelled);
    assert_eq!(old.superseded_by.as_ref(), Some(&revised.operation_id));
    let claimed = db
        .ledger
        .operation_claim("dispatcher", 30_000, 10, None, &[])
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].operation.operation_id, revised.operation_id);

    // Once claimed, a plan can no longer change.
    let third = revised
        .revise(
            TENANT,
            lease.run_id,
            "payments__charge",
            &json!({"to": "c@x"}),
            IntegerPolicy::Reject,
        )
        .unwrap();
    assert!(matches!(
        applied(db.ledger.operation_supersede(&lease, &revised.operation_id, &third).await.unwrap()),
        SupersedeOutcome::NotChangeable(record) if record.status == OperationStatus::Dispatching
    ));
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn in_flight_intent_is_not_claimed_twice_and_failures_are_recorded_final(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let (lease, _) = db.running_run("agent", 30_000).await;
    let send = intent(lease.run_id, "send", json!({"to": "x"}));
    let claim = claim_inline(&db, &lease, &send, 30_000).await;
    match applied(
        db.ledger
            .operation_register_claim(&lease, &send, None, "proxy-2", 30_000)
            .await
            .unwrap(),
    ) {
        InlineClaim::Existing(record) => {
            assert_eq!(
                (record.status, record.dispatch_owner.as_deref()),
                (OperationStatus::Dispatching, Some("proxy-1"))
            )
        }
        other => panic!("expected the in-flight operation, got {other:?}"),
    }
    // A response for another request than the recorded one settles nothing.
    let mut wrong = claim.clone();
    wrong.request_digest = intent(lease.run_id, "send", json!({"to": "y"})).request_digest;
    assert!(matches!(
        db.settle_succeeded(&wrong, None, &json!({})).await,
        SettleOutcome::KeptAsEvidence {
            reason: StaleReason::DigestMismatch,
            ..
        }
    ));
    // The tool answered isError: a final failure, replayed later.
    assert!(matches!(
        db.ledger.operation_settle(&claim, Settlement::FailedFinal, None, &json!({"isError": true})).await.unwrap(),
        SettleOutcome::Settled(record) if record.status == OperationStatus::FailedFinal
    ));
    assert_eq!(
        op_row(&db, &send).await,
        ("failed_final".into(), 2, 1, None)
    );
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn operator_resolves_only_unknown_operations_once_with_a_note(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let (lease, _) = db.running_run("agent", 30_000).await;
    let wire = intent(lease.run_id, "wire", json!({"amount": 10}));
    let claim = claim_inline(&db, &lease, &wire, 30_000).await;
    let unknown = match db
        .holder_marks_unknown(&claim, UnknownCause::TimedOut, &json!({}))
        .await
    {
        MarkUnknownOutcome::MarkedUnknown { operation, .. } => operation,
        other => panic!("{other:?}"),
    };
    let summary = db.ledger.operations_unknown_summary().await.unwrap();
    assert_eq!(
        (summary.count, summary.oldest_operation_id.as_ref()),
        (1, Some(&wire.operation_id))
    );
    assert!(summary.oldest_age_seconds.unwrap() >= 0.0);

    let resolve = |revision| {
        let ledger = db.operator.clone();
        let id = wire.operation_id.clone();
        async move {
            ledger
                .operation_converge(alice_resolves(
                    &id,
                    revision,
                    Settlement::FailedFinal,
                    None,
                    Some("bank says never received"),
                ))
                .await
        }
    };
    let no_note = db
        .operator
        .operation_converge(alice_resolves(
            &wire.operation_id,
            unknown.revision,
            Settlement::FailedFinal,
            None,
            Some("  "),
        ))
        .await;
    assert_eq!(
        no_note.unwrap_err().to_string(),
        "an operator resolution needs a note"
    );
    assert!(matches!(
        resolve(unknown.revision + 5).await.unwrap(),
        ConvergeOutcome::Conflict { .. }
    ));
    assert!(
        matches!(resolve(unknown.revision).await.unwrap(), ConvergeOutcome::Converged { operation, .. } if operation.status == OperationStatus::FailedFinal)
    );
    assert!(
        matches!(
            resolve(unknown.revision + 1).await.unwrap(),
            ConvergeOutcome::NotUnknown(_)
        ),
        "a second resolution is refused"
    );
    let view = db.operation_view(&wire.operation_id).await;
    let last = view.events.last().unwrap();
    assert_eq!(
        (last.actor_kind.as_str(), last.actor.as_deref()),
        ("operator", Some("alice"))
    );
    assert_eq!(last.detail["note"], "bank says never received");
    assert_eq!(
        db.ledger.operations_unknown_summary().await.unwrap().count,
        0
    );
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn database_operation_status_values_equal_the_rust_enum(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let (definition, in_database) = db.status_constraint("tool_operations").await;
    let mut in_rust: Vec<&str> = OperationStatus::ALL.iter().map(|s| s.as_str()).collect();
    in_rust.sort();
    assert_eq!(in_database, in_rust, "from {definition}");
}

/// What can happen to an operation, as the ledger's functions do it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Event {
    Claim,
    Settle(Settlement),
    MarkUnknown,
    ReleaseUnsent,
    /// The reconciler hands a not-found operation back to the dispatcher.
    Resend,
    Converge(Settlement),
    CancelRun,
    Supersede,
}

/// Puts a fresh operation of its own run into `status`; returns the run's
/// lease, the intent and the claim it was dispatched under (if it was).
async fn operation_in(
    db: &TestDb,
    status: OperationStatus,
) -> (LeaseClaim, Intent, Option<DispatchClaim>) {
    let (lease, _) = db.running_run("agent-1", 60_000).await;
    let original = intent(lease.run_id, "step", json!({"amount": 1}));
    let mut claim = None;
    match status {
        OperationStatus::Prepared | OperationStatus::Cancelled => {
            applied(
                db.ledger
                    .operation_register(&lease, std::slice::from_ref(&original), None)
                    .await
                    .unwrap(),
            );
            if status == OperationStatus::Cancelled {
                let revised = original
                    .revise(
                        TENANT,
                        lease.run_id,
                        "payments__charge",
                        &json!({"amount": 2}),
                        IntegerPolicy::Reject,
                    )
                    .unwrap();
                applied(
                    db.ledger
                        .operation_supersede(&lease, &original.operation_id, &revised)
                        .await
                        .unwrap(),
                );
            }
        }
        _ => {
            let held = claim_inline(db, &lease, &original, 60_000).await;
            match status {
                OperationStatus::Dispatching => {}
                OperationStatus::Unknown => {
                    db.holder_marks_unknown(&held, UnknownCause::TimedOut, &json!({}))
                        .await;
                }
                OperationStatus::Succeeded => {
                    db.settle_succeeded(&held, None, &json!({})).await;
                }
                OperationStatus::FailedFinal => {
                    db.ledger
                        .operation_settle(&held, Settlement::FailedFinal, None, &json!({}))
                        .await
                        .unwrap();
                }
                _ => unreachable!(),
            }
            claim = Some(held);
        }
    }
    assert_eq!(op_row(db, &original).await.0, status.as_str());
    (lease, original, claim)
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn every_operation_transition_in_the_database_follows_the_state_model(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    use OperationStatus::*;
    let db = TestDb::new(pool, connect).await;
    // The seed's state model (9.3); every pair not listed leaves the status
    // as it was. Only a proof that nothing was sent (release, or the tool's own
    // "not found" past the settle delay: resend) returns to prepared.
    let moves = [
        (Prepared, Event::Claim, Dispatching),
        (Dispatching, Event::Settle(Settlement::Succeeded), Succeeded),
        (
            Dispatching,
            Event::Settle(Settlement::FailedFinal),
            FailedFinal,
        ),
        (Dispatching, Event::MarkUnknown, Unknown),
        (Dispatching, Event::ReleaseUnsent, Prepared),
        (Unknown, Event::Resend, Prepared),
        (Unknown, Event::Converge(Settlement::Succeeded), Succeeded),
        (
            Unknown,
            Event::Converge(Settlement::FailedFinal),
            FailedFinal,
        ),
        (Prepared, Event::CancelRun, Cancelled),
        (Prepared, Event::Supersede, Cancelled),
    ];
    let events = [
        Event::Claim,
        Event::Settle(Settlement::Succeeded),
        Event::Settle(Settlement::FailedFinal),
        Event::MarkUnknown,
        Event::ReleaseUnsent,
        Event::Resend,
        Event::Converge(Settlement::Succeeded),
        Event::Converge(Settlement::FailedFinal),
        Event::CancelRun,
        Event::Supersede,
    ];
    for from in OperationStatus::ALL {
        for event in events {
            let (lease, original, claim) = operation_in(&db, from).await;
            let record = db.operation_view(&original.operation_id).await.operation;
            // A claim that is not this operation's live one, for events on
            // operations that were never dispatched.
            let claim = claim.unwrap_or(DispatchClaim {
                operation_id: original.operation_id.clone(),
                dispatch_owner: "proxy-1".into(),
                revision: record.revision,
                until: chrono::Utc::now(),
                request_digest: original.request_digest.clone(),
            });
            match event {
                Event::Claim => {
                    let _ = db
                        .ledger
                        .operation_register_claim(&lease, &original, None, "proxy-2", 60_000)
                        .await
                        .unwrap();
                }
                Event::Settle(settlement) => {
                    db.ledger
                        .operation_settle(&claim, settlement, None, &json!({}))
                        .await
                        .unwrap();
                }
                Event::MarkUnknown => {
                    db.holder_marks_unknown(&claim, UnknownCause::SendError, &json!({}))
                        .await;
                }
                Event::ReleaseUnsent => {
                    db.ledger
                        .operation_release_unsent(&claim, &json!({"error": "connection refused"}))
                        .await
                        .unwrap();
                }
                Event::Resend => {
                    // Under a reconcile claim when it can be claimed (unknown),
                    // else with the row as read: a stale claim.
                    let claimed = db
                        .ledger
                        .operation_reconcile_claim("reconciler-1", 60_000, 1000, None)
                        .await
                        .unwrap()
                        .into_iter()
                        .find(|item| item.operation.operation_id == original.operation_id)
                        .map_or(record.clone(), |item| item.operation);
                    let _ = db
                        .ledger
                        .operation_reconcile_resend(
                            &claimed,
                            "reconciler-1",
                            0,
                            5,
                            &json!({"found": false}),
                        )
                        .await
                        .unwrap();
                }
                Event::Converge(settlement) => {
                    db.operator
                        .operation_converge(alice_resolves(
                            &original.operation_id,
                            record.revision,
                            settlement,
                            None,
                            Some("checked by hand"),
                        ))
                        .await
                        .unwrap();
                }
                Event::CancelRun => {
                    db.operator_cancels(lease.run_id, "alice", None).await;
                }
                Event::Supersede => {
                    let revised = original
                        .revise(
                            TENANT,
                            lease.run_id,
                            "payments__charge",
                            &json!({"amount": 3}),
                            IntegerPolicy::Reject,
                        )
                        .unwrap();
                    let _ = db
                        .ledger
                        .operation_supersede(&lease, &original.operation_id, &revised)
                        .await
                        .unwrap();
                }
            }
            let expected = moves
                .iter()
                .find(|(f, e, _)| *f == from && *e == event)
                .map_or(from, |(_, _, to)| *to);
            assert_eq!(
                op_row(&db, &original).await.0,
                expected.as_str(),
                "{from} + {event:?}"
            );
        }
    }
    // Every transition's event names its run and operation (no foreign
    // keys hold that since migrations/0011; the functions do).
    assert!(db.assert_events_name_ledger_rows().await > 0);
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn a_not_found_operation_is_sent_again_only_after_the_settle_delay_within_budget_under_the_claim(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let (_, original, _) = operation_in(&db, OperationStatus::Unknown).await;
    let claim = |owner: &'static str| {
        let ledger = db.ledger.clone();
        async move {
            ledger
                .operation_reconcile_claim(owner, 60_000, 10, None)
                .await
                .unwrap()
                .into_iter()
                .next()
                .map(|item| item.operation)
        }
    };
    let evidence = json!({"query_tool": "get_bucket", "found": false});
    let held = claim("reconciler-1").await.expect("the unknown operation");
    // Sent moments ago: a first request may still land.
    assert_eq!(
        db.ledger
            .operation_reconcile_resend(&held, "reconciler-1", 3_600_000, 5, &evidence)
            .await
            .unwrap(),
        ResendVerdict::Settling
    );
    // No budget left.
    assert_eq!(
        db.ledger
            .operation_reconcile_resend(&held, "reconciler-1", 0, 0, &evidence)
            .await
            .unwrap(),
        ResendVerdict::BudgetSpent
    );
    // Not the claim's owner, or a revision the claim moved past.
    assert_eq!(
        db.ledger
            .operation_reconcile_resend(&held, "reconciler-2", 0, 5, &evidence)
            .await
            .unwrap(),
        ResendVerdict::StaleClaim
    );
    let moved = leasegate::ledger::OperationRecord {
        revision: held.revision - 1,
        ..held.clone()
    };
    assert_eq!(
        db.ledger
            .operation_reconcile_resend(&moved, "reconciler-1", 0, 5, &evidence)
            .await
            .unwrap(),
        ResendVerdict::StaleClaim
    );
    assert_eq!(
        op_row(&db, &original).await.0,
        "unknown",
        "nothing moved yet"
    );

    assert_eq!(
        db.ledger
            .operation_reconcile_resend(&held, "reconciler-1", 0, 5, &evidence)
            .await
            .unwrap(),
        ResendVerdict::Resent
    );
    assert_eq!(op_row(&db, &original).await.0, "prepared");
    let view = db.operation_view(&original.operation_id).await;
    let last = view.events.last().unwrap();
    assert_eq!(
        (
            last.from_status.as_deref(),
            last.to_status.as_str(),
            last.actor_kind.as_str()
        ),
        (Some("unknown"), "prepared", "reconciler")
    );
    let kept: (String, Option<String>, Value) = db
        .row(
            "SELECT kind, outcome, body FROM operation_evidence WHERE operation_id = $1 \
         ORDER BY evidence_id DESC LIMIT 1",
            original.operation_id.as_str(),
        )
        .await;
    assert_eq!(
        (kept.0.as_str(), kept.1.as_deref()),
        ("query_result", Some("not_sent"))
    );
    assert_eq!(kept.2["query_tool"], "get_bucket");
    // The dispatcher sends it again under the same operation id, counted.
    let claimed = db
        .ledger
        .operation_claim("dispatcher-1", 60_000, 10, None, &[])
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].claim.operation_id, original.operation_id);
    let attempts: (i32, i32) = db
        .row(
            "SELECT reconcile_attempts, dispatch_count FROM tool_operations WHERE operation_id = $1",
            original.operation_id.as_str(),
        )
        .await;
    assert_eq!(attempts, (1, 2), "one resend counted, sent twice in all");
}

/// The hot path's round trips carry what used to cost extra ones: the run's
/// tenant is judged by `operation_register_claim` itself (another tenant's
/// run is not found, nothing written), the settle commits and then reads
/// where the WAL stands (at or beyond its own commit), and a replay reads it
/// after the recorded row.
#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn hot_path_judges_the_tenant_and_samples_the_wal_in_its_own_statements(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let (lease, _) = db.running_run("agent-1", 30_000).await;
    let charge = intent(lease.run_id, "charge", json!({"amount": 7}));
    let events_before = db.event_count(lease.run_id).await;

    // Another tenant's proxy: not found, and nothing written.
    let (outcome, sampled) = db
        .ledger
        .operation_register_claim_in(Some("tenant-b"), &lease, &charge, None, "proxy-b", 30_000)
        .await
        .unwrap();
    assert!(
        matches!(outcome, Fenced::Rejected(Rejection::NotFound)),
        "{outcome:?}"
    );
    assert_eq!(sampled, None);
    assert_eq!(db.row_count("tool_operations").await, 0);
    assert_eq!(db.event_count(lease.run_id).await, events_before);

    // Its own tenant: claimed (no position: nothing acknowledged yet).
    let (outcome, sampled) = db
        .ledger
        .operation_register_claim_in(Some(TENANT), &lease, &charge, None, "proxy-1", 30_000)
        .await
        .unwrap();
    let InlineClaim::Claimed { claim, .. } = applied(outcome) else {
        panic!("expected a claim");
    };
    assert_eq!(sampled, None);

    let lsn = |sql: &'static str| {
        let admin = db.admin.clone();
        async move {
            sqlx::query_scalar::<_, i64>(sql)
                .fetch_one(&admin)
                .await
                .unwrap() as u64
        }
    };
    let before = lsn("SELECT (pg_current_wal_insert_lsn() - '0/0'::pg_lsn)::bigint").await;
    let (settled, position) = db
        .ledger
        .operation_settle_acknowledged(
            &claim,
            Settlement::Succeeded,
            Some("ch_7"),
            &json!({"ok": 1}),
        )
        .await
        .unwrap();
    assert!(
        matches!(settled, SettleOutcome::Settled(ref record)
        if record.status == OperationStatus::Succeeded && record.result == Some(json!({"ok": 1}))),
        "{settled:?}"
    );
    let position = position.expect("the settle reads the WAL position after its commit");
    // Read after the settle's writes and commit: past everything inserted
    // before the call, and no further than the WAL reached after it.
    assert!(position.lsn.0 > before, "{position:?} vs {before}");
    let after = lsn("SELECT (pg_current_wal_insert_lsn() - '0/0'::pg_lsn)::bigint").await;
    assert!(position.lsn.0 <= after, "{position:?} vs {after}");
    let (system, timeline): (String, i64) = db
        .query_row(
            "SELECT system_identifier::text, \
                ('x' || lpad(substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8), 16, '0'))::bit(64)::bigint \
           FROM pg_control_system()",
        )
        .await;
    assert_eq!(
        (position.system_identifier.as_str(), position.timeline),
        (system.as_str(), timeline)
    );

    // The replay: one statement, the recorded answer and a position at or
    // beyond the settle's.
    let (outcome, replay_position) = db
        .ledger
        .operation_register_claim_in(Some(TENANT), &lease, &charge, None, "proxy-2", 30_000)
        .await
        .unwrap();
    match applied(outcome) {
        InlineClaim::Existing(record) => {
            assert_eq!(record.status, OperationStatus::Succeeded);
            assert_eq!(record.result, Some(json!({"ok": 1})));
        }
        other => panic!("expected a replay, got {other:?}"),
    }
    let replay_position = replay_position.expect("a replay samples the WAL position");
    assert!(replay_position.lsn >= position.lsn);
    assert_eq!(
        op_row(&db, &charge).await,
        ("succeeded".into(), 2, 1, Some("ch_7".into()))
    );
}

/// A run-state write (here the worker's heartbeat, `lease_renew`) locks its
/// run's row FOR NO KEY UPDATE, not FOR UPDATE: the settle of one of the
/// run's calls, whose event's foreign key takes FOR KEY SHARE on that row,
/// goes through while the renewal's transaction is still open. With FOR
/// UPDATE the settle would wait for the renewal (and a renewal for a
/// settle).
#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn a_heartbeat_in_flight_does_not_hold_up_a_settle_of_its_run(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let (lease, _) = db.running_run("agent-1", 30_000).await;
    let charge = intent(lease.run_id, "charge", json!({"amount": 500}));
    let claim = claim_inline(&db, &lease, &charge, 30_000).await;

    // The renewal, as the ledger sends it, in a transaction left open.
    let mut renewal = db.admin.begin().await.unwrap();
    let outcome: String = sqlx::query_scalar("SELECT (lease_renew($1, $2, $3, $4, 60000)).outcome")
        .bind(lease.run_id.as_uuid())
        .bind(&lease.owner)
        .bind(lease.epoch)
        .bind(
            lease
                .token
                .as_ref()
                .expect("a taken lease has a token")
                .sha256(),
        )
        .fetch_one(&mut *renewal)
        .await
        .unwrap();
    assert_eq!(outcome, "applied");

    let settled = within(
        "the settle, with the run's renewal uncommitted",
        db.ledger.operation_settle(
            &claim,
            Settlement::Succeeded,
            Some("ch_1"),
            &json!({"ok": true}),
        ),
    )
    .await
    .unwrap();
    assert!(
        matches!(settled, SettleOutcome::Settled(_)),
        "settled: {settled:?}"
    );
    renewal.commit().await.unwrap();
    let (status, ..) = op_row(&db, &charge).await;
    assert_eq!(status, "succeeded");
    let renewed: bool = db
        .scalar(
            "SELECT expires_at > clock_timestamp() + interval '40 seconds' FROM worker_leases WHERE run_id = $1",
            lease.run_id.as_uuid(),
        )
        .await;
    assert!(renewed, "the renewal committed too (60 s ttl)");
}

/// Migration 0012 turned the single-column rules of `tool_operations` and
/// `ledger_events` into domains. On a ledger that already holds rows it
/// must change the catalog only: the same rows, in the same files (no
/// table or index rewritten under its lock), and every rule still refuses
/// what it refused, with the same SQLSTATE.
#[sqlx::test(migrations = false)]
async fn a_ledger_holding_rows_moves_to_the_column_domains_without_a_rewrite(pool: sqlx::PgPool) {
    use sqlx::migrate::Migrator;
    let before_domains = Migrator::with_migrations(
        leasegate::ledger::MIGRATOR
            .iter()
            .filter(|m| m.version <= 11)
            .cloned()
            .collect(),
    );
    before_domains.run(&pool).await.unwrap();
    sqlx::raw_sql(
        "INSERT INTO agent_tasks (tenant_id, task_id) VALUES ('t', 'task');
         INSERT INTO agent_runs (run_id, tenant_id, task_id, attempt, status)
           VALUES ('00000000-0000-7000-8000-000000000001', 't', 'task', 1, 'running');
         INSERT INTO tool_operations (operation_id, run_id, step_id, effect_version, tool_name,
                                      request_digest, request_body, status, dispatch_count)
           SELECT 'op-' || i, '00000000-0000-7000-8000-000000000001', 'step-' || i, 1 + i % 3, 'tool',
                  encode(sha256(convert_to(i::text, 'UTF8')), 'hex'), '{}', 'succeeded', 1
             FROM generate_series(1, 2000) i;
         INSERT INTO ledger_events (run_id, operation_id, subject, to_status, actor_kind)
           SELECT run_id, operation_id, 'operation', status, 'dispatcher' FROM tool_operations;",
    )
    .execute(&pool)
    .await
    .unwrap();
    let files = "SELECT c.relname::text, c.relfilenode::bigint FROM pg_class c
                  WHERE c.relname LIKE 'tool_operations%' OR c.relname LIKE 'ledger_events%'
                  ORDER BY 1";
    // The columns later migrations add (0017's claim facts, NULL on these
    // rows) left out, so the rows compare across them.
    let rows = "SELECT (SELECT md5(string_agg((to_jsonb(o) - ARRAY['claimed_at', 'claim_epoch', 'claim_worker'])::text,
                                              ',' ORDER BY o.operation_id)) FROM tool_operations o),
                       (SELECT md5(string_agg(e::text, ',' ORDER BY e.event_id)) FROM ledger_events e)";
    let files_before: Vec<(String, i64)> = sqlx::query_as(files).fetch_all(&pool).await.unwrap();
    let rows_before: (String, String) = sqlx::query_as(rows).fetch_one(&pool).await.unwrap();
    assert!(files_before.len() >= 10, "{files_before:?}");

    leasegate::ledger::MIGRATOR.run(&pool).await.unwrap();

    let types: Vec<(String, String)> = sqlx::query_as(
        "SELECT attname::text, format_type(atttypid, atttypmod) FROM pg_attribute
          WHERE attrelid IN ('tool_operations'::regclass, 'ledger_events'::regclass)
            AND atttypid IN (SELECT oid FROM pg_type WHERE typtype = 'd')
          ORDER BY attrelid::regclass::text DESC, attnum",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let types: Vec<(&str, &str)> = types
        .iter()
        .map(|(c, t)| (c.as_str(), t.as_str()))
        .collect();
    assert_eq!(
        types,
        [
            ("step_id", "ledger_step_id"),
            ("effect_version", "ledger_effect_version"),
            ("request_digest", "ledger_request_digest"),
            ("dispatch_count", "ledger_count"),
            ("reconcile_attempts", "ledger_count"),
            ("subject", "ledger_event_subject"),
            ("actor_kind", "ledger_actor_kind"),
        ]
    );
    let files_after: Vec<(String, i64)> = sqlx::query_as(files).fetch_all(&pool).await.unwrap();
    assert_eq!(files_after, files_before, "no table or index was rewritten");
    let rows_after: (String, String) = sqlx::query_as(rows).fetch_one(&pool).await.unwrap();
    assert_eq!(rows_after, rows_before);
    // sqlx reads domain columns as their base types.
    let (step, version, count): (String, i32, i32) = sqlx::query_as(
        "SELECT step_id, effect_version, dispatch_count FROM tool_operations WHERE operation_id = 'op-4'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!((step.as_str(), version, count), ("step-4", 2, 1));

    // Every rule refuses what it refused before, as a check violation.
    for (write, rule) in [
        (
            "UPDATE tool_operations SET step_id = '' WHERE operation_id = 'op-1'",
            "ledger_step_id_shape",
        ),
        (
            "UPDATE tool_operations SET step_id = repeat('s', 513) WHERE operation_id = 'op-1'",
            "ledger_step_id_shape",
        ),
        (
            "UPDATE tool_operations SET effect_version = 0 WHERE operation_id = 'op-1'",
            "ledger_effect_version_positive",
        ),
        (
            "UPDATE tool_operations SET request_digest = upper(request_digest) WHERE operation_id = 'op-1'",
            "ledger_request_digest_shape",
        ),
        (
            "UPDATE tool_operations SET dispatch_count = dispatch_count - 2 WHERE operation_id = 'op-1'",
            "ledger_count_not_negative",
        ),
        (
            "UPDATE tool_operations SET reconcile_attempts = -1 WHERE operation_id = 'op-1'",
            "ledger_count_not_negative",
        ),
        (
            "UPDATE tool_operations SET status = 'done' WHERE operation_id = 'op-1'",
            "tool_operations_status_check",
        ),
        (
            "INSERT INTO ledger_events (run_id, subject, to_status, actor_kind)
               VALUES ('00000000-0000-7000-8000-000000000001', 'task', 'x', 'worker')",
            "ledger_event_subject_known",
        ),
        (
            "INSERT INTO ledger_events (run_id, subject, to_status, actor_kind)
               VALUES ('00000000-0000-7000-8000-000000000001', 'run', 'x', 'robot')",
            "ledger_actor_kind_known",
        ),
    ] {
        let refused = sqlx::query(write).execute(&pool).await.unwrap_err();
        let refused = refused.as_database_error().expect(write);
        assert_eq!(refused.code().as_deref(), Some("23514"), "{write}");
        assert_eq!(refused.constraint(), Some(rule), "{write}");
    }
    let (still,): (String,) = sqlx::query_as(
        "SELECT md5(string_agg((to_jsonb(o) - ARRAY['claimed_at', 'claim_epoch', 'claim_worker'])::text,
                               ',' ORDER BY o.operation_id)) FROM tool_operations o",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(still, rows_before.0, "nothing refused was written");
}
