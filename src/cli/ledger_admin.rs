//! The commands that administer the ledger itself: `leasegate migrate`
//! (create the database if missing, apply the migrations and install the
//! SQL functions; running it again is a no-op) and `leasegate secrets
//! rotate` (re-seal stored bodies under the policy's current key, as the
//! operator role; safe while serving and to run again: an operation that
//! changed meanwhile is counted and left for the next run).

use crate::config::{Config, DatabaseUrl};
use crate::ledger::{Ledger, LedgerOptions};

/// `leasegate secrets rotate`; `database` is set to the ledger's URL once
/// it is known. An error when some operation could not be re-sealed.
pub(super) async fn secrets_rotate(
    config: &std::path::Path,
    database_url: Option<String>,
    database: &mut Option<DatabaseUrl>,
) -> anyhow::Result<()> {
    let mut config = Config::load(config)?;
    config.database.resolve_url(database_url.as_deref());
    let located = crate::app::client_database(config.database.located())?;
    config.database.url = located.url.clone();
    *database = Some(located);
    // As the operator role: the proxy's role cannot rewrite bodies.
    let options = LedgerOptions {
        max_connections: 2,
        bodies: config.policy.bodies(),
        session_role: Some(crate::ledger::OPERATOR_ROLE.to_owned()),
        ..Default::default()
    };
    let ledger = Ledger::connect(&config.database.url, options).await?;
    let progress = crate::progress::Progress::spinner("re-sealing stored bodies");
    let report = ledger.secrets_rotate(100).await;
    progress.finish();
    ledger.close().await;
    let report = report?;
    println!(
        "re-sealed {} operations under key {}",
        report.resealed, report.key_id
    );
    for (operation_id, why) in &report.failed {
        println!("not re-sealed: operation {operation_id}: {why}");
    }
    if report.changed_meanwhile > 0 {
        println!(
            "{} operations changed meanwhile: run it again",
            report.changed_meanwhile
        );
    }
    println!(
        "re-sealed {} evidence rows under key {}",
        report.evidence_resealed, report.key_id
    );
    for (key_id, count) in &report.evidence_under_other_keys {
        println!(
            "{count} evidence rows stay sealed under key {key_id} (not re-sealed: see above): keep it in encryption_keys to read them"
        );
    }
    if report.failed.is_empty() && report.changed_meanwhile == 0 {
        Ok(())
    } else {
        anyhow::bail!("rotation incomplete")
    }
}

/// `leasegate migrate`; `database` is set to the ledger's URL once it is
/// known.
pub(super) async fn migrate(
    database_url: Option<String>,
    config: Option<std::path::PathBuf>,
    database: &mut Option<DatabaseUrl>,
) -> anyhow::Result<()> {
    let resolved = match config {
        Some(path) => {
            let mut config = Config::load(&path)?;
            config.database.resolve_url(database_url.as_deref());
            config.database.located()
        }
        None => DatabaseUrl::from_environment(database_url.as_deref(), None),
    };
    let resolved = crate::app::client_database(resolved)?;
    let url = resolved.url.clone();
    *database = Some(resolved);
    // A spinner on a terminal; nothing in CI or a pipe.
    let progress = crate::progress::Progress::spinner("migrating the ledger");
    if Ledger::create_database_if_missing(&url).await? {
        tracing::info!("created the ledger database");
    }
    Ledger::migrate(&url).await?;
    progress.finish();
    let applied = crate::ledger::MIGRATOR.iter().count();
    println!("ledger migrated ({applied} migrations)");
    Ok(())
}
