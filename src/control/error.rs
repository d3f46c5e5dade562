//! The control API's error answers and the one table of error codes.
//!
//! [`ErrorCode`] is the single source of every stable `code` string of the
//! control API, of its HTTP status, and of the operator CLI's exit code for
//! it, so the three cannot drift apart. (The MCP front's JSON-RPC codes are
//! a separate table, `mcp::convert`, since they answer a different protocol;
//! docs/calling.md lists both.)
//!
//! Errors are JSON `{"code", "message", "detail"?}`. Messages never carry SQL
//! or stack traces: ledger failures are logged here and answered with a
//! fixed message.

use axum::Json;
use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::ids::InvalidRunId;
use crate::intent::IntentError;
use crate::ledger::{
    ConnectFailure, Delivery, Fenced, InvalidInput, LedgerError, Rejection, RunId,
};

/// Process exit codes of the operator commands (`leasegate runs|lease|ops`).
pub mod exit {
    pub const OK: u8 = 0;
    pub const OTHER: u8 = 1;
    pub const INVALID_INPUT: u8 = 2;
    pub const NOT_FOUND: u8 = 3;
    pub const CONFLICT: u8 = 4;
    pub const LEASE_LOST: u8 = 5;
    /// No database server answers (or a call could not reach it).
    pub const UNAVAILABLE: u8 = 6;
    pub const AUTHENTICATION_FAILED: u8 = 7;
    pub const DATABASE_MISSING: u8 = 8;
    pub const SCHEMA_MISSING: u8 = 9;
    /// `serve`/`stdio` with no database configured and nothing answering
    /// at the default: no PostgreSQL binaries to start a private cluster.
    pub const NO_POSTGRES_BINARIES: u8 = 10;
    /// The private cluster could not be started (initdb or pg_ctl failed,
    /// root without a `postgres` user, an unusable state directory).
    pub const PRIVATE_POSTGRES_FAILED: u8 = 11;
    /// The login may not become the database role the command needs
    /// (`leasegate_app`, or `leasegate_operator` for operator acts).
    /// (12–14 are `check-config`'s.)
    pub const ROLE_NOT_GRANTED: u8 = 15;
}

/// Every error the control API answers: its JSON `code`, HTTP status and
/// the operator CLI's exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    /// No route matches (404).
    NoRoute,
    /// Unknown run or operation (404).
    NotFound,
    /// The caller's lease is gone: another owner or epoch holds it (409).
    LeaseLost,
    /// The current owner and epoch without that lease's secret token
    /// (missing, wrong, or a lease taken before tokens existed) (403; CLI
    /// exit 5, as lease lost: the caller has no write authority).
    LeaseTokenInvalid,
    RevisionConflict,
    IntentConflict,
    LeaseBusy,
    TerminalRun,
    WrongStatus,
    ActiveRunLive,
    RunIdTaken,
    /// Only unknown operations are resolved (409).
    NotUnknown,
    /// A retry asked where none can follow: the tool's capability never
    /// sends again, or spends no budget (409; CLI exit 4).
    NothingToRetry,
    /// Nothing was written: the database is unreachable (503).
    LedgerUnavailable,
    /// The database server refused the login (503; CLI exit 7).
    DatabaseAuthFailed,
    /// The server has no database of that name (503; CLI exit 8).
    DatabaseMissing,
    /// The database holds no migrated ledger (503; CLI exit 9).
    SchemaMissing,
    /// A run for another tenant than the one this process serves (422).
    TenantMismatch,
    /// The ledger's answer was lost: read back before retrying (503).
    OutcomeUnknown,
    MalformedJson,
    /// A body that parses but does not fit (422).
    InvalidBody,
    /// A body that could not be read at all: `invalid_body` as well, with
    /// status 400 (the only code string two variants share).
    UnreadableBody,
    UnsupportedMediaType,
    BodyTooLarge,
    InvalidTtl,
    InvalidRunId,
    InvalidInput,
    InvalidStatus,
    InvalidOperationId,
    UnsafeInteger,
    InvalidArguments,
    /// A planned intent names a tool no upstream of this process lists
    /// (422; nothing written).
    UnknownTool,
    /// A stored body is sealed under a key this process does not have, or
    /// under a different key with that id (500; CLI exit 1): fix the
    /// policy's `encryption_keys`.
    KeyUnavailable,
    /// No valid bearer token (401, with `WWW-Authenticate`).
    Unauthorized,
    /// A valid token whose scope does not cover the route (403).
    InsufficientScope,
    /// The process's database login may not act as the role the request
    /// needs: an operator route on a `leasegate serve` whose login is not a
    /// member of `leasegate_operator`, or a CLI login that is not (503; CLI
    /// exit 15).
    RoleNotGranted,
}

