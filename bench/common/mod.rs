//! What every benchmark harness under `bench/` shares, one implementation
//! each: the statistics of a run's samples ([`stats`]: percentiles and
//! medians), running pgbench and reading what it reports ([`pgbench`]), and
//! the scratch databases a harness measures on ([`database`]: naming one on
//! the admin URL's server, creating it afresh, dropping it).
//!
//! A harness includes it with `#[path = "../common/mod.rs"] mod common;`
//! (a harness that `tests/` also includes declares it inside that file, so
//! both builds see the same module). Each harness uses a part of it.

#![allow(dead_code)]

pub mod database;
pub mod pgbench;
pub mod stats;
