//! Intents as the tests build them: tenant `tenant-a`, integers rejected
//! (the proxy's default policy), either planned as a step (effect version 1
//! unless a test says otherwise) or unplanned (no step reference).

use leasegate::intent::{IntegerPolicy, Intent, StepRef};
use leasegate::ledger::RunId;
use serde_json::Value;

/// The tenant every fixture run belongs to.
pub const TENANT: &str = "tenant-a";

/// An unplanned call of `tool` with `arguments` in run `run_id`.
pub fn unplanned(run_id: RunId, tool: &str, arguments: &Value) -> Intent {
    Intent::new(TENANT, run_id, None, tool, arguments, IntegerPolicy::Reject)
        .expect("a valid unplanned intent")
}

/// An unplanned call of the example `payments__charge` for `amount` in
/// `currency`, in run `run_id`.
pub fn unplanned_charge(run_id: RunId, amount: i64, currency: &str) -> Intent {
    unplanned(
        run_id,
        "payments__charge",
        &serde_json::json!({"amount": amount, "currency": currency}),
    )
}

/// A call of `tool` with `arguments` planned as step `step` (effect version 1).
pub fn planned(run_id: RunId, step: &str, tool: &str, arguments: &Value) -> Intent {
    planned_version(run_id, step, 1, tool, arguments)
}

/// A call of `tool` with `arguments` planned as step `step` at `effect_version`.
pub fn planned_version(
    run_id: RunId,
    step: &str,
    effect_version: i32,
    tool: &str,
    arguments: &Value,
) -> Intent {
    Intent::new(
        TENANT,
        run_id,
        Some(StepRef {
            step_id: step.into(),
            effect_version,
        }),
        tool,
        arguments,
        IntegerPolicy::Reject,
    )
    .expect("a valid planned intent")
}
