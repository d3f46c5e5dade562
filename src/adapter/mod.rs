//! Adapters: what each upstream tool can promise, and the `Upstream` trait
//! through which dispatch reaches tool servers (implemented by `mcp`).
//!
//! An adapter file (`adapters/<name>.toml`) covers one upstream:
//!
//! ```toml
//! upstream = "payments"
//! trust_annotations = false   # honour the upstream's readOnlyHint
//! timeout = "30s"             # default per-call timeout
//! on_disconnect = "finish"    # | "cancel": a `V_2026_07_28` agent closing a gated
//!                             # call's stream (default for the file's tools)
//! roots_outside_calls = "empty"   # | "refuse": the upstream's `roots/list`
//!                                 # when no call is in flight
//!
//! [tools.charge]
//! capability = "idempotency_key"        # | resource_id | operation_query | none
//! operation_id_argument = "idempotency_key"   # or operation_id_meta = "<_meta key>",
//!                                             # or operation_id_header = "Idempotency-Key" (HTTP upstreams)
//! key_retention = "24h"
//! replays_first_outcome = true          # a same-key retry answers the first attempt's
//!                                       # outcome, errors included (Stripe); default false
//! # Error answers the provider documents as "nothing was done": the
//! # operation stays sendable under the same id instead of failed_final.
//! not_done_errors = [{ pointer = "/error/code", values = ["rate_limited", "unavailable"] }]
//! remote_id_pointer = "/charge_id"      # JSON pointer into structuredContent
//!
//! [tools.create_bucket]
//! capability = "resource_id"            # the agent names the resource
//! resource_id_pointer = "/name"         # where that name is in the arguments
//! query_tool = "get_bucket"             # asked with {query_argument: <name>}
//! query_argument = "name"               # (without resource_id_pointer: the operation id)
//! query_resource_pointer = "/bucket"
//! match_fields = ["region"]             # the found resource must agree on these
//! resend_after_not_found = "5m"         # "not found" this long after the last send
//!                                       # (at least the policy's claim_ttl):
//!                                       # send again under the same operation id
//!
//! [tools.send_email]
//! capability = "none"
//! identity = ["/to", "/subject"]       # the fields that make two calls the same effect
//! on_rephrase = "replay"                # | "conflict": same identity, other words
//! after_undelivered = "show"            # | "send": an outcome the agent never received
//!                                       # is shown before a different call is sent
//!
//! [tools.get_charge]
//! read_only = true
//! ```
//!
//! A tool that no adapter names is side-effecting with capability `none`:
//! leasegate never retries it on its own, and an unknown outcome waits for
//! an operator.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

use crate::policy::{FieldError, parse_duration};

mod seam;
pub use seam::*;

/// What a tool can promise when an outcome is unknown (docs/concepts.md, docs/adapters-and-policies.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Capability {
    /// The tool honours a durable idempotency key: retry with the same key
    /// inside its retention window.
    IdempotencyKey,
    /// The resource id is derived from the intent: query it, check it.
    ResourceId,
    /// The tool can be asked about an operation by its id.
    OperationQuery,
    /// Nothing: unknown stays unknown until an operator resolves it.
    None,
}

/// Where the operation id goes on the upstream call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OperationIdPlacement {
    /// Nowhere (capability `none`, or the tool derives nothing from it).
    Omitted,
    /// Into `arguments.<name>` (after the digest was taken).
    Argument(String),
    /// Into the request's `_meta.<key>`.
    Meta(String),
    /// Into an HTTP header of the one `tools/call` POST (Streamable HTTP
    /// upstreams only), e.g. `Idempotency-Key`.
    Header(String),
}

/// What a call whose declared identity (`identity`) matches a recorded
/// intent's, but whose full request differs, gets: a re-planned retry whose
/// model reworded a free-text field or added an optional one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnRephrase {
    /// The recorded outcome (or the earlier call's fate while it is in
    /// flight or unknown), with a note naming the fields that differed.
    /// Nothing is sent. The default: the agent wanted the effect once, and
    /// its model learns what happened instead of a refusal it would re-plan
    /// around again.
    #[default]
    Replay,
    /// `-31003` intent conflict naming the fields that differed; nothing is
    /// sent.
    Conflict,
}

