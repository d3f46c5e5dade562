//! What a request brings besides its method: the caller's lease, step,
//! principal and lease-mode namespace, the headers given twice, the `_meta`
//! passed through to the upstream and the trace context. Read from rmcp's
//! request context (`_meta`, and the HTTP request's parts when there is
//! one); nothing here is stored.

use std::time::Instant;

use rmcp::model::{ErrorCode, ProtocolVersion, RequestId};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer};
use serde_json::{Map, Value, json};

use super::super::convert::{self, codes};
use super::super::wire::*;
use crate::dispatch::CallError;
use crate::ids::{MAX_OWNER_LEN, MAX_STEP_ID_LEN, check_identifier};
use crate::intent::StepRef;
use crate::ledger::{LeaseClaim, LeaseToken, RunId};

pub(super) fn request_key(id: &RequestId) -> String {
    serde_json::to_string(id).unwrap_or_default()
}

pub(super) fn invalid_params(message: impl Into<String>) -> McpError {
    McpError::new(ErrorCode(codes::INVALID_PARAMS), message.into(), None)
}

pub(super) fn is_modern(context: &RequestContext<RoleServer>) -> bool {
    context
        .protocol_version()
        .is_some_and(|v| v.as_str() >= ProtocolVersion::V_2026_07_28.as_str())
}

/// What a `tools/call` brings besides its name and arguments, read once at
/// the top of the call from rmcp's request context (`_meta` first, then the
/// HTTP request's headers). A malformed part is kept as its error and
/// answered where the call first needs it, so which refusal an agent hears
/// does not depend on the order things are read in.
pub(super) struct CallCredentials<'c> {
    /// The caller's own lease; `Err(CallError::LeaseRequired)`: it sent none.
    pub lease: Result<LeaseClaim, CallError>,
    /// Lease mode `key`: the lease of the run the call's idempotency key
    /// stands for, when the call brings none of its own (`Front::key_lease`).
    pub keyed: Option<LeaseClaim>,
    pub step: Result<Option<StepRef>, CallError>,
    /// Lease mode `key`: `_meta`'s idempotency key, else the header's
    /// (trimmed), not yet checked against the identifier rule.
    pub idempotency_key: Result<Option<String>, McpError>,
    /// Lease mode `session` over HTTP: the `Leasegate-Task` header, trimmed,
    /// when not empty.
    pub task: Option<String>,
    /// The authenticated caller (`None` without authentication, over stdio).
    principal: Option<&'c crate::auth::Principal>,
    /// Whether the call came over HTTP (what a refusal tells the agent to send).
    pub over_http: bool,
    /// When the HTTP request arrived (`lease_holder::session::Arrived`).
    pub arrived: Option<Instant>,
    /// `_meta` worth passing upstream: W3C trace context.
    pub meta: Map<String, Value>,
    /// The agent's W3C trace context: `_meta`, else the HTTP headers.
    pub traceparent: Option<String>,
    pub tracestate: Option<String>,
}

impl<'c> CallCredentials<'c> {
    pub(super) fn read(context: &'c RequestContext<RoleServer>) -> Self {
        let parts = context.extensions.get::<http::request::Parts>();
        let header = |name: &str| {
            parts
                .and_then(|parts| parts.headers.get(name))
                .and_then(|v| v.to_str().ok())
                .map(str::trim)
        };
        let idempotency_key = match context.meta.get(IDEMPOTENCY_KEY_META) {
            None => Ok(header(IDEMPOTENCY_KEY_HEADER).map(str::to_owned)),
            Some(Value::String(key)) => Ok(Some(key.clone())),
            Some(_) => Err(invalid_params(format!(
                "_meta \"{IDEMPOTENCY_KEY_META}\" must be a string"
            ))),
        };
        let (traceparent, tracestate) = trace_context(context);
        Self {
            lease: lease_of(context),
            keyed: None,
            step: step_of(context),
            idempotency_key,
            task: header(TASK_HEADER)
                .filter(|t| !t.is_empty())
                .map(str::to_owned),
            principal: principal_of(context),
            over_http: parts.is_some(),
            arrived: parts
                .and_then(|parts| parts.extensions.get::<crate::http_server::Arrived>())
                .map(|arrived| arrived.0),
            meta: passthrough_meta(context),
            traceparent,
            tracestate,
        }
    }

