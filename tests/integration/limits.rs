//! Bounded resources, against `leasegate serve` as a
//! real child process on real sockets: half-sent requests and idle
//! connections are closed while a long call is not cut; connections beyond
//! `max_connections` are refused while the first ones are answered; MCP
//! sessions beyond `max_sessions` evict the idle ones; a principal over its
//! rate gets 429 with `Retry-After`; a megabyte of tool name or
//! `traceparent` leaves no long log line. Every refusal is counted in
//! `http_refused_total`. No timing assertions: "closed within the
//! timeout" is "closed before a generous deadline", with small timeouts.

use crate::common;
use crate::common::proxy::charge_eur;
use crate::common::tokens::create_token;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::proxy::{
    LEASEGATE, MAILER_ADAPTER, PAYMENTS_ADAPTER, Scenario, ServedChild, call, connect_http,
    connect_http_with,
};
use common::{DEADLINE, TestDb, prometheus, replace_exactly, within};
use serde_json::json;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// `leasegate serve` as a child, with every stderr line it writes.
struct Served {
    child: tokio::process::Child,
    mcp: String,
    control: String,
    stderr: Arc<Mutex<Vec<String>>>,
    drained: tokio::task::JoinHandle<()>,
}

impl Served {
    async fn start(scenario: &Scenario, env: &[(&str, &str)]) -> Served {
        Self::start_with(scenario, env, None).await
    }

    /// With `open_files`: under that open-file limit (soft and hard).
    async fn start_with(
        scenario: &Scenario,
        env: &[(&str, &str)],
        open_files: Option<u64>,
    ) -> Served {
        let command = match open_files {
            Some(limit) => {
                let mut command = tokio::process::Command::new("bash");
                command.args([
                    "-c",
                    &format!("ulimit -n {limit} && exec \"$0\" \"$@\""),
                    LEASEGATE,
                ]);
                command
            }
            None => tokio::process::Command::new(LEASEGATE),
        };
        let served = ServedChild::spawn(ServedChild::serve_with(command, scenario, env)).await;
        Served {
            child: served.child,
            mcp: served.mcp,
            control: served.control,
            stderr: served.log,
            drained: served.drained,
        }
    }

    fn address(url: &str) -> String {
        url.trim_start_matches("http://")
            .split('/')
            .next()
            .unwrap()
            .to_owned()
    }

    fn mcp_address(&self) -> String {
        Self::address(&self.mcp)
    }

    fn control_address(&self) -> String {
        Self::address(&self.control)
    }

    /// The sum of one counter's samples with these labels.
    async fn metric(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let answer = common::http::get(&format!("{}/metrics", self.control)).await;
        assert_eq!(answer.status, 200, "{}", answer.body);
        prometheus::sum(&answer.body, name, labels)
    }

