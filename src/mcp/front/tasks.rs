//! The MCP Tasks extension through leasegate: a task an upstream made of a
//! `tools/call` is the agent's to follow (`tasks/get`, `tasks/update`,
//! `tasks/cancel`), by the task id the upstream chose, sent to the
//! upstream that made it. For a gated call the ledger follows it too
//! (`dispatch::TaskFollowers`): what the agent's own `tasks/get` reads is
//! observed there, and a terminal status is settled before the agent
//! hears it.
//!
//! # Routes
//!
//! Each task handle passed to an agent is remembered here (task id →
//! upstream, and the principal it went to), for [`ROUTE_TTL`] and at most
//! [`ROUTES_MAX`] at once. Another principal's request for a known task is
//! answered as for an unknown one. A task id this process does not know
//! (made before it started, or through another process) is asked of each
//! upstream that declared the extension, in order, until one knows it.
//!
//! # Crash points
//!
//! Routes live in memory only; the tasks themselves live at the upstream,
//! and a gated call's task is in the ledger as evidence.

use std::time::{Duration, Instant};

use rmcp::model::{
    CancelTaskParams, CancelTaskRequest, ClientRequest, CreateTaskResult, ErrorCode, GetTaskParams,
    GetTaskRequest, GetTaskResult, ServerResult, UpdateTaskParams, UpdateTaskRequest,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer};

use super::request::principal_of;
use super::{Front, typed, upstream_failure};
use crate::mcp::convert;
use crate::mcp::upstream::REQUEST_TIMEOUT;

/// How long a task handle given to an agent stays routable by this process
/// without a look through the upstreams.
pub(super) const ROUTE_TTL: Duration = Duration::from_secs(24 * 3600);
/// At most this many routes at once (the oldest go first).
pub(super) const ROUTES_MAX: usize = 100_000;

/// Where a task handle went.
pub(super) struct TaskRoute {
    upstream: String,
    /// The principal's token id, when the request carried one.
    principal: Option<String>,
    at: Instant,
}

/// The routes of task handles given to agents, by task id.
pub(super) type TaskRoutes = std::sync::Mutex<std::collections::HashMap<String, TaskRoute>>;

/// Whether the calling agent follows tasks: it declared the extension (for
/// this request, or for its session), and some upstream offers them.
pub(super) fn agent_follows_tasks(context: &RequestContext<RoleServer>) -> bool {
    context
        .client_capabilities()
        .is_some_and(|capabilities| capabilities.supports_tasks())
}

fn caller(context: &RequestContext<RoleServer>) -> Option<String> {
    principal_of(context).map(|p| p.token_id.clone())
}

fn unknown_task(task_id: &str) -> McpError {
    McpError::new(
        ErrorCode::INVALID_PARAMS,
        format!("unknown task {task_id:?}"),
        None,
    )
}

impl Front {
    /// Remembers that the handle of `task_id` of `upstream` went to this
    /// request's caller, and gives the agent the handle.
    pub(super) fn route_task(
        &self,
        upstream: &str,
        task: CreateTaskResult,
        context: &RequestContext<RoleServer>,
    ) -> CreateTaskResult {
        if let Ok(mut routes) = self.state.task_routes.lock() {
            if routes.len() >= ROUTES_MAX {
                routes.retain(|_, r| r.at.elapsed() < ROUTE_TTL);
                if routes.len() >= ROUTES_MAX
                    && let Some(oldest) = routes
                        .iter()
                        .min_by_key(|(_, r)| r.at)
                        .map(|(id, _)| id.clone())
                {
                    routes.remove(&oldest);
                }
            }
            routes.insert(
                task.task.task_id.clone(),
                TaskRoute {
                    upstream: upstream.to_owned(),
                    principal: caller(context),
                    at: Instant::now(),
                },
            );
        }
        task
    }

    /// The upstreams to ask about `task_id`: the one that made it, when
    /// this process gave out its handle (to this caller only), else every
    /// upstream that declared the extension.
    fn task_upstreams(
        &self,
        task_id: &str,
        context: &RequestContext<RoleServer>,
    ) -> Result<Vec<String>, McpError> {
        let known = self.state.task_routes.lock().ok().and_then(|routes| {
            routes
                .get(task_id)
                .filter(|r| r.at.elapsed() < ROUTE_TTL)
                .map(|r| (r.upstream.clone(), r.principal.clone()))
        });
        match known {
            Some((_, principal)) if principal != caller(context) => Err(unknown_task(task_id)),
            Some((upstream, _)) => Ok(vec![upstream]),
            None => Ok(self.upstreams_with(|c| c.supports_tasks())),
        }
    }

    /// Sends a tasks request to the upstream that knows `task_id`: the
    /// first whose answer is not an error (or the last error).
    async fn to_task_upstream(
        &self,
        task_id: &str,
        context: &RequestContext<RoleServer>,
        request: ClientRequest,
    ) -> Result<(String, ServerResult), McpError> {
        let upstreams = self.task_upstreams(task_id, context)?;
        let mut last = None;
        for upstream in upstreams {
            match self
                .state
                .upstreams
                .task_request(&upstream, request.clone(), REQUEST_TIMEOUT)
                .await
            {
                Ok(answer) => return Ok((upstream, answer)),
                Err(error) => last = Some((upstream, error)),
            }
        }
        Err(match last {
            Some((upstream, error)) => upstream_failure(&upstream, error),
            None => unknown_task(task_id),
        })
    }

    /// `tasks/get`: the upstream's answer as it sent it; for a task the
    /// ledger follows, observed there first (a terminal status is settled
    /// before the agent reads it).
    pub(super) async fn get_task_state(
        &self,
        request: GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, McpError> {
        let task_id = request.task_id.clone();
        let (upstream, answer) = self
            .to_task_upstream(
                &task_id,
                &context,
                ClientRequest::GetTaskRequest(GetTaskRequest::new(request)),
            )
            .await?;
        let followers = self.state.dispatcher.tasks();
        if followers.follows(&upstream, &task_id)
            && let Ok(poll) = convert::task_poll(answer.clone())
        {
            followers.observe(&upstream, &task_id, poll).await;
        }
        typed(answer, "tasks/get")
    }

    /// `tasks/update`: the agent's answers to the task's input requests.
    pub(super) async fn update_task_input(
        &self,
        request: UpdateTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let task_id = request.task_id.clone();
        let request = ClientRequest::UpdateTaskRequest(UpdateTaskRequest::new(request));
        self.acknowledged(&task_id, &context, request).await
    }

    /// `tasks/cancel`: passed on. A gated call's operation then ends as
    /// its task does (cancelled: unknown, as it may have acted).
    pub(super) async fn cancel_task_run(
        &self,
        request: CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let task_id = request.task_id.clone();
        let request = ClientRequest::CancelTaskRequest(CancelTaskRequest::new(request));
        self.acknowledged(&task_id, &context, request).await
    }

    /// A tasks request whose answer is an empty acknowledgement.
    async fn acknowledged(
        &self,
        task_id: &str,
        context: &RequestContext<RoleServer>,
        request: ClientRequest,
    ) -> Result<(), McpError> {
        self.to_task_upstream(task_id, context, request)
            .await
            .map(|_| ())
    }
}
