//! Dependencies point one way (src/lib.rs, "Layout"): per external crate, the
//! modules that may import it; per internal module, the modules it may use —
//! only those of a lower layer:
//!
//! ```text
//! main → cli → app → mcp, control, reconcile → dispatch → config, auth,
//!      worker, durability, embedded → adapter, ledger → policy → intent →
//!      ids, logfield, telemetry, progress
//! ```
//!
//! The scan covers `src/` (the library and the `leasegate` binary, whose
//! `main.rs` only hands over to `cli`). The
//! binaries under `examples/` (the example tool server, the example worker)
//! are not part of the product: they may import rmcp, sqlx or axum, and
//! reach leasegate only through its public API.

use std::fs;
use std::path::{Path, PathBuf};

/// External crates and the places (path prefixes under `src/`) that may use them.
const CRATE_RULES: &[(&str, &[&str])] = &[
    ("sqlx", &["ledger/"]),
    ("deadpool", &["ledger/pool.rs"]),
    ("rmcp", &["mcp/"]),
    // HTTP framework types stay in the control API and the MCP front.
    // limits/: the one server both listeners are served by.
    ("axum", &["control/", "mcp/", "limits/"]),
    ("tower", &["control/", "limits/"]),
    ("hyper", &["limits/"]),
    ("hyper_util", &["limits/"]),
    ("governor", &["limits/"]),
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
    ("limits", 5),
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