impl ErrorCode {
    /// Every variant, for table tests.
    pub const ALL: [ErrorCode; 36] = [
        ErrorCode::NoRoute,
        ErrorCode::NotFound,
        ErrorCode::LeaseLost,
        ErrorCode::LeaseTokenInvalid,
        ErrorCode::RevisionConflict,
        ErrorCode::IntentConflict,
        ErrorCode::LeaseBusy,
        ErrorCode::TerminalRun,
        ErrorCode::WrongStatus,
        ErrorCode::ActiveRunLive,
        ErrorCode::RunIdTaken,
        ErrorCode::NotUnknown,
        ErrorCode::NothingToRetry,
        ErrorCode::LedgerUnavailable,
        ErrorCode::DatabaseAuthFailed,
        ErrorCode::DatabaseMissing,
        ErrorCode::SchemaMissing,
        ErrorCode::TenantMismatch,
        ErrorCode::OutcomeUnknown,
        ErrorCode::MalformedJson,
        ErrorCode::InvalidBody,
        ErrorCode::UnreadableBody,
        ErrorCode::UnsupportedMediaType,
        ErrorCode::BodyTooLarge,
        ErrorCode::InvalidTtl,
        ErrorCode::InvalidRunId,
        ErrorCode::InvalidInput,
        ErrorCode::InvalidStatus,
        ErrorCode::InvalidOperationId,
        ErrorCode::UnsafeInteger,
        ErrorCode::InvalidArguments,
        ErrorCode::UnknownTool,
        ErrorCode::KeyUnavailable,
        ErrorCode::Unauthorized,
        ErrorCode::InsufficientScope,
        ErrorCode::RoleNotGranted,
    ];