    /// The caller sent no lease of its own (lease modes may lend one).
    pub(super) fn brings_no_lease(&self) -> bool {
        matches!(self.lease, Err(CallError::LeaseRequired))
    }

    /// The namespace of the caller's lease-mode tasks: its principal's (a
    /// bearer token, a JWT subject), or `anonymous` without authentication.
    /// A JWT without a subject would share one namespace with every token of
    /// its issuer, so lease modes `session` and `key` refuse it.
    pub(super) fn lease_namespace(&self, mode: &str) -> Result<&'c str, McpError> {
        match self.principal {
            None => Ok(crate::agent_leases::ANONYMOUS),
            Some(principal) => principal.lease_namespace().ok_or_else(|| {
                McpError::new(
                    ErrorCode(codes::INVALID_PARAMS),
                    format!(
                        "lease_mode = \"{mode}\" needs a caller identity: this token has no \
                         subject (a JWT without `sub`), so its calls cannot be told from other \
                         callers'. Use a token with a subject, or send a lease of your own. \
                         Nothing was recorded or sent"
                    ),
                    Some(json!({"reason": "no_subject", "lease_mode": mode})),
                )
            }),
        }
    }

    /// The trace id of the agent's `_meta` trace context, for log lines.
    pub(super) fn trace_id(&self) -> &str {
        self.meta
            .get("traceparent")
            .and_then(Value::as_str)
            .and_then(|tp| tp.split('-').nth(1))
            .unwrap_or("")
    }
}

/// The caller's lease: `_meta` first, then the HTTP headers.
fn lease_of(context: &RequestContext<RoleServer>) -> Result<LeaseClaim, CallError> {
    if let Some(value) = context.meta.get(LEASE_META) {
        let bad = |what: &str| CallError::BadRequestMeta(format!("_meta \"{LEASE_META}\": {what}"));
        let run_id = value
            .get("run_id")
            .and_then(Value::as_str)
            .ok_or_else(|| bad("run_id must be a UUID string"))?;
        let owner = value
            .get("owner")
            .and_then(Value::as_str)
            .ok_or_else(|| bad("owner must be a string"))?;
        let epoch = value
            .get("epoch")
            .and_then(Value::as_i64)
            .ok_or_else(|| bad("epoch must be an integer"))?;
        let token = match value.get("token") {
            None | Some(Value::Null) => None,
            Some(Value::String(token)) => Some(LeaseToken::presented(token)),
            Some(_) => return Err(bad("token must be a string")),
        };
        let run_id: RunId = run_id
            .parse()
            .map_err(|e: crate::ids::InvalidRunId| bad(&e.to_string()))?;
        check_identifier("owner", owner, MAX_OWNER_LEN).map_err(|e| bad(&e.to_string()))?;
        return Ok(LeaseClaim {
            run_id,
            owner: owner.to_owned(),
            epoch,
            token,
        });
    }
    let Some(parts) = context.extensions.get::<http::request::Parts>() else {
        return Err(CallError::LeaseRequired);
    };
    let header = |name: &str| {
        parts
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    };
    match (
        header(RUN_ID_HEADER),
        header(OWNER_HEADER),
        header(EPOCH_HEADER),
    ) {
        (None, None, None) => Err(CallError::LeaseRequired),
        (Some(run_id), Some(owner), Some(epoch)) => {
            let bad = |what: String| CallError::BadRequestMeta(what);
            let run_id: RunId = run_id.parse().map_err(|e: crate::ids::InvalidRunId| {
                bad(format!("header Leasegate-Run-Id: {e}"))
            })?;
            let epoch: i64 = epoch.parse().map_err(|_| {
                bad(format!(
                    "header Leasegate-Epoch: {:?} is not an integer",
                    epoch.chars().take(40).collect::<String>()
                ))
            })?;
            check_identifier("owner", owner, MAX_OWNER_LEN)
                .map_err(|e| bad(format!("header Leasegate-Owner: {e}")))?;
            Ok(LeaseClaim {
                run_id,
                owner: owner.to_owned(),
                epoch,
                token: header(LEASE_TOKEN_HEADER).map(LeaseToken::presented),
            })
        }
        _ => Err(CallError::BadRequestMeta(
            "headers Leasegate-Run-Id, Leasegate-Owner and Leasegate-Epoch go together".into(),
        )),
    }
}

