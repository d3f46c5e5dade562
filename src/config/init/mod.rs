//! What `leasegate init` writes: a `leasegate.toml`, a copy of the default
//! policy and one adapter skeleton per upstream, from the tools the
//! upstreams listed. Pure: the connection and the listing are `mcp`'s
//! (`mcp::inspect_upstream`), the command line is `main`'s; only
//! [`write_files`] touches the disk.
//!
//! Every tool gets a table of its own:
//!
//! - a tool the server annotates `readOnlyHint = true` is `read_only = true`,
//!   with a comment that the hint is the server's claim, to be checked;
//! - every other tool is `capability = "none"` (recorded, never sent again
//!   on its own), with commented ways to declare `idempotency_key`,
//!   `resource_id` or `operation_query`, pre-filled where the tool's input
//!   schema names an obvious idempotency key parameter or where a read-only
//!   sibling (`get_x` for `create_x`) could be the query tool.
//!
//! What is written is accepted by `leasegate check-config` as it stands.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde_json::Value;

mod adapter_file;
use adapter_file::{key, quote};
pub use adapter_file::{key_argument, query_candidates, render_adapter};

use super::database::{DEFAULT_DATABASE_URL, EMBEDDED_DATABASE};
use super::http::{DEFAULT_CONTROL_LISTEN, DEFAULT_LISTEN};
use super::upstreams::{EnvValue, RawUpstream};

/// The default policy, copied to `policies/default.toml`.
pub const DEFAULT_POLICY: &str = include_str!("../../../policies/default.toml");

/// What `init` needs to know of one upstream tool (from `tools/list`).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ToolSummary {
    pub name: String,
    pub title: Option<String>,
    pub description: Option<String>,
    pub read_only_hint: Option<bool>,
    pub destructive_hint: Option<bool>,
    pub idempotent_hint: Option<bool>,
    /// The tool's input JSON Schema (an object).
    pub input_schema: Value,
}

impl ToolSummary {
    /// The top-level argument names of the input schema (sorted).
    pub fn arguments(&self) -> Vec<&str> {
        self.input_schema
            .get("properties")
            .and_then(Value::as_object)
            .map(|properties| properties.keys().map(String::as_str).collect())
            .unwrap_or_default()
    }

