//! The duplicate-effect benchmark in reduced form (`bench/duplicates/`):
//! the same 48 intents under the same seeded faults (answer streams cut
//! after the tool acted, tool servers killed after the effect — over
//! Streamable HTTP and over stdio —, tools slower than the agent's timeout,
//! the leasegate process killed and restarted, its database backends
//! terminated) straight to the tool servers and
//! through leasegate in each lease mode, driven by the official Python
//! SDK's clients with an agent framework's retry, through `run.sh` as the
//! docs give it. Every path but the one that needs mcp-proxy built runs;
//! only leasegate's rows are held to a promise.

use crate::common;

use std::process::Command;

use serde_json::Value;

const INTENTS: u64 = 48;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_under_faults_duplicate_no_effect_through_leasegate_in_any_lease_mode() {
    let _exclusive = common::exclusive().await;
    let out = std::env::temp_dir().join(format!("leasegate-dup-{}", uuid::Uuid::new_v4().simple()));
    // The benchmark's own entry point (docs/benchmarks.md), which makes its
    // pinned venv; without the mcp-proxy install, whose path is left out.
    let output = Command::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/bench/duplicates/run.sh"
    ))
    .env("DUPLICATES_MCP_PROXY", "0")
    .args(["--intents", &INTENTS.to_string(), "--agents", "6"])
    .args(["--seed", "5", "--settle", "60"])
    // Enough of the stdio tool's few intents doomed that its server is killed.
    .args(["--stdio-kill", "0.3"])
    .args(["--paths", "direct,explicit,session,key"])
    .args(["--leasegate", env!("CARGO_BIN_EXE_leasegate")])
    .args(["--tools", env!("CARGO_BIN_EXE_leasegate-example-tools")])
    .args(["--admin-url", &crate::chaos::admin_url()])
    .arg("--out")
    .arg(&out)
    .output()
    .expect("the test Python runs");
    let lines = common::peers::json_lines(&output);
    let rows: Vec<&Value> = lines.iter().filter_map(|line| line.get("row")).collect();
    let report = String::from_utf8_lossy(&output.stdout);
    assert_eq!(
        rows.len(),
        4,
        "every path measured (exit {:?}):\n{report}\n{}",
        output.status.code(),
        common::peers::stderr_tail(&output)
    );
    let row = |path: &str| -> &Value {
        rows.iter()
            .find(|row| row["path"] == path)
            .unwrap_or_else(|| panic!("no row for {path}:\n{report}"))
    };
    let number = |row: &Value, key: &str| row[key].as_u64().unwrap_or(u64::MAX);

    // The direct path is measured, not judged.
    let direct = row("direct");
    assert_eq!(number(direct, "intended"), INTENTS, "{direct}");
    assert!(number(direct, "effects") > 0, "{direct}");

    for mode in ["explicit", "session", "key"] {
        let row = row(mode);
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
        // What leasegate promises: one effect per intent, none lost, no
        // answer that disagrees with what happened.
        assert_eq!(number(row, "duplicates"), 0, "{mode}: {row}");
        assert_eq!(number(row, "lost"), 0, "{mode}: {row}");
        assert_eq!(number(row, "wrong"), 0, "{mode}: {row}");
        // Every unknown converged or waits on the operator's list with its reason.
        assert_eq!(number(row, "unknown_unsettled"), 0, "{mode}: {row}");
        for listed in row["operator_list"].as_array().into_iter().flatten() {
            assert!(
                listed["reason"].as_str().is_some_and(|r| !r.is_empty()),
                "{mode}: an unknown on the operator's list without a reason: {listed}"
            );
        }
    }
    assert!(
        output.status.success(),
        "the benchmark exits 0 when leasegate's rows hold:\n{report}"
    );
    let _ = std::fs::remove_dir_all(&out);
}
