//! One adapter skeleton per upstream, as `leasegate init` writes it: a table
//! per tool, read-only where the server says so, else `capability =
//! "none"` with the other capabilities commented out and pre-filled where
//! the input schema names an idempotency key or a read-only sibling could
//! be the query tool; and the TOML spelling of keys and strings the config
//! shares.

use std::fmt::Write as _;

use super::{InitUpstream, ToolSummary};

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
pub(super) fn words(name: &str) -> Vec<String> {
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
                "# operation_id_argument = {}   # leasegate sends its operation id here and hides {} from the agent's tools/list",
                quote(argument),
                quote(argument)
            );
            out.push_str("# key_retention = \"24h\"         # the server's key retention window\n");
        }
        None => {
            out.push_str(
                "# - idempotency_key: the server deduplicates on a key leasegate sends:\n\
                 # capability = \"idempotency_key\"\n\
                 # operation_id_argument = \"<key argument>\"   # hidden from the agent; or operation_id_meta = \"<_meta key>\",\n\
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
pub(super) fn key(name: &str) -> String {
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
pub(super) fn quote(text: &str) -> String {
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