    /// `/metrics` read with `token` (an operator's, where tokens are
    /// required).
    async fn metrics_as(&self, token: &str) -> String {
        let response = reqwest::Client::new()
            .get(format!("{}/metrics", self.control))
            .header("authorization", format!("Bearer {token}"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        response.text().await.unwrap()
    }

    async fn stop(mut self) -> Vec<String> {
        let _ = self.child.start_kill();
        let _ = within("leasegate to exit", self.child.wait()).await;
        let _ = within("its stderr to be read to the end", self.drained).await;
        std::mem::take(&mut *self.stderr.lock().unwrap())
    }
}

/// Reads until the server closes the connection (EOF or reset), failing the
/// test after [`DEADLINE`]; returns what arrived.
async fn read_until_closed(stream: &mut TcpStream, what: &str) -> String {
    let mut received = Vec::new();
    within(what, async {
        let mut buffer = [0u8; 4096];
        loop {
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(n) => received.extend_from_slice(&buffer[..n]),
            }
        }
    })
    .await;
    String::from_utf8_lossy(&received).into_owned()
}

/// Sends one HTTP/1.1 request on a kept-alive connection and reads one
/// answer (content-length framed); returns the status line and body.
async fn exchange(stream: &mut TcpStream, request: &str) -> (String, String) {
    stream.write_all(request.as_bytes()).await.unwrap();
    within("an answer on a kept-alive connection", async {
        let mut received = Vec::new();
        let mut buffer = [0u8; 8192];
        loop {
            let n = stream.read(&mut buffer).await.unwrap();
            assert!(n > 0, "closed before answering: {received:?}");
            received.extend_from_slice(&buffer[..n]);
            let text = String::from_utf8_lossy(&received).into_owned();
            let Some(head_end) = text.find("\r\n\r\n") else {
                continue;
            };
            let length: usize = text[..head_end]
                .lines()
                .find_map(|line| {
                    let (name, value) = line.split_once(':')?;
                    name.eq_ignore_ascii_case("content-length")
                        .then(|| value.trim().parse().unwrap())
                })
                .expect("a content-length answer");
            if received.len() >= head_end + 4 + length {
                let status = text.lines().next().unwrap().to_owned();
                return (status, text[head_end + 4..].to_owned());
            }
        }
    })
    .await
}

fn get(path: &str, host: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nhost: {host}\r\n\r\n")
}

const LONG_CALLS: &str = r#"upstream = "payments"
timeout = "20s"
[tools.charge]
capability = "idempotency_key"
operation_id_argument = "idempotency_key"
key_retention = "24h"
timeout = "20s"
[tools.get_charge]
read_only = true
"#;

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn half_sent_requests_and_idle_connections_are_closed_but_a_long_call_is_not_cut(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let scenario = Scenario::with_adapters(&db.url, "", LONG_CALLS, MAILER_ADAPTER);
    append_limits(
        &scenario,
        "header_read_timeout = \"1s\"\nbody_read_timeout = \"1s\"\nidle_timeout = \"2s\"\n",
    );
    let served = Served::start(&scenario, &[]).await;

    for (address, listener) in [
        (served.mcp_address(), "mcp"),
        (served.control_address(), "control"),
    ] {
        // Slow-loris: half a head, then nothing.
        let mut loris = TcpStream::connect(&address).await.unwrap();
        loris
            .write_all(format!("POST /mcp HTTP/1.1\r\nhost: {address}\r\nx-slow: ").as_bytes())
            .await
            .unwrap();
        let answered = read_until_closed(&mut loris, "a half-sent head to be closed").await;
        assert_eq!(answered, "", "{listener}: dropped without an answer");

        // Half a body.
        let mut half = TcpStream::connect(&address).await.unwrap();
        let path = if listener == "mcp" {
            "/mcp"
        } else {
            "/v1/runs"
        };
        half.write_all(
            format!(
                "POST {path} HTTP/1.1\r\nhost: {address}\r\ncontent-type: application/json\r\n\
                 accept: application/json, text/event-stream\r\ncontent-length: 100\r\n\r\n{{\"jsonrpc\""
            )
            .as_bytes(),
        )
        .await
        .unwrap();
        let answered = read_until_closed(&mut half, "a half-sent body to be refused").await;
        let expected = if listener == "mcp" { " 408 " } else { " 400 " };
        assert!(answered.contains(expected), "{listener}: {answered}");
        assert!(
            answered.contains("body_read_timeout"),
            "{listener}: {answered}"
        );

        // An idle connection: nothing sent at all.
        let mut idle = TcpStream::connect(&address).await.unwrap();
        let answered = read_until_closed(&mut idle, "an idle connection to be closed").await;
        assert_eq!(answered, "");

        // A kept-alive connection goes idle after its answer, and is closed.
        let mut kept = TcpStream::connect(&address).await.unwrap();
        let (status, _) = exchange(&mut kept, &get("/metrics", &address)).await;
        assert!(status.starts_with("HTTP/1.1 "), "{status}");
        assert_eq!(
            read_until_closed(&mut kept, "idle keep-alive closed").await,
            ""
        );
    }

    // A call longer than both timeouts, answered on one request: not cut.
    let (lease, _) = db.running_run("agent", 120_000).await;
    let (agent, _) = connect_http(&served.mcp, Some(&lease)).await;
    let result = call(
        &agent,
        "payments__charge",
        json!({"amount": 5, "currency": "eur", "hang_ms": 3500}),
        None,
    )
    .await
    .expect("a call longer than idle_timeout and header_read_timeout is answered");
    assert_ne!(result.is_error, Some(true), "{result:?}");
    assert_eq!(scenario.side_effects("charges.jsonl").len(), 1);
    agent.cancel().await.unwrap();

    for listener in ["mcp", "control"] {
        for reason in ["header_timeout", "body_timeout"] {
            let counted = served
                .metric(
                    "http_refused_total",
                    &[("listener", listener), ("reason", reason)],
                )
                .await;
            assert!(counted >= 1.0, "{listener} {reason}: {counted}");
        }
    }
    served.stop().await;
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn connections_beyond_the_cap_are_refused_while_the_first_ones_are_answered(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let scenario = Scenario::new(&db.url, "");
    append_limits(&scenario, "max_connections = 4\nrate_limit = 0\n");
    let served = Served::start(&scenario, &[]).await;

    for (address, path) in [
        (served.control_address(), "/v1/upstreams"),
        (served.mcp_address(), "/nothing-here"),
    ] {
        // Four connections, each answered once (so all four are accepted).
        let mut first = Vec::new();
        for _ in 0..4 {
            let mut stream = TcpStream::connect(&address).await.unwrap();
            let (status, _) = exchange(&mut stream, &get(path, &address)).await;
            assert!(!status.contains(" 503 "), "{status}");
            first.push(stream);
        }
        // The fifth is answered 503 and closed at once.
        let mut fifth = TcpStream::connect(&address).await.unwrap();
        let _ = fifth.write_all(get(path, &address).as_bytes()).await;
        let answered = read_until_closed(&mut fifth, "the fifth connection to be refused").await;
        assert!(
            answered.is_empty() || answered.starts_with("HTTP/1.1 503"),
            "{answered}"
        );
        // The first four are still served.
        for stream in &mut first {
            let (status, _) = exchange(stream, &get(path, &address)).await;
            assert!(!status.contains(" 503 "), "{status}");
        }
        drop(first);
    }
    // Room again once they are gone.
    let refused = wait_metric(
        &served,
        "http_refused_total",
        &[("listener", "control"), ("reason", "max_connections")],
    )
    .await;
    assert!(refused >= 1.0);
    let refused = served
        .metric(
            "http_refused_total",
            &[("listener", "mcp"), ("reason", "max_connections")],
        )
        .await;
    assert!(refused >= 1.0);
    served.stop().await;
}

/// Reads a metric through the control listener, retrying while the
/// listener is still full (the test's own connections are closing).
async fn wait_metric(served: &Served, name: &str, labels: &[(&str, &str)]) -> f64 {
    common::wait_until("the control listener to answer /metrics", || async {
        let response = reqwest::get(format!("{}/metrics", served.control))
            .await
            .ok()?;
        if response.status() != 200 {
            return None;
        }
        let body = response.text().await.ok()?;
        Some(prometheus::sum(&body, name, labels))
    })
    .await
}

/// Opens an MCP session with raw HTTP (an SDK client would start a new
/// session on its own when one is evicted); returns its id.
async fn open_session(client: &reqwest::Client, url: &str) -> String {
    let initialize = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "limits-test", "version": "1"}}});
    let response = client
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(initialize.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let id = response.headers()["mcp-session-id"]
        .to_str()
        .unwrap()
        .to_owned();
    let _ = response.text().await;
    let initialized = client
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-session-id", &id)
        .header("mcp-protocol-version", "2025-06-18")
        .body(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(initialized.status(), 202);
    id
}

/// `tools/list` in session `id`: the HTTP status.
async fn list_in(client: &reqwest::Client, url: &str, id: &str) -> u16 {
    let response = client
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-session-id", id)
        .header("mcp-protocol-version", "2025-06-18")
        .body(r#"{"jsonrpc":"2.0","id":2,"method":"tools/list","params":{}}"#)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let _ = response.text().await;
    status
}

fn append_limits(scenario: &Scenario, lines: &str) {
    use std::io::Write;
    let mut config = std::fs::OpenOptions::new()
        .append(true)
        .open(scenario.config_path())
        .unwrap();
    write!(config, "\n[limits]\n{lines}").unwrap();
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn sessions_beyond_the_cap_evict_the_idle_ones_and_a_new_session_works(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let scenario = Scenario::new(&db.url, "");
    scenario.prepend_config("http_sessions = true");
    append_limits(&scenario, "max_sessions = 2\nrate_limit = 0\n");
    let served = Served::start(&scenario, &[]).await;

    let client = reqwest::Client::builder()
        .timeout(DEADLINE)
        .build()
        .unwrap();
    let first = open_session(&client, &served.mcp).await;
    let second = open_session(&client, &served.mcp).await;
    assert_eq!(list_in(&client, &served.mcp, &first).await, 200);
    assert_eq!(list_in(&client, &served.mcp, &second).await, 200);
    // The third evicts the least recently used idle session: the first.
    let third = open_session(&client, &served.mcp).await;
    assert_eq!(list_in(&client, &served.mcp, &third).await, 200);
    assert_eq!(
        list_in(&client, &served.mcp, &first).await,
        404,
        "the evicted session is gone"
    );
    assert_eq!(list_in(&client, &served.mcp, &second).await, 200);
    // A new session still works, evicting the third (now least recent).
    let fourth = open_session(&client, &served.mcp).await;
    assert_eq!(list_in(&client, &served.mcp, &fourth).await, 200);
    assert_eq!(list_in(&client, &served.mcp, &second).await, 200);
    assert_eq!(list_in(&client, &served.mcp, &third).await, 404);
    // A client ends its session with DELETE: 204 and no body (not rmcp's
    // 202, which the Python SDK reports as a failed termination), and the
    // session is gone.
    let ended = client
        .delete(&served.mcp)
        .header("mcp-session-id", &second)
        .header("mcp-protocol-version", "2025-06-18")
        .send()
        .await
        .unwrap();
    assert_eq!(ended.status(), 204);
    assert_eq!(ended.text().await.unwrap(), "");
    assert_eq!(list_in(&client, &served.mcp, &second).await, 404);
    // An SDK client starts a new session when its own was evicted.
    let agent = connect_http_with(&served.mcp, &[]).await;
    let tools = agent.peer().list_all_tools().await.unwrap();
    assert!(tools.iter().any(|t| t.name == "payments__charge"));
    let _ = agent.cancel().await;
    let evicted = served.metric("mcp_sessions_evicted_total", &[]).await;
    assert!(evicted >= 2.0, "{evicted}");
    let open = served.metric("mcp_sessions_open", &[]).await;
    assert!(open <= 2.0, "{open}");
    served.stop().await;
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn a_principal_over_its_rate_gets_429_with_retry_after_and_others_do_not(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let scenario = Scenario::new(&db.url, "");
    append_limits(&scenario, "rate_limit = 1\nrate_limit_burst = 2\n");
    let served = Served::start(&scenario, &[]).await;
    let client = reqwest::Client::builder()
        .timeout(DEADLINE)
        .build()
        .unwrap();

    let list = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}"#;
    for (url, post) in [
        (format!("{}/v1/upstreams", served.control), false),
        (served.mcp.clone(), true),
    ] {
        let send = |authorization: Option<&str>| {
            let mut request = if post {
                client
                    .post(&url)
                    .header("content-type", "application/json")
                    .header("accept", "application/json, text/event-stream")
                    .header("mcp-protocol-version", "2025-11-25")
                    .body(list)
            } else {
                client.get(&url)
            };
            if let Some(token) = authorization {
                request = request.header("authorization", token);
            }
            request.send()
        };
        // Ten at once from one address: at most the burst and what the rate
        // refills meanwhile pass.
        let mut limited = None;
        for _ in 0..10 {
            let response = send(None).await.unwrap();
            if response.status() == 429 {
                limited = Some(response);
                break;
            }
            assert_eq!(response.status(), 200, "{url}");
        }
        let limited = limited.expect("ten requests at once exceed 1/s with a burst of 2");
        let retry_after: u64 = limited.headers()["retry-after"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!(retry_after >= 1);
        let body = limited.text().await.unwrap();
        assert!(body.contains("rate limit"), "{body}");
        if !post {
            assert!(body.contains("\"rate_limited\""), "{body}");
        }
        // Without tokens the principal is the peer address: a header names
        // no principal of its own (it is verified by no one) ...
        // (a new header each time: each would have had a fresh bucket if
        // headers named principals; the rate may refill one in between).
        let mut statuses = Vec::new();
        for n in 0..3 {
            let header = format!("Bearer another-principal-{n}");
            let status = send(Some(header.as_str())).await.unwrap().status().as_u16();
            statuses.push(status);
            if status == 429 {
                break;
            }
        }
        assert_eq!(statuses.last(), Some(&429), "{url}: {statuses:?}");
        // ... and another address has its own bucket.
        let elsewhere = reqwest::Client::builder()
            .timeout(DEADLINE)
            .local_address(std::net::IpAddr::from([127, 0, 0, 2]))
            .build()
            .unwrap();
        let request = if post {
            elsewhere
                .post(&url)
                .header("content-type", "application/json")
                .header("accept", "application/json, text/event-stream")
                .header("mcp-protocol-version", "2025-11-25")
                .body(list)
        } else {
            elsewhere.get(&url)
        };
        assert_eq!(request.send().await.unwrap().status(), 200, "{url}");
    }
    let answer = common::wait_until("/metrics within the rate", || async {
        let response = client
            .get(format!("{}/metrics", served.control))
            .header("authorization", "Bearer metrics-reader")
            .send()
            .await
            .ok()?;
        (response.status() == 200).then_some(response.text().await.ok()?)
    })
    .await;
    for listener in ["mcp", "control"] {
        let counted = prometheus::sum(
            &answer,
            "http_refused_total",
            &[("listener", listener), ("reason", "rate_limited")],
        );
        assert!(counted >= 1.0, "{listener}: {counted}");
    }
    served.stop().await;
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn a_megabyte_tool_name_or_traceparent_leaves_no_long_log_line(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let payments = replace_exactly(PAYMENTS_ADAPTER, "timeout = \"2s\"", "timeout = \"5s\"");
    let scenario = Scenario::with_adapters(&db.url, "", &payments, MAILER_ADAPTER);
    append_limits(&scenario, "log_field_max_bytes = 64\nrate_limit = 0\n");
    // Debug logs too: rmcp's and leasegate's own.
    let served = Served::start(&scenario, &[("RUST_LOG", "debug")]).await;
    let megabyte = "x".repeat(1024 * 1024);
    let (lease, _) = db.running_run("agent", 120_000).await;
    let (agent, _) = connect_http(&served.mcp, Some(&lease)).await;

    // An unknown tool with a 1 MB name.
    for _ in 0..3 {
        let refused = call(&agent, &megabyte, json!({}), None).await;
        assert!(refused.is_err());
    }
    // A refused call (a stale epoch) with a 1 MB traceparent and owner.
    let stale = leasegate::ledger::LeaseClaim {
        epoch: lease.epoch + 1,
        owner: megabyte.clone(),
        ..lease.clone()
    };
    let mut meta = common::proxy::lease_meta(&stale);
    meta.insert(
        "traceparent".into(),
        json!(format!("00-{megabyte}-00f067aa0ba902b7-01")),
    );
    let refused = charge_eur(&agent, 1, Some(meta)).await;
    assert!(refused.is_err(), "{refused:?}");
    agent.cancel().await.unwrap();
    // A side-effecting call without a lease is refused before the ledger
    // sees it, and counted with the ledger's own fence refusals.
    let (leaseless, _) = connect_http(&served.mcp, None).await;
    let refused = charge_eur(&leaseless, 1, None).await;
    match refused {
        Err((code, _)) => assert_eq!(code, -31001),
        Ok(result) => panic!("a call without a lease was answered: {result:?}"),
    }
    leaseless.cancel().await.unwrap();
    let counted = served
        .metric(
            "protected_write_rejected_total",
            &[("call", "mcp_tools_call"), ("reason", "lease_missing")],
        )
        .await;
    assert_eq!(counted, 1.0);
    // Everything above is logged by now: the next request comes after it.
    assert_eq!(
        common::http::get(&format!("{}/v1/upstreams", served.control))
            .await
            .status,
        200
    );
    let lines = served.stop().await;
    let total: usize = lines.iter().map(String::len).sum();
    let longest = lines.iter().map(String::len).max().unwrap_or(0);
    // The line cap is 16 × 64 bytes, at least 4096; the marker adds a few.
    assert!(
        longest <= 4096 + 64,
        "a log line of {longest} bytes: {}",
        &lines.iter().find(|l| l.len() == longest).unwrap()[..300]
    );
    assert!(
        total < 4 * 1024 * 1024,
        "{total} bytes of logs for four 1 MB requests"
    );
    // (No clipped marker is required: with lease tokens, identifier rules and
    // the body-free log filter, none of these values reaches a log line.)
    assert!(
        !lines.iter().any(|l| l.contains(&megabyte[..4096])),
        "no request-controlled megabyte in the log"
    );
}

/// Resident memory of a process, in KiB (`VmRSS`).
fn resident_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .expect("VmRSS in /proc/<pid>/status")
}

/// Not a check: prints the child's resident memory before, during and after
/// a burst of half-open connections and of MCP sessions (unbounded, such a
/// burst once grew the process by hundreds of MB and kept most). Run it with
/// `cargo test --test integration limits -- --ignored --nocapture memory`.
#[ignore = "a measurement, run by hand"]
#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn memory_after_bursts_of_half_open_connections_and_sessions(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    const CONNECTIONS: usize = 5000;
    const SESSIONS: usize = 5000;
    let db = TestDb::new(pool, connect).await;
    let scenario = Scenario::new(&db.url, "");
    scenario.prepend_config("http_sessions = true");
    append_limits(
        &scenario,
        "header_read_timeout = \"15s\"\nidle_timeout = \"15s\"\nmax_connections = 8000\n\
         max_sessions = 1000\nsession_idle_timeout = \"30s\"\nrate_limit = 0\n",
    );
    let served = Served::start(&scenario, &[]).await;
    let pid = served.child.id().unwrap();
    let client = reqwest::Client::builder()
        .timeout(DEADLINE)
        .build()
        .unwrap();
    let open = |labels| {
        let served = &served;
        async move { served.metric("http_connections_open", labels).await }
    };
    assert_eq!(list_in(&client, &served.mcp, "none").await, 404);
    let baseline = resident_kib(pid);

    // Half-open connections: half a head each.
    let address = served.mcp_address();
    let mut streams = Vec::new();
    let started = tokio::time::Instant::now();
    for _ in 0..CONNECTIONS {
        let mut stream = TcpStream::connect(&address).await.unwrap();
        stream
            .write_all(b"POST /mcp HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: appl")
            .await
            .unwrap();
        streams.push(stream);
    }
    let opened = started.elapsed();
    let held = open(&[("listener", "mcp")]).await;
    let peak_connections = resident_kib(pid);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while open(&[("listener", "mcp")]).await > 0.0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "half-open connections still open after 120 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    drop(streams);
    tokio::time::sleep(Duration::from_secs(7)).await;
    let after_connections = resident_kib(pid);

    // Sessions: initialize only, as the issue's probe did.
    for _ in 0..SESSIONS {
        open_session(&client, &served.mcp).await;
    }
    let peak_sessions = resident_kib(pid);
    let held_sessions = served.metric("mcp_sessions_open", &[]).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while served.metric("mcp_sessions_open", &[]).await > 0.0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "sessions still open after 120 s"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    tokio::time::sleep(Duration::from_secs(7)).await;
    let after_sessions = resident_kib(pid);
    let evicted = served.metric("mcp_sessions_evicted_total", &[]).await;
    let refused = served
        .metric(
            "http_refused_total",
            &[("listener", "mcp"), ("reason", "header_timeout")],
        )
        .await;
    eprintln!(
        "resident memory (KiB): baseline {baseline}; {CONNECTIONS} half-open connections \
         (opened in {:?}, {held} held at once): peak {peak_connections}, after they were closed {after_connections} ({refused} closed on \
         header_read_timeout); {SESSIONS} sessions (max 1000, {held_sessions} held at the end): peak {peak_sessions}, after \
         expiry {after_sessions} ({evicted} evicted)",
        opened
    );
    served.stop().await;
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn a_low_open_file_limit_lowers_the_connection_cap_instead_of_running_out(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let scenario = Scenario::new(&db.url, "");
    append_limits(
        &scenario,
        "rate_limit = 0\nidle_timeout = \"60s\"\nheader_read_timeout = \"60s\"\n",
    );
    // 300 descriptors cannot hold 2 × 1024 connections: fewer are served.
    let served = Served::start_with(&scenario, &[], Some(300)).await;
    let address = served.mcp_address();
    let mut held = Vec::new();
    for _ in 0..400 {
        held.push(TcpStream::connect(&address).await.unwrap());
    }
    // Those beyond the lowered cap are refused and counted, never an
    // accept error (no descriptor shortage).
    common::wait_until(
        "connections beyond the lowered cap to be refused",
        || async {
            let refused = served
                .metric(
                    "http_refused_total",
                    &[("listener", "mcp"), ("reason", "max_connections")],
                )
                .await;
            (refused >= 100.0).then_some(())
        },
    )
    .await;
    assert_eq!(
        served.metric("http_accept_errors_total", &[]).await,
        0.0,
        "no accept failed"
    );
    drop(held);
    // Room again: a new connection is answered.
    common::wait_until("a new connection to be served", || async {
        let mut stream = TcpStream::connect(&address).await.ok()?;
        stream
            .write_all(get("/nothing-here", &address).as_bytes())
            .await
            .ok()?;
        let mut answer = [0u8; 12];
        stream.read_exact(&mut answer).await.ok()?;
        (&answer == b"HTTP/1.1 404").then_some(())
    })
    .await;
    let lines = served.stop().await;
    assert!(
        lines.iter().any(|l| l.contains("open-file limit")),
        "the lowered cap is logged: {lines:#?}"
    );
    assert!(!lines.iter().any(|l| l.contains("accept failed")));
}

/// With tokens required, the rate bucket is taken after authentication:
/// a verified token's requests count against its token id, and every
/// missing or bad token from one address counts against that address's one
/// bucket — inventing tokens does not buy fresh buckets (before, each
/// presented header had its own).
#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn rate_buckets_are_the_verified_tokens_and_bad_tokens_share_their_address(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let scenario = Scenario::new(&db.url, "");
    append_limits(
        &scenario,
        "rate_limit = 1\nrate_limit_burst = 2\n\n[auth]\nmode = \"required\"\n",
    );
    let first = create_token(&db, "tenant-a", "operator", None).await;
    let second = create_token(&db, "tenant-a", "operator", None).await;
    let served = Served::start(&scenario, &[]).await;
    let client = reqwest::Client::builder()
        .timeout(DEADLINE)
        .build()
        .unwrap();
    let url = format!("{}/v1/upstreams", served.control);
    let send = |token: String| {
        client
            .get(&url)
            .header("authorization", format!("Bearer {token}"))
            .send()
    };
    // Bad tokens, a new one each time: two refusals, then the address's
    // bucket is spent. A refill in between (1/s) may let one more through.
    let bogus = |n: usize| format!("lgt_{:016x}_{}", n, "x".repeat(43));
    let mut statuses = Vec::new();
    for n in 0..6 {
        let status = send(bogus(n)).await.unwrap().status().as_u16();
        statuses.push(status);
        if status == 429 {
            break;
        }
    }
    assert!(
        statuses.len() <= 4 && statuses.last() == Some(&429),
        "distinct bad tokens from one address share one bucket: {statuses:?}"
    );
    assert!(
        statuses[..statuses.len() - 1].iter().all(|s| *s == 401),
        "{statuses:?}"
    );
    // A valid token has its own bucket: the bad ones did not spend it ...
    let mut own = Vec::new();
    for _ in 0..6 {
        let status = send(first.clone()).await.unwrap().status().as_u16();
        own.push(status);
        if status == 429 {
            break;
        }
    }
    assert!(own.len() >= 2 && own.len() <= 4, "{own:?}");
    assert!(own[..own.len() - 1].iter().all(|s| *s == 200), "{own:?}");
    assert_eq!(own.last(), Some(&429), "{own:?}");
    // ... and it is not the other token's: that one still passes.
    assert_eq!(send(second.clone()).await.unwrap().status(), 200);
    served.stop().await;
}

/// A batch renewal weighs its leases against the caller's rate (one
/// request per 100 leases): a batch within the burst is served, one that
/// asks more than the burst can ever hold is 429 with nothing fenced.
#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn a_batch_renewal_weighs_its_leases_against_the_rate(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let scenario = Scenario::new(&db.url, "");
    append_limits(&scenario, "rate_limit = 1\nrate_limit_burst = 3\n");
    let served = Served::start(&scenario, &[]).await;
    let (lease, _) = db.running_run("batch-host", 60_000).await;
    let held = json!({"run_id": lease.run_id, "owner": lease.owner, "epoch": lease.epoch,
        "lease_token": lease.token.as_ref().map(|t| t.expose())});
    let batch =
        |size: usize| {
            let mut leases = vec![held.clone()];
            leases.extend((1..size).map(
                |_| json!({"run_id": uuid::Uuid::now_v7(), "owner": "batch-host", "epoch": 1}),
            ));
            json!({"ttl_ms": 60_000, "leases": leases}).to_string()
        };
    let client = reqwest::Client::builder()
        .timeout(DEADLINE)
        .build()
        .unwrap();
    let renew = |body: String| {
        client
            .post(format!("{}/v1/leases/renew", served.control))
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    let expiry = || async {
        let at: chrono::DateTime<chrono::Utc> = db
            .scalar(
                "SELECT expires_at FROM worker_leases WHERE run_id = $1",
                lease.run_id.as_uuid(),
            )
            .await;
        at
    };

    // 250 leases weigh three requests: the whole burst of a fresh bucket.
    let before = expiry().await;
    let served_batch = renew(batch(250)).await.unwrap();
    assert_eq!(served_batch.status(), 200);
    let answer: serde_json::Value = served_batch.json().await.unwrap();
    assert_eq!(answer["renewed"], 1, "{answer}");
    let renewed = expiry().await;
    assert!(renewed >= before);

    // 10,000 leases weigh a hundred: more than the burst ever holds.
    let refused = renew(batch(10_000)).await.unwrap();
    assert_eq!(refused.status(), 429);
    assert!(refused.headers().contains_key("retry-after"));
    assert!(refused.text().await.unwrap().contains("rate_limited"));
    assert_eq!(expiry().await, renewed, "nothing was fenced or renewed");
}

/// One peer address holds at most its share of the connections: its
/// connections beyond it are refused at once, while another address is
/// still served under the cap.
#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn one_peer_cannot_take_the_other_peers_connections(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let scenario = Scenario::new(&db.url, "");
    append_limits(
        &scenario,
        "max_connections = 8\nmax_connections_per_peer = 2\nrate_limit = 0\n",
    );
    let served = Served::start(&scenario, &[]).await;
    let address = served.control_address();
    let from = |source: &'static str| {
        let address = address.clone();
        async move {
            let socket = tokio::net::TcpSocket::new_v4().unwrap();
            socket.bind(format!("{source}:0").parse().unwrap()).unwrap();
            socket.connect(address.parse().unwrap()).await.unwrap()
        }
    };
    // The hog holds its share.
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut stream = from("127.0.0.1").await;
        let (status, _) = exchange(&mut stream, &get("/v1/upstreams", &address)).await;
        assert!(!status.contains(" 503 "), "{status}");
        held.push(stream);
    }
    let mut third = from("127.0.0.1").await;
    let _ = third
        .write_all(get("/v1/upstreams", &address).as_bytes())
        .await;
    let answered = read_until_closed(&mut third, "the hog's third connection to be refused").await;
    assert!(
        answered.is_empty() || answered.starts_with("HTTP/1.1 503"),
        "{answered}"
    );
    // Another address is served meanwhile.
    let mut other = from("127.0.0.2").await;
    let (status, _) = exchange(&mut other, &get("/v1/upstreams", &address)).await;
    assert!(status.contains(" 200 "), "{status}");
    // The hog lets go: its address has room again (the metric is read
    // from it).
    drop(held);
    let refused = wait_metric(
        &served,
        "http_refused_total",
        &[
            ("listener", "control"),
            ("reason", "max_connections_per_peer"),
        ],
    )
    .await;
    assert!(refused >= 1.0);
}