    /// The stable `code` string of the JSON answer.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::NoRoute => "no_route",
            ErrorCode::NotFound => "not_found",
            ErrorCode::LeaseLost => "lease_lost",
            ErrorCode::LeaseTokenInvalid => "lease_token_invalid",
            ErrorCode::RevisionConflict => "revision_conflict",
            ErrorCode::IntentConflict => "intent_conflict",
            ErrorCode::LeaseBusy => "lease_busy",
            ErrorCode::TerminalRun => "terminal_run",
            ErrorCode::WrongStatus => "wrong_status",
            ErrorCode::ActiveRunLive => "active_run_live",
            ErrorCode::RunIdTaken => "run_id_taken",
            ErrorCode::NotUnknown => "not_unknown",
            ErrorCode::NothingToRetry => "nothing_to_retry",
            ErrorCode::LedgerUnavailable => "ledger_unavailable",
            ErrorCode::DatabaseAuthFailed => "database_auth_failed",
            ErrorCode::DatabaseMissing => "database_missing",
            ErrorCode::SchemaMissing => "schema_missing",
            ErrorCode::TenantMismatch => "tenant_mismatch",
            ErrorCode::OutcomeUnknown => "outcome_unknown",
            ErrorCode::MalformedJson => "malformed_json",
            ErrorCode::InvalidBody | ErrorCode::UnreadableBody => "invalid_body",
            ErrorCode::UnsupportedMediaType => "unsupported_media_type",
            ErrorCode::BodyTooLarge => "body_too_large",
            ErrorCode::InvalidTtl => "invalid_ttl",
            ErrorCode::InvalidRunId => "invalid_run_id",
            ErrorCode::InvalidInput => "invalid_input",
            ErrorCode::InvalidStatus => "invalid_status",
            ErrorCode::InvalidOperationId => "invalid_operation_id",
            ErrorCode::UnsafeInteger => "unsafe_integer",
            ErrorCode::InvalidArguments => "invalid_arguments",
            ErrorCode::UnknownTool => "unknown_tool",
            ErrorCode::KeyUnavailable => "key_unavailable",
            ErrorCode::Unauthorized => "unauthorized",
            ErrorCode::InsufficientScope => "insufficient_scope",
            ErrorCode::RoleNotGranted => "role_not_granted",
        }
    }

    /// The code of a `code` string (`invalid_body` reads as [`ErrorCode::InvalidBody`]).
    pub fn parse(text: &str) -> Option<ErrorCode> {
        ErrorCode::ALL
            .into_iter()
            .find(|code| code.as_str() == text)
    }

    /// The HTTP status of the answer.
    pub fn status(self) -> StatusCode {
        match self {
            ErrorCode::NoRoute | ErrorCode::NotFound => StatusCode::NOT_FOUND,
            ErrorCode::LeaseTokenInvalid => StatusCode::FORBIDDEN,
            ErrorCode::Unauthorized => StatusCode::UNAUTHORIZED,
            ErrorCode::InsufficientScope => StatusCode::FORBIDDEN,
            ErrorCode::LeaseLost
            | ErrorCode::RevisionConflict
            | ErrorCode::IntentConflict
            | ErrorCode::LeaseBusy
            | ErrorCode::TerminalRun
            | ErrorCode::WrongStatus
            | ErrorCode::ActiveRunLive
            | ErrorCode::RunIdTaken
            | ErrorCode::NotUnknown
            | ErrorCode::NothingToRetry => StatusCode::CONFLICT,
            ErrorCode::LedgerUnavailable
            | ErrorCode::DatabaseAuthFailed
            | ErrorCode::DatabaseMissing
            | ErrorCode::SchemaMissing
            | ErrorCode::RoleNotGranted
            | ErrorCode::OutcomeUnknown => StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::MalformedJson | ErrorCode::UnreadableBody => StatusCode::BAD_REQUEST,
            ErrorCode::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ErrorCode::BodyTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ErrorCode::InvalidBody
            | ErrorCode::InvalidTtl
            | ErrorCode::InvalidRunId
            | ErrorCode::InvalidInput
            | ErrorCode::InvalidStatus
            | ErrorCode::InvalidOperationId
            | ErrorCode::UnsafeInteger
            | ErrorCode::InvalidArguments
            | ErrorCode::UnknownTool
            | ErrorCode::TenantMismatch => StatusCode::UNPROCESSABLE_ENTITY,
            ErrorCode::KeyUnavailable => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The operator CLI's exit code (docs/operating.md: 3 not found, 4 conflict, 5
    /// lease lost or lease token invalid, 2 invalid input, 6 database unavailable, 7 login refused,
    /// 8 database missing, 9 schema missing, 1 otherwise). `serve`, `stdio`
    /// and `migrate` exit with 6 to 9 too when the ledger cannot be opened.
    pub fn exit_code(self) -> u8 {
        match self {
            ErrorCode::NotFound => exit::NOT_FOUND,
            ErrorCode::LeaseLost | ErrorCode::LeaseTokenInvalid => exit::LEASE_LOST,
            ErrorCode::RevisionConflict
            | ErrorCode::IntentConflict
            | ErrorCode::LeaseBusy
            | ErrorCode::TerminalRun
            | ErrorCode::WrongStatus
            | ErrorCode::ActiveRunLive
            | ErrorCode::RunIdTaken
            | ErrorCode::NotUnknown
            | ErrorCode::NothingToRetry => exit::CONFLICT,
            ErrorCode::LedgerUnavailable | ErrorCode::OutcomeUnknown => exit::UNAVAILABLE,
            ErrorCode::DatabaseAuthFailed => exit::AUTHENTICATION_FAILED,
            ErrorCode::DatabaseMissing => exit::DATABASE_MISSING,
            ErrorCode::SchemaMissing => exit::SCHEMA_MISSING,
            ErrorCode::RoleNotGranted => exit::ROLE_NOT_GRANTED,
            ErrorCode::MalformedJson
            | ErrorCode::InvalidBody
            | ErrorCode::UnreadableBody
            | ErrorCode::InvalidTtl
            | ErrorCode::InvalidRunId
            | ErrorCode::InvalidInput
            | ErrorCode::InvalidStatus
            | ErrorCode::InvalidOperationId
            | ErrorCode::UnsafeInteger
            | ErrorCode::InvalidArguments
            | ErrorCode::UnknownTool
            | ErrorCode::TenantMismatch => exit::INVALID_INPUT,
            // The CLI builds its own requests (in-process, without a
            // token): these mean a CLI bug.
            ErrorCode::NoRoute
            | ErrorCode::UnsupportedMediaType
            | ErrorCode::BodyTooLarge
            | ErrorCode::Unauthorized
            | ErrorCode::InsufficientScope => exit::OTHER,
            ErrorCode::KeyUnavailable => exit::OTHER,
        }
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl From<&Rejection> for ErrorCode {
    fn from(rejection: &Rejection) -> Self {
        match rejection {
            Rejection::LeaseLost { .. } => ErrorCode::LeaseLost,
            Rejection::LeaseTokenInvalid { .. } => ErrorCode::LeaseTokenInvalid,
            Rejection::Conflict { .. } => ErrorCode::RevisionConflict,
            Rejection::WrongStatus { .. } => ErrorCode::WrongStatus,
            Rejection::Terminal { .. } => ErrorCode::TerminalRun,
            Rejection::NotFound => ErrorCode::NotFound,
            Rejection::IntentConflict { .. } => ErrorCode::IntentConflict,
        }
    }
}

impl From<ConnectFailure> for ErrorCode {
    fn from(failure: ConnectFailure) -> Self {
        match failure {
            ConnectFailure::InvalidUrl => ErrorCode::InvalidInput,
            ConnectFailure::Unreachable => ErrorCode::LedgerUnavailable,
            ConnectFailure::AuthenticationFailed => ErrorCode::DatabaseAuthFailed,
            ConnectFailure::DatabaseMissing => ErrorCode::DatabaseMissing,
            ConnectFailure::SchemaMissing => ErrorCode::SchemaMissing,
            ConnectFailure::RoleNotGranted => ErrorCode::RoleNotGranted,
        }
    }
}

impl From<&InvalidInput> for ErrorCode {
    fn from(invalid: &InvalidInput) -> Self {
        match invalid {
            InvalidInput::TtlNotPositive { .. } | InvalidInput::TtlAboveCeiling { .. } => {
                ErrorCode::InvalidTtl
            }
            InvalidInput::RunId(_) => ErrorCode::InvalidRunId,
            InvalidInput::TextLength { .. }
            | InvalidInput::Identifier(_)
            | InvalidInput::Request(_) => ErrorCode::InvalidInput,
        }
    }
}

impl From<&IntentError> for ErrorCode {
    fn from(error: &IntentError) -> Self {
        match error {
            IntentError::UnsafeInteger { .. } => ErrorCode::UnsafeInteger,
            IntentError::Canonicalize(_) => ErrorCode::InvalidArguments,
            IntentError::TextLength { .. } | IntentError::EffectVersion(_) => {
                ErrorCode::InvalidInput
            }
        }
    }
}

/// An error answer: a stable code (which fixes the HTTP status), a human
/// message, and optional structured detail.
#[derive(Debug)]
pub struct ApiError {
    pub(super) code: ErrorCode,
    pub(super) message: String,
    pub(super) detail: Option<Value>,
}

impl ApiError {
    pub(super) fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            detail: None,
        }
    }

    pub(super) fn with_detail(mut self, detail: Value) -> Self {
        self.detail = Some(detail);
        self
    }

    pub(super) fn not_found(what: &str) -> Self {
        Self::new(ErrorCode::NotFound, format!("{what} not found"))
    }

    pub fn code(&self) -> ErrorCode {
        self.code
    }

    /// The message the API answers with (no SQL, no stack traces).
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut body = json!({ "code": self.code.as_str(), "message": self.message });
        if let Some(detail) = self.detail {
            body["detail"] = detail;
        }
        (self.code.status(), Json(body)).into_response()
    }
}

