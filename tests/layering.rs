//! Dependencies point one way (DESIGN.md, "Where the code lives"): only
//! `src/ledger/` talks SQL; only `src/mcp/` talks MCP.

use std::fs;
use std::path::{Path, PathBuf};

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

#[test]
fn only_the_ledger_imports_sqlx_and_only_mcp_imports_rmcp() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    assert!(files.len() > 3, "found the sources");
    let mut crossings = Vec::new();
    for file in files {
        let relative = file
            .strip_prefix(&src)
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let text = fs::read_to_string(&file).unwrap();
        let rules = [("sqlx", "ledger/"), ("rmcp", "mcp/")];
        for (crate_name, home) in rules {
            if relative.starts_with(home) {
                continue;
            }
            for (number, line) in text.lines().enumerate() {
                let code = line.split("//").next().unwrap_or("");
                if code.contains(&format!("{crate_name}::"))
                    || code.contains(&format!("use {crate_name}"))
                {
                    crossings.push(format!(
                        "src/{relative}:{}: {crate_name} outside src/{home}",
                        number + 1
                    ));
                }
            }
        }
    }
    assert!(
        crossings.is_empty(),
        "layer boundaries crossed:\n{}",
        crossings.join("\n")
    );
}
