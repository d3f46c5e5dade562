//! The quickstart's curl walkthrough (docs/quickstart.md), run as written (only the two addresses
//! are the test proxy's): a lease, a planned intent, the call, the same
//! call again (replayed, as the page says), completion — and one charge.

use crate::common;

use common::TestDb;
use common::proxy::{RunningProxy, Scenario};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

/// docs/quickstart.md's first `sh` block that starts with the control API address.
fn walkthrough() -> Vec<String> {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/quickstart.md"))
            .unwrap();
    let start = readme
        .find("```sh\nC=http://127.0.0.1:8641/v1")
        .expect("docs/quickstart.md's curl walkthrough");
    let block = &readme[start + "```sh\n".len()..];
    let block = &block[..block.find("```").unwrap()];
    block.lines().map(str::to_owned).collect()
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn the_readme_curl_walkthrough_charges_once_and_its_repeated_call_replays(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let scenario = Scenario::new(&db.url, "claim_ttl = \"60s\"\n");
    // The quickstart's tenant.
    let config = std::fs::read_to_string(scenario.config_path()).unwrap();
    std::fs::write(
        scenario.config_path(),
        common::replace_exactly(&config, "tenant = \"tenant-a\"", "tenant = \"quickstart\""),
    )
    .unwrap();
    let proxy = RunningProxy::start(&scenario.config_path()).await;

    let lines = walkthrough();
    // The call is the command from `curl -s http://127.0.0.1:8640/mcp` to
    // the line before `complete`; the page says to repeat it before
    // completing, so the script does.
    let call_start = lines
        .iter()
        .position(|l| l.starts_with("curl -s http://127.0.0.1:8640/mcp"))
        .expect("the MCP call");
    let call_end = lines
        .iter()
        .position(|l| l.contains("/complete"))
        .expect("the complete call");
    let mut script: Vec<String> = lines[..call_end].to_vec();
    script.push("echo".into());
    script.extend_from_slice(&lines[call_start..call_end]);
    script.push("echo".into());
    script.extend_from_slice(&lines[call_end..]);
    let script = script
        .join("\n")
        .replace(
            "http://127.0.0.1:8641/v1",
            &format!("{}/v1", proxy.control_url),
        )
        .replace("http://127.0.0.1:8640/mcp", &proxy.url);

    let output = common::within(
        "the walkthrough to run",
        tokio::process::Command::new("bash")
            .args(["-euo", "pipefail", "-c", &script])
            .output(),
    )
    .await
    .expect("bash and curl run");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    for expected in [
        r#""epoch":1"#,
        r#""dev.leasegate/operation":{"operation_id":"#,
        r#""status":"succeeded""#,
    ] {
        assert!(
            stdout.contains(expected),
            "{expected} missing from:\n{stdout}"
        );
    }
    // The first call sends the planned intent, unless the background
    // dispatcher got to it first (the page says either may); the repeat
    // always replays.
    const NOTE: &str = r#""dev.leasegate/operation":{"#;
    assert_eq!(stdout.matches(NOTE).count(), 2, "{stdout}");
    let last = &stdout[stdout.rfind(NOTE).unwrap()..];
    let last = &last[..last.find('}').unwrap()];
    assert!(last.contains(r#""replayed":true"#), "{last}");
    assert_eq!(
        scenario.side_effects("charges.jsonl").len(),
        1,
        "one charge: {stdout}"
    );
    proxy.stop().await;
}
