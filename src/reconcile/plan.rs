//! The reconciler's decisions as pure functions: what to do with an unknown
//! operation ([`plan`]), and what an answer proves ([`judge_query`],
//! [`judge_retry`], [`judge_task`]: `judge`, re-exported here). No I/O here; `reconciler` executes the steps. Every
//! row of the decision table below is a unit test at the end of this file.
//!
//! # Decision table
//!
//! | evidence / capability | step | what converges it |
//! |---|---|---|
//! | a late response to the same request digest (any capability) | converge from it | its outcome |
//! | a task the upstream made of the call (`task` evidence, any capability) | ask the upstream for the task (`tasks/get`) | completed → `succeeded` / `failed_final` by its result's `isError`; failed with -32600..-32602 → `failed_final`; still working → stays unknown; failed otherwise, cancelled, or not known to the upstream → the rows below, as if no task were on record |
//! | tool unknown to every upstream | needs operator | — |
//! | `none` | needs operator | — |
//! | `operation_query` / `resource_id` without a query tool | needs operator | — |
//! | `operation_query` | query by operation id | found → `succeeded` with the resource; not found, error, no answer → stays unknown |
//! | `resource_id` | query by operation id, or by the resource id at the adapter's `resource_id_pointer` in the stored arguments (none stored there → needs operator) | found and every `match_fields` equal to the request's → `succeeded`; a mismatch → stays unknown (logged); not found, error, no answer → stays unknown |
//! | `operation_query` / `resource_id` with `resend_after_not_found` | the same query | an authoritative "not found" (the found pointer holds `false`) → sent again under the same operation id (unknown → prepared) once the settle delay has passed since the last send, within the retry budget; before that → stays unknown (`not_found_settling`) |
//! | a masked request (`request_body = "masked"`: holds `"***"` and does not hash to the intent's digest): `idempotency_key`, a `resource_id_pointer` or a `match_fields` entry that is masked | needs operator (`arguments_masked`) | — (a query by operation id still runs) |
//! | `idempotency_key` | same-key retry (inside the key retention window and retry budget, counted before it leaves) | success → `succeeded` (a provider replay, or the first execution); an error the adapter's `not_done_errors` match → stays unknown (nothing was done now); another error → `failed_final` only if the adapter says `replays_first_outcome`, else stays unknown; no answer → stays unknown |
//!
//! A retry's or query's failure to answer never converges anything: only
//! an answer that proves an outcome does.
//!
//! An operator's `ops retry` (a fresh retry budget) is refused where no
//! row above spends the budget (`adapter::retry_budget_matters`): `none`,
//! a query without `resend_after_not_found`, a tool no upstream offers.
//!
//! A stored request that is not the request (policy `request_body =
//! "masked"`: it does not hash to the intent's digest and holds `"***"`) is
//! never sent and never taken for the request: a same-key retry, a query by
//! a masked resource id, a `match_fields` check of a masked field and a
//! resend all become "needs operator" (`arguments_masked`); a query by
//! operation id still runs. `dispatch::is_original` is the check every sender
//! makes.

use serde_json::{Value, json};

use crate::adapter::{Capability, QuerySpec, ToolAdapter};
use crate::dispatch::is_original;
use crate::ledger::{ConvergeEvidence, Evidence, EvidenceKind, OperationRecord, Settlement};
use crate::policy::secrets::MASK;

pub use super::judge::{Judgement, RemoteFact, judge_query, judge_retry, judge_task};

/// What the reconciler does next with one unknown operation.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Evidence on record proves the outcome.
    Converge(RemoteFact),
    /// Ask the tool's query operation: `{spec.argument: by}`, `by` being the
    /// operation id or the resource id from the request.
    Query { spec: QuerySpec, by: Value },
    /// Retry with the same key, if the ledger grants an attempt.
    RetrySameKey,
    /// Ask `upstream` where the task it made of the call stands.
    FollowTask { upstream: String, task_id: String },
    /// Nothing leasegate can do: an operator resolves it.
    NeedsOperator(&'static str),
}

/// Whether a stored body is a masked copy of the request.
fn is_masked(operation: &OperationRecord, body: &Value) -> bool {
    fn holds_mask(value: &Value) -> bool {
        match value {
            Value::String(text) => text == MASK,
            Value::Array(items) => items.iter().any(holds_mask),
            Value::Object(map) => map.values().any(holds_mask),
            _ => false,
        }
    }
    holds_mask(body) && !is_original(operation, body)
}