    /// The schema's `required` argument names.
    pub fn required(&self) -> Vec<&str> {
        self.input_schema
            .get("required")
            .and_then(Value::as_array)
            .map(|names| names.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default()
    }

    fn read_only(&self) -> bool {
        self.read_only_hint == Some(true)
    }
}

/// One upstream as `init` found it.
#[derive(Debug, Clone, PartialEq)]
pub struct InitUpstream {
    pub name: String,
    /// As it goes into `leasegate.toml`.
    pub transport: RawUpstream,
    /// The server's `name version` from `initialize`, if it said.
    pub server: Option<String>,
    /// Every tool, every page, in the order listed.
    pub tools: Vec<ToolSummary>,
}

/// A file to write, by its path relative to the output directory.
#[derive(Debug, Clone, PartialEq)]
pub struct InitFile {
    pub path: PathBuf,
    pub contents: String,
}

/// Why an upstream name cannot be used, or `None` when it can: it names an
/// adapter file and a namespace prefix (`<name>__<tool>`).
pub fn invalid_upstream_name(name: &str) -> Option<String> {
    if name.is_empty() {
        return Some("an upstream name must not be empty".into());
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        return Some(format!(
            "upstream name {name:?}: use letters, digits, '_' and '-' only"
        ));
    }
    if name.contains("__") {
        return Some(format!(
            "upstream name {name:?} contains \"__\", the namespace separator of tool names"
        ));
    }
    None
}

/// Whether an environment variable's name says it holds a secret (its
/// value is then not written: `{ from_env = "NAME" }`).
pub fn looks_secret(name: &str) -> bool {
    let name = name.to_ascii_uppercase();
    ["TOKEN", "KEY", "SECRET", "PASSWORD"]
        .iter()
        .any(|word| name.contains(word))
}

/// The addresses a new `leasegate.toml` names: its listeners and, when
/// given, its ledger.
#[derive(Debug, Clone, PartialEq)]
pub struct Listen {
    pub listen: String,
    pub control_listen: String,
    /// `database_url`: a PostgreSQL URL or `"embedded"`; `None`: left
    /// unset (the default, or the private cluster where none answers), as
    /// a comment says.
    pub database_url: Option<String>,
}

impl Default for Listen {
    fn default() -> Self {
        Self {
            listen: DEFAULT_LISTEN.to_owned(),
            control_listen: DEFAULT_CONTROL_LISTEN.to_owned(),
            database_url: None,
        }
    }
}

/// The files `init` writes, relative to the output directory:
/// `leasegate.toml`, `policies/default.toml`, `adapters/<name>.toml`.
pub fn render(upstreams: &[InitUpstream]) -> Vec<InitFile> {
    render_with(upstreams, &Listen::default())
}

/// [`render`], with `listen` as the addresses.
pub fn render_with(upstreams: &[InitUpstream], listen: &Listen) -> Vec<InitFile> {
    let mut files = vec![
        InitFile {
            path: PathBuf::from("leasegate.toml"),
            contents: render_config_with(upstreams, listen),
        },
        InitFile {
            path: PathBuf::from("policies/default.toml"),
            contents: DEFAULT_POLICY.to_owned(),
        },
    ];
    files.extend(render_adapters(upstreams));
    files
}

/// The adapter files of `upstreams` alone (`adapters/<name>.toml`): what
/// adding them to an existing configuration writes besides its
/// `leasegate.toml`.
pub fn render_adapters(upstreams: &[InitUpstream]) -> Vec<InitFile> {
    upstreams
        .iter()
        .map(|upstream| InitFile {
            path: PathBuf::from(format!("adapters/{}.toml", upstream.name)),
            contents: render_adapter(upstream),
        })
        .collect()
}

/// `leasegate.toml` naming `upstreams`.
pub fn render_config(upstreams: &[InitUpstream]) -> String {
    render_config_with(upstreams, &Listen::default())
}

/// The `[upstreams.<name>]` table headers of a `leasegate.toml`, in order.
pub fn upstream_names(config: &str) -> Vec<String> {
    config
        .lines()
        .filter_map(|line| table_of(line.trim()))
        .filter(|name| !name.contains('.'))
        .map(str::to_owned)
        .collect()
}

/// The upstream a table header line belongs to (`[upstreams.x]`,
/// `[upstreams.x.env]`, quoted names unquoted), if it is one.
fn table_of(header: &str) -> Option<&str> {
    let inner = header.strip_prefix("[upstreams.")?.split(']').next()?;
    Some(inner.trim_matches('"'))
}

/// `config` (a `leasegate.toml`) with `upstreams` in it: the tables of
/// upstreams of the same names removed (with their sub-tables), and each
/// upstream's table appended. The rest of the text, comments included, is
/// kept as it is.
pub fn with_upstreams(config: &str, upstreams: &[InitUpstream]) -> String {
    let replaced = |line: &str| {
        let line = line.trim();
        line.starts_with('[').then(|| {
            table_of(line).is_some_and(|table| {
                let owner = table.split('.').next().unwrap_or(table);
                upstreams.iter().any(|u| u.name == owner)
            })
        })
    };
    let mut out = String::new();
    let mut skipping = false;
    for line in config.lines() {
        if let Some(replace) = replaced(line) {
            skipping = replace;
        }
        if !skipping {
            out.push_str(line);
            out.push('\n');
        }
    }
    while out.ends_with("\n\n") {
        out.pop();
    }
    for upstream in upstreams {
        out.push('\n');
        out.push_str(&render_upstream(upstream));
    }
    out
}

/// One `[upstreams.<name>]` table.
pub fn render_upstream(upstream: &InitUpstream) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "[upstreams.{}]", key(&upstream.name));
    match &upstream.transport {
        RawUpstream::Stdio { command, args, env } => {
            out.push_str("transport = \"stdio\"\n");
            let _ = writeln!(out, "command = {}", quote(command));
            if !args.is_empty() {
                let args: Vec<String> = args.iter().map(|a| quote(a)).collect();
                let _ = writeln!(out, "args = [{}]", args.join(", "));
            }
            if env.is_empty() {
                out.push_str(
                    "# The command inherits leasegate's environment; add more with\n\
                     # env = { NAME = \"value\" } (or NAME = { from_env = \"VARIABLE\" })\n",
                );
            } else {
                let env: Vec<String> = env
                    .iter()
                    .map(|(name, value)| {
                        let value = match value {
                            EnvValue::Text(text) => quote(text),
                            EnvValue::FromEnv(from) => {
                                format!("{{ from_env = {} }}", quote(&from.from_env))
                            }
                        };
                        format!("{} = {value}", key(name))
                    })
                    .collect();
                let _ = writeln!(out, "env = {{ {} }}", env.join(", "));
            }
        }
        RawUpstream::StreamableHttp { url } => {
            out.push_str("transport = \"streamable_http\"\n");
            let _ = writeln!(out, "url = {}", quote(url));
        }
    }
    out
}