impl From<LedgerError> for ApiError {
    fn from(error: LedgerError) -> Self {
        match &error {
            LedgerError::InvalidInput(invalid) => {
                ApiError::new(ErrorCode::from(invalid), invalid.to_string())
            }
            LedgerError::Sealed { .. } => {
                tracing::error!(%error, "a stored body cannot be opened");
                ApiError::new(ErrorCode::KeyUnavailable, error.to_string())
            }
            LedgerError::Connect(connect) => {
                tracing::error!(error = %crate::logfield::clip_display(&connect), "ledger connect failed");
                ApiError::new(
                    ErrorCode::from(connect.failure),
                    "the ledger database cannot be opened; nothing was written",
                )
            }
            _ => {
                tracing::error!(error = %crate::logfield::clip_display(&error), "ledger call failed");
                match error.delivery() {
                    Delivery::Unknown => ApiError::new(
                        ErrorCode::OutcomeUnknown,
                        "the ledger's answer was lost: read the run or operation back before retrying",
                    ),
                    _ => ApiError::new(
                        ErrorCode::LedgerUnavailable,
                        "the ledger database is unreachable; nothing was written",
                    ),
                }
            }
        }
    }
}

impl From<Rejection> for ApiError {
    fn from(rejection: Rejection) -> Self {
        let detail = match &rejection {
            Rejection::LeaseLost { expected, found } => {
                Some(json!({"expected": expected, "found": found}))
            }
            // The claim serializes without its token.
            Rejection::LeaseTokenInvalid { claim, fault } => {
                Some(json!({"lease": claim, "fault": fault}))
            }
            Rejection::Conflict {
                expected_revision,
                found,
            } => Some(json!({"expected_revision": expected_revision, "found_revision": found})),
            Rejection::IntentConflict {
                operation_id,
                expected_digest,
                found_digest,
                ..
            } => Some(json!({
                "operation_id": operation_id, "expected_digest": expected_digest, "found_digest": found_digest})),
            Rejection::Terminal { status } | Rejection::WrongStatus { found: status, .. } => {
                Some(json!({"run_status": status}))
            }
            Rejection::NotFound => None,
        };
        ApiError {
            code: ErrorCode::from(&rejection),
            message: rejection.to_string(),
            detail,
        }
    }
}