/// Decides the next step from the operation, its adapter (`None`: no
/// upstream offers the tool), the evidence on record and the stored
/// request arguments (`Null` when the policy keeps only the digest).
pub fn plan(
    operation: &OperationRecord,
    adapter: Option<&ToolAdapter>,
    evidence: &[Evidence],
    request_body: &Value,
) -> Step {
    // A late answer to the very request counts as evidence.
    let late = evidence.iter().rev().find(|e| {
        e.kind == EvidenceKind::LateResponse
            && matches!(e.outcome.as_deref(), Some("succeeded" | "failed_final"))
            && e.body.get("request_digest").and_then(Value::as_str)
                == Some(operation.request_digest.as_str())
    });
    if let Some(late) = late {
        return Step::Converge(RemoteFact {
            settlement: if late.outcome.as_deref() == Some("succeeded") {
                Settlement::Succeeded
            } else {
                Settlement::FailedFinal
            },
            remote_id: late.remote_id.clone(),
            result: late.body.get("result").cloned().unwrap_or(Value::Null),
            kind: ConvergeEvidence::LateResponse,
            evidence: json!({"late_evidence_id": late.evidence_id}),
        });
    }
    let task = evidence
        .iter()
        .rev()
        .filter(|e| e.kind == EvidenceKind::Task)
        .find_map(|e| {
            let upstream = e.body.get("upstream")?.as_str()?;
            let task_id = e.body.get("task_id")?.as_str()?;
            Some((upstream.to_owned(), task_id.to_owned()))
        });
    if let Some((upstream, task_id)) = task {
        return Step::FollowTask { upstream, task_id };
    }
    plan_by_capability(operation, adapter, request_body)
}

/// [`plan`] from the tool's capability alone: what is done when no
/// evidence on record decides (and when a task on record cannot tell).
pub fn plan_by_capability(
    operation: &OperationRecord,
    adapter: Option<&ToolAdapter>,
    request_body: &Value,
) -> Step {
    let Some(adapter) = adapter else {
        return Step::NeedsOperator("unknown_tool");
    };
    let masked = is_masked(operation, request_body);
    let masked_field = |value: &Value| masked && value.as_str() == Some(MASK);
    match adapter.capability {
        Capability::None => Step::NeedsOperator("no_capability"),
        Capability::OperationQuery | Capability::ResourceId => match &adapter.query {
            Some(query)
                if adapter.capability == Capability::ResourceId
                    && query.match_fields.iter().any(|field| {
                        request_body.get(field.as_str()).is_some_and(masked_field)
                    }) =>
            {
                Step::NeedsOperator("arguments_masked")
            }
            Some(query) => match &query.resource_id_pointer {
                None => Step::Query {
                    spec: query.clone(),
                    by: Value::String(operation.operation_id.as_str().to_owned()),
                },
                Some(pointer) => match request_body.pointer(pointer) {
                    Some(id) if masked_field(id) => Step::NeedsOperator("arguments_masked"),
                    Some(id) if !id.is_null() => Step::Query {
                        spec: query.clone(),
                        by: id.clone(),
                    },
                    // Masked, digest-only, or the agent left it out.
                    _ => Step::NeedsOperator("resource_id_not_stored"),
                },
            },
            None => Step::NeedsOperator("no_query_tool"),
        },
        Capability::IdempotencyKey if masked => Step::NeedsOperator("arguments_masked"),
        Capability::IdempotencyKey => Step::RetrySameKey,
    }
}

