//! The gateway benchmark's harness (`bench/gateway/harness.rs`)
//! end to end in quick mode against the debug build: the
//! example tool server as upstream, 1 and 8 callers, 1 s cells. Timings are
//! reported, never asserted; what is asserted is that every cell measured
//! calls, that the counting proxy saw the gated calls' round trips, and
//! that memory and every hot-path cell's CPU (per part) were read. Its own
//! databases (`bench_gateway_t<random>*`) are dropped at the end. The
//! harness's unit tests (the PostgreSQL frontend counter, the counting
//! proxy against the real server, output parsing) run in this binary too.

use crate::common;
#[path = "../../bench/gateway/harness.rs"]
mod harness;

use std::path::PathBuf;

use harness::{Kind, Measure};
use leasegate::ledger::{InlineClaim, Ledger, LedgerOptions, SettleOutcome, Settlement};
use serde_json::json;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

/// `DATABASE_URL` (the suite's server), or the local default.
fn admin_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned())
}

/// The round-trip goal on the wire: a gated call (register-and-claim, then
/// settle) is exactly two client round trips and a replay one, counted by
/// the benchmark's PostgreSQL frontend counter between the ledger and the
/// server. Nothing else may ride along: no liveness ping when a connection
/// is taken from or given back to the pool (sqlx's pool pinged on every
/// release, which made it four), no separate tenant or WAL read.
#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn a_gated_call_is_two_round_trips_on_the_wire_and_a_replay_one(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let _exclusive = common::exclusive().await;
    let db = common::TestDb::new(pool, connect.clone()).await;
    let (lease, _) = db.running_run("agent-1", 120_000).await;
    let proxy = harness::CountingProxy::start((connect.get_host().to_owned(), connect.get_port()))
        .await
        .expect("start the counting proxy");
    // Two sessions, so that a call could take either: a per-checkout or
    // per-release check would show on both.
    let ledger = Ledger::connect_with(
        connect.clone().host("127.0.0.1").port(proxy.port),
        LedgerOptions {
            max_connections: 2,
            ..LedgerOptions::default()
        },
    )
    .await
    .expect("connect the ledger through the counting proxy");
    let intent = |step: usize| {
        crate::common::intents::planned(
            lease.run_id,
            &format!("step-{step}"),
            "payments__charge",
            &json!({"amount": step, "currency": "eur"}),
        )
    };
    let register = async |step: usize| {
        let (claimed, _) = ledger
            .operation_register_claim_in(
                Some("tenant-a"),
                &lease,
                &intent(step),
                None,
                "proxy-1",
                60_000,
            )
            .await
            .expect("register and claim");
        common::applied(claimed)
    };
    let gated = async |step: usize| {
        let claim = match register(step).await {
            InlineClaim::Claimed { claim, .. } => claim,
            other => panic!("expected a fresh claim, got {other:?}"),
        };
        let (settled, _) = ledger
            .operation_settle_acknowledged(
                &claim,
                Settlement::Succeeded,
                None,
                &json!({"content": []}),
            )
            .await
            .expect("settle");
        assert!(matches!(settled, SettleOutcome::Settled(_)), "{settled:?}");
    };
    // Warm-up: each session prepares each statement once (Parse + Sync).
    for step in 0..8 {
        gated(step).await;
    }
    const CALLS: usize = 40;
    let before = proxy.count();
    for step in 8..8 + CALLS {
        gated(step).await;
    }
    let counted = proxy.count() - before;
    assert_eq!(
        counted,
        2 * CALLS as u64,
        "{counted} round trips for {CALLS} gated calls; executions: {:#?}",
        proxy.executions()
    );

    let before = proxy.count();
    for step in 8..8 + CALLS {
        assert!(
            matches!(register(step).await, InlineClaim::Existing(_)),
            "a replay finds the settled operation"
        );
    }
    let counted = proxy.count() - before;
    assert_eq!(
        counted, CALLS as u64,
        "{counted} round trips for {CALLS} replays"
    );
    ledger.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quick_run_measures_every_cell_round_trips_and_memory() {
    let _exclusive = common::exclusive().await;
    let mut settings = harness::Settings::quick(
        PathBuf::from(env!("CARGO_BIN_EXE_leasegate")),
        PathBuf::from(env!("CARGO_BIN_EXE_leasegate-example-tools")),
    );
    settings.admin_url = admin_url();
    settings.db_prefix = format!(
        "bench_gateway_t{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    settings.upstream = harness::UpstreamChoice::ExampleTools;
    settings.verbose = false;
    let report = harness::run(&settings)
        .await
        .expect("the quick run completes");
    let table = report.to_markdown();
    println!("{table}");

    for &callers in &settings.callers {
        for measure in [
            Measure::Leasegate(Kind::Gated),
            Measure::Leasegate(Kind::PassThrough),
            Measure::Leasegate(Kind::Replay),
            Measure::PgbenchLeasegate,
            Measure::PgbenchCeiling,
        ] {
            let cells = &report.cells[&(measure.clone(), callers)];
            assert_eq!(cells.len(), 1, "{measure:?} at {callers}: one repetition");
            assert!(
                cells[0].calls > 0,
                "{measure:?} at {callers} measured no call"
            );
            assert!(
                cells[0].p99_ms >= cells[0].p50_ms,
                "{measure:?} at {callers}: p99 below p50"
            );
            // Where the CPU went: read for every hot-path cell, the
            // database's share wherever a call reached it, leasegate's in
            // every cell it served.
            let cpu = cells[0]
                .cpu
                .unwrap_or_else(|| panic!("{measure:?} at {callers}: no CPU reading"));
            assert!(
                cpu.busy > 0.0 && cpu.total_ms() > 0.0,
                "{measure:?} at {callers}: {cpu:?}"
            );
            match measure {
                Measure::Leasegate(Kind::Gated) => assert!(
                    cpu.postgres_ms > 0.0 && cpu.leasegate_ms > 0.0,
                    "a gated call costs the database and the proxy: {cpu:?}"
                ),
                Measure::Leasegate(_) => assert!(
                    cpu.leasegate_ms > 0.0,
                    "{measure:?} at {callers}: the proxy's CPU was read: {cpu:?}"
                ),
                _ => assert!(
                    cpu.postgres_ms > 0.0 && cpu.leasegate_ms == 0.0,
                    "pgbench's cells cost the database, not the proxy: {cpu:?}"
                ),
            }
            // The group-commit statements of a gated cell, read from the
            // served process's /metrics (group commit on, as served by
            // default): every call registered and settled through them.
            if measure == Measure::Leasegate(Kind::Gated)
                && leasegate::ledger::group_commit_env_override() != Some(false)
            {
                let batches = cells[0]
                    .batches
                    .unwrap_or_else(|| panic!("gated at {callers}: /metrics not read"));
                for (kind, mean) in [
                    ("register-claim", batches.register),
                    ("settle", batches.settle),
                ] {
                    let mean = mean.unwrap_or_else(|| {
                        panic!("gated at {callers}: no {kind} statement counted: {batches:?}")
                    });
                    assert!(
                        (1.0..=64.0).contains(&mean),
                        "gated at {callers}: {mean} {kind} calls per statement"
                    );
                }
            }
        }
    }
    for measure in [
        Measure::RenewControlApi,
        Measure::PgbenchRenewLeasegate,
        Measure::PgbenchRenewCeiling,
        Measure::PgbenchRenewBatchCeiling,
    ] {
        let cells = &report.cells[&(measure.clone(), settings.renew_callers)];
        assert!(cells[0].calls > 0, "{measure:?} measured no call");
    }
    // The batch row: one caller per worker host, each renewing all its
    // leases in every call, none of them lost.
    let batch = &report.cells[&(Measure::BatchRenewLeasegate, settings.batch_hosts)];
    assert!(batch[0].calls > 0, "the batch renewal renewed no lease");
    assert_eq!(
        batch[0].calls % settings.batch_leases as u64,
        0,
        "a batch call renews all {} leases of its host",
        settings.batch_leases
    );
    assert_eq!(
        report.batch_shape,
        (settings.batch_hosts, settings.batch_leases)
    );

    // Every gated call registers, claims and settles in the ledger: the
    // proxy must have seen at least one round trip per call. A pass-through
    // call and a replay never reach the ledger more often than a gated one.
    let gated = &report.round_trips[&Some(Kind::Gated)];
    assert!(gated.calls > 0);
    assert!(
        gated.raw_per_call >= 1.0,
        "gated calls: {} round trips for {} calls",
        gated.raw,
        gated.calls
    );
    let first = &report.round_trips[&None];
    assert_eq!(first.calls, settings.first_calls as u64);
    assert!(
        first.raw_per_call >= 1.0,
        "a run's first call reached the ledger"
    );
    let pass = &report.round_trips[&Some(Kind::PassThrough)];
    let replay = &report.round_trips[&Some(Kind::Replay)];
    assert!(pass.calls > 0 && replay.calls > 0);
    assert!(
        pass.per_call < gated.per_call,
        "pass-through {pass:?} vs gated {gated:?}"
    );
    assert!(
        replay.per_call <= gated.per_call,
        "replay {replay:?} vs gated {gated:?}"
    );

    let memory = &report.memory;
    assert!(memory.idle_kib > 0 && memory.idle_after_kib > 0);
    assert!(memory.sessions_idle_kib > 0 && memory.sessions_open_kib > 0);
    assert_eq!(memory.growth_kib.len(), settings.growth_cells);
    assert!(memory.load.is_some(), "memory under load was read");

    for row in [
        "gated (new intent per call)",
        "minimal ceiling",
        "lease_renew",
        "batch renewal (leases/s): leasegate",
        "per session",
        "Where the CPU goes",
        "| leasegate, gated | 1 |",
    ] {
        assert!(table.contains(row), "the table has {row:?}:\n{table}");
    }
}