/// What the next call to a tool with a *different* request gets while an
/// earlier call of the same run to that tool has an outcome its agent never
/// received (it cancelled, its SDK timed out and cancelled, or its request
/// was dropped).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AfterUndelivered {
    /// Not sent: answered with the earlier call's arguments and outcome (or
    /// fate), which delivers it; calling again sends it. The default: the
    /// commonest duplicate is a model re-planning a call whose answer it
    /// never saw, and a legitimate different call pays one extra round trip.
    #[default]
    Show,
    /// Sent as any other call.
    Send,
}

/// The `_meta` key through which dispatch asks the Streamable HTTP client for
/// per-call headers (`{name: value}`); removed before the request is sent.
pub const HTTP_HEADERS_META: &str = "dev.leasegate/http_headers";

/// An adapter file as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAdapter {
    pub upstream: String,
    #[serde(default)]
    pub trust_annotations: bool,
    pub timeout: Option<String>,
    pub on_disconnect: Option<OnDisconnect>,
    pub roots_outside_calls: Option<RootsOutsideCalls>,
    #[serde(default)]
    pub tools: BTreeMap<String, RawToolAdapter>,
}

/// What the upstream's `roots/list` gets when it arrives outside any call
/// (no call in flight on the upstream: servers ask at start). Roots are an
/// agent's, and the upstream's session is shared by every agent, so there
/// is no agent to ask.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RootsOutsideCalls {
    /// An empty list: a server that asks at start (server-filesystem)
    /// keeps its own configuration and stays quiet.
    #[default]
    Empty,
    /// An error: for a server that keeps the answer and asks again within
    /// a call only while it has none (server-everything), so that each
    /// call's agent is asked.
    Refuse,
}

/// What a side-effecting call does when an agent on MCP `V_2026_07_28` closes
/// its response stream, which that protocol makes both a cancel and, on a
/// broken stream, a reason to re-issue the call under a new request id.
/// (Earlier protocol versions say a disconnect is not a cancel: there the
/// call always finishes, and `notifications/cancelled` cancels.)
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnDisconnect {
    /// The call runs to its end and its outcome is recorded: the agent's
    /// re-issued call (same intent) waits for it or replays it.
    #[default]
    Finish,
    /// The upstream is told to cancel; the operation is `unknown` until
    /// evidence proves what happened.
    Cancel,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawToolAdapter {
    #[serde(default)]
    pub read_only: bool,
    pub capability: Option<Capability>,
    pub operation_id_argument: Option<String>,
    pub operation_id_meta: Option<String>,
    pub operation_id_header: Option<String>,
    pub key_retention: Option<String>,
    /// idempotency_key: the provider answers a same-key retry with the
    /// first attempt's outcome, errors included, so a retry's error is the
    /// first attempt's final failure. Default false: a retry's error says
    /// nothing about the first attempt.
    pub replays_first_outcome: Option<bool>,
    /// Error answers the provider documents as "nothing was done": a JSON
    /// pointer into `structuredContent` and the values it may hold.
    pub not_done_errors: Option<Vec<RawNotDone>>,
    pub query_tool: Option<String>,
    pub query_argument: Option<String>,
    /// JSON pointer into the query's structuredContent: true when found (default "/found").
    pub query_found_pointer: Option<String>,
    /// JSON pointer to the resource in the query's structuredContent (resource_id).
    pub query_resource_pointer: Option<String>,
    /// JSON pointer to the remote id in the query's structuredContent.
    pub query_remote_id_pointer: Option<String>,
    /// resource_id: fields of the found resource that must equal the request's.
    pub match_fields: Option<Vec<String>>,
    /// resource_id: JSON pointer to the resource's id in the request's
    /// arguments (a name the agent chose); the query asks by it instead of
    /// by the operation id.
    pub resource_id_pointer: Option<String>,
    /// operation_query / resource_id: after the query answers "not found"
    /// (the found pointer holds `false`) this long after the operation was
    /// last sent, the operation is sent again under the same operation id.
    /// Unset: it stays unknown for an operator.
    pub resend_after_not_found: Option<String>,
    pub remote_id_pointer: Option<String>,
    pub timeout: Option<String>,
    /// Overrides the file's `on_disconnect` for this tool.
    pub on_disconnect: Option<OnDisconnect>,
    /// JSON pointers into the arguments: the fields that make two calls the
    /// same effect. A derived step hashes only these.
    pub identity: Option<Vec<String>>,
    /// See [`OnRephrase`]; only with `identity`.
    pub on_rephrase: Option<OnRephrase>,
    /// See [`AfterUndelivered`].
    pub after_undelivered: Option<AfterUndelivered>,
}

/// One "nothing was done" rule of an adapter file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawNotDone {
    pub pointer: String,
    pub values: Vec<Value>,
}

