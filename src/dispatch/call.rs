//! The vocabulary of one side-effecting call, shared by the inline path
//! (`Dispatcher`), a claim's execution (`execute`) and the outbox: the
//! request as the front received it, what travels with it, what the agent
//! gets back, why a call is refused, and the identity a process's claims
//! carry. Types only; nothing here touches the ledger or an upstream.

use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

use crate::adapter::{AgentSink, ResolvedTool};
use crate::intent::{IntentError, OperationId, StepRef};
use crate::ledger::{LeaseClaim, LedgerError, OperationStatus, Rejection};

/// The `_meta` key under which the upstream always receives the operation id.
pub const OPERATION_ID_META: &str = "dev.leasegate/operation_id";

/// One side-effecting call as the front received it.
#[derive(Debug)]
pub struct CallRequest {
    pub lease: LeaseClaim,
    /// The lease is one leasegate holds for an agent that knows nothing of
    /// leases (lease modes `session` and `key`): an agent whose model
    /// plans its calls, whose undelivered outcomes are shown before a
    /// different call is sent (`after_undelivered`).
    pub lease_held_for_agent: bool,
    pub step: Option<StepRef>,
    /// The name the agent called (namespaced); part of the digest.
    pub exposed_name: String,
    /// Where it goes and what the tool promises.
    pub tool: ResolvedTool,
    pub arguments: Map<String, Value>,
    pub context: CallContext,
}

/// What travels with a call besides its arguments: `_meta` to pass on
/// (trace context), where the upstream's messages for the agent go, and the
/// agent's cancellation.
#[derive(Debug, Default)]
pub struct CallContext {
    pub meta: Map<String, Value>,
    /// `None`: nobody listens (background work).
    pub agent: Option<AgentSink>,
    /// Fired when the agent explicitly cancels; forwarded upstream.
    pub cancel: CancellationToken,
    /// Fired when the agent stops waiting for this call (cancelled or went
    /// away), whether or not the call goes on: its outcome is undelivered.
    pub gone: CancellationToken,
    /// The agent follows tasks (it declared the MCP Tasks extension): a
    /// task the upstream makes of the call is answered with its handle and
    /// followed here. `None`: the upstream is not offered tasks.
    pub tasks: Option<std::sync::Arc<super::followers::TaskFollowers>>,
}

/// A fresh identity for one leasegate process: every claim it takes carries
/// it, and its liveness is renewed under it (`Ledger::process_heartbeat`).
pub fn process_owner() -> String {
    format!(
        "leasegate-{}-{}",
        std::process::id(),
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    )
}

/// The operation a reply is about, as the agent sees it in `_meta`.
#[derive(Debug, Clone, PartialEq)]
pub struct OperationNote {
    pub operation_id: OperationId,
    pub status: OperationStatus,
    pub replayed: bool,
    /// The answer came from a call still in flight when this one arrived,
    /// after this one waited for it (`policy.in_flight_wait`): the front
    /// counts it apart from an answer already on record.
    pub waited: bool,
    /// What leasegate did to the request or decided about it that the
    /// agent should be told.
    pub remarks: Remarks,
}

/// What an answer says beyond its operation: leasegate's own changes to
/// the request, and why a call was answered from another one.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Remarks {
    /// The argument leasegate fills with the operation id, when the agent
    /// sent a value there: that value was not used.
    pub filled_argument: Option<String>,
    /// The `_meta` key leasegate fills with the operation id, when the
    /// agent sent a value there: that value was not used.
    pub filled_meta: Option<String>,
    /// The call matched a recorded intent by the tool's declared identity
    /// and was answered from it: the argument fields (JSON pointers) in
    /// which it differed (`None` when the recorded request is not kept in
    /// full, so which fields is not known).
    pub rephrased: Option<Rephrased>,
}

/// A call answered from an earlier one with the same declared identity.
#[derive(Debug, Clone, PartialEq)]
pub struct Rephrased {
    /// The identity fields (as declared).
    pub identity: Vec<String>,
    /// The fields that differed; `None`: unknown (the recorded request is
    /// masked, digest only or sealed).
    pub differs: Option<Vec<String>>,
}

impl Rephrased {
    /// One sentence for the model.
    pub fn said(&self) -> String {
        let identity = self.identity.join(", ");
        match &self.differs {
            Some(fields) if !fields.is_empty() => format!(
                "this call has the same {identity} as the earlier one and differs only in {}",
                fields.join(", ")
            ),
            _ => format!("this call has the same {identity} as the earlier one"),
        }
    }

    pub fn to_json(&self) -> Value {
        json!({"identity": self.identity, "differs": self.differs})
    }
}

impl OperationNote {
    pub fn to_json(&self) -> Value {
        let mut note = json!({
            "operation_id": self.operation_id.as_str(),
            "status": self.status.as_str(),
            "replayed": self.replayed,
        });
        if let Some(argument) = &self.remarks.filled_argument {
            note["replaced_argument"] = json!({
                "name": argument,
                "reason": "leasegate fills this argument with the operation id; the value sent was not used",
            });
        }
        if let Some(key) = &self.remarks.filled_meta {
            note["replaced_meta"] = json!({
                "key": key,
                "reason": "leasegate fills this _meta key with the operation id; the value sent was not used",
            });
        }
        if let Some(rephrased) = &self.remarks.rephrased {
            note["rephrased"] = rephrased.to_json();
        }
        note
    }
}