/// `leasegate.toml` naming `upstreams` and listening on `listen`.
pub fn render_config_with(upstreams: &[InitUpstream], listen: &Listen) -> String {
    let mut out = String::new();
    out.push_str(
        "# leasegate configuration, written by `leasegate init`.\n\
         # Review adapters/*.toml (what each tool can promise), then:\n\
         #   leasegate check-config leasegate.toml\n\
         #   leasegate serve --config leasegate.toml\n\n",
    );
    match listen.database_url.as_deref() {
        None => {
            let _ = writeln!(
                out,
                "# The ledger. Unset: PostgreSQL at {url} when a server answers there,\n\
                 # else a private PostgreSQL leasegate starts in its state directory\n\
                 # (PostgreSQL's programs must be installed). Set it (or --database-url,\n\
                 # LEASEGATE_DATABASE_URL) to use a server of yours, or to \"embedded\" for\n\
                 # the private one always:\n\
                 # database_url = {quoted}",
                url = DEFAULT_DATABASE_URL,
                quoted = quote(DEFAULT_DATABASE_URL)
            );
        }
        Some(EMBEDDED_DATABASE) => {
            let _ = writeln!(
                out,
                "# The ledger: leasegate's private PostgreSQL in its state directory\n\
                 # (.leasegate/pg where leasegate runs, or $LEASEGATE_STATE_DIR/pg;\n\
                 # PostgreSQL's programs must be installed), whether or not a server\n\
                 # answers elsewhere.\n\
                 database_url = {}",
                quote(EMBEDDED_DATABASE)
            );
        }
        Some(url) => {
            let _ = writeln!(out, "# The ledger.\ndatabase_url = {}", quote(url));
        }
    }
    let _ = writeln!(out, "tenant = {}", quote("default"));
    let _ = writeln!(
        out,
        "listen = {}          # MCP front: http://{}/mcp",
        quote(&listen.listen),
        listen.listen
    );
    let _ = writeln!(
        out,
        "control_listen = {}  # control API (\"off\" to disable)",
        quote(&listen.control_listen)
    );
    out.push_str("adapters = \"adapters\"               # adapters/<upstream>.toml\n");
    out.push_str("policy = \"policies/default.toml\"\n");
    for upstream in upstreams {
        out.push('\n');
        out.push_str(&render_upstream(upstream));
    }
    out
}

/// Why `init` will not write into `dir`.
#[derive(Debug, thiserror::Error)]
pub enum InitError {
    #[error(
        "{} already exist{}; pass --force to overwrite, or choose another --dir",
        list(.0),
        if .0.len() == 1 { "s" } else { "" }
    )]
    WouldOverwrite(Vec<PathBuf>),
    #[error(
        "{} would be loaded with the new leasegate.toml (every adapters/*.toml is) and name{} other upstreams; remove {} or choose another --dir",
        list(.0),
        if .0.len() == 1 { "s" } else { "" },
        if .0.len() == 1 { "it" } else { "them" }
    )]
    ForeignAdapters(Vec<PathBuf>),
    #[error(
        "upstream {name:?} already exists in {}; pass --force to replace it (its table and its adapter file), or choose another --name",
        config.display()
    )]
    UpstreamExists { name: String, config: PathBuf },
    #[error("{}: {error}", path.display())]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
}

