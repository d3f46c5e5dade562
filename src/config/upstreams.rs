//! `[upstreams.<name>]`: the tool servers behind the front, each reached
//! over stdio (a command this process spawns) or Streamable HTTP (a URL).
//!
//! A stdio upstream's `command` is resolved when the file is loaded
//! ([`resolve_command`]): a path (with a `/`) relative to the configuration
//! file's directory unless absolute; a bare name beside the running
//! `leasegate` executable, else found on `PATH` when the child is spawned.
//! [`check_stdio_commands`] (`leasegate check-config`) checks that each resolves
//! to an executable file.
//!
//! A stdio upstream's `env` values are text, or `{ from_env = "NAME" }`:
//! leasegate's own environment variable `NAME`, read when the child is
//! spawned ([`EnvValue::resolve`]), so that a secret is not written in the
//! file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::error::{ConfigError, Problem};

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(tag = "transport", rename_all = "snake_case", deny_unknown_fields)]
pub enum RawUpstream {
    Stdio {
        command: String,
        #[serde(default)]
        args: Vec<String>,
        #[serde(default)]
        env: BTreeMap<String, EnvValue>,
    },
    StreamableHttp {
        url: String,
    },
}

/// One environment variable of a stdio upstream's child.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(
    untagged,
    expecting = "a string, or { from_env = \"NAME\" } (an environment variable of leasegate's)"
)]
pub enum EnvValue {
    Text(String),
    /// Read from leasegate's environment when the child is spawned.
    FromEnv(FromEnv),
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FromEnv {
    pub from_env: String,
}

impl EnvValue {
    pub fn from_env(name: &str) -> Self {
        EnvValue::FromEnv(FromEnv {
            from_env: name.to_owned(),
        })
    }

    /// The value the child gets: the text, or leasegate's variable (an
    /// error naming it when it is unset or not UTF-8).
    pub fn resolve(&self) -> Result<String, String> {
        match self {
            EnvValue::Text(text) => Ok(text.clone()),
            EnvValue::FromEnv(FromEnv { from_env }) => std::env::var(from_env).map_err(|_| {
                format!("leasegate's environment variable {from_env} is not set (or not UTF-8)")
            }),
        }
    }
}

/// How to reach one upstream tool server.
#[derive(Debug, Clone, PartialEq)]
pub enum UpstreamTransport {
    Stdio {
        command: PathBuf,
        args: Vec<String>,
        env: BTreeMap<String, EnvValue>,
    },
    StreamableHttp {
        url: String,
    },
}

/// The `[upstreams.<name>]` of `file`, each name free of the separator and
/// each command resolved against `base` (the configuration's directory);
/// every `unprefixed` name must be one of them.
pub(super) fn from_raw(
    raw: &BTreeMap<String, RawUpstream>,
    file: &Path,
    base: &Path,
    separator: &str,
    unprefixed: &[String],
) -> Result<BTreeMap<String, UpstreamTransport>, ConfigError> {
    let err = |message: String| ConfigError::new(file, message);
    if raw.is_empty() {
        return Err(err("upstreams: at least one upstream is needed".into()));
    }
    let mut upstreams = BTreeMap::new();
    for (name, upstream) in raw {
        if name.is_empty() || name.contains(separator) {
            return Err(err(format!(
                "upstreams.{name}: an upstream name must be non-empty and free of the separator {separator:?}"
            )));
        }
        let transport = match upstream {
            RawUpstream::Stdio { command, args, env } => {
                if command.is_empty() {
                    return Err(err(format!("upstreams.{name}.command: must not be empty")));
                }
                UpstreamTransport::Stdio {
                    command: resolve_command(base, command),
                    args: args.clone(),
                    env: env.clone(),
                }
            }
            RawUpstream::StreamableHttp { url } => {
                if !(url.starts_with("http://") || url.starts_with("https://")) {
                    return Err(err(format!(
                        "upstreams.{name}.url: {url:?} is not an http(s) URL"
                    )));
                }
                UpstreamTransport::StreamableHttp { url: url.clone() }
            }
        };
        upstreams.insert(name.clone(), transport);
    }
    if let Some(unknown) = unprefixed
        .iter()
        .find(|name| !upstreams.contains_key(*name))
    {
        return Err(err(format!("unprefixed: {unknown:?} is not an upstream")));
    }
    Ok(upstreams)
}

/// `name` in the directory of the running executable, if a file is there.
fn beside_executable(name: &str) -> Option<PathBuf> {
    let candidate = std::env::current_exe().ok()?.parent()?.join(name);
    candidate.is_file().then_some(candidate)
}

/// Where a stdio upstream's `command` is run from (see the module docs): a path (with a `/`) relative to `base`, the directory
/// of the configuration file; a bare name beside the running executable if
/// it is there, else as it is (found on `PATH` when spawned).
pub fn resolve_command(base: &Path, command: &str) -> PathBuf {
    if command.contains('/') {
        base.join(command)
    } else {
        beside_executable(command).unwrap_or_else(|| PathBuf::from(command))
    }
}

/// Whether `path` is a file this process could execute.
fn executable(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    match std::fs::metadata(path) {
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            Err(format!("{} does not exist", path.display()))
        }
        Err(error) => Err(format!("{} cannot be read: {error}", path.display())),
        Ok(meta) if !meta.is_file() => Err(format!("{} is not a file", path.display())),
        Ok(meta) if meta.permissions().mode() & 0o111 == 0 => Err(format!(
            "{} is not executable (mode {:o})",
            path.display(),
            meta.permissions().mode() & 0o777
        )),
        Ok(_) => Ok(()),
    }
}

/// Every stdio upstream's command, resolved as `serve` resolves it (a path
/// relative to the config file; a bare name beside the running executable,
/// then on `PATH`), exists and is executable.
pub fn check_stdio_commands(
    upstreams: &BTreeMap<String, UpstreamTransport>,
    file: &Path,
) -> Result<(), ConfigError> {
    for (name, transport) in upstreams {
        let UpstreamTransport::Stdio { command, .. } = transport else {
            continue;
        };
        let field = format!("upstreams.{name}.command");
        let fail = |why: String| ConfigError::of(Problem::Command, file, format!("{field}: {why}"));
        if command.components().count() > 1 || command.is_absolute() {
            executable(command).map_err(fail)?;
            continue;
        }
        // A bare name: what `Command::new` would find on PATH.
        let path = std::env::var_os("PATH").unwrap_or_default();
        let found = std::env::split_paths(&path)
            .map(|dir| dir.join(command))
            .find(|candidate| candidate.is_file());
        match found {
            Some(candidate) => executable(&candidate).map_err(fail)?,
            None => {
                let beside = std::env::current_exe()
                    .ok()
                    .and_then(|exe| exe.parent().map(Path::to_path_buf))
                    .map_or_else(String::new, |dir| {
                        format!("beside leasegate ({}) nor ", dir.display())
                    });
                return Err(fail(format!(
                    "{:?} is found neither {beside}on PATH",
                    command.display().to_string()
                )));
            }
        }
    }
    Ok(())
}