/// An error answer the provider documents as "nothing was done": the value
/// at `pointer` in `structuredContent` is one of `values`.
#[derive(Debug, Clone, PartialEq)]
pub struct NotDoneRule {
    pub pointer: String,
    pub values: Vec<Value>,
}

/// What leasegate does with one upstream tool.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolAdapter {
    pub read_only: bool,
    pub capability: Capability,
    pub placement: OperationIdPlacement,
    pub timeout: Duration,
    pub key_retention: Option<Duration>,
    /// See [`RawToolAdapter::replays_first_outcome`].
    pub replays_first_outcome: bool,
    /// See [`RawToolAdapter::not_done_errors`].
    pub not_done_errors: Vec<NotDoneRule>,
    pub query: Option<QuerySpec>,
    pub remote_id_pointer: Option<String>,
    /// See [`OnDisconnect`].
    pub on_disconnect: OnDisconnect,
    /// The declared identity fields (JSON pointers into the arguments);
    /// `None`: the whole request is the identity.
    pub identity: Option<Vec<String>>,
    /// See [`OnRephrase`].
    pub on_rephrase: OnRephrase,
    /// See [`AfterUndelivered`].
    pub after_undelivered: AfterUndelivered,
}

/// How to ask the upstream about an operation (reconciler).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuerySpec {
    /// The upstream's query tool, called with `{argument: operation_id}`.
    pub tool: String,
    pub argument: String,
    pub found_pointer: String,
    pub resource_pointer: Option<String>,
    pub remote_id_pointer: Option<String>,
    /// resource_id: the found resource must agree with the request on these.
    pub match_fields: Vec<String>,
    /// resource_id: where the resource's id is in the request's arguments;
    /// `None`: the query asks by operation id.
    pub resource_id_pointer: Option<String>,
    /// See [`RawToolAdapter::resend_after_not_found`].
    pub resend_after_not_found: Option<Duration>,
}

/// Whether starting an operation's retry budget over (`leasegate ops
/// retry`) can change what the reconciler does next, from its tool's
/// adapter (`None`: no upstream offers the tool). Only a same-key retry and
/// a resend after an authoritative "not found" spend the budget; `Err`
/// says why nothing would.
pub fn retry_budget_matters(adapter: Option<&ToolAdapter>) -> Result<(), &'static str> {
    let Some(adapter) = adapter else {
        return Err(
            "no upstream of this process offers its tool, so nothing can send it again; \
                    resolve it from the tool's own records (leasegate ops resolve)",
        );
    };
    match adapter.capability {
        Capability::IdempotencyKey => Ok(()),
        Capability::OperationQuery | Capability::ResourceId
            if adapter
                .query
                .as_ref()
                .is_some_and(|query| query.resend_after_not_found.is_some()) =>
        {
            Ok(())
        }
        Capability::OperationQuery | Capability::ResourceId => Err(
            "its tool is reconciled by queries, which spend no retry budget: the reconciler keeps \
             asking on its own, and an operator resolves what no query can prove (leasegate ops resolve)",
        ),
        Capability::None => Err(
            "its tool has capability `none`: leasegate never sends such a call again, so there is no \
             retry to start over; resolve it from the tool's own records (leasegate ops resolve)",
        ),
    }
}