impl Step {
    /// The step in words, for a reader (the web console): a short name
    /// (`converge`, `query`, `retry_same_key`, `needs_operator`) and what
    /// it means for this operation. Read-only: describing runs nothing.
    pub fn describe(&self) -> (&'static str, String) {
        match self {
            Step::Converge(fact) => (
                "converge",
                format!(
                    "evidence on record ({}) proves the outcome: it will be settled {}",
                    fact.kind.as_str(),
                    fact.settlement.as_str()
                ),
            ),
            Step::Query { spec, by } => (
                "query",
                format!("ask the upstream's query tool {} with {{{}: {by}}}", spec.tool, spec.argument),
            ),
            Step::FollowTask { upstream, task_id } => (
                "follow_task",
                format!("ask upstream {upstream} where task {task_id} stands (tasks/get); a terminal status settles it"),
            ),
            Step::RetrySameKey => (
                "retry_same_key",
                "retry with the same idempotency key, if the retry budget and the key's retention window allow"
                    .to_owned(),
            ),
            Step::NeedsOperator(reason) => (
                "needs_operator",
                format!("leasegate cannot settle it ({reason}): an operator resolves it"),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use chrono::Utc;

    use super::*;
    use crate::adapter::{OperationIdPlacement, ToolAnswer};
    use crate::intent::{IntegerPolicy, request_digest};
    use crate::intent::{OperationId, RequestDigest};
    use crate::ledger::{OperationStatus, RunId};

    const DIGEST: &str = "0000000000000000000000000000000000000000000000000000000000000000";

    fn operation() -> OperationRecord {
        OperationRecord {
            operation_id: OperationId::from_string("op-1".into()),
            run_id: RunId::generate(),
            step_id: "charge".into(),
            effect_version: 1,
            tool_name: "payments__charge".into(),
            request_digest: RequestDigest::from_hex(DIGEST.into()),
            status: OperationStatus::Unknown,
            revision: 3,
            dispatch_owner: None,
            dispatch_until: None,
            dispatch_count: 1,
            remote_id: None,
            result: None,
            route: None,
        }
    }

    fn query() -> QuerySpec {
        QuerySpec {
            tool: "get".into(),
            argument: "operation_id".into(),
            found_pointer: "/found".into(),
            resource_pointer: Some("/resource".into()),
            remote_id_pointer: Some("/resource/id".into()),
            match_fields: vec!["name".into()],
            resource_id_pointer: None,
            resend_after_not_found: None,
        }
    }

    fn adapter(capability: Capability) -> ToolAdapter {
        ToolAdapter {
            capability,
            placement: OperationIdPlacement::Argument("key".into()),
            key_retention: Some(Duration::from_secs(3600)),
            query: matches!(
                capability,
                Capability::OperationQuery | Capability::ResourceId
            )
            .then(query),
            remote_id_pointer: Some("/id".into()),
            ..ToolAdapter::unknown(Duration::from_secs(1))
        }
    }

    fn late(outcome: &str, digest: &str) -> Evidence {
        Evidence {
            evidence_id: 7,
            at: Utc::now(),
            kind: EvidenceKind::LateResponse,
            source: "proxy".into(),
            claim_owner: Some("proxy".into()),
            claim_revision: Some(1),
            outcome: Some(outcome.into()),
            remote_id: Some("ch_1".into()),
            body: json!({"request_digest": digest, "result": {"isError": outcome != "succeeded"}}),
        }
    }

    fn answer(is_error: bool, structured: Value) -> ToolAnswer {
        ToolAnswer {
            is_error,
            result: json!({"structuredContent": structured, "isError": is_error}),
        }
    }

    #[test]
    fn a_retry_budget_matters_only_where_a_retry_or_a_resend_can_follow() {
        use crate::adapter::retry_budget_matters;
        assert!(retry_budget_matters(Some(&adapter(Capability::IdempotencyKey))).is_ok());
        let mut resending = adapter(Capability::ResourceId);
        resending.query.as_mut().unwrap().resend_after_not_found = Some(Duration::from_secs(5));
        assert!(retry_budget_matters(Some(&resending)).is_ok());
        for (adapter, says) in [
            (Some(adapter(Capability::None)), "`none`"),
            (Some(adapter(Capability::OperationQuery)), "queries"),
            (Some(adapter(Capability::ResourceId)), "queries"),
            (None, "no upstream"),
        ] {
            let why = retry_budget_matters(adapter.as_ref()).expect_err(says);
            assert!(why.contains(says) && why.contains("ops resolve"), "{why}");
        }
    }

    #[test]
    fn a_late_response_to_the_same_request_converges_first_whatever_the_capability() {
        for capability in [
            Capability::None,
            Capability::IdempotencyKey,
            Capability::OperationQuery,
            Capability::ResourceId,
        ] {
            for (outcome, settlement) in [
                ("succeeded", Settlement::Succeeded),
                ("failed_final", Settlement::FailedFinal),
            ] {
                let step = plan(
                    &operation(),
                    Some(&adapter(capability)),
                    &[late(outcome, DIGEST)],
                    &Value::Null,
                );
                let Step::Converge(fact) = step else {
                    panic!("{capability:?}: {step:?}")
                };
                assert_eq!(
                    (fact.settlement, fact.kind, fact.remote_id.as_deref()),
                    (settlement, ConvergeEvidence::LateResponse, Some("ch_1"))
                );
                assert_eq!(fact.evidence, json!({"late_evidence_id": 7}));
            }
        }
        // Even without an adapter.
        assert!(matches!(
            plan(
                &operation(),
                None,
                &[late("succeeded", DIGEST)],
                &Value::Null
            ),
            Step::Converge(_)
        ));
    }

    #[test]
    fn a_late_response_to_another_request_or_without_an_outcome_is_not_evidence() {
        let other = "1111111111111111111111111111111111111111111111111111111111111111";
        let key = adapter(Capability::IdempotencyKey);
        assert_eq!(
            plan(
                &operation(),
                Some(&key),
                &[late("succeeded", other)],
                &Value::Null
            ),
            Step::RetrySameKey
        );
        assert_eq!(
            plan(
                &operation(),
                Some(&key),
                &[late("unknown", DIGEST)],
                &Value::Null
            ),
            Step::RetrySameKey
        );
    }

    #[test]
    fn each_capability_plans_its_own_step() {
        let op = operation();
        assert_eq!(
            plan(&op, None, &[], &Value::Null),
            Step::NeedsOperator("unknown_tool")
        );
        assert_eq!(
            plan(&op, Some(&adapter(Capability::None)), &[], &Value::Null),
            Step::NeedsOperator("no_capability")
        );
        assert_eq!(
            plan(
                &op,
                Some(&adapter(Capability::IdempotencyKey)),
                &[],
                &Value::Null
            ),
            Step::RetrySameKey
        );
        for capability in [Capability::OperationQuery, Capability::ResourceId] {
            assert_eq!(
                plan(&op, Some(&adapter(capability)), &[], &Value::Null),
                Step::Query {
                    spec: query(),
                    by: json!("op-1")
                }
            );
            let without = ToolAdapter {
                query: None,
                ..adapter(capability)
            };
            assert_eq!(
                plan(&op, Some(&without), &[], &Value::Null),
                Step::NeedsOperator("no_query_tool")
            );
        }
    }

    #[test]
    fn a_query_converges_only_what_it_finds() {
        let request = json!({"name": "invoices", "region": "eu"});
        let found = answer(
            false,
            json!({"found": true, "resource": {"id": "b-1", "name": "invoices"}}),
        );
        for capability in [Capability::OperationQuery, Capability::ResourceId] {
            let Judgement::Converge(fact) =
                judge_query(capability, &query(), Some(&found), &request)
            else {
                panic!("{capability:?} found")
            };
            assert_eq!(
                (fact.settlement, fact.kind, fact.remote_id.as_deref()),
                (
                    Settlement::Succeeded,
                    ConvergeEvidence::QueryResult,
                    Some("b-1")
                )
            );
            assert_eq!(
                fact.result["structuredContent"],
                json!({"id": "b-1", "name": "invoices"})
            );
            assert_eq!(
                judge_query(
                    capability,
                    &query(),
                    Some(&answer(false, json!({"found": false}))),
                    &request
                ),
                Judgement::StaysUnknown("not_known_remotely")
            );
            assert_eq!(
                judge_query(
                    capability,
                    &query(),
                    Some(&answer(true, json!({"found": true}))),
                    &request
                ),
                Judgement::StaysUnknown("query_failed")
            );
            assert_eq!(
                judge_query(capability, &query(), None, &request),
                Judgement::StaysUnknown("query_failed")
            );
        }
        // resource_id checks match_fields; operation_query does not.
        let other = answer(
            false,
            json!({"found": true, "resource": {"id": "b-2", "name": "payroll"}}),
        );
        assert_eq!(
            judge_query(Capability::ResourceId, &query(), Some(&other), &request),
            Judgement::StaysUnknown("resource_mismatch")
        );
        assert!(matches!(
            judge_query(Capability::OperationQuery, &query(), Some(&other), &request),
            Judgement::Converge(_)
        ));
    }

    #[test]
    fn a_retry_success_proves_success_and_its_error_proves_nothing_unless_replayed() {
        let plain = adapter(Capability::IdempotencyKey);
        let Judgement::Converge(fact) =
            judge_retry(&plain, Some(answer(false, json!({"id": "ch_1"}))), 2)
        else {
            panic!("success")
        };
        assert_eq!(
            (
                fact.settlement,
                fact.kind,
                fact.remote_id.as_deref(),
                &fact.evidence
            ),
            (
                Settlement::Succeeded,
                ConvergeEvidence::RetryResult,
                Some("ch_1"),
                &json!({"attempt": 2})
            )
        );
        assert_eq!(
            judge_retry(&plain, Some(answer(true, json!({}))), 1),
            Judgement::StaysUnknown("retry_error_inconclusive")
        );
        assert_eq!(
            judge_retry(&plain, None, 1),
            Judgement::StaysUnknown("retry_failed")
        );
        let replaying = ToolAdapter {
            replays_first_outcome: true,
            ..plain
        };
        let Judgement::Converge(fact) = judge_retry(&replaying, Some(answer(true, json!({}))), 1)
        else {
            panic!("a replayed error is the first outcome")
        };
        assert_eq!(fact.settlement, Settlement::FailedFinal);
        assert_eq!(
            judge_retry(&replaying, None, 1),
            Judgement::StaysUnknown("retry_failed")
        );
        // An error the provider documents as "nothing was done" proves
        // nothing, even from a provider that replays first outcomes.
        let documented = ToolAdapter {
            not_done_errors: vec![crate::adapter::NotDoneRule {
                pointer: "/error/code".into(),
                values: vec![json!("rate_limited")],
            }],
            ..replaying
        };
        assert_eq!(
            judge_retry(
                &documented,
                Some(answer(true, json!({"error": {"code": "rate_limited"}}))),
                1
            ),
            Judgement::StaysUnknown("retry_not_done")
        );
        assert!(matches!(
            judge_retry(
                &documented,
                Some(answer(true, json!({"error": {"code": "card_declined"}}))),
                1
            ),
            Judgement::Converge(RemoteFact {
                settlement: Settlement::FailedFinal,
                ..
            })
        ));
    }
    #[test]
    fn a_masked_request_is_never_retried_nor_taken_for_the_request() {
        let masked = json!({"card": "***", "name": "***", "amount": 5});
        assert!(!is_original(&operation(), &masked));
        assert_eq!(
            plan(
                &operation(),
                Some(&adapter(Capability::IdempotencyKey)),
                &[],
                &masked
            ),
            Step::NeedsOperator("arguments_masked")
        );
        // resource_id's match_fields ("name") is masked: no check possible.
        assert_eq!(
            plan(
                &operation(),
                Some(&adapter(Capability::ResourceId)),
                &[],
                &masked
            ),
            Step::NeedsOperator("arguments_masked")
        );
        // A query by operation id needs nothing from the request.
        assert!(matches!(
            plan(
                &operation(),
                Some(&adapter(Capability::OperationQuery)),
                &[],
                &masked
            ),
            Step::Query { .. }
        ));
        let named = ToolAdapter {
            query: Some(QuerySpec {
                resource_id_pointer: Some("/name".into()),
                match_fields: Vec::new(),
                ..query()
            }),
            ..adapter(Capability::OperationQuery)
        };
        assert_eq!(
            plan(&operation(), Some(&named), &[], &masked),
            Step::NeedsOperator("arguments_masked")
        );
        // The request itself (its digest is the intent's) is sent again.
        let arguments = json!({"card": "***", "amount": 5});
        let mut original = operation();
        original.request_digest =
            request_digest(&original.tool_name, &arguments, IntegerPolicy::Reject).unwrap();
        assert!(is_original(&original, &arguments));
        assert_eq!(
            plan(
                &original,
                Some(&adapter(Capability::IdempotencyKey)),
                &[],
                &arguments
            ),
            Step::RetrySameKey
        );
    }

    #[test]
    fn a_resource_named_by_the_agent_is_queried_by_that_name() {
        let named = ToolAdapter {
            query: Some(QuerySpec {
                resource_id_pointer: Some("/bucket/name".into()),
                ..query()
            }),
            ..adapter(Capability::ResourceId)
        };
        let request = json!({"bucket": {"name": "invoices-2026"}, "region": "eu"});
        assert_eq!(
            plan(&operation(), Some(&named), &[], &request),
            Step::Query {
                spec: named.query.clone().unwrap(),
                by: json!("invoices-2026")
            }
        );
        // Not stored (digest-only or masked policy), or not given: nothing to ask by.
        for body in [
            Value::Null,
            json!({"region": "eu"}),
            json!({"bucket": {"name": null}}),
        ] {
            assert_eq!(
                plan(&operation(), Some(&named), &[], &body),
                Step::NeedsOperator("resource_id_not_stored"),
                "{body}"
            );
        }
    }

    #[test]
    fn an_authoritative_not_found_resends_only_when_the_adapter_opts_in() {
        let request = json!({"name": "invoices"});
        let not_found = answer(false, json!({"found": false}));
        let resending = QuerySpec {
            resend_after_not_found: Some(Duration::from_secs(30)),
            ..query()
        };
        for capability in [Capability::OperationQuery, Capability::ResourceId] {
            let Judgement::Resend { settle, evidence } =
                judge_query(capability, &resending, Some(&not_found), &request)
            else {
                panic!("{capability:?}: a not-found resends")
            };
            assert_eq!(settle, Duration::from_secs(30));
            assert_eq!(evidence["found"], json!(false));
            assert_eq!(evidence["query_tool"], json!("get"));
            // Without the opt-in it stays unknown.
            assert_eq!(
                judge_query(capability, &query(), Some(&not_found), &request),
                Judgement::StaysUnknown("not_known_remotely")
            );
            // Only an answer that says "not found" counts: no found field,
            // an error answer or no answer prove nothing.
            for (answer, reason) in [
                (Some(answer(false, json!({}))), "not_known_remotely"),
                (
                    Some(answer(false, json!({"found": "no"}))),
                    "not_known_remotely",
                ),
                (Some(answer(true, json!({"found": false}))), "query_failed"),
                (None, "query_failed"),
            ] {
                assert_eq!(
                    judge_query(capability, &resending, answer.as_ref(), &request),
                    Judgement::StaysUnknown(reason)
                );
            }
        }
    }

    #[test]
    fn a_task_on_record_is_followed_whatever_the_capability_and_only_its_end_converges() {
        use crate::adapter::{PeerError, TaskState};
        let task = Evidence {
            kind: EvidenceKind::Task,
            outcome: None,
            remote_id: None,
            body: json!({"upstream": "reports", "task_id": "t-1", "handle": {}}),
            ..late("succeeded", "other")
        };
        for capability in [
            Capability::None,
            Capability::IdempotencyKey,
            Capability::OperationQuery,
        ] {
            assert_eq!(
                plan(
                    &operation(),
                    Some(&adapter(capability)),
                    std::slice::from_ref(&task),
                    &json!({})
                ),
                Step::FollowTask {
                    upstream: "reports".into(),
                    task_id: "t-1".into()
                },
                "{capability:?}"
            );
        }
        let none = adapter(Capability::None);
        let completed = TaskState::Completed(answer(false, json!({"id": "exp_1"})));
        match judge_task(Some(&none), "t-1", Some(&completed)) {
            Some(Judgement::Converge(fact)) => {
                assert_eq!(fact.settlement, Settlement::Succeeded);
                assert_eq!(fact.remote_id.as_deref(), Some("exp_1"));
                assert_eq!(fact.kind, ConvergeEvidence::QueryResult);
            }
            other => panic!("a completed task converges: {other:?}"),
        }
        let tool_error = TaskState::Completed(answer(true, json!({})));
        assert!(matches!(
            judge_task(Some(&none), "t-1", Some(&tool_error)),
            Some(Judgement::Converge(RemoteFact {
                settlement: Settlement::FailedFinal,
                ..
            }))
        ));
        let rejected = TaskState::Failed(PeerError {
            code: -32602,
            message: "bad".into(),
            data: None,
        });
        assert!(matches!(
            judge_task(Some(&none), "t-1", Some(&rejected)),
            Some(Judgement::Converge(RemoteFact {
                settlement: Settlement::FailedFinal,
                ..
            }))
        ));
        assert_eq!(
            judge_task(Some(&none), "t-1", Some(&TaskState::Working)),
            Some(Judgement::StaysUnknown("task_working"))
        );
        // It may have acted: the capability decides, as without a task.
        let internal = TaskState::Failed(PeerError {
            code: -32603,
            message: "boom".into(),
            data: None,
        });
        for state in [Some(&internal), Some(&TaskState::Cancelled), None] {
            assert_eq!(judge_task(Some(&none), "t-1", state), None);
        }
    }
}
