//! The web console: server-rendered HTML pages over the ledger, served by
//! the control listener under `/console`, behind the same Host/Origin guard,
//! authentication and tenant scoping as the control API.
//!
//! * `pages`: the HTML (maud templates, every interpolation escaped); the
//!   stylesheet and script are `console.css` and `console.js`, embedded with
//!   `include_str!` — no Node toolchain at build or run time. `page_data`:
//!   what the pages are rendered from besides the ledger's rows.
//! * `routes`: the paths, their scopes, the router; `state`: what every
//!   handler shares (the viewer, the error page); `session`: login and
//!   logout by cookie; `views`: the pages that only read; `forms`: the
//!   actions, through the operator acts of `control::acts`.
//! * Pages: overview (`/console`), runs (`/console/runs`, a run's page),
//!   operations (`/console/operations`, an operation's page with what the
//!   reconciler plans next — read-only, `reconcile::plan` through
//!   [`Sources::planner`]).
//! * Actions (forms, POST): resolve an unknown operation, start a
//!   budget-spent one's same-key retries over, cancel a run.
//!
//! # Invariants
//!
//! 1. Who: every action is written with the actor of the request — the
//!    token's id (`token:<id>`) when authentication is on, `local-operator`
//!    when it is off (shown as "local operator") — and the note the form
//!    requires; the ledger keeps both in `ledger_events` (and the
//!    operator's evidence for a resolution).
//! 2. Optimistic: every action form carries the revision its page was
//!    rendered at. A resolution passes it to `operation_converge` (the
//!    ledger's compare-and-swap: `conflict` when the row moved on); a retry
//!    and a cancel compare it with the row read just before the one ledger
//!    call. Either way a moved-on operation or run is refused (409, a page
//!    that says so) and nothing is written.
//! 3. Tenant: a run or operation of another tenant than the caller's is
//!    "not found", exactly as one that does not exist; lists and counts are
//!    of the caller's tenant only.
//! 4. Bad input (no note, an outcome that is not `succeeded` or
//!    `failed_final`, a missing or wrong form token) is refused with a
//!    precise message before any write.
//! 5. Never the lease secret: pages show owner, epoch and expiry only.
//!    Bodies are shown as the control API shows them (the policy's masking
//!    kept; sealed bodies opened by the ledger).
//!
//! # Browser authentication
//!
//! With tokens required, `/console/login` takes a token and sets it as the
//! `lg_console` cookie (HttpOnly, SameSite=Strict, Path=/console, Secure
//! unless the request's Host is loopback); `control::auth` accepts that
//! cookie on `/console` routes only (the JSON API stays bearer-only) and
//! sends a browser without a valid one to the login page. Logout clears it.
//! CSRF: SameSite=Strict, the Origin check of `control::guard`, and a
//! per-form token (SHA-256 of a per-process random key and the caller's
//! token id) every POST must carry.
//!
//! # Failure handling
//!
//! Each action is one ledger call (one short transaction). If the process
//! dies before it, nothing was written; after it, the ledger has the change
//! and its event, and the page shows it on the next load. A ledger that
//! cannot be reached is a 503 page; nothing is retried here.

mod forms;
mod page_data;
mod pages;
mod routes;
mod session;
mod state;
mod views;

pub use routes::{CONSOLE_ROUTES, is_console, is_public, with_console};
pub use session::{cookie_bearer, insufficient_scope, login_redirect};
pub use state::{COOKIE, LOCAL_ACTOR, Planner, Sources};
