//! What an answer proves, as pure functions: a query's ([`judge_query`]),
//! a same-key retry's ([`judge_retry`]) and a task's status
//! ([`judge_task`]), each a [`Judgement`] the reconciler executes. The rows
//! of the decision table they decide are in `plan`, and are unit tests
//! there.

use serde_json::{Value, json};

use crate::adapter::{Capability, QuerySpec, ToolAdapter, ToolAnswer};
use crate::dispatch::remote_id_of;
use crate::ledger::{ConvergeEvidence, Settlement};

/// What the remote says happened, and how leasegate learned it.
#[derive(Debug, Clone, PartialEq)]
pub struct RemoteFact {
    pub settlement: Settlement,
    pub remote_id: Option<String>,
    pub result: Value,
    pub kind: ConvergeEvidence,
    pub evidence: Value,
}

/// Judges where a task stands (`None`: the upstream could not say).
/// `None` back: the task decides nothing; plan by capability.
pub fn judge_task(
    adapter: Option<&ToolAdapter>,
    task_id: &str,
    state: Option<&crate::adapter::TaskState>,
) -> Option<Judgement> {
    use crate::adapter::TaskState;
    let evidence = |status: &str| json!({"task_id": task_id, "task_status": status});
    match state? {
        TaskState::Working | TaskState::InputRequired => {
            Some(Judgement::StaysUnknown("task_working"))
        }
        TaskState::Completed(answer) => Some(Judgement::Converge(RemoteFact {
            settlement: if answer.is_error {
                Settlement::FailedFinal
            } else {
                Settlement::Succeeded
            },
            remote_id: remote_id_of(
                adapter.and_then(|a| a.remote_id_pointer.as_deref()),
                &answer.result,
            ),
            result: answer.result.clone(),
            kind: ConvergeEvidence::QueryResult,
            evidence: evidence("completed"),
        })),
        // By protocol nothing executed.
        TaskState::Failed(error) if (-32602..=-32600).contains(&error.code) => {
            Some(Judgement::Converge(RemoteFact {
                settlement: Settlement::FailedFinal,
                remote_id: None,
                result: ToolAnswer::refused("the task failed", error.code, &error.message).result,
                kind: ConvergeEvidence::QueryResult,
                evidence: evidence("failed"),
            }))
        }
        // It may have acted before it failed or was cancelled.
        TaskState::Failed(_) | TaskState::Cancelled => None,
    }
}

/// What an answer proves.
#[derive(Debug, Clone, PartialEq)]
pub enum Judgement {
    Converge(RemoteFact),
    /// The tool says it does not know the operation: send it again under
    /// the same operation id once `settle` passed since the last send.
    Resend {
        settle: std::time::Duration,
        evidence: Value,
    },
    /// Nothing proven; the reason is a metric label.
    StaysUnknown(&'static str),
}

/// Judges a query's answer (`None`: no answer). `request_body` is what the
/// intent asked for (the resource_id `match_fields` check).
pub fn judge_query(
    capability: Capability,
    query: &QuerySpec,
    answer: Option<&ToolAnswer>,
    request_body: &Value,
) -> Judgement {
    let Some(answer) = answer.filter(|answer| !answer.is_error) else {
        return Judgement::StaysUnknown("query_failed");
    };
    let structured = answer
        .result
        .get("structuredContent")
        .cloned()
        .unwrap_or(Value::Null);
    match structured.pointer(&query.found_pointer) {
        Some(Value::Bool(true)) => {}
        // Authoritative: the tool answered, and says it has no such thing.
        Some(Value::Bool(false)) => {
            return match query.resend_after_not_found {
                Some(settle) => Judgement::Resend {
                    settle,
                    evidence: json!({"query_tool": query.tool, "found": false,
                                     "answer": structured}),
                },
                None => Judgement::StaysUnknown("not_known_remotely"),
            };
        }
        _ => return Judgement::StaysUnknown("not_known_remotely"),
    }
    let resource = match &query.resource_pointer {
        Some(pointer) => structured.pointer(pointer).cloned().unwrap_or(Value::Null),
        None => structured.clone(),
    };
    if capability == Capability::ResourceId
        && query
            .match_fields
            .iter()
            .any(|field| resource.get(field.as_str()) != request_body.get(field.as_str()))
    {
        return Judgement::StaysUnknown("resource_mismatch");
    }
    let remote_id = query
        .remote_id_pointer
        .as_deref()
        .and_then(|pointer| structured.pointer(pointer))
        .map(|v| {
            v.as_str()
                .map(str::to_owned)
                .unwrap_or_else(|| v.to_string())
        });
    Judgement::Converge(RemoteFact {
        settlement: Settlement::Succeeded,
        remote_id,
        result: json!({"structuredContent": resource, "content": answer.result.get("content"), "isError": false}),
        kind: ConvergeEvidence::QueryResult,
        evidence: json!({"query_tool": query.tool}),
    })
}

/// Judges a same-key retry's answer (`None`: no answer). `attempt` is the
/// attempt's number, kept with the evidence.
pub fn judge_retry(adapter: &ToolAdapter, answer: Option<ToolAnswer>, attempt: i32) -> Judgement {
    let Some(answer) = answer else {
        return Judgement::StaysUnknown("retry_failed");
    };
    if adapter.says_nothing_was_done(&answer) {
        // Nothing was done now; that says nothing about the first attempt.
        return Judgement::StaysUnknown("retry_not_done");
    }
    if answer.is_error && !adapter.replays_first_outcome {
        // Says nothing about the first attempt: it may have acted.
        return Judgement::StaysUnknown("retry_error_inconclusive");
    }
    Judgement::Converge(RemoteFact {
        settlement: if answer.is_error {
            Settlement::FailedFinal
        } else {
            Settlement::Succeeded
        },
        remote_id: remote_id_of(adapter.remote_id_pointer.as_deref(), &answer.result),
        result: answer.result,
        kind: ConvergeEvidence::RetryResult,
        evidence: json!({"attempt": attempt}),
    })
}
