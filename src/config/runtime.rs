//! What the process is set up with before the configuration is loaded,
//! read ahead of the rest of the file: `worker_threads`, the async
//! runtime's worker threads ([`read_ahead_worker_threads`]), and
//! `[telemetry]`, for the tracing subscriber ([`read_ahead_telemetry`]).
//! A file that does not load gets the defaults here; `Config::load` then
//! reports why and the process exits.

use std::path::Path;

use super::raw::RawConfig;
use crate::telemetry::Settings;

/// Most worker threads `worker_threads` accepts.
pub const MAX_WORKER_THREADS: u32 = 1024;

/// The async runtime's worker threads when `worker_threads` is not set:
/// half the cores this process may use, at least one.
///
/// Not one per core, tokio's default: leasegate shares its host with its
/// stdio upstreams (its own child processes) and often with PostgreSQL,
/// and on a lightly loaded multi-threaded runtime a call's tasks hop
/// between idle workers, each hop a thread wake-up. Fewer workers cost
/// less CPU per call and a lone caller less latency, and cost some gated
/// throughput at many callers
/// (docs/performance.md).
pub fn default_worker_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |cores| (cores.get() / 2).max(1))
}

/// `worker_threads` checked (1 to [`MAX_WORKER_THREADS`]), or the default.
pub fn worker_threads(raw: Option<u32>) -> Result<usize, String> {
    match raw {
        None => Ok(default_worker_threads()),
        Some(threads @ 1..=MAX_WORKER_THREADS) => Ok(threads as usize),
        Some(threads) => Err(format!(
            "worker_threads: must be 1 to {MAX_WORKER_THREADS}, got {threads}"
        )),
    }
}

/// `worker_threads` of the config file at `path`, read ahead of
/// [`Config::load`]: the runtime is built before the file is loaded. The
/// default when the file does not read or parse or the value is out of
/// range; `Config::load` then reports why and the process exits.
pub fn read_ahead_worker_threads(path: &Path) -> usize {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|text| toml::from_str::<RawConfig>(&text).ok())
        .and_then(|raw| worker_threads(raw.worker_threads).ok())
        .unwrap_or_else(default_worker_threads)
}

/// `[telemetry]` of the config file at `path`, read ahead of
/// `Config::load` (the tracing subscriber is set up before the rest is
/// loaded). `None` when the file does not read or parse, or its
/// `[telemetry]` is invalid: `Config::load` then reports why.
pub fn read_ahead_telemetry(path: &Path) -> Option<Settings> {
    let text = std::fs::read_to_string(path).ok()?;
    let raw: RawConfig = toml::from_str(&text).ok()?;
    raw.telemetry.unwrap_or_default().validate().ok()
}