/// A `tools/call` of `tool` with `arguments` as JSON-RPC request `id`.
fn tools_call(id: u64, tool: &str, arguments: serde_json::Value) -> String {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": {"name": tool, "arguments": arguments}})
    .to_string()
}

/// One principal holds at most its share of the requests in flight: a
/// token whose two slow calls fill its share is refused its third request
/// at once (429, `Retry-After`, the documented JSON-RPC error under its id;
/// nothing registered or sent), may still send notifications, and is served
/// again once a call finishes; another token's calls are served meanwhile.
#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn a_principal_beyond_its_in_flight_share_is_refused_and_another_is_served(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    use common::http::post_mcp;
    let db = TestDb::new(pool, connect).await;
    let scenario = Scenario::with_adapters(&db.url, "", LONG_CALLS, MAILER_ADAPTER);
    append_limits(
        &scenario,
        "max_in_flight_per_principal = 2\nrate_limit = 0\n\n[auth]\nmode = \"required\"\n",
    );
    let hog = create_token(&db, "tenant-a", "agent", Some("hog")).await;
    let other = create_token(&db, "tenant-a", "agent", Some("other")).await;
    let operator = create_token(&db, "tenant-a", "operator", Some("metrics")).await;
    let served = Served::start(&scenario, &[]).await;
    let (lease, _) = db.running_run("agent", 120_000).await;
    let lease_headers = |token: &str| {
        vec![
            ("authorization".to_owned(), format!("Bearer {token}")),
            ("leasegate-run-id".to_owned(), lease.run_id.to_string()),
            ("leasegate-owner".to_owned(), lease.owner.clone()),
            ("leasegate-epoch".to_owned(), lease.epoch.to_string()),
            (
                "leasegate-lease-token".to_owned(),
                lease.token.as_ref().unwrap().expose().to_owned(),
            ),
        ]
    };
    let send = |token: &str, body: String| {
        let headers = lease_headers(token);
        let url = served.mcp.clone();
        async move {
            let headers: Vec<(&str, &str)> = headers
                .iter()
                .map(|(name, value)| (name.as_str(), value.as_str()))
                .collect();
            post_mcp(&url, &headers, &body).await
        }
    };

    // The hog's two slow charges: each sends, then hangs.
    let slow: Vec<_> = (1..=2)
        .map(|n| {
            tokio::spawn(send(
                &hog,
                tools_call(
                    n,
                    "payments__charge",
                    json!({"amount": n, "currency": "eur", "hang_ms": 8000}),
                ),
            ))
        })
        .collect();
    common::wait_until("both slow charges to be in flight", || async {
        (scenario.side_effects("charges.jsonl").len() == 2).then_some(())
    })
    .await;
    let operations_before = db.row_count("tool_operations").await;
    assert_eq!(operations_before, 2);

    // Its third request, a charge or a listing, is refused at once.
    for (id, body) in [
        (
            7,
            tools_call(
                7,
                "payments__charge",
                json!({"amount": 3, "currency": "eur"}),
            ),
        ),
        (
            8,
            r#"{"jsonrpc":"2.0","id":8,"method":"tools/list","params":{}}"#.to_owned(),
        ),
    ] {
        let refused = send(&hog, body).await;
        assert_eq!(refused.status, 429, "{}", refused.body);
        let answer = refused.json_rpc();
        assert_eq!(answer["id"], id, "{answer}");
        let message = common::http::rpc_error_message(&answer, -31012, "");
        assert!(
            message.contains("limits.max_in_flight_per_principal"),
            "{message}"
        );
        assert_eq!(
            answer["error"]["data"]["reason"],
            "max_in_flight_per_principal"
        );
        assert_eq!(answer["error"]["data"]["limit"], 2);
    }
    // A notification is no request: never refused (a principal at its share
    // can still cancel).
    let notified = send(
        &hog,
        r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":99}}"#
            .to_owned(),
    )
    .await;
    assert_eq!(notified.status, 202, "{}", notified.body);

    // The other token is served meanwhile: a listing and a read-only call.
    let listed = send(
        &other,
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}"#.to_owned(),
    )
    .await;
    assert_eq!(listed.status, 200, "{}", listed.body);
    assert!(
        listed.body.contains("payments__get_charge"),
        "{}",
        listed.body
    );
    let read = send(
        &other,
        tools_call(
            2,
            "payments__get_charge",
            json!({"idempotency_key": "none"}),
        ),
    )
    .await;
    assert_eq!(read.status, 200, "{}", read.body);
    assert!(read.json_rpc().get("result").is_some(), "{}", read.body);

    // The slow calls finish; nothing of the refused charge was registered
    // or sent, and the hog is served again.
    for call in slow {
        let answered = within("a slow charge to finish", call).await.unwrap();
        assert_eq!(answered.status, 200, "{}", answered.body);
    }
    assert_eq!(db.row_count("tool_operations").await, operations_before);
    assert_eq!(scenario.side_effects("charges.jsonl").len(), 2);
    let again = send(
        &hog,
        r#"{"jsonrpc":"2.0","id":9,"method":"tools/list","params":{}}"#.to_owned(),
    )
    .await;
    assert_eq!(again.status, 200, "{}", again.body);
    let metrics = served.metrics_as(&operator).await;
    let counted = prometheus::sum(
        &metrics,
        "http_refused_total",
        &[
            ("listener", "mcp"),
            ("reason", "max_in_flight_per_principal"),
        ],
    );
    assert_eq!(counted, 2.0, "{metrics}");
    served.stop().await;
}

