//! Repository checks: module layering, the configuration reference and the
//! docs' links, the alerting rules, the quickstart's walkthrough as written,
//! the agent-framework snippets as the suite runs them.

#[path = "../common/mod.rs"]
mod common;

mod alerts;
mod client_snippets;
mod config_reference;
mod doc_commands;
mod layering;
mod readme_walkthrough;
