//! The control HTTP API: runs, leases, checkpoints (with planned intents),
//! run transitions, and the fate of a call. A thin layer over the ledger's
//! functions — no protocol logic of its own. Described by `openapi.json` at
//! the repository root; `tests/integration/control_api.rs` checks the two agree.
//!
//! * `router`: the router built from the handlers, `/metrics`, serving; the
//!   top of the folder (it depends on the route files, never the reverse).
//! * `routes`: every route (`ROUTES`) and the body limits, as data.
//! * `state`: what the handlers share — the router's state, the operator
//!   ledger ([`OperatorLedger`]), the upstream health source.
//! * `caller`: the tenant a request acts for (`Caller`: another tenant's
//!   run or operation is 404) and the audited actor of an operator act.
//! * `acts`: the operator acts (resolve, retry, cancel) — their checks,
//!   their one ledger call as `leasegate_operator`, their outcome — shared
//!   by the JSON handlers and the console's forms.
//! * `error`: [`ErrorCode`], the one table of error codes, HTTP statuses and
//!   operator CLI exit codes; error answers and JSON body extraction.
//! * `runs`, `leases` (`POST /v1/leases/renew`: many leases renewed in one
//!   call, each answered on its own), `operations`, `durability`: the handlers (`durability`: the
//!   recorded failovers and their resolution; `with_durability` adds this
//!   process's `GET /v1/durability`).
//! * `auth`: bearer tokens on both listeners (`authenticated`), the scope
//!   of every route, the RFC 9728 metadata.
//! * `console`: the web console under `/console` (server-rendered HTML over
//!   the ledger, the same guard, authentication and tenant scoping; login
//!   by cookie for browsers; actions audited and checked against the
//!   revision the page showed). Not part of `openapi.json`.
//! * `in_process`: one request through the router without a listener, as
//!   the operator CLI (`crate::cli`) sends each of its commands.
//!
//! # Database roles
//!
//! The operator routes — resolve and retry an operation, cancel a run,
//! resolve a failover — run their SQL through [`OperatorLedger`], a ledger
//! whose sessions are `leasegate_operator`; every other route runs as
//! `leasegate_app`, which may not execute those functions (migrations/0007).
//! A process without an operator ledger answers the operator routes 503
//! `role_not_granted` and writes nothing. The audited actor stays the
//! caller's (`actor`/`by` in the body, the CLI's `--actor`/`--by`), never
//! the database role.
//!
//! Errors are JSON `{"code", "message"}` with a stable code: 409 for lease
//! lost, conflicts and busy leases, 404 for unknown ids, 400/413/415/422 for
//! bad input (422 `tenant_mismatch`: a run of another tenant than the
//! serving process's or the token's; 422 `unknown_tool`: a planned intent
//! for a tool no upstream of the serving process lists), 401 `unauthorized`
//! and 403 `insufficient_scope` when authentication is on, 503 when the database is unreachable or the outcome
//! of a write is unknown. Messages never carry SQL or stack traces.

mod acts;
pub mod auth;
mod caller;
pub mod console;
mod durability;
pub mod error;
pub mod guard;
pub mod in_process;
mod leases;
mod operations;
mod router;
mod routes;
mod runs;
mod state;

pub use error::{ApiError, Body, ErrorCode, exit};
pub use router::{
    guarded, process_views_for, router, router_for_tenant, router_with_metrics,
    router_with_operator, router_with_tools, serve, with_durability, with_metrics,
    with_upstream_health,
};
pub use routes::{MAX_BODY_BYTES, ROUTES};
pub use state::{OperatorLedger, UpstreamHealthSource};
