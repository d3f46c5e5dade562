//! Dependencies point one way (src/lib.rs, "Layout"): per external crate, the
//! modules that may import it; per internal module, the modules it may use —
//! only those of a lower layer:
//!
//! ```text
//! main → cli → app → mcp, control, reconcile → dispatch, http_server,
//!      agent_leases → config, auth, worker, durability, embedded → adapter,
//!      ledger → policy → intent → ids, logfield, telemetry, progress
//! ```
//!
//! The scan covers `src/` (the library and the `leasegate` binary, whose
//! `main.rs` only hands over to `cli`). The
//! binaries under `examples/` (the example tool server, the example worker)
//! are not part of the product: they may import rmcp, sqlx or axum, and
//! reach leasegate only through its public API.
//!
//! Inside a folder, no two files import each other, directly or around a
//! longer circle (`no_import_circle_between_files_of_a_folder`).

use std::fs;
use std::path::{Path, PathBuf};

/// External crates and the places (path prefixes under `src/`) that may use them.
const CRATE_RULES: &[(&str, &[&str])] = &[
    ("sqlx", &["ledger/"]),
    ("deadpool", &["ledger/pool.rs"]),
    ("rmcp", &["mcp/"]),
    // HTTP framework types stay in the control API and the MCP front.
    // http_server/: the one server both listeners are served by.
    ("axum", &["control/", "mcp/", "http_server/"]),
    ("tower", &["control/", "http_server/"]),
    ("hyper", &["http_server/"]),
    ("hyper_util", &["http_server/"]),
    ("governor", &["http_server/"]),
    ("reqwest", &["mcp/"]),
    // The command line: its definitions and the log set-up of its commands.
    ("clap", &["cli/"]),
    ("tracing_subscriber", &["cli/logging.rs", "telemetry.rs"]),
    // Traces: the exporter, the layer and W3C trace context live in one place.
    ("opentelemetry", &["telemetry.rs"]),
    ("opentelemetry_sdk", &["telemetry.rs"]),
    ("opentelemetry_otlp", &["telemetry.rs"]),
    ("tracing_opentelemetry", &["telemetry.rs"]),
    ("indicatif", &["progress.rs"]),
    ("metrics_exporter_prometheus", &["app.rs", "control/"]),
    // The web console's HTML templates.
    ("maud", &["control/console/"]),
];

/// Internal modules by layer: a module may use only modules of a lower layer.
const LAYERS: &[(&str, u8)] = &[
    ("ids", 0),
    ("logfield", 0),
    ("telemetry", 0),
    ("progress", 0),
    ("intent", 1),
    ("policy", 2),
    ("adapter", 3),
    ("ledger", 3),
    ("config", 4),
    ("auth", 4),
    ("worker", 4),
    ("durability", 4),
    ("embedded", 4),
    ("dispatch", 5),
    ("http_server", 5),
    ("agent_leases", 5),
    ("mcp", 6),
    ("control", 6),
    ("reconcile", 6),
    ("app", 7),
    ("cli", 8),
    ("main", 9),
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            out.push(path);
        }
    }
}

/// (path relative to `src/`, line number, code without `//` comments) of every source line.
fn source_lines() -> Vec<(String, usize, String)> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    assert!(files.len() > 3, "found the sources");
    let mut lines = Vec::new();
    for file in files {
        let relative = file
            .strip_prefix(&src)
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let text = fs::read_to_string(&file).unwrap();
        for (number, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("").to_owned();
            lines.push((relative.clone(), number + 1, code));
        }
    }
    lines
}

/// The identifiers that follow `prefix` in `code` (`crate::ledger::X` → `ledger`).
fn paths_after<'a>(code: &'a str, prefix: &str) -> Vec<&'a str> {
    code.match_indices(prefix)
        .filter(|(at, _)| {
            // Not part of a longer identifier (`my_crate::`).
            code[..*at]
                .chars()
                .next_back()
                .is_none_or(|c| !(c.is_alphanumeric() || c == '_'))
        })
        .filter_map(|(at, _)| {
            let rest = &code[at + prefix.len()..];
            let end = rest
                .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            (end > 0).then(|| &rest[..end])
        })
        .collect()
}

fn layer(module: &str) -> Option<u8> {
    LAYERS.iter().find(|(m, _)| *m == module).map(|(_, l)| *l)
}

/// The module a file belongs to: `ledger/lease.rs` → `ledger`, `app.rs` → `app`.
fn module_of(relative: &str) -> &str {
    relative.split('/').next().unwrap().trim_end_matches(".rs")
}

