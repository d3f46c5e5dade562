//! What `leasegate check-config` checks of one file: its kind judged by
//! what it holds (main configuration, adapter or policy), the file loaded
//! as `serve` would load it, and a main configuration's stdio commands
//! there to run.

use std::path::Path;

use super::error::ConfigError;
use super::files::{load_adapter, load_policy};
use super::load::Config;
use super::upstreams::check_stdio_commands;
use crate::policy::RawPolicy;

/// Every stdio upstream's command, resolved as `serve` resolves it (a path
/// relative to the config file; a bare name beside the running executable,
/// then on `PATH`), exists and is executable.
pub fn check_commands(config: &Config, file: &Path) -> Result<(), ConfigError> {
    check_stdio_commands(&config.upstreams, file)
}

/// What `leasegate check-config` checks for one path, judged by what the
/// file holds: a top-level `upstream` key makes an adapter file,
/// `upstreams` (or any key only the main configuration has) a main
/// configuration with everything it names, and a file of policy fields
/// alone a policy. A file under a directory named `adapters` or `policies`
/// is that kind when its contents do not say otherwise.
pub fn check_file(path: &Path) -> Result<&'static str, ConfigError> {
    let parent = path
        .parent()
        .and_then(Path::file_name)
        .and_then(|name| name.to_str())
        .unwrap_or("");
    let table = std::fs::read_to_string(path)
        .ok()
        .and_then(|text| text.parse::<toml::Table>().ok());
    let kind = match table {
        Some(table) if table.contains_key("upstream") => "adapter",
        Some(table) if table.contains_key("upstreams") => "config",
        Some(table)
            if !table.is_empty()
                && parent != "adapters"
                && toml::from_str::<RawPolicy>(&toml::to_string(&table).unwrap_or_default())
                    .is_ok() =>
        {
            "policy"
        }
        _ => match parent {
            "adapters" => "adapter",
            "policies" => "policy",
            _ => "config",
        },
    };
    match kind {
        "adapter" => load_adapter(path).map(|_| "adapter"),
        "policy" => load_policy(path).map(|_| "policy"),
        _ => Config::load(path).map(|_| "config"),
    }
}

/// What `leasegate check-config` checks beyond [`check_file`]: a main
/// configuration's stdio commands are there to run ([`check_commands`],
/// resolved beside the running executable as `serve` would resolve them).
/// Other kinds of file pass. Returns what a valid main configuration
/// leaves to defaults worth knowing ([`notes`]).
pub fn check_runnable(path: &Path, kind: &str) -> Result<Vec<String>, ConfigError> {
    if kind != "config" {
        return Ok(Vec::new());
    }
    let config = Config::load(path)?;
    check_commands(&config, path)?;
    Ok(notes(&config))
}

/// Each upstream of `config` without an adapter file, whose tools are then
/// all side-effecting with capability `none` (valid, and the safe default,
/// but easy to miss: an adapter file not written, or named for another
/// upstream).
fn notes(config: &Config) -> Vec<String> {
    config
        .upstreams
        .keys()
        .filter(|name| !config.adapters.contains_key(*name))
        .map(|name| {
            format!(
                "upstream {name:?} has no adapter file: each of its tools is side-effecting with capability \"none\" (every call gated; an unknown outcome waits for an operator)"
            )
        })
        .collect()
}
