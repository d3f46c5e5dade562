//! DNS rebinding: a browser page on a foreign name that resolves to
//! loopback reaches leasegate's listeners with its own `Host` and `Origin`.
//! Both listeners refuse such requests (403) before anything runs;
//! requests from loopback names, allowed origins or without `Origin` pass.

use crate::common;

use common::TestDb;
use common::proxy::RunningProxy;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

async fn post(url: &str, headers: &[(&str, &str)], body: &str) -> (u16, String) {
    let mut request = reqwest::Client::new()
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(body.to_owned());
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.unwrap();
    (response.status().as_u16(), response.text().await.unwrap())
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn foreign_hosts_and_origins_are_refused_on_both_listeners_and_write_nothing(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let (_scenario, proxy) = RunningProxy::serve(&db.url, "").await;
    let port = |url: &str| {
        url.rsplit(':')
            .next()
            .unwrap()
            .split('/')
            .next()
            .unwrap()
            .to_owned()
    };
    let control_port = port(&proxy.control_url);
    let mcp_port = port(&proxy.url);
    let runs = format!("{}/v1/runs", proxy.control_url);
    let create = r#"{"tenant_id":"tenant-a","task_id":"t-1"}"#;
    let rebound_control = format!("attacker.example:{control_port}");
    let rebound_mcp = format!("attacker.example:{mcp_port}");

    // Control API.
    let (status, body) = post(&runs, &[("host", &rebound_control)], create).await;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("forbidden_host"), "{body}");
    let (status, body) = post(&runs, &[("origin", "http://attacker.example")], create).await;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("forbidden_origin"), "{body}");
    let runs_written = db.row_count("agent_runs").await;
    assert_eq!(runs_written, 0, "refused before any handler ran");
    let (status, body) = post(&runs, &[("origin", "http://localhost:5173")], create).await;
    assert_eq!(status, 201, "a loopback page may: {body}");

    // MCP front.
    let list = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}"#;
    let version = ("mcp-protocol-version", "2025-11-25");
    let (status, _) = post(&proxy.url, &[("host", &rebound_mcp), version], list).await;
    assert_eq!(status, 403);
    let (status, _) = post(
        &proxy.url,
        &[("origin", "http://attacker.example"), version],
        list,
    )
    .await;
    assert_eq!(status, 403);
    let (status, body) = post(&proxy.url, &[version], list).await;
    assert_eq!(status, 200, "{body}");
    proxy.stop().await;
}
