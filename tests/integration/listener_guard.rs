//! DNS rebinding: a browser page on a foreign name that resolves to
//! loopback reaches leasegate's listeners with its own `Host` and `Origin`.
//! Both listeners refuse such requests (403) before anything runs;
//! requests from loopback names, allowed origins or without `Origin` pass.
//! And what `leasegate serve` says about its listeners: the startup banner
//! names each URL once, and an address it cannot listen on is named with
//! the setting that chose it.

use crate::common;

use common::TestDb;
use common::proxy::{LEASEGATE, RunningProxy, Scenario, ServedChild};
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

/// `leasegate serve` with `args`, to its end; its exit code and stderr.
async fn serve_fails(scenario: &Scenario, args: &[&str]) -> (Option<i32>, String) {
    let output = common::within(
        "leasegate serve to exit",
        tokio::process::Command::new(LEASEGATE)
            .arg("serve")
            .arg("--config")
            .arg(scenario.config_path())
            .args(args)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .unwrap();
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn the_banner_names_each_url_once_and_a_taken_address_names_its_setting(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let scenario = Scenario::new(&db.url, "");
    let served = ServedChild::spawn(ServedChild::command(&scenario, &[])).await;
    let control = served.control.clone();
    let log = common::wait_until("the banner", || async {
        let log = served.log_text();
        log.contains("leasegate: web console at").then_some(log)
    })
    .await;
    let mentions = |text: &str| log.matches(text).count();
    assert_eq!(mentions(&served.mcp), 1, "{log}");
    assert_eq!(mentions("serving MCP"), 1, "{log}");
    assert_eq!(
        mentions(&format!(
            "leasegate: web console at {control}/console, metrics at {control}/metrics"
        )),
        1,
        "{log}"
    );
    drop(served);

    // An address another process holds: named with the setting to change,
    // for the MCP listener (from the file, or from --listen) and the
    // control listener.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = taken.local_addr().unwrap();
    let (code, stderr) = serve_fails(&scenario, &["--listen", &address.to_string()]).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "leasegate: cannot listen on {address} (--listen): address already in use"
        )),
        "{stderr}"
    );
    for (key, setting) in [("listen", "listen"), ("control_listen", "control_listen")] {
        let config = std::fs::read_to_string(scenario.config_path()).unwrap();
        let line = config
            .lines()
            .find(|line| line.starts_with(&format!("{key} = ")))
            .unwrap()
            .to_owned();
        let moved = config.replace(&line, &format!("{key} = \"{address}\""));
        std::fs::write(scenario.config_path(), &moved).unwrap();
        let (code, stderr) = serve_fails(&scenario, &[]).await;
        std::fs::write(scenario.config_path(), &config).unwrap();
        assert_eq!(code, Some(1), "{stderr}");
        assert!(
            stderr.contains(&format!(
                "leasegate: cannot listen on {address} ({setting}): address already in use"
            )),
            "{stderr}"
        );
    }
    drop(taken);
}
