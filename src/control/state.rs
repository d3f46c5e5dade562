//! What every control handler shares: the router's state
//! ([`ControlState`]: the ledger, the operator ledger, the integer policy,
//! the served tenant and the tools), the operator ledger the operator acts
//! run their SQL through ([`OperatorLedger`]), and the upstream health
//! source a serving process provides. Built once per router; nothing here
//! writes.

use std::sync::Arc;

use axum::extract::State;

use super::error::{ApiError, ErrorCode};
use crate::adapter::SharedDirectory;
use crate::intent::IntegerPolicy;
use crate::ledger::Ledger;

/// Who runs the operator routes' SQL — resolve, retry, cancel, failover
/// resolve — which only the database role `leasegate_operator` may execute
/// (migrations/0007): a compromised proxy, running as `leasegate_app`,
/// cannot resolve as an operator.
#[derive(Debug, Clone)]
pub enum OperatorLedger {
    /// A ledger whose sessions run as `leasegate_operator`.
    Ready(Ledger),
    /// This process cannot act as `leasegate_operator` (why, and the fix):
    /// the operator routes answer 503 `role_not_granted`, nothing written.
    Unavailable(String),
}

impl OperatorLedger {
    /// The operator ledger, or why there is none and what to do about it
    /// (the control API's 503 and the console's refusal both say this).
    pub(super) fn ready(&self) -> Result<&Ledger, String> {
        match self {
            OperatorLedger::Ready(ledger) => Ok(ledger),
            OperatorLedger::Unavailable(why) => Err(format!(
                "this leasegate cannot act as the database role leasegate_operator, which \
                 operator acts need: {why}. Nothing was written. Use `leasegate ops …` with a \
                 login that is a member of leasegate_operator, or give this process one \
                 (database_operator_url)"
            )),
        }
    }

    /// The operator ledger, or the 503 that says why there is none.
    pub(super) fn get(&self) -> Result<&Ledger, ApiError> {
        self.ready()
            .map_err(|message| ApiError::new(ErrorCode::RoleNotGranted, message))
    }
}

pub(super) struct ControlState {
    pub(super) ledger: Ledger,
    /// The operator routes' ledger (see [`OperatorLedger`]).
    pub(super) operator: OperatorLedger,
    pub(super) integers: IntegerPolicy,
    /// The one tenant this API creates runs for (`tenant` of the serving
    /// process's config): a run of another tenant would be "not found" on
    /// that process's MCP front, so it is refused at creation. `None`: any.
    pub(super) tenant: Option<String>,
    /// The tools this process's upstreams list (the directory its MCP front
    /// and outbox resolve calls by): a planned intent for any other tool is
    /// refused at checkpoint time. `None` (the operator CLI, bare routers):
    /// not judged here.
    pub(super) tools: Option<Arc<SharedDirectory>>,
}

pub(super) type Shared = State<Arc<ControlState>>;

/// What the upstreams' health looks like as JSON (the MCP layer provides
/// it; this module does not depend on it).
pub type UpstreamHealthSource = Arc<dyn Fn() -> serde_json::Value + Send + Sync>;