/// A validated adapter file.
#[derive(Debug, Clone, PartialEq)]
pub struct Adapter {
    pub upstream: String,
    pub trust_annotations: bool,
    pub timeout: Duration,
    /// The default of the file's tools (see [`OnDisconnect`]).
    pub on_disconnect: OnDisconnect,
    pub roots_outside_calls: RootsOutsideCalls,
    pub tools: BTreeMap<String, ToolAdapter>,
}

/// Default per-call timeout when an adapter names none.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

impl Adapter {
    /// The adapter of a tool this file does not name: side-effecting, no
    /// promises, unless the upstream says read-only and annotations are trusted.
    pub fn tool(&self, name: &str, read_only_hint: Option<bool>) -> ToolAdapter {
        self.tools
            .get(name)
            .cloned()
            .unwrap_or_else(|| ToolAdapter {
                read_only: self.trust_annotations && read_only_hint == Some(true),
                on_disconnect: self.on_disconnect,
                ..ToolAdapter::unknown(self.timeout)
            })
    }
}

impl ToolAdapter {
    /// Whether `answer` is an error the provider documents as "nothing was
    /// done" (the adapter's `not_done_errors`).
    pub fn says_nothing_was_done(&self, answer: &ToolAnswer) -> bool {
        answer.is_error
            && self.not_done_errors.iter().any(|rule| {
                answer
                    .result
                    .get("structuredContent")
                    .and_then(|s| s.pointer(&rule.pointer))
                    .is_some_and(|found| rule.values.contains(found))
            })
    }

    /// No adapter at all: side-effecting, capability `none`.
    pub fn unknown(timeout: Duration) -> Self {
        Self {
            read_only: false,
            capability: Capability::None,
            placement: OperationIdPlacement::Omitted,
            timeout,
            key_retention: None,
            replays_first_outcome: false,
            not_done_errors: Vec::new(),
            query: None,
            remote_id_pointer: None,
            on_disconnect: OnDisconnect::Finish,
            identity: None,
            on_rephrase: OnRephrase::default(),
            after_undelivered: AfterUndelivered::default(),
        }
    }

    /// The argument leasegate fills with the operation id, which is never
    /// the agent's to choose: hidden from the tool's schema, left out of
    /// the intent's identity, overwritten when sent.
    pub fn filled_argument(&self) -> Option<&str> {
        match &self.placement {
            OperationIdPlacement::Argument(name) if !self.read_only => Some(name),
            _ => None,
        }
    }
}

impl RawAdapter {
    pub fn validate(&self) -> Result<Adapter, FieldError> {
        if self.upstream.trim().is_empty() {
            return Err(FieldError::new("upstream", "must name an upstream"));
        }
        let timeout = match &self.timeout {
            Some(text) => parse_duration("timeout", text)?,
            None => DEFAULT_TIMEOUT,
        };
        let on_disconnect = self.on_disconnect.unwrap_or_default();
        let mut tools = BTreeMap::new();
        for (name, raw) in &self.tools {
            let field = |f: &str| format!("tools.{name}.{f}");
            let tool = raw
                .validate(timeout, on_disconnect)
                .map_err(|e| FieldError::new(field(&e.field), e.message))?;
            tools.insert(name.clone(), tool);
        }
        Ok(Adapter {
            upstream: self.upstream.clone(),
            trust_annotations: self.trust_annotations,
            timeout,
            on_disconnect,
            roots_outside_calls: self.roots_outside_calls.unwrap_or_default(),
            tools,
        })
    }
}