/// What the agent gets back.
#[derive(Debug, Clone, PartialEq)]
pub enum CallReply {
    /// The upstream's answer (fresh or recorded).
    Answer {
        result: Value,
        is_error: bool,
        operation: OperationNote,
    },
    /// The upstream made a task of the call: its `CreateTaskResult` as
    /// sent; the operation stays `dispatching` until the task ends.
    Task {
        handle: Value,
        operation: OperationNote,
    },
    /// The outcome is unknown: reported as a tool result with isError and
    /// the operation named, never as a failure.
    Unknown {
        operation_id: OperationId,
        reason: String,
    },
    /// Not sent: earlier calls of this tool in this run have outcomes their
    /// agent never received (adapter `after_undelivered = "show"`); these
    /// are they, shown instead. Calling again sends the call.
    Shown { tool: String, calls: Vec<ShownCall> },
}

/// An earlier call shown to an agent that never received its outcome.
#[derive(Debug, Clone, PartialEq)]
pub struct ShownCall {
    pub operation_id: OperationId,
    pub status: OperationStatus,
    /// Its request as the ledger keeps it (masked or digest only per policy).
    pub arguments: Value,
    /// Its recorded answer, when it has one.
    pub result: Option<Value>,
}

impl ShownCall {
    pub fn to_json(&self) -> Value {
        json!({
            "operation_id": self.operation_id.as_str(),
            "status": self.status.as_str(),
            "arguments": self.arguments,
            "result": self.result,
        })
    }
}

/// Why a call was refused; nothing reached the upstream.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// The front names how to send one (its transport's words).
    #[error("this tool has side effects and needs a lease")]
    LeaseRequired,
    /// A malformed lease or step in `_meta` or the headers.
    #[error("{0}")]
    BadRequestMeta(String),
    #[error(
        "{0}; stop this worker: another worker owns the run now, or the lease expired (re-acquire to continue)"
    )]
    LeaseLost(Box<Rejection>),
    /// The current owner and epoch without that lease's secret token.
    #[error(
        "{0}; send the lease token you were given when the lease was taken (header \
         Leasegate-Lease-Token, or token in _meta \"dev.leasegate/lease\")"
    )]
    LeaseTokenInvalid(Box<Rejection>),
    /// Lease mode `session`: the session's lease is gone.
    #[error(
        "the session lease of task {task:?} is gone ({cause}): this leasegate stopped renewing its \
         share of the task's lease (was it paused?) and the task's other holders moved on, or it \
         could not renew it. Nothing was sent; start a new session (restart the agent's \
         leasegate) to take the task back"
    )]
    SessionLost { task: String, cause: String },
    #[error("{0}")]
    RunTerminal(Box<Rejection>),
    #[error("run not found: create the run and acquire its lease first")]
    RunNotFound,
    #[error("{0}")]
    IntentConflict(Box<Rejection>),
    /// The tool's declared identity matches a recorded intent whose request
    /// differs, and the tool's `on_rephrase` is `conflict`.
    #[error(
        "intent conflict: {} (operation {operation_id}, {status}); nothing was sent. Call again \
         with the earlier call's arguments to get its outcome, or change one of the identity \
         fields if this is a different effect",
        rephrased.said()
    )]
    Rephrased {
        operation_id: OperationId,
        status: OperationStatus,
        rephrased: Rephrased,
    },
    #[error("operation {operation_id} is in progress under another claim; ask again later")]
    InProgress { operation_id: OperationId },
    #[error("operation {operation_id} was cancelled (its run was cancelled or its plan changed)")]
    Cancelled { operation_id: OperationId },
    /// Provably nothing reached the tool; the operation is `prepared` again
    /// under the same id.
    #[error(
        "operation {operation_id} was not sent: {reason}. Nothing reached the tool; call again \
         with the same step to send it (leasegate's outbox also sends it once the upstream is back)"
    )]
    NotSent {
        operation_id: OperationId,
        reason: String,
    },
    /// The front names how to send one (its transport's words).
    #[error("policy requires an explicit step")]
    StepRequired,
    #[error(
        "arguments are {size} bytes, above the policy limit of {limit} (policy max_arguments_bytes; the request was not recorded or sent)"
    )]
    ArgumentsTooLarge { size: usize, limit: usize },
    #[error(transparent)]
    Intent(#[from] IntentError),
    #[error("ledger: {0}")]
    Ledger(#[from] LedgerError),
    /// The durability contract is not met, or a lossy failover is
    /// unresolved (`crate::durability`): nothing was registered or sent.
    #[error("durability hold: {reason}. Nothing was registered or sent; call again later")]
    Held { reason: String },
    /// The ledger could not be reached or confirmed before anything was
    /// registered (a check that failed, a connection that broke, this
    /// process's liveness possibly lapsed: `durability::Hold`); the
    /// durability contract is not known to have failed.
    #[error("ledger unavailable: {reason}. Nothing was registered or sent; call again")]
    LedgerUnreachable { reason: String },
}

/// A call's outcome as a trace records it (span attribute `outcome`).
pub fn trace_outcome(result: Result<&CallReply, &CallError>) -> &'static str {
    match result {
        Ok(CallReply::Answer {
            operation,
            is_error,
            ..
        }) => match operation.status {
            OperationStatus::Succeeded | OperationStatus::FailedFinal => operation.status.as_str(),
            // Provider said nothing was done: prepared again.
            _ if *is_error => "not_sent",
            other => other.as_str(),
        },
        Ok(CallReply::Unknown { .. }) => "unknown",
        Ok(CallReply::Shown { .. }) => "shown",
        Ok(CallReply::Task { .. }) => "task",
        Err(CallError::NotSent { .. }) => "not_sent",
        Err(_) => "refused",
    }
}
