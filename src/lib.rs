//! leasegate: an MCP tool-call idempotency proxy with a fenced PostgreSQL
//! ledger. Agents call tools through it; every side-effecting call becomes an
//! intent in the ledger under the caller's lease, is dispatched with a stable
//! operation id, and is settled from evidence. A paused or stale worker can
//! never write state after another worker took over.
//!
//! # Layout
//!
//! * `ledger`: the PostgreSQL ledger. Typed `<entity>_<verb>` calls of the
//!   SQL functions in `migrations/` (one function = one short transaction =
//!   one statement), typed outcomes (`Fenced`, `Rejection`,
//!   `AcquireOutcome`), retries of 40001/40P01, "outcome unknown" on a
//!   connection lost mid-call. The only module that imports sqlx.
//! * `worker`: what a Rust worker links: `LeaseHandle` and the heartbeat that
//!   cancels the worker (`WorkerCancellation`, with a `StopCause`) on the
//!   first unconfirmed renewal.
//! * `migrations/`: the schema and every protected transition as one SQL
//!   function; the `leasegate_app` role that may only execute them and read.
//! * `src/main.rs`: the `leasegate` CLI (`migrate`).
//! * `examples/worker/`: a worker process (lease, heartbeat, checkpoint loop)
//!   that the process-level tests freeze with SIGSTOP.
//!
//! Still to come, with their issues: `intent` (canonical digest,
//! operation_id), `adapter`/`policy`, `dispatch`, `reconcile`, `mcp` (front
//! and upstreams), `control` (HTTP API).
//!
//! # Invariant index (DESIGN.md numbering)
//!
//! 1. Only the current run's current epoch writes workflow state —
//!    `_lease_fence` in the migration; `ledger` module docs.
//! 2. Within one epoch, writes are ordered by revision CAS — `_run_advance`.
//! 5. No transaction spans a network call — each ledger call is one statement.
//! 6. A retry is a new run; terminal runs are never reused — `run_create`.
//! 7. Lease time is the database's `clock_timestamp()`.
//! 8. Nothing is deleted; every status change is in `ledger_events`, which
//!    refuses UPDATE, DELETE and TRUNCATE.

pub mod ids;
pub mod intent;
pub mod ledger;
pub mod worker;