impl RawToolAdapter {
    fn validate(
        &self,
        default_timeout: Duration,
        default_on_disconnect: OnDisconnect,
    ) -> Result<ToolAdapter, FieldError> {
        let timeout = match &self.timeout {
            Some(text) => parse_duration("timeout", text)?,
            None => default_timeout,
        };
        if self.read_only {
            let extra = [
                ("capability", self.capability.is_some()),
                (
                    "operation_id_argument",
                    self.operation_id_argument.is_some(),
                ),
                ("operation_id_meta", self.operation_id_meta.is_some()),
                ("operation_id_header", self.operation_id_header.is_some()),
                ("key_retention", self.key_retention.is_some()),
                (
                    "replays_first_outcome",
                    self.replays_first_outcome.is_some(),
                ),
                ("not_done_errors", self.not_done_errors.is_some()),
                ("query_tool", self.query_tool.is_some()),
                ("resource_id_pointer", self.resource_id_pointer.is_some()),
                (
                    "resend_after_not_found",
                    self.resend_after_not_found.is_some(),
                ),
                ("on_disconnect", self.on_disconnect.is_some()),
                ("identity", self.identity.is_some()),
                ("on_rephrase", self.on_rephrase.is_some()),
                ("after_undelivered", self.after_undelivered.is_some()),
            ];
            if let Some((field, _)) = extra.iter().find(|(_, set)| *set) {
                return Err(FieldError::new(
                    *field,
                    "a read_only tool has no side effect to adapt",
                ));
            }
            return Ok(ToolAdapter {
                read_only: true,
                ..ToolAdapter::unknown(timeout)
            });
        }
        let capability = self
            .capability
            .ok_or_else(|| FieldError::new("capability", "required for a side-effecting tool (idempotency_key, resource_id, operation_query, none)"))?;
        let placement = match (
            &self.operation_id_argument,
            &self.operation_id_meta,
            &self.operation_id_header,
        ) {
            (Some(name), None, None) if !name.is_empty() => {
                OperationIdPlacement::Argument(name.clone())
            }
            (None, Some(key), None) if !key.is_empty() => OperationIdPlacement::Meta(key.clone()),
            (None, None, Some(header)) => {
                if http::HeaderName::from_bytes(header.as_bytes()).is_err() {
                    return Err(FieldError::new(
                        "operation_id_header",
                        format!("{header:?} is not an HTTP header name"),
                    ));
                }
                // Headers the MCP transport or HTTP itself owns.
                const RESERVED: [&str; 9] = [
                    "accept",
                    "authorization",
                    "content-length",
                    "content-type",
                    "host",
                    "last-event-id",
                    "mcp-protocol-version",
                    "mcp-session-id",
                    "transfer-encoding",
                ];
                if RESERVED.contains(&header.to_ascii_lowercase().as_str()) {
                    return Err(FieldError::new(
                        "operation_id_header",
                        format!(
                            "{header:?} is used by HTTP or the MCP transport; pick another name"
                        ),
                    ));
                }
                OperationIdPlacement::Header(header.clone())
            }
            (None, None, None) => OperationIdPlacement::Omitted,
            (Some(_), None, None) | (None, Some(_), None) => {
                return Err(FieldError::new(
                    "operation_id_argument",
                    "must not be empty",
                ));
            }
            _ => {
                return Err(FieldError::new(
                    "operation_id_meta",
                    "give one of operation_id_argument, operation_id_meta, operation_id_header",
                ));
            }
        };
        if capability == Capability::IdempotencyKey && placement == OperationIdPlacement::Omitted {
            return Err(FieldError::new(
                "capability",
                "idempotency_key needs operation_id_argument, operation_id_meta or operation_id_header: where the key goes",
            ));
        }
        let key_retention = match (&self.key_retention, capability) {
            (Some(text), Capability::IdempotencyKey) => {
                Some(parse_duration("key_retention", text)?)
            }
            (None, Capability::IdempotencyKey) => {
                return Err(FieldError::new(
                    "key_retention",
                    "idempotency_key needs the provider's key retention window, e.g. \"24h\"",
                ));
            }
            (Some(_), _) => {
                return Err(FieldError::new(
                    "key_retention",
                    "only for capability idempotency_key",
                ));
            }
            (None, _) => None,
        };
        if self.replays_first_outcome.is_some() && capability != Capability::IdempotencyKey {
            return Err(FieldError::new(
                "replays_first_outcome",
                "only for capability idempotency_key",
            ));
        }
        let not_done_errors = self
            .not_done_errors
            .iter()
            .flatten()
            .map(|rule| {
                if !rule.pointer.is_empty() && !rule.pointer.starts_with('/') {
                    return Err(FieldError::new(
                        "not_done_errors",
                        format!("{:?} is not a JSON pointer (\"/error/code\")", rule.pointer),
                    ));
                }
                if rule.values.is_empty() {
                    return Err(FieldError::new(
                        "not_done_errors",
                        "each rule needs at least one value",
                    ));
                }
                Ok(NotDoneRule {
                    pointer: rule.pointer.clone(),
                    values: rule.values.clone(),
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let query = match (&self.query_tool, &self.query_argument, capability) {
            (Some(tool), Some(argument), Capability::OperationQuery | Capability::ResourceId) => {
                Some(QuerySpec {
                    tool: tool.clone(),
                    argument: argument.clone(),
                    found_pointer: self
                        .query_found_pointer
                        .clone()
                        .unwrap_or_else(|| "/found".to_owned()),
                    resource_pointer: self.query_resource_pointer.clone(),
                    remote_id_pointer: self.query_remote_id_pointer.clone(),
                    match_fields: self.match_fields.clone().unwrap_or_default(),
                    resource_id_pointer: self.resource_id_pointer.clone(),
                    resend_after_not_found: self
                        .resend_after_not_found
                        .as_deref()
                        .map(|text| parse_duration("resend_after_not_found", text))
                        .transpose()?,
                })
            }
            (None, None, Capability::OperationQuery | Capability::ResourceId) => {
                return Err(FieldError::new(
                    "query_tool",
                    "operation_query and resource_id need query_tool and query_argument",
                ));
            }
            (None, None, _) => None,
            (_, _, Capability::OperationQuery | Capability::ResourceId) => {
                return Err(FieldError::new(
                    "query_argument",
                    "query_tool and query_argument go together",
                ));
            }
            _ => {
                return Err(FieldError::new(
                    "query_tool",
                    "only for capability operation_query or resource_id",
                ));
            }
        };
        if capability == Capability::ResourceId
            && query.as_ref().is_some_and(|q| q.match_fields.is_empty())
        {
            return Err(FieldError::new(
                "match_fields",
                "resource_id needs the fields that prove the found resource is this intent's",
            ));
        }
        if capability != Capability::ResourceId && self.match_fields.is_some() {
            return Err(FieldError::new(
                "match_fields",
                "only for capability resource_id",
            ));
        }
        if capability != Capability::ResourceId && self.resource_id_pointer.is_some() {
            return Err(FieldError::new(
                "resource_id_pointer",
                "only for capability resource_id",
            ));
        }
        if self.resend_after_not_found.is_some() && query.is_none() {
            return Err(FieldError::new(
                "resend_after_not_found",
                "only for capability operation_query or resource_id, with a query_tool",
            ));
        }
        for (field, pointer) in [
            ("resource_id_pointer", &self.resource_id_pointer),
            ("query_found_pointer", &self.query_found_pointer),
            ("query_resource_pointer", &self.query_resource_pointer),
            ("query_remote_id_pointer", &self.query_remote_id_pointer),
        ] {
            if let Some(pointer) = pointer
                && !pointer.starts_with('/')
            {
                return Err(FieldError::new(field, "a JSON pointer starts with '/'"));
            }
        }
        if let Some(pointer) = &self.remote_id_pointer
            && !pointer.starts_with('/')
        {
            return Err(FieldError::new(
                "remote_id_pointer",
                "a JSON pointer starts with '/'",
            ));
        }
        let identity = match &self.identity {
            None => None,
            Some(pointers) if pointers.is_empty() => {
                return Err(FieldError::new(
                    "identity",
                    "name at least one field (a JSON pointer such as \"/to\"), or leave identity out: \
                     then the whole request is the identity",
                ));
            }
            Some(pointers) => {
                if let Some(bad) = pointers.iter().find(|p| !p.starts_with('/')) {
                    return Err(FieldError::new(
                        "identity",
                        format!("{bad:?} is not a JSON pointer into the arguments (\"/to\")"),
                    ));
                }
                if let OperationIdPlacement::Argument(filled) = &placement
                    && let Some(bad) = pointers.iter().find(|p| {
                        p.trim_start_matches('/').split('/').next() == Some(filled.as_str())
                    })
                {
                    return Err(FieldError::new(
                        "identity",
                        format!(
                            "{bad:?} is the operation id argument leasegate fills ({filled:?}); \
                             it is never part of an identity"
                        ),
                    ));
                }
                Some(pointers.clone())
            }
        };
        if self.on_rephrase.is_some() && identity.is_none() {
            return Err(FieldError::new(
                "on_rephrase",
                "only with identity: without it every different request is a different intent",
            ));
        }
        Ok(ToolAdapter {
            read_only: false,
            identity,
            on_rephrase: self.on_rephrase.unwrap_or_default(),
            after_undelivered: self.after_undelivered.unwrap_or_default(),
            capability,
            placement,
            timeout,
            key_retention,
            replays_first_outcome: self.replays_first_outcome.unwrap_or(false),
            not_done_errors,
            query,
            remote_id_pointer: self.remote_id_pointer.clone(),
            on_disconnect: self.on_disconnect.unwrap_or(default_on_disconnect),
        })
    }
}

/// A tool as the agent names it, resolved to its upstream and adapter.
#[derive(Debug, Clone, PartialEq)]
pub struct ResolvedTool {
    pub upstream: String,
    pub tool: String,
    pub adapter: ToolAdapter,
}

/// Exposed tool name → where it lives and what it promises.
pub type ToolDirectory = BTreeMap<String, ResolvedTool>;

/// The current [`ToolDirectory`], shared by the front and the background
/// loops and replaced whole when an upstream's tool list changes.
#[derive(Debug, Default)]
pub struct SharedDirectory {
    current: std::sync::RwLock<std::sync::Arc<ToolDirectory>>,
}

impl SharedDirectory {
    pub fn new(directory: ToolDirectory) -> Self {
        Self {
            current: std::sync::RwLock::new(std::sync::Arc::new(directory)),
        }
    }

    /// The tool exposed as `name`, as of now.
    pub fn get(&self, name: &str) -> Option<ResolvedTool> {
        self.snapshot().get(name).cloned()
    }

    /// The tool a recorded operation goes to: by its route (`upstream`,
    /// the upstream's own tool name) when it was recorded, so a renamed
    /// namespace still finds it; else by the exposed name.
    pub fn resolve(&self, exposed: &str, route: Option<(&str, &str)>) -> Option<ResolvedTool> {
        let snapshot = self.snapshot();
        match route {
            Some((upstream, tool)) => snapshot
                .get(exposed)
                .filter(|found| found.upstream == upstream && found.tool == tool)
                .or_else(|| {
                    snapshot
                        .values()
                        .find(|found| found.upstream == upstream && found.tool == tool)
                })
                .cloned(),
            None => snapshot.get(exposed).cloned(),
        }
    }

    pub fn snapshot(&self) -> std::sync::Arc<ToolDirectory> {
        self.current
            .read()
            .map(|current| current.clone())
            .unwrap_or_default()
    }

    pub fn replace(&self, directory: ToolDirectory) {
        if let Ok(mut current) = self.current.write() {
            *current = std::sync::Arc::new(directory);
        }
    }
}
