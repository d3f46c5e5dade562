//! The seam between dispatch and the MCP client: one call to an upstream
//! tool, what the upstream sends the agent meanwhile, what it answers (a
//! result, or a task made of the call), and what a failure proves about
//! delivery. `mcp` implements [`Upstream`]; dispatch and the reconciler use
//! only this.

use std::future::Future;
use std::time::Duration;

use serde_json::{Map, Value};

/// One call to an upstream tool.
#[derive(Debug, Clone)]
pub struct UpstreamCall {
    pub upstream: String,
    pub tool: String,
    pub arguments: Map<String, Value>,
    /// Extra `_meta` for the upstream request (operation id, trace context).
    pub meta: Map<String, Value>,
    pub timeout: Duration,
    /// Where what the upstream sends during the call goes: progress,
    /// notifications and requests for the agent (sampling, elicitation,
    /// roots). `None`: nobody listens (background work); requests are then
    /// refused.
    pub agent: Option<AgentSink>,
    /// Fired when the agent explicitly cancels: forwarded to the upstream.
    pub cancel: tokio_util::sync::CancellationToken,
    /// The agent takes a task handle for an answer (it declared the MCP
    /// Tasks extension): the upstream is told so for this request alone,
    /// and may answer [`ToolReply::Task`]. Background work never does.
    pub tasks: bool,
}

/// What an upstream sends the agent while one of its calls runs, in the
/// order the upstream sent it.
#[derive(Debug)]
pub enum ToAgent {
    /// A progress update (only when the agent asked for progress).
    Progress(Progress),
    /// A notification tied to the call (`notifications/message`,
    /// `notifications/elicitation/complete`, …), as JSON-RPC method and params.
    Notification {
        /// The upstream that sent it.
        upstream: String,
        method: String,
        params: Value,
    },
    /// A request the agent must answer (`sampling/createMessage`,
    /// `elicitation/create`, `roots/list`, `ping`).
    Request(AgentRequest),
}

/// A request from the upstream to the agent, answered through `reply`.
#[derive(Debug)]
pub struct AgentRequest {
    pub method: String,
    pub params: Value,
    pub reply: tokio::sync::oneshot::Sender<Result<Value, PeerError>>,
}

/// A JSON-RPC error answer.
#[derive(Debug, Clone, PartialEq)]
pub struct PeerError {
    pub code: i32,
    pub message: String,
    pub data: Option<Value>,
}

/// The channel to the agent's side of a call.
pub type AgentSink = tokio::sync::mpsc::UnboundedSender<ToAgent>;

/// A progress update from the upstream, to forward to the agent.
#[derive(Debug, Clone, PartialEq)]
pub struct Progress {
    pub progress: f64,
    pub total: Option<f64>,
    pub message: Option<String>,
}

/// A tool's answer, as the JSON of an MCP `CallToolResult`.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolAnswer {
    pub is_error: bool,
    pub result: Value,
}

/// What an upstream answered a `tools/call`: its result, or a task it made
/// of the call (MCP Tasks extension; only when [`UpstreamCall::tasks`]).
#[derive(Debug, Clone, PartialEq)]
pub enum ToolReply {
    Answer(ToolAnswer),
    Task(TaskStarted),
}

impl ToolReply {
    /// The answer of a call that did not ask for a task: a task handle
    /// there is an upstream's error, and proves nothing about the outcome.
    pub fn into_answer(self) -> Result<ToolAnswer, UpstreamError> {
        match self {
            ToolReply::Answer(answer) => Ok(answer),
            ToolReply::Task(task) => Err(UpstreamError::MaybeSent(format!(
                "the upstream answered with a task ({}) where no task was asked for",
                task.task_id
            ))),
        }
    }
}

/// A task an upstream made of a call: its id, and its `CreateTaskResult`
/// as the upstream sent it (what the agent receives).
#[derive(Debug, Clone, PartialEq)]
pub struct TaskStarted {
    pub task_id: String,
    pub handle: Value,
    /// How often the upstream suggests asking for the task's status.
    pub poll_interval: Option<Duration>,
}

/// Where a task stands (`tasks/get`), with what its terminal status carries.
#[derive(Debug, Clone, PartialEq)]
pub enum TaskState {
    Working,
    /// The upstream waits for the agent's input (`tasks/update`).
    InputRequired,
    /// The call's final result, as a `CallToolResult`'s JSON.
    Completed(ToolAnswer),
    /// The call failed with this JSON-RPC error.
    Failed(PeerError),
    Cancelled,
}

