//! The names leasegate reads from an agent's request: `_meta` keys and HTTP
//! headers. One home, so that the front, the error answers (`convert`) and
//! the stdio key lifting (`idempotency`) name the same thing.

pub const LEASE_META: &str = "dev.leasegate/lease";
pub const STEP_META: &str = "dev.leasegate/step";
pub const RUN_ID_HEADER: &str = "leasegate-run-id";
pub const OWNER_HEADER: &str = "leasegate-owner";
pub const EPOCH_HEADER: &str = "leasegate-epoch";
/// The secret lease token of the lease the other three headers name.
pub const LEASE_TOKEN_HEADER: &str = "leasegate-lease-token";
/// Lease mode `session` over HTTP: the task key of this MCP session.
pub const TASK_HEADER: &str = "leasegate-task";
/// Lease mode `key`: the call's idempotency key in `_meta` (the HTTP front
/// also moves a draft-spec `params.idempotencyKey` here, and takes the
/// `Idempotency-Key` header).
pub const IDEMPOTENCY_KEY_META: &str = "dev.leasegate/idempotency_key";
pub const IDEMPOTENCY_KEY_HEADER: &str = "idempotency-key";
/// Lease mode `key`: the step of a key's run when the agent names none.
pub const KEY_STEP: &str = "idempotency-key";
/// Resource URIs are exposed as `<upstream>+<uri>`.
pub const URI_SEPARATOR: &str = "+";
/// The stateless-MCP per-request log level (`_meta`).
pub const LOG_LEVEL_META: &str = "io.modelcontextprotocol/logLevel";
