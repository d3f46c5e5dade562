//! What the console's pages are rendered from besides the ledger's rows:
//! the list pages' queries, the overview's figures and what a refused form
//! asked. Plain data, shared by the handlers that fill it and `pages`,
//! which renders it.

use serde::Deserialize;
use serde_json::Value;

use crate::ledger::OperationRecord;

/// What the overview shows.
pub(crate) struct Overview {
    pub(super) counts: crate::ledger::ConsoleCounts,
    pub(super) unknown: crate::ledger::UnknownSummary,
    /// Unknown operations the reconciler cannot settle: (operation, age, why).
    pub(super) needs_operator: Vec<(OperationRecord, f64, String)>,
    pub(super) upstreams: Option<Value>,
    pub(super) calls_per_second: Option<f64>,
    pub(super) calls_total: Option<f64>,
    /// Agent calls answered from the ledger instead of the tool: (after the
    /// call had ended, after waiting on it in flight).
    pub(super) replays: Option<(f64, f64)>,
    pub(super) takeovers_total: Option<f64>,
    pub(super) rejections: Vec<(String, f64)>,
    pub(super) refusals: Vec<(String, f64)>,
}

#[derive(Debug, Deserialize, Default)]
pub(crate) struct RunQuery {
    pub(super) task: Option<String>,
    pub(super) run_id: Option<String>,
    pub(super) status: Option<String>,
}

#[derive(Debug, Deserialize, Default)]
pub(crate) struct OperationQuery {
    pub(super) status: Option<String>,
    pub(super) tool: Option<String>,
    pub(super) upstream: Option<String>,
    pub(super) run_id: Option<String>,
    /// Minimum age, e.g. `5m`, `1h`, `30s`.
    pub(super) older_than: Option<String>,
}

/// What a refused form asked, to fill the form again.
#[derive(Debug, Default)]
pub(crate) struct Asked {
    pub(super) outcome: Option<String>,
    pub(super) remote_id: Option<String>,
    pub(super) note: Option<String>,
}
