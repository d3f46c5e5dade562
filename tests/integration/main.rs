//! The integration suite: a real PostgreSQL, real MCP servers and clients
//! over real transports, real child processes (frozen with SIGSTOP where a
//! test says so). One binary, one module per subject (docs/testing.md).

#[path = "../common/mod.rs"]
mod common;

mod acceptance_b_process;
mod auth;
mod call_counts;
mod config_files;
mod control_api;
mod database_url;
mod early_refusals;
mod group_commit;
mod http_bodies;
mod http_outage;
mod init;
mod intent_identity;
mod key_mode;
mod lease_renew_batch;
mod lease_tokens;
mod ledger_acceptance;
mod ledger_blips;
mod ledger_errors;
mod ledger_lease_tokens;
mod ledger_permissions;
mod limits;
mod listener_guard;
mod operations_ledger;
mod operator_role;
mod page_room;
mod progress;
mod proxy_e2e;
mod proxy_stdio;
mod raw_fidelity;
mod reconcile;
mod reissue;
mod replanned_retries;
mod retention;
mod run_lifecycle;
mod run_state_machine;
mod secrets_at_rest;
mod session_mode;
mod tasks;
mod telemetry;
mod upstream_supervision;
mod worker_heartbeat;
