//! leasegate: an MCP tool-call idempotency proxy with a fenced PostgreSQL
//! ledger. Agents call tools through it; every side-effecting call becomes an
//! intent in the ledger under the caller's lease, is dispatched with a stable
//! operation id, and is settled from evidence. A paused or stale worker can
//! never write state after another worker took over.
//!
//! # Layout
//!
//! * `ledger`: the PostgreSQL ledger. Typed `<entity>_<verb>` calls of the
//!   SQL functions in `sql/` (one function = one short transaction =
//!   one statement), typed outcomes (`Fenced`, `Rejection`,
//!   `AcquireOutcome`), retries of 40001/40P01, "outcome unknown" on a
//!   connection lost mid-call. The only module that imports sqlx.
//! * `ids`: identities every layer shares (`RunId`).
//! * `intent`: canonical JSON (RFC 8785), `request_digest`, `operation_id`,
//!   `Intent`. Pure functions; the ledger depends on it, not the reverse.
//! * `ledger::operations`: the side-effect half of the ledger — register,
//!   claim, settle, mark unknown, converge, supersede, and the read side
//!   (the fate of a call). `ledger::stored_json`: how JSON that `jsonb`
//!   cannot hold (U+0000) is stored and read back exactly.
//! * `policy`, `adapter`, `config`: the files users write (`policies/`,
//!   `adapters/`, `leasegate.toml`), parsed with `deny_unknown_fields` and
//!   validated into normalized types; `adapter::Upstream` is the seam
//!   through which dispatch reaches tool servers.
//! * `dispatch`: the inline path of a side-effecting call — register+claim,
//!   upstream call in a leasegate-owned task, settle or mark unknown.
//! * `mcp`: the only module that imports rmcp — the front (`Front`, HTTP at
//!   `/mcp` and stdio: the upstreams' whole server surface, namespaced, with
//!   sampling/elicitation/roots relayed within the call and 2026-07-28
//!   `input_required` calls parked until the agent's retry), the upstream
//!   clients (`Upstreams`, implementing `adapter::Upstream`; one shared
//!   session per upstream, per-request routing of what upstreams send), the
//!   stateless front's cancellation registry (`inflight`), per-call HTTP
//!   headers to Streamable HTTP upstreams (`http_headers`), conversions and
//!   JSON-RPC codes (`convert`), and the example tool server.
//! * `reconcile`: the background loops of every `serve` process —
//!   dispatcher of planned intents, claim expiry, reconciler of unknown
//!   outcomes per adapter capability — claimed in the database, no leader.
//! * `control`: the control HTTP API (`openapi.json`) and the operator CLI
//!   that drives it in-process; `/metrics`.
//! * `app`: wiring (config → ledger → upstreams → front); `main` is thin.
//! * `worker`: what a Rust worker links: `LeaseHandle` and the heartbeat that
//!   cancels the worker (`WorkerCancellation`, with a `StopCause`) on the
//!   first unconfirmed renewal.
//! * `migrations/`: the tables (`0001`: tasks, runs, leases, events;
//!   `0002`: operations, evidence) and the `leasegate_app` role that may
//!   only execute the functions and read. `sql/`: every protected
//!   transition as one SQL function, each in one current home per entity
//!   (`common`, `lease`, `run`, `operation`), installed after the
//!   migrations by `ledger::schema`.
//! * `src/main.rs`: the `leasegate` CLI (`serve`, `stdio`, `check-config`,
//!   `migrate`, `example-tools`).
//! * `examples/worker/`: a worker process (lease, heartbeat, checkpoint loop)
//!   that the process-level tests freeze with SIGSTOP.
//!
//! Dependencies point one way: `main`/`app` → `mcp`, `control`,
//! `reconcile` → `dispatch` → `adapter`, `ledger` → `intent`, `policy`, `ids`. `tests/layering.rs`
//! checks that only `ledger` imports sqlx and only `mcp` imports rmcp.
//!
//! # Invariant index (DESIGN.md numbering)
//!
//! 1. Only the current run's current epoch writes workflow state —
//!    `_lease_fence` in `sql/common.sql`; `ledger` module docs.
//! 2. Within one epoch, writes are ordered by revision CAS — `_run_advance`.
//! 3. One intent has one operation_id forever — `intent::operation_id`;
//!    conflicts compared on every path — `_op_upsert`.
//! 4. Unknown stays unknown until evidence converges it; `dispatching` never
//!    returns to `prepared` — `sql/operation.sql`.
//! 5. No transaction spans a network call — each ledger call is one statement.
//! 6. A retry is a new run; terminal runs are never reused — `run_create`.
//! 7. Lease time is the database's `clock_timestamp()`.
//! 8. Nothing is deleted; every status change is in `ledger_events`, which
//!    refuses UPDATE, DELETE and TRUNCATE.

pub mod adapter;
pub mod app;
pub mod config;
pub mod control;
pub mod dispatch;
pub mod ids;
pub mod intent;
pub mod ledger;
pub mod mcp;
pub mod policy;
pub mod reconcile;
pub mod worker;