impl From<IntentError> for ApiError {
    fn from(error: IntentError) -> Self {
        ApiError::new(ErrorCode::from(&error), error.to_string())
    }
}

impl From<crate::ids::InvalidIdentifier> for ApiError {
    fn from(error: crate::ids::InvalidIdentifier) -> Self {
        ApiError::new(ErrorCode::InvalidInput, error.to_string())
            .with_detail(json!({"field": error.field()}))
    }
}

impl From<InvalidRunId> for ApiError {
    fn from(error: InvalidRunId) -> Self {
        ApiError::new(ErrorCode::InvalidRunId, error.to_string())
    }
}

/// JSON bodies with our error codes for every way a body can be wrong.
pub struct Body<T>(pub T);

impl<S, T> FromRequest<S> for Body<T>
where
    T: serde::de::DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        match Json::<T>::from_request(request, state).await {
            Ok(Json(value)) => Ok(Body(value)),
            Err(rejection) => Err(match rejection {
                JsonRejection::JsonSyntaxError(e) => {
                    ApiError::new(ErrorCode::MalformedJson, e.body_text())
                }
                JsonRejection::JsonDataError(e) => {
                    ApiError::new(ErrorCode::InvalidBody, e.body_text())
                }
                JsonRejection::MissingJsonContentType(_) => ApiError::new(
                    ErrorCode::UnsupportedMediaType,
                    "send Content-Type: application/json",
                ),
                other if other.status() == StatusCode::PAYLOAD_TOO_LARGE => {
                    crate::http_server::refused(
                        crate::http_server::Listener::Control,
                        crate::http_server::Refusal::BodyTooLarge,
                    );
                    ApiError::new(
                        ErrorCode::BodyTooLarge,
                        format!(
                            "request bodies are limited to {} bytes ({} for POST /v1/leases/renew)",
                            super::routes::MAX_BODY_BYTES,
                            super::routes::MAX_BATCH_BODY_BYTES
                        ),
                    )
                }
                // The body could not be read (axum answers 400 for it).
                other => ApiError::new(ErrorCode::UnreadableBody, other.body_text()),
            }),
        }
    }
}

/// A run id from a path segment; a malformed one is 400.
pub(super) fn run_id(raw: &str) -> Result<RunId, ApiError> {
    raw.parse::<RunId>().map_err(ApiError::from)
}