impl TaskState {
    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            TaskState::Completed(_) | TaskState::Failed(_) | TaskState::Cancelled
        )
    }

    pub fn as_str(&self) -> &'static str {
        match self {
            TaskState::Working => "working",
            TaskState::InputRequired => "input_required",
            TaskState::Completed(_) => "completed",
            TaskState::Failed(_) => "failed",
            TaskState::Cancelled => "cancelled",
        }
    }
}

/// One `tasks/get` answer: the state and the suggested poll interval.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskPoll {
    pub state: TaskState,
    pub poll_interval: Option<Duration>,
}

impl ToolAnswer {
    /// The recorded answer of a call the upstream rejected by protocol
    /// (nothing executed): `what` and its message in words, its code and
    /// message in `structuredContent.upstream_error`.
    pub fn refused(what: &str, code: i32, message: &str) -> Self {
        Self {
            is_error: true,
            result: serde_json::json!({
                "content": [{"type": "text", "text": format!("{what}: {message}")}],
                "isError": true,
                "structuredContent": {"upstream_error": {"code": code, "message": message}},
            }),
        }
    }
}

/// Why an upstream call produced no answer, by what may have happened.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum UpstreamError {
    /// Provably nothing left leasegate (the upstream connection was down
    /// before the request was handed over).
    #[error("not sent: {0}")]
    NotSent(String),
    /// The request may have reached the tool; its outcome is unknown.
    #[error("no answer, the request may have been received: {0}")]
    MaybeSent(String),
    #[error("no answer within {0:?}")]
    TimedOut(Duration),
    /// The upstream answered with a JSON-RPC error: nothing executed (by
    /// protocol), e.g. invalid params.
    #[error("upstream refused the call: {message} (code {code})")]
    Refused {
        code: i32,
        message: String,
        /// The error's `data`, passed on to the agent as sent.
        data: Option<Value>,
    },
}

/// What an upstream failure proves about the request's delivery: the one
/// classification dispatch and the reconciler act on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamDelivery {
    /// Provably no byte of the request left: sending it again under the
    /// same operation id is safe.
    NotSent,
    /// The request may have reached the tool; its outcome is unknown.
    MaybeSent,
    /// The upstream answered that it did not execute the request (a
    /// JSON-RPC protocol rejection: invalid request, unknown method,
    /// invalid params): a final answer.
    Rejected,
}

impl UpstreamError {
    pub fn delivery(&self) -> UpstreamDelivery {
        match self {
            UpstreamError::NotSent(_) => UpstreamDelivery::NotSent,
            UpstreamError::MaybeSent(_) | UpstreamError::TimedOut(_) => UpstreamDelivery::MaybeSent,
            // -32600 invalid request, -32601 method not found, -32602 invalid
            // params: rejected before execution by protocol. Any other
            // error (internal error, a server-defined code) may come after
            // the tool acted.
            UpstreamError::Refused { code, .. } if (-32602..=-32600).contains(code) => {
                UpstreamDelivery::Rejected
            }
            UpstreamError::Refused { .. } => UpstreamDelivery::MaybeSent,
        }
    }
}

/// A tool server reachable by name. `mcp` implements it; dispatch and the
/// reconciler use only this.
pub trait Upstream: Send + Sync + 'static {
    fn call(
        &self,
        call: UpstreamCall,
    ) -> impl Future<Output = Result<ToolReply, UpstreamError>> + Send;

    /// Where the task `task_id` of `upstream` stands (`tasks/get`: a pure
    /// read, safe to repeat). An error: the upstream could not say (down,
    /// or it does not know the task any more).
    fn task_state(
        &self,
        upstream: &str,
        task_id: &str,
        timeout: Duration,
    ) -> impl Future<Output = Result<TaskPoll, UpstreamError>> + Send {
        let _ = (task_id, timeout);
        std::future::ready(Err(UpstreamError::NotSent(format!(
            "upstream {upstream} does not follow tasks"
        ))))
    }

    /// Whether `upstream` takes calls now. False while a stdio child is
    /// being restarted or a Streamable HTTP server is down (its connections
    /// refused): background work defers instead of spending budget, and the
    /// upstream's own probe says when it is back.
    fn accepting_calls(&self, upstream: &str) -> bool {
        let _ = upstream;
        true
    }

    /// The upstreams that take no calls now (see [`Upstream::accepting_calls`]).
    fn unavailable(&self) -> Vec<String> {
        Vec::new()
    }
}
