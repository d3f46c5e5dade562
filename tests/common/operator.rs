//! What an operator (`alice`) writes by hand: a resolution of an operation
//! from what she checked at the provider, with a note and no result body.

use std::sync::LazyLock;

use leasegate::intent::OperationId;
use leasegate::ledger::{Converge, ConvergeEvidence, Settlement};
use serde_json::{Value, json};

static NO_EVIDENCE: LazyLock<Value> = LazyLock::new(|| json!({}));

/// Operator `alice`'s resolution of `operation_id` (as she read it at
/// `expected_revision`) to `settlement`, with `remote_id` and `note`.
pub fn alice_resolves<'a>(
    operation_id: &'a OperationId,
    expected_revision: i64,
    settlement: Settlement,
    remote_id: Option<&'a str>,
    note: Option<&'a str>,
) -> Converge<'a> {
    Converge {
        operation_id,
        expected_revision,
        settlement,
        remote_id,
        result: None,
        kind: ConvergeEvidence::Operator,
        actor: "alice",
        note,
        evidence: &NO_EVIDENCE,
    }
}
