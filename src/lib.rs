//! leasegate: an MCP tool-call idempotency proxy with a fenced PostgreSQL
//! ledger. Agents call tools through it; every side-effecting call becomes an
//! intent in the ledger under the caller's lease, is dispatched with a stable
//! operation id, and is settled from evidence. A paused or stale worker can
//! never write state after another worker took over.
//!
//! # Layout
//!
//! * `ledger`: the PostgreSQL ledger, by entity: `lease`, `run`,
//!   `operation` (typed `<entity>_<verb>` calls of the SQL functions in
//!   `sql/`; one function = one short transaction = one statement; the
//!   settle's `CALL operation_settle_acknowledged` commits and then reads
//!   the WAL position, still one statement), `read`
//!   (runs, operations — the fate of a call — events, evidence, health),
//!   `verdict` (the one decoder of every function's outcome and the shared
//!   fence rejections), `durability` (the server's durability facts, WAL
//!   position and timeline switch points, recorded failovers), `schema`
//!   (tables from `migrations/`, functions from
//!   `sql/`), `retention` (old settled history of terminal runs moved to
//!   the archive tables, as the operator role; `operation_get` reads the
//!   archive), `stored_json` (JSON that `jsonb` cannot hold, such as U+0000,
//!   stored and read back exactly, and sealed bodies opened in the same
//!   walk), `secrets` (key rotation: `operation_reseal`), `console` (the web
//!   console's searches and counts: tenant-scoped, read-only), `pool` (the
//!   sessions: deadpool over sqlx's `PgConnection`, returned without sqlx's
//!   ping, so a statement is one round trip on the wire). Every body
//!   written (request, result, evidence) passes the policy's data rules
//!   (`LedgerOptions::bodies`) and every body read is opened. Retries of 40001/40P01, "outcome
//!   unknown" on a connection lost mid-call; a ledger that cannot be opened
//!   is a `ConnectFailure` (unreachable, login refused, database missing,
//!   schema missing). The only module that imports sqlx.
//! * `ids`: identities every layer shares (`RunId`), and the one rule for
//!   client-chosen identifiers (`check_identifier`: owner, tenant, task,
//!   step, idempotency key, actor — bounded, visible ASCII), enforced at
//!   every edge and again by the ledger.
//! * `intent`: canonical JSON (RFC 8785), `request_digest`, `operation_id`,
//!   `Intent`. Pure functions; the ledger depends on it, not the reverse.
//! * `policy`, `adapter`, `config`: the files users write (`policies/`,
//!   `adapters/`, `leasegate.toml`), parsed with `deny_unknown_fields` and
//!   validated into normalized types; `policy::secrets`: what the ledger
//!   stores of bodies (`full`, `masked` by field name at any depth,
//!   `digest_only`, `encrypted`: XChaCha20-Poly1305 under named keys from
//!   files or environment variables); `adapter::Upstream` is the seam
//!   through which dispatch reaches tool servers. `config` resolves a stdio
//!   upstream's command (relative to the config file, or beside the running
//!   executable, then `PATH`), and the ledger's URL for every command
//!   (`DatabaseUrl::resolve`: `--database-url`, `LEASEGATE_DATABASE_URL`,
//!   the config's `database_url`, the default; never `DATABASE_URL`).
//!   `config::Config` is a composition of typed sections (`database`,
//!   `http`, `naming`, `lease`, `session`, `auth`, `limits`, `telemetry`),
//!   each validating its own keys in a file of its own.
//!   `config::init`: what `leasegate init` writes (`leasegate.toml`, the
//!   default policy, an adapter skeleton per upstream) from listed tools,
//!   as pure functions.
//! * `auth`: who is calling — bearer access tokens `lgt_<id>_<secret>`
//!   (only the secret's SHA-256 is stored, `ledger::token`), their scope
//!   (`agent`, `operator`, `admin`) and tenant (`Principal`), checked against
//!   the ledger on every request (`Authenticator`); JWTs of an identity
//!   provider (`auth::jwt`, `[auth.jwt]`: JWKS file, issuer, audience,
//!   tenant and scope claims). The HTTP side (401/403,
//!   route scopes, the RFC 9728 metadata, tenant scoping) is
//!   `control::auth`, wrapped around both listeners by `app::run` when
//!   `[auth]` requires tokens.
//! * `durability`: the durability contract (policy `durability = "local" |
//!   "sync_replica"`): `DurabilityGate`, checked at startup and with every liveness
//!   renewal, holds dispatch while the server does not give what the policy
//!   claims or while a lossy failover is unresolved; failover detection
//!   against this process's acknowledged WAL high-water;
//!   `durability::liveness`, the process's liveness renewal, retried with
//!   backoff, after which new claims wait only once the row may have
//!   lapsed.
//! * `embedded`: the embedded default — a private PostgreSQL cluster in the
//!   state directory (`.leasegate/pg`, or `$LEASEGATE_STATE_DIR/pg`),
//!   socket only, from the system's `initdb`/`pg_ctl` (as the `postgres`
//!   user when root); `app::provide_database` starts it when the URL is the
//!   default and nothing answers there, `cli` stops it on exit. Spawns
//!   processes, never imports sqlx.
//! * `dispatch`: the dispatch protocol, shared by the inline path and the
//!   outbox (`dispatch::Outbox`: planned intents claimed and sent) —
//!   register+claim, upstream call in a leasegate-owned task (what a
//!   failure proves: `UpstreamError::delivery`), settle or mark unknown;
//!   each round of a call that asks its agent something recorded as
//!   `input_round` evidence; a task an upstream made of a call (MCP Tasks
//!   extension) followed under the call's claim until it is terminal
//!   (`dispatch::TaskFollowers`).
//! * `mcp`: the only module that imports rmcp — the front (`Front`, HTTP at
//!   `/mcp` and stdio: the upstreams' whole server surface, namespaced, with
//!   sampling/elicitation/roots relayed within the call, stateless-MCP
//!   `input_required` calls parked until the agent's retry, and the Tasks
//!   extension's requests routed to the upstream that made each task), the upstream
//!   clients (`Upstreams`, implementing `adapter::Upstream`; one shared
//!   session per upstream, per-request routing of what upstreams send), the
//!   stateless front's cancellation registry and handshake-era log levels
//!   (`inflight`), per-call HTTP headers to Streamable HTTP upstreams
//!   and their `tools/list` answers read raw (`http_headers`), conversions and JSON-RPC codes (`convert`),
//!   JSON-RPC's own answers to bodies rmcp cannot read (`malformed`: 400
//!   with -32700 or -32600, -32700 under the message's id when only its
//!   depth or a number is at fault, 413 with -32600 for one over the limit);
//!   numbers that parsing would alter, found in the agent's own bytes
//!   (`numbers`); the upstreams' tool objects kept whole
//!   (`upstream::tool_objects`, `front::whole_tools`);
//!   each principal's share of the requests in flight on the HTTP front
//!   (`share`: 429 with `-31012` before rmcp);
//!   `inspect_upstream`, the one-off connection
//!   and tool listing of `leasegate init`.
//! * `reconcile`: the background services of every `serve` process —
//!   the outbox's passes (`dispatch::Outbox`, planned intents),
//!   `ClaimExpiry`, `Reconciler` (unknown
//!   outcomes per adapter capability), each on its own interval with an
//!   awaitable `Signal`; work claimed in the database, no leader.
//!   `reconcile::plan`: the reconciler's decisions as pure functions (the
//!   decision table).
//! * `http_server`: bounded serving — the one HTTP server both listeners run on
//!   (`http_server::serve`: header-read, body-read and idle timeouts, at most
//!   `max_connections` connections, accept errors backed off and logged
//!   once per interval), per-principal rate limits (`http_server::rate`, 429 with
//!   `Retry-After`), the refusal counter `http_refused_total`, the open-file
//!   limit and freed memory handed back. `[limits]` is `config::limits`;
//!   the session cap is `mcp::sessions`. The only module besides `control`
//!   and `mcp` that imports axum, and the only one that imports hyper.
//! * `telemetry`: traces — `[telemetry]` settings (parsed by
//!   `config::telemetry`), the OTLP exporter and the `tracing` layer that
//!   turns leasegate's spans into OpenTelemetry spans (installed by `cli`),
//!   and the W3C trace context: the agent's `traceparent` as a span's parent
//!   (`set_parent`), the upstream attempt's own as what the tool receives
//!   (`upstream_trace_context`). A bottom-layer module like `ids`, so that
//!   the front and dispatch use it; the only one besides `cli` (its logging
//!   set-up) that imports `tracing_subscriber`, and the only one that imports `opentelemetry*`.
//! * `progress`: progress bars and spinners on stderr for commands that
//!   wait (`migrate`, `secrets rotate`, the benchmarks, the chaos soak),
//!   drawn only when stderr is a terminal (`LEASEGATE_NO_PROGRESS` turns
//!   them off); elsewhere not a byte. Bottom layer; the only module that
//!   imports indicatif.
//! * `logfield`: request-controlled text in log lines cut to
//!   `limits.log_field_max_bytes` (`clip`, `clip_display`); every log site
//!   that prints such text goes through it.
//! * `control`: the control HTTP API (`openapi.json`): `router` (the
//!   router from the handlers, `/metrics`, serving), `routes` (every route
//!   and the body limits), `state` (what the handlers share: the router's
//!   state, `OperatorLedger`), `caller` (the caller's tenant and ownership
//!   checks), `acts` (the operator acts — resolve, retry, cancel — once,
//!   for the JSON handlers and the console's forms), `error` (`ErrorCode`:
//!   the one table of API error codes, HTTP statuses and operator CLI exit
//!   codes), `auth` (bearer tokens on both listeners, route scopes), the
//!   handlers (`runs`, `leases` — `POST /v1/leases/renew`, many leases in
//!   one call —, `operations`), `console` (the web console under
//!   `/console`: server-rendered HTML with maud, cookie login, audited
//!   actions checked against the revision shown), and `in_process` (one
//!   request through the router without a listener, as the operator CLI
//!   sends it). The operator routes (resolve, retry, cancel, failover
//!   resolve) run their SQL through `OperatorLedger`, a pool as
//!   `leasegate_operator`, or answer 503 `role_not_granted` when the
//!   process has none.
//! * `app`: wiring (config → ledger → upstreams → front) and `app::run`,
//!   the one seam that serves a started `Proxy` on caller-bound `Listeners`
//!   until a shutdown future completes (`cli`: ctrl-c/SIGTERM; tests: a
//!   `CancellationToken` on `127.0.0.1:0`), then stops loops and children.
//! * `worker`: what a Rust worker links: `LeaseHandle` and the heartbeat that
//!   cancels the worker (`WorkerCancellation`, with a `StopCause`) on the
//!   first renewal it cannot confirm before the lease may lapse (transient
//!   failures are retried until then); `worker::batch` (`BatchHeartbeat`: one
//!   batch renewal per interval for many leases of one host, each loss
//!   delivered to its own holder).
//! * `agent_leases`: the leases leasegate holds for agents without lease
//!   plumbing (lease modes `session` and `key`): tasks in the caller's
//!   namespace, one shared lease per task with each process a member,
//!   renewed with `worker`'s heartbeat.
//! * `migrations/`: the tables (`0001`: tasks, runs, leases, events;
//!   `0002`: operations, evidence; `0003`: detected failovers; `0004`:
//!   access tokens and the `leasegate_operator` role, the only one that may
//!   mint or revoke them; `0005`: the lease token's hash,
//!   `ledger::LeaseToken`; `0006`: identifier checks; `0007`: operator
//!   acts — resolve, retry reset, cancel, failover resolve — are
//!   `leasegate_operator`'s alone, which reads the ledger; evidence bodies
//!   may be re-sealed in place by `evidence_reseal` only; `0008`: fewer
//!   indexes on the hot path's status changes; `0009`: partial
//!   indexes on the live statuses, the archive tables of retention; `0010`:
//!   room on `tool_operations`' pages, so new rows stay out of old pages;
//!   `0011`: `ledger_events` without foreign keys, its rows written only by
//!   the functions beside the rows they name; `0012`: single-column rules
//!   as domains; `0013`: task namespaces — the tenant's shared one and one
//!   per principal for the lease modes — and `lease_members`, the members
//!   of a shared lease; `0014`: `input_round` evidence; `0015`: lease token
//!   hashes hidden from the app role; `0016`: `task` evidence; `0017`: a
//!   claim's facts on the operation row, told by the event that ends the
//!   claim) and the
//!   `leasegate_app` role that may only execute the functions and read (not
//!   the token hashes). `sql/`: every protected
//!   transition as one SQL function, each in one current home per entity
//!   (`common`, `process`, `lease`, `run`, `members`, `operation`, `durability`,
//!   `secrets`, `access_token`, `retention`), installed after the
//!   migrations by `ledger::schema`.
//! * `cli`: the `leasegate` command line — clap definitions (`args`,
//!   `operator_args`), `serve` and `stdio` start-up (`serve`: listeners
//!   bound, the private cluster provided and stopped, ctrl-c/SIGTERM),
//!   `migrate` and `secrets rotate` (`ledger_admin`: re-seals stored bodies
//!   under the policy's current key), `check-config`, `init`, the logging
//!   set-up (`logging`; logs never carry argument or result values unless
//!   `LEASEGATE_LOG_BODIES=1`), the operator CLI (`runs`, `lease`, `ops`:
//!   each one REST request to the control router in-process, operator acts
//!   as `leasegate_operator` and the rest as `leasegate_app`; `tokens` and
//!   `ops archive`: straight to the ledger as `leasegate_operator`), and
//!   how a failed command is told and which exit code it gets (`failure`:
//!   ledger refusals with their fixes).
//! * `src/main.rs`: the `leasegate` binary — chooses the allocator (it
//!   alone does) and hands over to `cli::main`, which parses arguments and
//!   builds the runtime in this crate, so the async tree compiles once.
//! * Not part of the library, binaries under `examples/`:
//!   `leasegate-example-worker` (`examples/worker/`: lease, heartbeat,
//!   checkpoint loop, frozen with SIGSTOP by the process-level tests) and
//!   `leasegate-example-tools` (`examples/example_tools/`: the example MCP
//!   tool server with counted side effects, for the quickstart and the
//!   end-to-end tests; it may import rmcp).
//!
//! Dependencies point one way: `main` → `cli` → `app` → `mcp`, `control`,
//! `reconcile` → `dispatch`, `http_server`, `agent_leases` → `config`, `auth`, `worker`, `durability`, `embedded` → `adapter`,
//! `ledger` → `policy` → `intent` → `ids`, `logfield`, `telemetry`, `progress`. `tests/checks/layering.rs` checks it per module,
//! and per crate who may import sqlx (`ledger`), rmcp and reqwest (`mcp`),
//! axum (`control`, `mcp`, `http_server`), hyper and governor (`http_server`), clap
//! (`cli`), opentelemetry and tracing-opentelemetry
//! (`telemetry`), indicatif (`progress`).
//!
//! # Invariant index (docs/architecture.md numbering)
//!
//! 1. Only the current run's current epoch writes workflow state —
//!    `_lease_fence` in `sql/common.sql`; `ledger` module docs.
//! 2. Within one epoch, writes are ordered by revision CAS — `_run_advance`.
//! 3. One intent has one operation_id forever — `intent::operation_id`;
//!    conflicts compared on every path — `_op_upsert`, and the hot path's
//!    one body `operation_register_claim`.
//! 4. Unknown stays unknown until evidence converges it; `dispatching`
//!    returns to `prepared` only with proof that no byte of the request left
//!    (`operation_release_unsent`, kept as `not_sent` evidence) —
//!    `sql/operation.sql`.
//! 5. No transaction spans a network call — each ledger call is one statement.
//! 6. A retry is a new run; terminal runs are never reused — `run_create`.
//! 7. Lease time is the database's `clock_timestamp()`.
//! 8. Nothing is deleted; every status change is in `ledger_events`, which
//!    refuses UPDATE, DELETE and TRUNCATE. A claim (→ `dispatching`) is
//!    told by the event that ends it, with the claim's facts; until then
//!    the operation row is its record (migration `0017`).

pub mod adapter;
pub mod agent_leases;
pub mod app;
pub mod auth;
pub mod cli;
pub mod config;
pub mod control;
pub mod dispatch;
pub mod durability;
pub mod embedded;
pub mod http_server;
pub mod ids;
pub mod intent;
pub mod ledger;
pub mod logfield;
pub mod mcp;
pub mod policy;
pub mod progress;
pub mod reconcile;
pub mod telemetry;
pub mod worker;