/// The victim's view of the MCP front during a measurement: how many calls
/// were answered and how long each took.
struct VictimCalls {
    answered: usize,
    sent: usize,
    latencies: Vec<Duration>,
}

impl VictimCalls {
    fn quantile(&self, q: f64) -> Duration {
        let mut sorted = self.latencies.clone();
        sorted.sort();
        let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
        sorted[rank - 1]
    }

    fn report(&self, phase: &str) -> String {
        format!(
            "{phase}: {}/{} answered ({:.1} %), p50 {:.1} ms, p99 {:.1} ms",
            self.answered,
            self.sent,
            100.0 * self.answered as f64 / self.sent as f64,
            self.quantile(0.5).as_secs_f64() * 1000.0,
            self.quantile(0.99).as_secs_f64() * 1000.0
        )
    }
}

/// `calls` requests from 127.0.0.1 with `token`, alternating `tools/list`
/// and a read-only `tools/call`, each on a new connection (so every call is
/// a new admission), paced under the default rate limit.
async fn victim_calls(url: &str, token: &str, calls: usize) -> VictimCalls {
    let client = reqwest::Client::builder()
        .timeout(DEADLINE)
        .local_address(std::net::IpAddr::from([127, 0, 0, 1]))
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let mut pace = tokio::time::interval(Duration::from_millis(40));
    let mut measured = VictimCalls {
        answered: 0,
        sent: 0,
        latencies: Vec::new(),
    };
    for n in 0..calls {
        pace.tick().await;
        let body = if n % 2 == 0 {
            json!({"jsonrpc": "2.0", "id": n, "method": "tools/list", "params": {}}).to_string()
        } else {
            tools_call(
                n as u64,
                "payments__get_charge",
                json!({"idempotency_key": "none"}),
            )
        };
        let started = std::time::Instant::now();
        let mut request = client.post(url).body(body);
        for (name, value) in common::http::MCP_HEADERS {
            request = request.header(name, value);
        }
        let answered = match request
            .header("authorization", format!("Bearer {token}"))
            .send()
            .await
        {
            Ok(response) if response.status() == 200 => response
                .text()
                .await
                .is_ok_and(|text| text.contains("\"result\"")),
            _ => false,
        };
        measured.latencies.push(started.elapsed());
        measured.sent += 1;
        measured.answered += usize::from(answered);
    }
    measured
}