#[test]
fn external_crates_are_imported_only_where_allowed() {
    let mut crossings = Vec::new();
    for (file, number, code) in source_lines() {
        for (crate_name, homes) in CRATE_RULES {
            if homes.iter().any(|home| file.starts_with(home)) {
                continue;
            }
            let used = !paths_after(&code, &format!("{crate_name}::")).is_empty()
                || code.trim_start().starts_with(&format!("use {crate_name}"))
                || code.contains(&format!(" {crate_name}::{{"));
            if used {
                crossings.push(format!(
                    "src/{file}:{number}: {crate_name} outside {}",
                    homes.join(", ")
                ));
            }
        }
    }
    assert!(
        crossings.is_empty(),
        "crate boundaries crossed:\n{}",
        crossings.join("\n")
    );
}

#[test]
fn internal_modules_depend_only_downward() {
    let mut crossings = Vec::new();
    for (file, number, code) in source_lines() {
        let module = module_of(&file);
        if module == "lib" {
            continue;
        }
        let own = layer(module).unwrap_or_else(|| {
            panic!("src/{file}: module {module:?} has no layer in LAYERS; add it")
        });
        // The binary names the library by its crate name.
        let prefix = if module == "main" {
            "leasegate::"
        } else {
            "crate::"
        };
        for target in paths_after(&code, prefix) {
            if target == module {
                continue;
            }
            let Some(target_layer) = layer(target) else {
                crossings.push(format!(
                    "src/{file}:{number}: {prefix}{target} is not a known module"
                ));
                continue;
            };
            if target_layer >= own {
                crossings.push(format!(
                    "src/{file}:{number}: {module} (layer {own}) uses {target} (layer {target_layer})"
                ));
            }
        }
    }
    assert!(
        crossings.is_empty(),
        "layers crossed:\n{}",
        crossings.join("\n")
    );
}

/// A span guard (`span.enter()`) kept in an async fn or block stays entered
/// across `.await`s, tagging other tasks' events on the same thread: spans
/// go in with `tracing::Instrument` or `Span::in_scope`.
#[test]
fn no_span_guard_is_entered_in_src() {
    let guards: Vec<String> = source_lines()
        .into_iter()
        .filter(|(_, _, code)| code.contains(".enter()"))
        .map(|(file, number, code)| format!("src/{file}:{number}: {}", code.trim()))
        .collect();
    assert!(
        guards.is_empty(),
        "use Instrument or in_scope:\n{}",
        guards.join("\n")
    );
}

#[test]
fn every_module_of_the_library_has_a_layer() {
    let lib = fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/src/lib.rs")).unwrap();
    let modules: Vec<&str> = lib
        .lines()
        .filter_map(|line| line.strip_prefix("pub mod "))
        .map(|rest| rest.trim_end_matches(';'))
        .collect();
    assert!(modules.len() > 5, "read lib.rs's modules: {modules:?}");
    for module in modules {
        assert!(layer(module).is_some(), "{module} has no layer in LAYERS");
    }
}

#[test]
fn the_checks_see_paths_and_skip_longer_names() {
    assert_eq!(
        paths_after("use crate::ledger::{A, B}; crate::ids::RunId", "crate::"),
        vec!["ledger", "ids"]
    );
    assert!(paths_after("my_sqlx::query", "sqlx::").is_empty());
}

/// No two files of a folder import each other, directly or around a
/// longer circle: each folder's files form a layered graph of their own.
/// A folder's `mod.rs` is its face (it declares the files, re-exports them
/// and holds the vocabulary they share), so edges to and from it are not
/// counted; an import of something `mod.rs` re-exports counts as an
/// import of the file that defines it. A subfolder is one node of its
/// parent folder.
#[test]
fn no_import_circle_between_files_of_a_folder() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut paths = Vec::new();
    rust_files(&src, &mut paths);
    let files: Vec<SourceFile> = paths
        .iter()
        .map(|path| SourceFile::read(&src, path))
        .collect();
    let by_module: std::collections::HashMap<&[String], &SourceFile> =
        files.iter().map(|f| (f.module.as_slice(), f)).collect();
    let mut circles = Vec::new();
    let mut folders: Vec<&str> = files.iter().map(|f| f.folder()).collect();
    folders.sort_unstable();
    folders.dedup();
    for folder in folders {
        let mut edges: std::collections::BTreeMap<String, std::collections::BTreeSet<String>> =
            Default::default();
        for file in &files {
            let Some(from) = file.node_in(folder) else {
                continue;
            };
            for target in file.references() {
                let Some(to) = resolve(&by_module, &target).and_then(|t| t.node_in(folder)) else {
                    continue;
                };
                if from != to && from != "mod.rs" && to != "mod.rs" {
                    edges.entry(from.clone()).or_default().insert(to);
                }
            }
        }
        if let Some(circle) = find_circle(&edges) {
            circles.push(format!("src/{folder}/: {}", circle.join(" → ")));
        }
    }
    assert!(
        circles.is_empty(),
        "files that import each other (move what they share into a file both import):\n{}",
        circles.join("\n")
    );
}