/// The authenticated caller of an HTTP request (the listener's
/// authentication puts it into the request; `None` without authentication
/// and over stdio).
pub(super) fn principal_of(
    context: &RequestContext<RoleServer>,
) -> Option<&crate::auth::Principal> {
    context
        .extensions
        .get::<http::request::Parts>()?
        .extensions
        .get::<crate::auth::Principal>()
}

/// A session lease that could not be had: the ledger's failure as such
/// (nothing was sent; try again), anything else as the session lost.
pub(super) fn session_refusal(task: &str, error: crate::agent_leases::SessionError) -> McpError {
    use crate::agent_leases::SessionError;
    match error {
        SessionError::Ledger(inner) => convert::error_from_call(&CallError::Ledger(inner)),
        SessionError::Refused { detail, .. } => convert::error_from_call(&CallError::SessionLost {
            task: task.to_owned(),
            cause: detail,
        }),
        other => convert::error_from_call(&CallError::SessionLost {
            task: task.to_owned(),
            cause: other.to_string(),
        }),
    }
}

fn step_of(context: &RequestContext<RoleServer>) -> Result<Option<StepRef>, CallError> {
    let Some(value) = context.meta.get(STEP_META) else {
        return Ok(None);
    };
    let bad = |what: &str| CallError::BadRequestMeta(format!("_meta \"{STEP_META}\": {what}"));
    let step_id = value
        .get("step_id")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("step_id must be a string"))?;
    check_identifier("step_id", step_id, MAX_STEP_ID_LEN).map_err(|e| bad(&e.to_string()))?;
    let effect_version = match value.get("effect_version") {
        None => 1,
        Some(v) => v
            .as_i64()
            .and_then(|n| i32::try_from(n).ok())
            .ok_or_else(|| bad("effect_version must be a positive integer"))?,
    };
    Ok(Some(StepRef {
        step_id: step_id.to_owned(),
        effect_version,
    }))
}

/// A `Leasegate-*` (or `Idempotency-Key`) header the request carries more
/// than once: which value counts would be a guess (an intermediary may
/// have added one), so the call is refused instead.
pub(super) fn duplicated_header(context: &RequestContext<RoleServer>) -> Option<(String, usize)> {
    let parts = context.extensions.get::<http::request::Parts>()?;
    parts.headers.keys().find_map(|name| {
        let lease_header =
            name.as_str().starts_with("leasegate-") || name.as_str() == IDEMPOTENCY_KEY_HEADER;
        let count = parts.headers.get_all(name).iter().count();
        (lease_header && count > 1).then(|| (name.as_str().to_owned(), count))
    })
}

/// `_meta` worth passing upstream: W3C trace context.
pub(super) fn passthrough_meta(context: &RequestContext<RoleServer>) -> Map<String, Value> {
    let mut meta = Map::new();
    for key in ["traceparent", "tracestate"] {
        if let Some(value) = context.meta.get(key) {
            meta.insert(key.to_owned(), value.clone());
        }
    }
    meta
}

/// The agent's W3C trace context: `traceparent`/`tracestate` in `_meta`,
/// else the HTTP request's headers of the same names.
fn trace_context(context: &RequestContext<RoleServer>) -> (Option<String>, Option<String>) {
    let from_meta = |key: &str| {
        context
            .meta
            .get(key)
            .and_then(Value::as_str)
            .map(str::to_owned)
    };
    if let Some(traceparent) = from_meta("traceparent") {
        return (Some(traceparent), from_meta("tracestate"));
    }
    let header = |key: &str| {
        context
            .extensions
            .get::<http::request::Parts>()
            .and_then(|parts| parts.headers.get(key))
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned)
    };
    (header("traceparent"), header("tracestate"))
}