/// The flood of the admission issue: one unauthenticated peer (127.0.0.2)
/// opens as many half-open connections as the MCP listener takes — heads
/// begun and never finished — while a client with a valid token from
/// 127.0.0.1 keeps calling `tools/list` and a read-only `tools/call`, each
/// on a new connection. The peer's share (`max_connections_per_peer`, a
/// quarter of `max_connections` where tokens are required) bounds what it
/// holds, so every victim call is admitted and answered. The victim's
/// success rate and latency, before and during the flood, are printed
/// (bench/results/2026-12-04-admission-flood.md), never asserted.
#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn a_flood_of_half_open_connections_from_one_peer_leaves_the_others_served(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    const FLOOD: usize = 1024;
    const CALLS: usize = 100;
    let (_exclusive, db) = TestDb::new_exclusive(pool, connect).await;
    let scenario = Scenario::new(&db.url, "");
    // The flood's heads stay half-sent for the whole measurement.
    append_limits(
        &scenario,
        "header_read_timeout = \"60s\"\n\n[auth]\nmode = \"required\"\n",
    );
    let victim = create_token(&db, "tenant-a", "agent", Some("victim")).await;
    let operator = create_token(&db, "tenant-a", "operator", Some("metrics")).await;
    let served = Served::start(&scenario, &[]).await;
    let address = served.mcp_address();

    let baseline = within(
        "the victim's calls before the flood",
        victim_calls(&served.mcp, &victim, CALLS),
    )
    .await;
    assert_eq!(
        baseline.answered,
        baseline.sent,
        "{}",
        baseline.report("baseline")
    );

    // The flood: every connection begins a head and never ends it.
    let flood = within("the flood to be opened", async {
        let mut held = Vec::new();
        for _ in 0..FLOOD {
            let socket = tokio::net::TcpSocket::new_v4().unwrap();
            socket.bind("127.0.0.2:0".parse().unwrap()).unwrap();
            let Ok(mut stream) = socket.connect(address.parse().unwrap()).await else {
                continue;
            };
            let half = format!("POST /mcp HTTP/1.1\r\nhost: {address}\r\ncontent-type: ");
            if stream.write_all(half.as_bytes()).await.is_ok() {
                held.push(stream);
            }
        }
        held
    })
    .await;
    // The default share: a quarter of the default max_connections.
    let share = 1024 / 4;
    let open = common::wait_until("the flood's share to be held", || async {
        let open = prometheus::sum(
            &served.metrics_as(&operator).await,
            "http_connections_open",
            &[("listener", "mcp")],
        );
        (open >= share as f64).then_some(open)
    })
    .await;

    let during = within(
        "the victim's calls during the flood",
        victim_calls(&served.mcp, &victim, CALLS),
    )
    .await;
    let metrics = served.metrics_as(&operator).await;
    let refused = prometheus::sum(
        &metrics,
        "http_refused_total",
        &[("listener", "mcp"), ("reason", "max_connections_per_peer")],
    );
    println!(
        "admission flood: {FLOOD} half-open connections tried from 127.0.0.2, {} still open on \
         the client, {open} open on the MCP listener, {refused} refused as beyond the peer's share; \
         {}; {}",
        flood.len(),
        baseline.report("victim before the flood"),
        during.report("victim during the flood")
    );
    assert_eq!(
        during.answered,
        during.sent,
        "every victim call is admitted and answered: {}",
        during.report("during the flood")
    );
    assert!(
        refused >= 1.0,
        "the flood reached the peer's share: {metrics}"
    );
    drop(flood);
    served.stop().await;
}