/// A fenced write's outcome: the value, or the API error of its rejection
/// (lease lost, conflict, …).
pub(super) fn applied<T>(outcome: Fenced<T>) -> Result<T, ApiError> {
    outcome.into_result().map_err(ApiError::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_strings_parse_back_and_only_invalid_body_is_shared() {
        for code in ErrorCode::ALL {
            let parsed = ErrorCode::parse(code.as_str()).expect("every code parses");
            if code == ErrorCode::UnreadableBody {
                assert_eq!(parsed, ErrorCode::InvalidBody);
                assert_eq!(parsed.exit_code(), code.exit_code());
            } else {
                assert_eq!(parsed, code);
            }
        }
        assert_eq!(ErrorCode::parse("no_such_code"), None);
    }

    #[test]
    fn statuses_and_exit_codes_are_the_documented_ones() {
        use ErrorCode::*;
        let table = [
            (NoRoute, 404, 1),
            (NotFound, 404, 3),
            (LeaseLost, 409, 5),
            (LeaseTokenInvalid, 403, 5),
            (RevisionConflict, 409, 4),
            (IntentConflict, 409, 4),
            (LeaseBusy, 409, 4),
            (TerminalRun, 409, 4),
            (WrongStatus, 409, 4),
            (ActiveRunLive, 409, 4),
            (RunIdTaken, 409, 4),
            (NotUnknown, 409, 4),
            (NothingToRetry, 409, 4),
            (LedgerUnavailable, 503, 6),
            (DatabaseAuthFailed, 503, 7),
            (DatabaseMissing, 503, 8),
            (SchemaMissing, 503, 9),
            (TenantMismatch, 422, 2),
            (OutcomeUnknown, 503, 6),
            (MalformedJson, 400, 2),
            (InvalidBody, 422, 2),
            (UnreadableBody, 400, 2),
            (UnsupportedMediaType, 415, 1),
            (BodyTooLarge, 413, 1),
            (InvalidTtl, 422, 2),
            (InvalidRunId, 422, 2),
            (InvalidInput, 422, 2),
            (InvalidStatus, 422, 2),
            (InvalidOperationId, 422, 2),
            (UnsafeInteger, 422, 2),
            (InvalidArguments, 422, 2),
            (UnknownTool, 422, 2),
            (KeyUnavailable, 500, 1),
            (Unauthorized, 401, 1),
            (InsufficientScope, 403, 1),
            (RoleNotGranted, 503, 15),
        ];
        assert_eq!(table.len(), ErrorCode::ALL.len());
        for (code, status, exit) in table {
            assert_eq!(
                (code.status().as_u16(), code.exit_code()),
                (status, exit),
                "{code}"
            );
        }
    }

    /// The lower layers name their errors too; the table must agree with them.
    #[test]
    fn codes_agree_with_the_ledger_and_intent_names() {
        let rejections = [
            Rejection::Conflict {
                expected_revision: 1,
                found: 2,
            },
            Rejection::Terminal {
                status: crate::ledger::RunStatus::Failed,
            },
            Rejection::WrongStatus {
                expected: crate::ledger::RunStatus::Running,
                found: crate::ledger::RunStatus::Pending,
            },
            Rejection::NotFound,
            Rejection::LeaseTokenInvalid {
                claim: crate::ledger::LeaseClaim {
                    run_id: crate::ledger::RunId::generate(),
                    owner: "w".into(),
                    epoch: 1,
                    token: Some(crate::ledger::LeaseToken::generate()),
                },
                fault: crate::ledger::TokenFault::Wrong,
            },
        ];
        for rejection in &rejections {
            assert_eq!(ErrorCode::from(rejection).as_str(), rejection.reason());
        }
        let invalid = [
            InvalidInput::TtlNotPositive {
                what: "ttl",
                ttl_ms: 0,
            },
            InvalidInput::TtlAboveCeiling {
                what: "ttl",
                ttl_ms: 2,
                ceiling_ms: 1,
            },
            InvalidInput::Request("x".into()),
            InvalidInput::RunId(InvalidRunId { value: "x".into() }),
            InvalidInput::TextLength {
                field: "reason",
                len: 0,
                max: 1,
            },
            InvalidInput::Identifier(crate::ids::InvalidIdentifier::Length {
                field: "owner",
                len: 0,
                max: 1,
            }),
        ];
        for invalid in &invalid {
            assert_eq!(ErrorCode::from(invalid).as_str(), invalid.code());
        }
        let intents = [
            IntentError::UnsafeInteger {
                path: "$".into(),
                value: "1".into(),
            },
            IntentError::Canonicalize("x".into()),
            IntentError::TextLength {
                field: "tool",
                len: 0,
                max: 1,
            },
            IntentError::EffectVersion(0),
        ];
        for error in &intents {
            assert_eq!(ErrorCode::from(error).as_str(), error.code());
        }
        assert_eq!(
            ErrorCode::InvalidRunId.as_str(),
            InvalidRunId { value: "x".into() }.code()
        );
    }
}
