//! The Python example agent (official MCP SDK + plain HTTP for its lease)
//! against a running leasegate: it plans with intents, "crashes", and a
//! second process takes over and resumes the same plan — one side effect per
//! step. Runs with the suite's own Python environment (`common::peers`:
//! `target/sdk-venv` with the pinned SDK).

use crate::common;

use std::process::Command;

use common::TestDb;
use common::proxy::RunningProxy;
use serde_json::Value;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

/// Runs the example Python agent on task `order-42` of `tenant-a` against
/// the control API at `control` and the MCP front at `mcp`, with `args`;
/// returns its exit code and the JSON lines it printed.
fn run_agent(control: &str, mcp: &str, args: &[&str]) -> (Option<i32>, Vec<Value>) {
    let output = Command::new(common::peers::python())
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/examples/python_agent/agent.py"
        ))
        .args(["--control", control, "--mcp", mcp])
        .args(["--tenant", "tenant-a", "--task", "order-42"])
        .args(args)
        .output()
        .expect("the test Python runs");
    let lines = String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|line| {
            serde_json::from_str(line).unwrap_or_else(|_| panic!("JSON line expected: {line}"))
        })
        .collect();
    if !output.status.success() && output.status.code() != Some(3) {
        eprintln!("agent stderr:\n{}", String::from_utf8_lossy(&output.stderr));
    }
    (output.status.code(), lines)
}

fn event<'a>(lines: &'a [Value], name: &str) -> &'a Value {
    lines
        .iter()
        .find(|l| l["event"] == name)
        .unwrap_or_else(|| panic!("no {name} event in {lines:#?}"))
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn python_agent_resumes_the_same_plan_after_a_takeover(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let (_exclusive, db) = TestDb::new_exclusive(pool, connect).await;
    let (scenario, proxy) = RunningProxy::serve(&db.url, "claim_ttl = \"60s\"\n").await;
    let (control, mcp) = (proxy.control_url.clone(), proxy.url.clone());

    // The first agent plans its steps, then dies without releasing its lease.
    let first = tokio::task::spawn_blocking({
        let (control, mcp) = (control.clone(), mcp.clone());
        move || run_agent(&control, &mcp, &["--ttl-ms", "1500", "--crash-after-plan"])
    })
    .await
    .unwrap();
    assert_eq!(first.0, Some(3), "{:#?}", first.1);
    let run_id = event(&first.1, "run_created")["run_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let planned = event(&first.1, "planned")["operations"].clone();
    assert!(
        scenario.side_effects("charges.jsonl").is_empty(),
        "nothing called before the crash"
    );

    db.wait_lease_expired(run_id.parse().unwrap()).await;
    let second = tokio::task::spawn_blocking({
        let run_id = run_id.clone();
        move || run_agent(&control, &mcp, &["--run-id", &run_id, "--ttl-ms", "30000"])
    })
    .await
    .unwrap();
    assert_eq!(second.0, Some(0), "{:#?}", second.1);
    assert_eq!(event(&second.1, "acquired")["took_over"], true);
    assert_eq!(event(&second.1, "acquired")["epoch"], 2);
    assert_eq!(event(&second.1, "resumed")["done"], serde_json::json!([]));
    let calls: Vec<&Value> = second.1.iter().filter(|l| l["event"] == "called").collect();
    assert_eq!(calls.len(), 2);
    for call in calls {
        let step = call["step_id"].as_str().unwrap();
        assert_eq!(
            call["operation"]["operation_id"], planned[step],
            "{step} used the planned operation id"
        );
        assert_eq!(call["operation"]["status"], "succeeded");
    }
    assert_eq!(scenario.side_effects("charges.jsonl").len(), 1);
    assert_eq!(scenario.side_effects("emails.jsonl").len(), 1);
    let (status, _, _, owner, epoch) = db.run_row(run_id.parse().unwrap()).await;
    assert_eq!((status.as_str(), owner, epoch), ("succeeded", None, 2));
    proxy.stop().await;
}
