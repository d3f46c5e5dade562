//! The suites that drive programs leasegate does not ship: a headless
//! browser, a PostgreSQL standby, the MCP conformance suite, the official
//! SDKs and server-everything, the agent frameworks' MCP clients, the chaos and gateway harnesses. Each
//! provisions or finds what it needs (docs/testing.md).

#[path = "../common/mod.rs"]
mod common;

mod agent_frameworks;
mod bench_gateway;
mod chaos;
mod conformance;
mod console;
mod duplicates;
mod embedded_pg;
mod failover;
mod pasted_commands;
mod postgres_binaries;
mod python_agent;
mod replanned_sdk;
mod sdk_transparency;