fn list(paths: &[PathBuf]) -> String {
    paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Checks that `files` can be written into `dir`: none exists yet (unless
/// `force`), and `dir/adapters` holds no other adapter file (which the new
/// configuration would load). Writes nothing.
pub fn check_target(dir: &Path, files: &[InitFile], force: bool) -> Result<(), InitError> {
    let existing: Vec<PathBuf> = files
        .iter()
        .map(|file| dir.join(&file.path))
        .filter(|path| path.exists())
        .collect();
    if !existing.is_empty() && !force {
        return Err(InitError::WouldOverwrite(existing));
    }
    let ours: Vec<PathBuf> = files.iter().map(|file| dir.join(&file.path)).collect();
    let adapters = dir.join("adapters");
    let mut foreign: Vec<PathBuf> = match std::fs::read_dir(&adapters) {
        Ok(entries) => entries
            .filter_map(Result::ok)
            .map(|entry| entry.path())
            .filter(|path| path.extension().is_some_and(|ext| ext == "toml"))
            .filter(|path| !ours.contains(path))
            .collect(),
        Err(_) => Vec::new(),
    };
    foreign.sort();
    if !foreign.is_empty() {
        return Err(InitError::ForeignAdapters(foreign));
    }
    Ok(())
}

/// Checks that `upstreams` can be added to the `leasegate.toml` at
/// `config` (its text `text`, its adapters in `adapters`): none is named
/// there already, and no adapter file of theirs exists, unless `force`.
pub fn check_addition(
    config: &Path,
    text: &str,
    adapters: &Path,
    upstreams: &[&str],
    force: bool,
) -> Result<(), InitError> {
    if force {
        return Ok(());
    }
    let existing = upstream_names(text);
    for name in upstreams {
        if existing.iter().any(|e| e == name) {
            return Err(InitError::UpstreamExists {
                name: (*name).to_owned(),
                config: config.to_owned(),
            });
        }
        let adapter = adapters.join(format!("{name}.toml"));
        if adapter.exists() {
            return Err(InitError::WouldOverwrite(vec![adapter]));
        }
    }
    Ok(())
}

/// Writes `files` into `dir` (creating directories), after
/// [`check_target`], readable by the owner alone (mode 0600). Without
/// `force` a file that appeared meanwhile is not overwritten. Returns the
/// paths written.
pub fn write_files(dir: &Path, files: &[InitFile], force: bool) -> Result<Vec<PathBuf>, InitError> {
    check_target(dir, files, force)?;
    files
        .iter()
        .map(|file| write_file(dir, file, force))
        .collect()
}

/// Writes one file into `dir` as [`write_files`] does (without its
/// checks); `overwrite` replaces a file that exists.
pub fn write_file(dir: &Path, file: &InitFile, overwrite: bool) -> Result<PathBuf, InitError> {
    let path = dir.join(&file.path);
    let io = |error| InitError::Io {
        path: path.clone(),
        error,
    };
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(io)?;
    }
    let mut options = std::fs::OpenOptions::new();
    options.write(true);
    // The owner's alone: a command's arguments or environment may hold
    // a secret.
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    if overwrite {
        options.create(true).truncate(true);
    } else {
        options.create_new(true);
    }
    let mut handle = options.open(&path).map_err(|error| {
        if error.kind() == std::io::ErrorKind::AlreadyExists {
            InitError::WouldOverwrite(vec![path.clone()])
        } else {
            io(error)
        }
    })?;
    std::io::Write::write_all(&mut handle, file.contents.as_bytes()).map_err(io)?;
    // A file overwritten under --force keeps its mode otherwise.
    handle
        .set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .map_err(io)?;
    Ok(path)
}

#[cfg(test)]
mod tests;
