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

use super::database::DEFAULT_DATABASE_URL;
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

/// The addresses a new `leasegate.toml` names.
#[derive(Debug, Clone, PartialEq)]
pub struct Listen {
    pub listen: String,
    pub control_listen: String,
}

impl Default for Listen {
    fn default() -> Self {
        Self {
            listen: DEFAULT_LISTEN.to_owned(),
            control_listen: DEFAULT_CONTROL_LISTEN.to_owned(),
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
    let _ = writeln!(
        out,
        "# The ledger. Unset: PostgreSQL at {url} when a server answers there,\n\
         # else a private PostgreSQL leasegate starts in its state directory\n\
         # (PostgreSQL's programs must be installed). Set it (or --database-url,\n\
         # LEASEGATE_DATABASE_URL) to use a server of yours:\n\
         # database_url = {quoted}",
        url = DEFAULT_DATABASE_URL,
        quoted = quote(DEFAULT_DATABASE_URL)
    );
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

/// Argument names that say "idempotency key", compared lowercase without
/// `_`, `-` and `.`.
const KEY_NAMES: &[&str] = &[
    "idempotencykey",
    "idempotencytoken",
    "idempotencyid",
    "clienttoken",
    "clientrequesttoken",
    "clientrequestid",
    "requestid",
    "requesttoken",
    "operationid",
    "dedupkey",
    "dedupid",
    "dedupekey",
    "dedupeid",
    "deduplicationkey",
    "deduplicationid",
    "uniquekey",
];

/// First words of tool names that read something.
const QUERY_VERBS: &[&str] = &[
    "get", "read", "describe", "fetch", "find", "lookup", "show", "retrieve", "query", "check",
    "status", "list", "search",
];

fn normalized(name: &str) -> String {
    name.chars()
        .filter(|c| !matches!(c, '_' | '-' | '.'))
        .flat_map(char::to_lowercase)
        .collect()
}

/// The argument of `tool` that looks like an idempotency key.
pub fn key_argument(tool: &ToolSummary) -> Option<&str> {
    let arguments = tool.arguments();
    // By the order of KEY_NAMES: the most telling name first.
    KEY_NAMES
        .iter()
        .find_map(|wanted| {
            arguments
                .iter()
                .find(|argument| normalized(argument) == *wanted)
        })
        .or_else(|| {
            arguments
                .iter()
                .find(|argument| normalized(argument).contains("idempotency"))
        })
        .copied()
}

/// The words of a tool name: split at `_`, `-`, `.`, `/`, spaces and
/// lowercase-to-uppercase steps; lowercased.
fn words(name: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut current = String::new();
    let mut previous_lower = false;
    for c in name.chars() {
        if !c.is_alphanumeric() {
            if !current.is_empty() {
                words.push(std::mem::take(&mut current));
            }
            previous_lower = false;
            continue;
        }
        if c.is_uppercase() && previous_lower && !current.is_empty() {
            words.push(std::mem::take(&mut current));
        }
        previous_lower = c.is_lowercase() || c.is_ascii_digit();
        current.extend(c.to_lowercase());
    }
    if !current.is_empty() {
        words.push(current);
    }
    words
}

/// Tools of the same upstream that could answer "did it happen?" for
/// `tool`: a reading verb followed by `tool`'s object (`get_bucket` for
/// `create_bucket`, `getBucket` for `createBucket`) or by its whole name
/// (`get_charge` for `charge`). Read-only-annotated ones first.
pub fn query_candidates<'a>(tool: &ToolSummary, tools: &'a [ToolSummary]) -> Vec<&'a ToolSummary> {
    let own = words(&tool.name);
    let object = own.get(1..).unwrap_or_default();
    let mut found: Vec<&ToolSummary> = tools
        .iter()
        .filter(|other| other.name != tool.name)
        .filter(|other| {
            let theirs = words(&other.name);
            let Some((verb, rest)) = theirs.split_first() else {
                return false;
            };
            QUERY_VERBS.contains(&verb.as_str())
                && !rest.is_empty()
                && (rest == own.as_slice() || (!object.is_empty() && rest == object))
        })
        .collect();
    found.sort_by_key(|other| !other.read_only());
    found
}

/// One line of comment text: whitespace collapsed, control characters
/// dropped, at most `max` characters (an ellipsis marks a cut).
fn one_line(text: &str, max: usize) -> String {
    let line: String = text
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .chars()
        .filter(|c| !c.is_control())
        .collect();
    if line.chars().count() <= max {
        return line;
    }
    let mut cut: String = line.chars().take(max.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

/// The `adapters/<name>.toml` skeleton of one upstream.
pub fn render_adapter(upstream: &InitUpstream) -> String {
    let mut out = String::new();
    let read_only = upstream.tools.iter().filter(|t| t.read_only()).count();
    let _ = writeln!(
        out,
        "# Adapter of upstream {}, written by `leasegate init` from its tools/list{}:",
        quote(&upstream.name),
        upstream
            .server
            .as_deref()
            .map(|server| format!(" ({})", one_line(server, 60)))
            .unwrap_or_default()
    );
    let _ = writeln!(
        out,
        "# {} tools, {read_only} annotated read-only, {} side-effecting.",
        upstream.tools.len(),
        upstream.tools.len() - read_only
    );
    out.push_str(
        "#\n\
         # read_only = true: passed through without a lease, never recorded. It is\n\
         # set only where the server says readOnlyHint = true, which is the server's\n\
         # claim: check it, a tool that writes must not be read_only.\n\
         #\n\
         # capability = \"none\" (every other tool): the safe default. leasegate records\n\
         # the call under the caller's lease and never sends it again on its own; an\n\
         # unknown outcome waits for an operator. Declare what a tool can promise to\n\
         # let leasegate retry and reconcile it (docs/adapters-and-policies.md):\n\
         #   idempotency_key  the server deduplicates on a key leasegate sends\n\
         #   resource_id      the agent names the resource; a read-only tool finds it\n\
         #   operation_query  a read-only tool finds an operation by the id leasegate sent\n\
         # Then: leasegate check-config leasegate.toml\n\n",
    );
    let _ = writeln!(out, "upstream = {}", quote(&upstream.name));
    out.push_str(
        "# true: a tool this file does not list (added to the server later) is\n\
         # read_only when the server says readOnlyHint = true; otherwise it is\n\
         # side-effecting with capability \"none\".\n\
         trust_annotations = false\n\
         timeout = \"30s\"             # per call; below the policy's claim_ttl\n",
    );
    for tool in &upstream.tools {
        out.push('\n');
        render_tool(&mut out, tool, &upstream.tools);
    }
    out
}

fn render_tool(out: &mut String, tool: &ToolSummary, tools: &[ToolSummary]) {
    let _ = writeln!(out, "[tools.{}]", key(&tool.name));
    let about = tool
        .description
        .as_deref()
        .filter(|d| !d.trim().is_empty())
        .or(tool.title.as_deref());
    if let Some(about) = about {
        let _ = writeln!(out, "# {}", one_line(about, 100));
    }
    let arguments = tool.arguments();
    if !arguments.is_empty() {
        let required = tool.required();
        let listed: Vec<String> = arguments
            .iter()
            .map(|a| {
                if required.contains(a) {
                    format!("{a} (required)")
                } else {
                    (*a).to_owned()
                }
            })
            .collect();
        let _ = writeln!(out, "# Arguments: {}", one_line(&listed.join(", "), 100));
    }
    let hints: Vec<String> = [
        ("readOnlyHint", tool.read_only_hint),
        ("destructiveHint", tool.destructive_hint),
        ("idempotentHint", tool.idempotent_hint),
    ]
    .iter()
    .filter_map(|(name, hint)| hint.map(|hint| format!("{name} = {hint}")))
    .collect();
    if tool.read_only() {
        out.push_str(
            "# The server says readOnlyHint = true. That is its claim, not a proof:\n\
             # check that this tool changes nothing before you rely on it.\n\
             read_only = true\n",
        );
        return;
    }
    if hints.is_empty() {
        out.push_str("# The server gives no annotations.\n");
    } else {
        let _ = writeln!(out, "# The server says {}.", hints.join(", "));
    }
    out.push_str("capability = \"none\"         # the safe default: never sent again on its own\n");

    let candidates = query_candidates(tool, tools);
    let query_tool = candidates.first().map(|c| c.name.as_str());
    if !candidates.is_empty() {
        let named: Vec<String> = candidates
            .iter()
            .map(|c| {
                if c.read_only() {
                    format!("{} (read-only)", c.name)
                } else {
                    format!("{} (not annotated read-only)", c.name)
                }
            })
            .collect();
        let _ = writeln!(
            out,
            "# A query_tool candidate: {}.",
            one_line(&named.join(", "), 90)
        );
    }
    // Arguments the query tool requires that this tool takes too: what it
    // could be asked by.
    let shared: Vec<&str> = candidates
        .first()
        .map(|candidate| {
            candidate
                .required()
                .into_iter()
                .filter(|a| arguments.contains(a))
                .collect()
        })
        .unwrap_or_default();

    let key_argument = key_argument(tool);
    out.push_str("# To declare what it can promise instead, replace the line above with one of:\n");
    match key_argument {
        Some(argument) => {
            let _ = writeln!(
                out,
                "# - idempotency_key: its argument {} looks like an idempotency key. If the\n\
                 #   server deduplicates on it (check its docs for how long it keeps keys):",
                quote(argument)
            );
            out.push_str("# capability = \"idempotency_key\"\n");
            let _ = writeln!(
                out,
                "# operation_id_argument = {}   # leasegate sends its operation id here",
                quote(argument)
            );
            out.push_str("# key_retention = \"24h\"         # the server's key retention window\n");
        }
        None => {
            out.push_str(
                "# - idempotency_key: the server deduplicates on a key leasegate sends:\n\
                 # capability = \"idempotency_key\"\n\
                 # operation_id_argument = \"<key argument>\"   # or operation_id_meta = \"<_meta key>\",\n\
                 #                       # or operation_id_header = \"Idempotency-Key\" (HTTP upstreams)\n\
                 # key_retention = \"24h\"         # the server's key retention window\n",
            );
        }
    }
    let query = query_tool
        .map(quote)
        .unwrap_or_else(|| "\"<read-only tool>\"".into());
    // resource_id: the agent's name for the resource, which the query asks by.
    let name_argument = shared
        .iter()
        .filter(|a| Some(**a) != key_argument)
        .find(|a| !normalized(a).ends_with("id") || normalized(a) == "name")
        .copied();
    let (pointer, asked_by) = match name_argument {
        Some(argument) => (quote(&format!("/{argument}")), quote(argument)),
        None => ("\"/<argument>\"".into(), "\"<its argument>\"".into()),
    };
    let others: Vec<&str> = arguments
        .iter()
        .filter(|a| Some(**a) != name_argument && Some(**a) != key_argument)
        .copied()
        .collect();
    out.push_str("# - resource_id: the agent names the resource, and a read-only tool finds it:\n");
    out.push_str("# capability = \"resource_id\"\n");
    let _ = writeln!(
        out,
        "# resource_id_pointer = {pointer}   # where that name is in the arguments"
    );
    let _ = writeln!(out, "# query_tool = {query}");
    let _ = writeln!(out, "# query_argument = {asked_by}");
    let _ = writeln!(
        out,
        "# match_fields = [{}]   # what the found resource must agree on",
        if others.is_empty() {
            "\"<field>\"".to_owned()
        } else {
            one_line(
                &others
                    .iter()
                    .map(|a| quote(a))
                    .collect::<Vec<_>>()
                    .join(", "),
                80,
            )
        }
    );
    // operation_query: an id argument the query tool asks by.
    let id_argument = shared
        .iter()
        .find(|a| normalized(a).ends_with("id"))
        .copied()
        .or(key_argument);
    let (id_placement, id_query) = match id_argument {
        Some(argument) => (quote(argument), quote(argument)),
        None => ("\"<id argument>\"".into(), "\"<its id argument>\"".into()),
    };
    out.push_str(
        "# - operation_query: a read-only tool finds an operation by the id leasegate sent:\n\
         # capability = \"operation_query\"\n",
    );
    let _ = writeln!(
        out,
        "# operation_id_argument = {id_placement}   # or operation_id_meta = \"<_meta key>\""
    );
    let _ = writeln!(out, "# query_tool = {query}");
    let _ = writeln!(out, "# query_argument = {id_query}");
}

/// A TOML key: bare when it can be, else a quoted string.
fn key(name: &str) -> String {
    if !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        name.to_owned()
    } else {
        quote(name)
    }
}

/// A TOML basic string.
fn quote(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04X}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
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
