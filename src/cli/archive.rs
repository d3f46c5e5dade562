//! `leasegate ops archive`: retention on the ledger directly, as the
//! database role `leasegate_operator` (no control API route). Batches of
//! `operations_archive` run until a batch moves no run, each batch one
//! transaction: on a crash, the batches so far are committed and the one in
//! flight is wholly moved or untouched, so running it again picks up.

use serde_json::json;

use super::failure::ledger_refusal;
use super::operator_args::Common;
use super::output::report;
use super::target::Target;
use crate::control::{ErrorCode, exit};
use crate::ledger::{Ledger, LedgerOptions};

/// `leasegate ops archive`: batches of `operations_archive` as the operator
/// role until a batch moves no run (or `max_batches`). Prints one line per
/// batch and the totals (`--json`: one object with the totals).
pub(super) async fn archive(
    common: &Common,
    older_than: &str,
    delete: bool,
    batch: i32,
    max_batches: Option<u64>,
) -> u8 {
    let window_ms = match checked_window(common.json, older_than, batch) {
        Ok(window_ms) => window_ms,
        Err(code) => return code,
    };
    let Target {
        database, tenant, ..
    } = match Target::of(common) {
        Ok(target) => target,
        Err(code) => return code,
    };
    let options = LedgerOptions {
        max_connections: 1,
        session_role: Some(crate::ledger::OPERATOR_ROLE.to_owned()),
        ..Default::default()
    };
    let ledger = match Ledger::connect(&database.url, options).await {
        Ok(ledger) => ledger,
        Err(error) => {
            let (code, message) = ledger_refusal(&error, &database);
            return report(common.json, code, &message);
        }
    };
    let mut total = crate::ledger::ArchiveBatch::default();
    let mut batches = 0u64;
    let outcome = loop {
        if max_batches.is_some_and(|max| batches >= max) {
            break Ok(());
        }
        // If we crash here, the batches so far are committed; a batch in
        // flight is wholly moved or untouched (one transaction).
        match ledger
            .operations_archive(window_ms, batch, delete, tenant.as_deref())
            .await
        {
            Ok(moved) if moved.runs == 0 => break Ok(()),
            Ok(moved) => {
                batches += 1;
                total.runs += moved.runs;
                total.operations += moved.operations;
                total.evidence += moved.evidence;
                total.events += moved.events;
                if !common.json {
                    println!(
                        "batch {batches}: {} runs, {} operations, {} evidence, {} events {}",
                        moved.runs,
                        moved.operations,
                        moved.evidence,
                        moved.events,
                        if delete { "deleted" } else { "archived" }
                    );
                }
            }
            Err(error) => break Err(error),
        }
    };
    ledger.close().await;
    if let Err(error) = outcome {
        let api = crate::control::ApiError::from(error);
        return report(
            common.json,
            api.code(),
            &format!("archive stopped after {batches} batches: {}", api.message()),
        );
    }
    if common.json {
        println!(
            "{}",
            json!({"batches": batches, "deleted": delete, "runs": total.runs, "operations": total.operations,
                   "evidence": total.evidence, "events": total.events})
        );
    } else {
        println!(
            "{} runs, {} operations, {} evidence, {} events {} in {batches} batches (older than {older_than})",
            total.runs,
            total.operations,
            total.evidence,
            total.events,
            if delete { "deleted" } else { "archived" }
        );
    }
    exit::OK
}

/// `--older-than` in milliseconds, once it and `--batch` are checked; else
/// the exit code of the error reported.
fn checked_window(json: bool, older_than: &str, batch: i32) -> Result<i64, u8> {
    let window_ms = match humantime::parse_duration(older_than) {
        Ok(duration) if !duration.is_zero() => {
            i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
        }
        _ => {
            return Err(report(
                json,
                ErrorCode::InvalidInput,
                &format!("--older-than {older_than:?} is not a duration like \"30d\" or \"12h\""),
            ));
        }
    };
    if !(1..=crate::ledger::MAX_ARCHIVE_BATCH).contains(&batch) {
        return Err(report(
            json,
            ErrorCode::InvalidInput,
            &format!(
                "--batch {batch} is not 1 to {}",
                crate::ledger::MAX_ARCHIVE_BATCH
            ),
        ));
    }
    Ok(window_ms)
}
