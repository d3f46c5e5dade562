//! Every shell block of README.md and docs/ is run by a test: this table
//! names, for each block (by its page and first line), the test that runs
//! its commands, and the check fails for a block the table does not name,
//! for an entry whose block is gone, and for a test name that no test in
//! `tests/` carries. The commands of the suite itself (`.ci/run`, `cargo
//! test …`) are run by CI.

use std::collections::BTreeSet;
use std::path::Path;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// Who runs a block's commands.
enum RunBy {
    /// A test function of that name under `tests/`.
    Test(&'static str),
    /// The suite's own commands: CI runs `.ci/run`, which runs `cargo test`.
    Ci,
}

/// (page, the block's first line (its comment is not compared), who runs
/// it).
const BLOCKS: &[(&str, &str, RunBy)] = &[
    (
        "README.md",
        "cargo build --release --bins && target/release/leasegate serve --config examples/quickstart/leasegate.toml",
        RunBy::Test("the_readme_quickstart_runs_as_pasted_on_a_private_cluster"),
    ),
    ("README.md", ".ci/run", RunBy::Ci),
    (
        "README.md",
        "J='content-type: application/json'",
        RunBy::Test("the_readme_quickstart_runs_as_pasted_on_a_private_cluster"),
    ),
    (
        "README.md",
        "cargo build --bins                      # leasegate, the example worker, the example tool server",
        RunBy::Ci,
    ),
    (
        "docs/quickstart.md",
        "cargo build --release --bins && target/release/leasegate serve --config examples/quickstart/leasegate.toml",
        RunBy::Test("the_readme_quickstart_runs_as_pasted_on_a_private_cluster"),
    ),
    (
        "docs/quickstart.md",
        "C=http://127.0.0.1:8641/v1; J='content-type: application/json'",
        RunBy::Test("the_readme_curl_walkthrough_charges_once_and_its_repeated_call_replays"),
    ),
    (
        "docs/quickstart.md",
        "RUN=$(psql -h 127.0.0.1 -U postgres -d leasegate -Atc \\",
        RunBy::Test("the_quickstart_worker_loses_its_lease_as_the_page_shows"),
    ),
    (
        "docs/adapters-and-policies.md",
        "leasegate init --dir my-proxy --name payments -- leasegate-example-tools --tools payments",
        RunBy::Test("the_readme_walkthrough_prints_what_the_readme_shows"),
    ),
    (
        "docs/adapters-and-policies.md",
        "leasegate check-config my-proxy/leasegate.toml    # prints: ok   my-proxy/leasegate.toml (config)",
        RunBy::Test("the_front_your_own_server_commands_init_check_and_serve"),
    ),
    (
        "docs/adapters-and-policies.md",
        "leasegate init --dir everything --name everything -- npx -y @modelcontextprotocol/server-everything@2026.8.31",
        RunBy::Test("the_front_your_own_server_commands_init_check_and_serve"),
    ),
    (
        "docs/operating.md",
        "TOKEN=$(leasegate tokens create --database-url postgres://postgres@127.0.0.1:5432/leasegate \\",
        RunBy::Test("the_token_commands_the_docs_give_mint_use_list_and_revoke"),
    ),
    (
        "docs/operating.md",
        "leasegate ops show <operation_id>          # status, request, result, history, evidence",
        RunBy::Test("the_operator_commands_the_docs_list_run_with_every_flag_they_name"),
    ),
    (
        "docs/benchmarks.md",
        "cargo build --release --bins --example bench_gateway && target/release/examples/bench_gateway   # the gateway benchmark, one table",
        RunBy::Test("every_benchmark_command_the_docs_give_runs_a_short_round"),
    ),
    (
        "docs/benchmarks.md",
        "cargo build --release --bins",
        RunBy::Test("retries_under_faults_duplicate_no_effect_through_leasegate_in_any_lease_mode"),
    ),
    (
        "docs/benchmarks.md",
        "bench/duplicates/run.sh --retry replan --intents 2000 --agents 48 --seed 7 --out /tmp/replan",
        RunBy::Test(
            "a_re_planning_agent_duplicates_no_effect_and_holds_no_look_alike_where_identity_is_declared",
        ),
    ),
    ("docs/testing.md", ".ci/run", RunBy::Ci),
    (
        "docs/testing.md",
        "cargo test --test integration proxy_e2e",
        RunBy::Ci,
    ),
    (
        "docs/testing.md",
        "cargo build --release --bins --example chaos",
        RunBy::Test("every_benchmark_command_the_docs_give_runs_a_short_round"),
    ),
];

/// A command line without its trailing `# comment`.
fn without_comment(line: &str) -> String {
    match line.find(" #") {
        Some(at) => line[..at].trim_end().to_owned(),
        None => line.to_owned(),
    }
}

/// (page, first line without its comment) of every shell block of README.md and docs/*.md.
fn shell_blocks() -> Vec<(String, String)> {
    let mut pages = vec![Path::new(ROOT).join("README.md")];
    crate::common::files::with_extension(&Path::new(ROOT).join("docs"), "md", &mut pages);
    pages.sort();
    let mut blocks = Vec::new();
    for page in pages {
        let name = page
            .strip_prefix(ROOT)
            .unwrap()
            .to_string_lossy()
            .trim_start_matches('/')
            .to_owned();
        let text = std::fs::read_to_string(&page).unwrap();
        for block in crate::common::files::fenced_blocks(&text) {
            if crate::common::files::is_shell(&block.lang) {
                let first = without_comment(block.body.lines().next().unwrap_or(""));
                blocks.push((name.clone(), first));
            }
        }
    }
    blocks
}

/// The names of every `fn` under `tests/`.
fn test_functions() -> BTreeSet<String> {
    let mut files = Vec::new();
    crate::common::files::with_extension(&Path::new(ROOT).join("tests"), "rs", &mut files);
    let mut names = BTreeSet::new();
    for file in files {
        for line in std::fs::read_to_string(file).unwrap().lines() {
            let line = line.trim_start();
            let line = line.strip_prefix("async ").unwrap_or(line);
            if let Some(rest) = line.strip_prefix("fn ") {
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                names.insert(name);
            }
        }
    }
    names
}

#[test]
fn every_shell_block_of_the_readme_and_docs_is_run_by_a_named_test() {
    let blocks = shell_blocks();
    let functions = test_functions();
    let mut problems = Vec::new();
    for (page, first) in &blocks {
        if !BLOCKS
            .iter()
            .any(|(p, f, _)| p == page && without_comment(f) == *first)
        {
            problems.push(format!(
                "{page}: the block starting {first:?} is run by no test (add one, and name it in tests/checks/doc_commands.rs)"
            ));
        }
    }
    for (page, first, run_by) in BLOCKS {
        if !blocks
            .iter()
            .any(|(p, f)| p == page && *f == without_comment(first))
        {
            problems.push(format!(
                "{page}: no block starts {first:?} any more: update tests/checks/doc_commands.rs"
            ));
        }
        if let RunBy::Test(name) = run_by
            && !functions.contains(*name)
        {
            problems.push(format!("{page}: no test is called {name}"));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