struct SourceFile {
    /// Path under `src/`, with `/`.
    relative: String,
    /// `ledger/group/mod.rs` → [ledger, group]; `lib.rs`, `main.rs` → [].
    module: Vec<String>,
    /// The code without comments.
    code: String,
}

impl SourceFile {
    fn read(src: &Path, path: &Path) -> Self {
        let relative = path
            .strip_prefix(src)
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/");
        let mut module: Vec<String> = relative
            .trim_end_matches(".rs")
            .split('/')
            .map(str::to_owned)
            .collect();
        if matches!(
            module.last().map(String::as_str),
            Some("mod" | "lib" | "main")
        ) {
            module.pop();
        }
        let code = fs::read_to_string(path)
            .unwrap()
            .lines()
            .map(|line| line.split("//").next().unwrap_or(""))
            .collect::<Vec<_>>()
            .join("\n");
        Self {
            relative,
            module,
            code,
        }
    }

    fn is_root(&self) -> bool {
        ["mod.rs", "lib.rs", "main.rs"]
            .iter()
            .any(|root| self.relative == *root || self.relative.ends_with(&format!("/{root}")))
    }

    /// The folder the file lies in ("" for `src/`).
    fn folder(&self) -> &str {
        self.relative.rsplit_once('/').map_or("", |(dir, _)| dir)
    }

    /// The file (or the subfolder it lies in) as a node of `folder`.
    fn node_in(&self, folder: &str) -> Option<String> {
        let rest = if folder.is_empty() {
            self.relative.as_str()
        } else {
            self.relative.strip_prefix(folder)?.strip_prefix('/')?
        };
        Some(rest.split('/').next().unwrap().to_owned())
    }

    /// Every module path the file names through `crate::`, `super::` or
    /// `self::` (in `use` trees and inline), made absolute; a root file's
    /// bare `child::` paths too.
    fn references(&self) -> Vec<Vec<String>> {
        let own = self.module.as_slice();
        let children: Vec<&str> = if self.is_root() {
            self.code
                .lines()
                .filter_map(|l| {
                    let l = l.trim_start();
                    let l = l.strip_prefix("pub ").unwrap_or(l);
                    let l = l.strip_prefix("pub(crate) ").unwrap_or(l);
                    l.strip_prefix("mod ")?.strip_suffix(';')
                })
                .collect()
        } else {
            Vec::new()
        };
        let mut paths = Vec::new();
        for path in use_paths(&self.code)
            .into_iter()
            .chain(inline_paths(&self.code))
        {
            let (head, tail) = path.split_first().unwrap();
            let mut absolute: Vec<String> = match head.as_str() {
                "crate" => Vec::new(),
                "self" => own.to_vec(),
                "super" => own[..own.len().saturating_sub(1)].to_vec(),
                child if children.contains(&child) => [own, &path[..1]].concat(),
                _ => continue,
            };
            for part in tail {
                if part == "super" {
                    absolute.pop();
                } else {
                    absolute.push(part.clone());
                }
            }
            paths.push(absolute);
        }
        paths
    }
}

/// The file a module path lands in: the longest prefix that is a file,
/// then through `pub use child::…` of that file when it re-exports the
/// next name.
fn resolve<'a>(
    by_module: &std::collections::HashMap<&[String], &'a SourceFile>,
    path: &[String],
) -> Option<&'a SourceFile> {
    for len in (1..=path.len()).rev() {
        let Some(file) = by_module.get(&path[..len]) else {
            continue;
        };
        if let Some(name) = path.get(len) {
            for export in use_paths(&file.code)
                .into_iter()
                .filter(|p| p.len() >= 2)
                .filter(|p| p.last() == Some(name) || p.last().is_some_and(|l| l == "*"))
            {
                let child = if export[0] == "self" {
                    &export[1]
                } else {
                    &export[0]
                };
                let mut module = path[..len].to_vec();
                module.push(child.clone());
                let reexported = ["pub use", "pub(crate) use", "pub(super) use"]
                    .iter()
                    .any(|export| file.code.contains(&format!("{export} {child}::")));
                if let Some(found) = by_module.get(module.as_slice())
                    && reexported
                {
                    return Some(found);
                }
            }
        }
        return Some(file);
    }
    None
}

