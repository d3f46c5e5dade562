//! The pgbench side of the comparison: the ceiling's and leasegate's own
//! SQL set up on their scratch databases, the pgbench ledger's leases kept
//! alive, and one pgbench cell measured (rate, latency percentiles, CPU).

use super::*;

/// The seed's schema, the ceiling's function and its 1,000 leased runs.
pub(super) async fn setup_ceiling(url: &str) -> anyhow::Result<()> {
    use sqlx::Connection as _;
    let mut connection = sqlx::PgConnection::connect(url).await?;
    sqlx::raw_sql("SET client_min_messages = warning")
        .execute(&mut connection)
        .await?;
    sqlx::raw_sql(CEILING_SCHEMA)
        .execute(&mut connection)
        .await?;
    sqlx::raw_sql(CEILING_FN).execute(&mut connection).await?;
    connection.close().await?;
    Ok(())
}

/// leasegate's ledger with [`RUNS`] runs `00000000-0000-7000-8000-<n>` leased
/// by `bench-<n>` at epoch 1 (as `bench/operations` does).
pub(super) async fn setup_leasegate_sql(url: &str) -> anyhow::Result<()> {
    use leasegate::ledger::{InitialLease, Ledger, LedgerOptions, RunCreateOutcome};
    Ledger::migrate(url).await?;
    let ledger = Ledger::connect(url, LedgerOptions::default()).await?;
    for client in 0..RUNS {
        let owner = format!("{OWNER_PREFIX}{client}");
        let created = ledger
            .run_create(
                run_id_of(client),
                "bench",
                &format!("task-{client}"),
                Some(InitialLease {
                    owner: &owner,
                    ttl_ms: LEASE_TTL_MS,
                }),
            )
            .await?;
        ensure!(
            matches!(created, RunCreateOutcome::Created(_)),
            "run {client}: {created:?}"
        );
    }
    ledger.close().await;
    Ok(())
}

/// Extends every lease of the pgbench ledger (as the superuser, straight to
/// the table: benchmark setup, not a fenced write) before a pgbench run.
pub(super) async fn extend_sql_leases(url: &str) -> anyhow::Result<()> {
    use sqlx::Connection as _;
    let mut connection = sqlx::PgConnection::connect(url).await?;
    sqlx::query(
        "UPDATE worker_leases SET expires_at = clock_timestamp() + $1 * interval '1 millisecond'",
    )
    .bind(LEASE_TTL_MS as f64)
    .execute(&mut connection)
    .await?;
    connection.close().await?;
    Ok(())
}

/// Transactions per second and per-transaction latency percentiles of one
/// pgbench run (`-M prepared`, `-l` per-transaction log).
pub(super) fn pgbench(
    pgbench: &Path,
    url: &str,
    script: &str,
    clients: usize,
    duration: Duration,
    scratch: &Path,
) -> anyhow::Result<Cell> {
    let dir = scratch.join(format!("pgbench-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir)?;
    let script_file = dir.join("script.sql");
    std::fs::write(&script_file, script)?;
    let seconds = duration.as_secs().max(1);
    let postgres_before = cpu::postgres_processes();
    let cpu_start = cpu::CpuSample::take(None);
    let output = Pgbench {
        program: pgbench,
        url,
        script: &script_file,
        clients,
        seconds,
        log_dir: Some(&dir),
    }
    .output()?;
    // pgbench's backends are reaped into the postmaster's time before the reading.
    cpu::settle_postgres(postgres_before, Duration::from_secs(5));
    let cpu_end = cpu::CpuSample::take(None);
    let rate = pgbench_run::Report::parse(&output)?.tps;
    let mut samples = pgbench_run::read_log(&dir)?;
    let _ = std::fs::remove_dir_all(&dir);
    let calls = samples.len() as u64;
    Ok(Cell {
        cpu: cpu_start.per_call(&cpu_end, calls, cpu::Load::ReapedChildren),
        ..Cell::of_samples(&mut samples, calls, rate)
    })
}
