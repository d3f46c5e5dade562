//! Side-effecting calls through the ledger: the inline path of one call
//! (claim → call → settle) and the outbox of calls planned for later, which
//! sends each exactly like the inline path.
//!
//! - `call`: the vocabulary (request, context, reply, refusal, the
//!   process's claim identity);
//! - `dispatcher`: [`Dispatcher`], the inline path;
//! - `execute`: a claimed operation's execution, shared by both paths;
//! - `outcome`: what a call's end writes (settle, release as unsent, mark
//!   unknown), for an execution and a followed task alike;
//! - `keeper`: what a tool answered (or proof nothing left), kept in the
//!   process and written when a failed ledger write can land again;
//! - `rounds`: each round of a call that asks its agent something,
//!   recorded as `input_round` evidence;
//! - `tasks`: calls an upstream made a task of (MCP Tasks extension),
//!   followed under their claim until the task is terminal (`followers`:
//!   the ones this process follows);
//! - `undelivered`: outcomes this process's agents never received, shown
//!   before a different call to the same tool is sent;
//! - `outbox`: [`Outbox`], one pass over planned operations (scheduled by
//!   `crate::reconcile`), and [`is_original`], the check every sender of a
//!   stored request makes.
//!
//! ```text
//!  register+claim (1 tx) ──▶ upstream call (no tx open) ──▶ settle | mark unknown (1 tx)
//! ```
//!
//! # Invariants
//!
//! - Nothing reaches the upstream without a claim committed under the
//!   caller's valid lease (ledger invariant 1; invariant 5 of docs/architecture.md: no
//!   transaction is open during the call).
//! - The upstream call runs in a task owned by leasegate, not by the agent's
//!   request: if the agent disconnects, the answer is still recorded.
//! - A timeout or a transport error after the request may have left is
//!   `unknown`, never `failed_final`. An error proven to happen before
//!   anything was sent (`UpstreamDelivery::NotSent`) is retried while the
//!   claim is valid; in the end the claim's holder releases the operation
//!   back to `prepared` with the proof kept as `not_sent` evidence, and the
//!   agent hears "not sent" (the same operation id goes out on its re-call,
//!   or by the outbox after a backoff).
//! - Once the tool has answered, the agent never hears "not sent": a settle
//!   that fails is retried in place a few times, then the answer is kept
//!   (`keeper`) and written in the background until the ledger takes it,
//!   and the agent hears `unknown` meanwhile. A "not sent" proof the ledger
//!   cannot take yet is kept the same way. A kept answer settles the
//!   operation as the first settle would have, or — once its claim has
//!   expired into `unknown` — converges it through the reconciler as
//!   late evidence, whatever the tool's capability.
//!
//! # Crash points
//!
//! - After the claim commits, before or during the call: the row stays
//!   `dispatching` until its claim expires; then it becomes `unknown` (by
//!   the next call of the same intent here, or the reconciler).
//! - After the upstream answered, before settle commits: the same, and the
//!   side effect exists; the tool's capability decides how it converges.
//!   While the process lives, the answer itself is kept and written when
//!   the ledger is back (`keeper`); only a process that dies holding it
//!   loses it.

mod call;
mod dispatcher;
mod execute;
mod followers;
mod keeper;
mod outbox;
mod outcome;
mod rounds;
mod tasks;
mod undelivered;

pub use call::{
    CallContext, CallError, CallReply, CallRequest, OPERATION_ID_META, OperationNote, Remarks,
    Rephrased, ShownCall, process_owner, trace_outcome,
};
pub use dispatcher::Dispatcher;
pub use execute::{Claimed, execute_claim, execute_claim_acknowledged, inject_operation_id};
pub use followers::TaskFollowers;
pub use keeper::{MAX_KEPT, drain as drain_kept_facts};
pub use outbox::{Outbox, is_original, recorded_tool};
pub use outcome::remote_id_of;