/// The paths of every `use` tree (`use a::{b, c::d}` → `a::b`, `a::c::d`).
fn use_paths(code: &str) -> Vec<Vec<String>> {
    let mut paths = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("use ") {
        let before = rest[..at].chars().next_back();
        let after = &rest[at + 4..];
        rest = after;
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let Some(end) = after.find(';') else { break };
        // `a as b` → `a`, then the tree without spaces.
        let mut tree = String::new();
        let mut tokens = after[..end].split_whitespace();
        while let Some(token) = tokens.next() {
            if token == "as" {
                let renamed = tokens.next().unwrap_or("");
                tree.push_str(
                    renamed.trim_start_matches(|c: char| c.is_alphanumeric() || c == '_'),
                );
            } else {
                tree.push_str(token);
            }
        }
        expand_tree(&tree, &mut Vec::new(), &mut paths);
    }
    paths
}

fn expand_tree(tree: &str, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    let (head, group) = match tree.find('{') {
        Some(open) if tree.ends_with('}') => (&tree[..open], Some(&tree[open + 1..tree.len() - 1])),
        Some(_) => return,
        None => (tree, None),
    };
    let depth = prefix.len();
    for part in head.split("::").filter(|p| !p.is_empty()) {
        prefix.push(part.to_owned());
    }
    match group {
        None => out.push(prefix.clone()),
        Some(group) => {
            let mut level = 0;
            let mut start = 0;
            for (i, c) in group.char_indices() {
                match c {
                    '{' => level += 1,
                    '}' => level -= 1,
                    ',' if level == 0 => {
                        expand_tree(&group[start..i], prefix, out);
                        start = i + 1;
                    }
                    _ => {}
                }
            }
            if start < group.len() {
                expand_tree(&group[start..], prefix, out);
            }
        }
    }
    prefix.truncate(depth);
}

/// `crate::a::b`, `super::x`, `self::y` paths written inline.
fn inline_paths(code: &str) -> Vec<Vec<String>> {
    let mut paths = Vec::new();
    for head in ["crate::", "super::", "self::"] {
        for (at, _) in code.match_indices(head) {
            if code[..at]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':')
            {
                continue;
            }
            let text = &code[at..];
            let end = text
                .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                .unwrap_or(text.len());
            let path: Vec<String> = text[..end]
                .split("::")
                .filter(|p| !p.is_empty())
                .map(str::to_owned)
                .collect();
            paths.push(path);
        }
    }
    paths
}

/// One circle of `edges`, if there is any.
fn find_circle(
    edges: &std::collections::BTreeMap<String, std::collections::BTreeSet<String>>,
) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        edges: &std::collections::BTreeMap<String, std::collections::BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut std::collections::BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            let mut circle = path[at..].to_vec();
            circle.push(node.to_owned());
            return Some(circle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_owned());
        for next in edges.get(node).into_iter().flatten() {
            if let Some(circle) = visit(next, edges, path, done) {
                return Some(circle);
            }
        }
        path.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = std::collections::BTreeSet::new();
    edges
        .keys()
        .find_map(|node| visit(node, edges, &mut Vec::new(), &mut done))
}

#[test]
fn the_circle_check_reads_use_trees_and_finds_circles() {
    let mut paths = Vec::new();
    let tree: String = "super::{a::{self,B},c::D}".to_owned();
    expand_tree(&tree, &mut Vec::new(), &mut paths);
    assert_eq!(use_paths("use x::Y as Z;"), vec![vec!["x", "Y"]]);
    assert_eq!(
        paths,
        vec![
            vec!["super", "a", "self"],
            vec!["super", "a", "B"],
            vec!["super", "c", "D"]
        ]
    );
    let edges = [("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")]
        .iter()
        .fold(std::collections::BTreeMap::new(), |mut map, (from, to)| {
            map.entry(from.to_string())
                .or_insert_with(std::collections::BTreeSet::new)
                .insert(to.to_string());
            map
        });
    assert_eq!(find_circle(&edges).unwrap(), vec!["a", "b", "c", "a"]);
    let mut acyclic = edges.clone();
    acyclic.remove("c");
    assert_eq!(find_circle(&acyclic), None);
}
