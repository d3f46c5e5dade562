//! The duplicate-effect benchmark in reduced form (`bench/duplicates/`):
//! the same 48 intents under the same seeded faults (answer streams cut
//! after the tool acted, tool servers killed after the effect — over
//! Streamable HTTP and over stdio —, tools slower than the agent's timeout,
//! the leasegate process killed and restarted, its database backends
//! terminated) straight to the tool servers and
//! through leasegate in each lease mode, driven by the official Python
//! SDK's clients with an agent framework's retry, through `run.sh` as the
//! docs give it. Every path but the one that needs mcp-proxy built runs;
//! only leasegate's rows are held to a promise. Then the re-planning agent
//! (`--retry replan`): its model plans every failed call again in other
//! words and its tasks mix in legitimate look-alike calls; leasegate with
//! each tool's identity declared is held to the same promise and to no
//! false hold.

use crate::common;

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

const INTENTS: u64 = 48;

/// Runs the benchmark's own entry point (docs/benchmarks.md), which makes
/// its pinned venv, with the test build's binaries and without the
/// mcp-proxy install (whose path `arguments` leave out): its output and
/// the rows it printed.
fn run_benchmark(out: &Path, arguments: &[&str]) -> (Output, Vec<Value>) {
    let output = Command::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/bench/duplicates/run.sh"
    ))
    .env("DUPLICATES_MCP_PROXY", "0")
    .args(["--intents", &INTENTS.to_string(), "--agents", "6"])
    .args(arguments)
    .args(["--leasegate", env!("CARGO_BIN_EXE_leasegate")])
    .args(["--tools", env!("CARGO_BIN_EXE_leasegate-example-tools")])
    .args(["--admin-url", &crate::chaos::admin_url()])
    .arg("--out")
    .arg(out)
    .output()
    .expect("the test Python runs");
    let rows = common::peers::json_lines(&output)
        .into_iter()
        .filter_map(|mut line| line.get_mut("row").map(Value::take))
        .collect();
    (output, rows)
}

/// The row of `path`, with the report in the panic message when there is none.
fn row_of<'a>(rows: &'a [Value], path: &str, report: &str) -> &'a Value {
    rows.iter()
        .find(|row| row["path"] == path)
        .unwrap_or_else(|| panic!("no row for {path}:\n{report}"))
}

fn number(row: &Value, key: &str) -> u64 {
    row[key].as_u64().unwrap_or(u64::MAX)
}

/// What leasegate promises on `path`: one effect per intent, none lost, no
/// answer that disagrees with what happened, every unknown converged or on
/// the operator's list with its reason.
fn assert_held(path: &str, row: &Value) {
    assert_eq!(number(row, "duplicates"), 0, "{path}: {row}");
    assert_eq!(number(row, "lost"), 0, "{path}: {row}");
    assert_eq!(number(row, "wrong"), 0, "{path}: {row}");
    assert_eq!(number(row, "unknown_unsettled"), 0, "{path}: {row}");
    for listed in row["operator_list"].as_array().into_iter().flatten() {
        assert!(
            listed["reason"].as_str().is_some_and(|r| !r.is_empty()),
            "{path}: an unknown on the operator's list without a reason: {listed}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_under_faults_duplicate_no_effect_through_leasegate_in_any_lease_mode() {
    let _exclusive = common::exclusive().await;
    let out = std::env::temp_dir().join(format!("leasegate-dup-{}", uuid::Uuid::new_v4().simple()));
    let (output, rows) = run_benchmark(
        &out,
        &[
            "--seed",
            "5",
            "--settle",
            "60",
            // Enough of the stdio tool's few intents doomed that its server is killed.
            "--stdio-kill",
            "0.3",
            "--paths",
            "direct,explicit,session,key",
        ],
    );
    let report = String::from_utf8_lossy(&output.stdout);
    assert_eq!(
        rows.len(),
        4,
        "every path measured (exit {:?}):\n{report}\n{}",
        output.status.code(),
        common::peers::stderr_tail(&output)
    );

    // The direct path is measured, not judged.
    let direct = row_of(&rows, "direct", &report);
    assert_eq!(number(direct, "intended"), INTENTS, "{direct}");
    assert!(number(direct, "effects") > 0, "{direct}");

    for mode in ["explicit", "session", "key"] {
        let row = row_of(&rows, mode, &report);
        assert_eq!(number(row, "intended"), INTENTS, "{row}");
        // The faults happened on this path too.
        for fault in ["cut", "crash", "slow", "kill"] {
            assert!(
                number(&row["tool_faults"], fault) > 0,
                "{mode}: no {fault}: {row}"
            );
        }
        assert!(
            row["process_faults"]
                .as_array()
                .is_some_and(|f| !f.is_empty()),
            "{mode}: no proxy kill or backend termination: {row}"
        );
        assert_held(mode, row);
    }
    assert!(
        output.status.success(),
        "the benchmark exits 0 when leasegate's rows hold:\n{report}"
    );
    let _ = std::fs::remove_dir_all(&out);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_re_planning_agent_duplicates_no_effect_and_holds_no_look_alike_where_identity_is_declared()
 {
    let _exclusive = common::exclusive().await;
    let out = std::env::temp_dir().join(format!(
        "leasegate-replan-{}",
        uuid::Uuid::new_v4().simple()
    ));
    let (output, rows) = run_benchmark(
        &out,
        &[
            "--retry",
            "replan",
            "--seed",
            "5",
            "--settle",
            "60",
            "--stdio-kill",
            "0.3",
            "--paths",
            "direct,session-identity",
        ],
    );
    let report = String::from_utf8_lossy(&output.stdout);
    assert_eq!(
        rows.len(),
        2,
        "every path measured (exit {:?}):\n{report}\n{}",
        output.status.code(),
        common::peers::stderr_tail(&output)
    );

    // Without leasegate a re-planned call is a second effect: what the
    // leasegate row below is measured against.
    let direct = row_of(&rows, "direct", &report);
    assert_eq!(number(direct, "intended"), INTENTS, "{direct}");
    assert!(number(direct, "duplicates") > 0, "{direct}");

    let row = row_of(&rows, "session-identity", &report);
    assert_eq!(number(row, "intended"), INTENTS, "{row}");
    // Look-alike calls were made, and failed calls were planned again in
    // other words, under faults that cut answers after the tool acted.
    assert!(number(row, "look_alikes") > 0, "{row}");
    assert!(number(row, "calls") > INTENTS, "{row}");
    assert!(number(&row["tool_faults"], "cut") > 0, "{row}");
    // A re-planned call was answered from its first call (replayed, or
    // shown and not sent): the declared identity matched it.
    assert!(
        number(row, "replayed_own").saturating_add(number(row, "shown")) > 0,
        "{row}"
    );
    assert_held("session-identity", row);
    // No legitimate call, a look-alike included, was answered from another
    // call or shown instead of sent.
    assert_eq!(number(row, "false_holds"), 0, "{row}");
    assert!(
        output.status.success(),
        "the benchmark exits 0 when the identity row holds:\n{report}"
    );
    let _ = std::fs::remove_dir_all(&out);
}
