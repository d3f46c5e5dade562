//! What the agent wrote and what the tool declared, carried exactly, on
//! every front: numbers that JSON-RPC parsing would change are refused
//! before anything is registered or sent (or, under `integers =
//! "as_double"`, go on as doubles), and `tools/list` gives the agent every
//! field of the upstream's tool objects with only the name changed.
//!
//! The agents are raw (HTTP bodies and stdio lines written by hand: an SDK
//! would re-read the numbers itself); the tool server is
//! `tests/sdk/raw_tools.py`, which keeps each request line as received (and
//! each answer to what it asks: a `roots/list` outside any call is answered
//! with no roots, not an error).

use std::path::{Path, PathBuf};

use crate::common;
use common::proxy::{LEASEGATE, RunningProxy, config_head, lease_meta};
use common::{TestDb, http, within};
use leasegate::ledger::LeaseClaim;
use serde_json::{Value, json};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

const RAW_TOOLS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/sdk/raw_tools.py");

/// Numbers whose value parsing changes: 2^64 and its neighbours above, an
/// integer below i64's range, one far beyond u64's, and decimals with more
/// significant digits than a double keeps.
const ALTERED: [&str; 7] = [
    "18446744073709551616",
    "18446744073709551617",
    "18446744073709551616.0",
    "-9223372036854775809",
    "123456789012345678901234567890",
    "3.1415926535897932384",
    "0.12345678901234567890",
];

/// Numbers parsing keeps (some respelled: `1e3` is sent as `1000.0`).
const ORDINARY: [&str; 6] = ["1", "-1", "0.5", "1e3", "9007199254740992", "-0.000123"];

/// Numbers parsing keeps that gated calls refuse under `reject` anyway:
/// doubles beyond ±2^53 (the ±2^53 rule of `intent::canonical`).
const DOUBLES_BEYOND_2_53: [&str; 2] = ["1.8446744073709552e19", "1.5e300"];

/// A config with `raw_tools.py` as the stdio upstream `raw` (`echo`
/// read-only, `record` side-effecting) and `integers` as the policy's.
struct Setup {
    dir: PathBuf,
}

impl Setup {
    fn new(database_url: &str, integers: &str, extra_config: &str) -> Self {
        Self::with_upstream(database_url, integers, extra_config, |state| {
            format!(
                "transport = \"stdio\"\ncommand = \"python3\"\nargs = [\"{RAW_TOOLS}\", \"{}\"]",
                state.display()
            )
        })
    }

    /// As `new`, with `upstream(state dir)` as the body of `[upstreams.raw]`.
    fn with_upstream(
        database_url: &str,
        integers: &str,
        extra_config: &str,
        upstream: impl FnOnce(&Path) -> String,
    ) -> Self {
        let dir =
            std::env::temp_dir().join(format!("leasegate-raw-{}", uuid::Uuid::new_v4().simple()));
        for sub in ["adapters", "policies", "state"] {
            std::fs::create_dir_all(dir.join(sub)).unwrap();
        }
        let config = format!(
            "{extra_config}\n{head}\n[upstreams.raw]\n{upstream}\n",
            head = config_head(database_url, "off"),
            upstream = upstream(&dir.join("state")),
        );
        std::fs::write(dir.join("leasegate.toml"), config).unwrap();
        std::fs::write(
            dir.join("adapters/raw.toml"),
            "upstream = \"raw\"\ntimeout = \"5s\"\n[tools.echo]\nread_only = true\n",
        )
        .unwrap();
        std::fs::write(
            dir.join("policies/test.toml"),
            format!("integers = \"{integers}\"\n"),
        )
        .unwrap();
        Self { dir }
    }

    fn config(&self) -> PathBuf {
        self.dir.join("leasegate.toml")
    }

    /// The `tools/call` lines the tool received, parsed.
    fn calls(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.join("state/calls.jsonl"))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A `tools/call` written by hand: `number` as it stands in the text.
fn raw_call(id: u64, tool: &str, number: &str, tag: usize, lease: &LeaseClaim) -> String {
    let meta = Value::Object(lease_meta(lease));
    format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"{tool}","arguments":{{"tag":{tag},"n":{number}}},"_meta":{meta}}}}}"#
    )
}

/// `leasegate stdio` driven by raw lines.
struct StdioAgent {
    child: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
}

impl StdioAgent {
    async fn start(config: &Path) -> Self {
        let mut child = tokio::process::Command::new(LEASEGATE)
            .arg("stdio")
            .arg("--config")
            .arg(config)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut agent = Self {
            child,
            stdin,
            lines,
        };
        let initialize = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "raw", "version": "1"}}});
        agent.request(&initialize.to_string(), 0).await;
        agent
            .send(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#)
            .await;
        agent
    }

    async fn send(&mut self, line: &str) {
        self.stdin
            .write_all(format!("{line}\n").as_bytes())
            .await
            .unwrap();
    }

    /// Sends `line` and waits for the answer under `id`.
    async fn request(&mut self, line: &str, id: u64) -> Value {
        self.send(line).await;
        let lines = &mut self.lines;
        within("leasegate stdio to answer", async {
            loop {
                let line = lines
                    .next_line()
                    .await
                    .unwrap()
                    .expect("leasegate stdio answers");
                let message: Value = serde_json::from_str(&line).unwrap();
                if message["id"] == id {
                    return message;
                }
            }
        })
        .await
    }

    async fn stop(mut self) {
        drop(self.stdin);
        let _ = within("leasegate stdio to end", self.child.wait()).await;
    }
}

/// Each front's way of sending one raw `tools/call`.
enum Front<'a> {
    Http(&'a str),
    Stdio(&'a mut StdioAgent),
}

impl Front<'_> {
    async fn call(&mut self, id: u64, line: &str) -> Value {
        let answer = match self {
            Front::Http(url) => http::post_mcp(url, &[], line).await.json_rpc(),
            Front::Stdio(agent) => agent.request(line, id).await,
        };
        assert_eq!(answer["id"], id, "{answer}");
        answer
    }

    fn name(&self) -> &'static str {
        match self {
            Front::Http(_) => "http",
            Front::Stdio(_) => "stdio",
        }
    }
}

/// A stateless 2026-07-28 request: the method (and the tool's name) in the
/// headers too, the client's protocol version and capabilities in `_meta`.
async fn post_2026(url: &str, mut request: Value, name: Option<&str>) -> Value {
    let method = request["method"].as_str().unwrap().to_owned();
    let meta = request["params"]["_meta"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    let mut meta = Value::Object(meta);
    meta["io.modelcontextprotocol/protocolVersion"] = json!("2026-07-28");
    meta["io.modelcontextprotocol/clientCapabilities"] = json!({});
    meta["io.modelcontextprotocol/clientInfo"] = json!({"name": "raw", "version": "1"});
    request["params"]["_meta"] = meta;
    let mut headers = vec![
        ("content-type", "application/json"),
        ("accept", "application/json, text/event-stream"),
        ("mcp-protocol-version", "2026-07-28"),
        ("mcp-method", method.as_str()),
    ];
    if let Some(name) = name {
        headers.push(("mcp-name", name));
    }
    let answer = http::post(url, &headers, &request.to_string()).await;
    json_rpc(&answer.body)
}

/// The value of `n` in a recorded call line, as JSON reads it.
fn sent_value(line: &str) -> Value {
    let call: Value = serde_json::from_str(line).unwrap();
    call["params"]["arguments"]["n"].clone()
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn numbers_parsing_would_change_are_refused_on_every_front_before_anything_is_recorded_or_sent(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let setup = Setup::new(&db.url, "reject", "");
    let proxy = RunningProxy::start(&setup.config()).await;
    let mut stdio = StdioAgent::start(&setup.config()).await;
    let (lease, _) = db.running_run("agent", 60_000).await;
    let mut id = 100;
    let mut tag = 0;
    let mut fronts = [Front::Http(&proxy.url), Front::Stdio(&mut stdio)];
    for front in &mut fronts {
        for tool in ["raw__echo", "raw__record"] {
            for token in ALTERED {
                id += 1;
                tag += 1;
                let answer = front
                    .call(id, &raw_call(id, tool, token, tag, &lease))
                    .await;
                let context = format!("{} {tool} {token}: ", front.name());
                let message = http::rpc_error_message(&answer, -32602, &context);
                assert!(
                    message
                        .starts_with(&format!("number {token} at $.n cannot be carried exactly")),
                    "{context}{message}"
                );
                assert!(
                    message.contains("send it as a string")
                        && message.contains("integers = \"as_double\"")
                        && message.ends_with("Nothing was recorded or sent"),
                    "{context}{message}"
                );
                assert_eq!(
                    answer["error"]["data"]["numbers"][0]["token"], token,
                    "{context}{answer}"
                );
            }
        }
    }
    // A 2026-07-28 client names the method in a header as well, which the
    // refusal's rewritten method must not contradict. (Its `tools/list`
    // shows the request is well formed.)
    let listed = post_2026(
        &proxy.url,
        json!({"jsonrpc": "2.0", "id": 97,
        "method": "tools/list", "params": {}}),
        None,
    )
    .await;
    assert!(listed["result"]["tools"].is_array(), "{listed}");
    let meta = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
    });
    let modern = format!(
        r#"{{"jsonrpc":"2.0","id":98,"method":"tools/call","params":{{"name":"raw__echo","arguments":{{"n":{}}},"_meta":{meta}}}}}"#,
        ALTERED[0]
    );
    let headers = [
        ("content-type", "application/json"),
        ("accept", "application/json, text/event-stream"),
        ("mcp-protocol-version", "2026-07-28"),
        ("mcp-method", "tools/call"),
        ("mcp-name", "raw__echo"),
    ];
    let answer = json_rpc(&http::post(&proxy.url, &headers, &modern).await.body);
    let message = http::rpc_error_message(&answer, -32602, "2026-07-28: ");
    assert!(
        message.starts_with(&format!(
            "number {} at $.n cannot be carried exactly",
            ALTERED[0]
        )),
        "{message}"
    );
    assert!(setup.calls().is_empty(), "the tool saw nothing");
    assert_eq!(
        db.row_count("tool_operations").await,
        0,
        "nothing registered"
    );

    // A double's own spelling beyond ±2^53 is carried exactly: a read-only
    // tool gets its value (respelled `1.8446744073709552e+19`); a gated call
    // refuses it by the ±2^53 rule.
    for front in &mut fronts {
        for token in DOUBLES_BEYOND_2_53 {
            id += 1;
            tag += 1;
            let answer = front
                .call(id, &raw_call(id, "raw__echo", token, tag, &lease))
                .await;
            let sent = answer["result"]["content"][0]["text"]
                .as_str()
                .unwrap_or_else(|| panic!("{} {token}: {answer}", front.name()));
            assert_eq!(
                sent_value(sent),
                serde_json::from_str::<Value>(token).unwrap()
            );
            id += 1;
            tag += 1;
            let line = raw_call(id, "raw__record", token, tag, &lease);
            let answer = front.call(id, &line).await;
            let message = http::rpc_error_message(&answer, -32602, "").to_owned();
            assert!(message.contains("beyond ±2^53"), "{message}");
            assert_eq!(
                answer["error"]["data"],
                json!({"reason": "unsafe_integer", "path": "$.n",
                       "value": serde_json::from_str::<Value>(token).unwrap().to_string()}),
                "{answer}"
            );
        }
    }
    let calls = setup.calls();
    assert_eq!(calls.len(), 2 * DOUBLES_BEYOND_2_53.len(), "{calls:?}");
    assert!(
        calls[0].contains(r#""n":1.8446744073709552e+19"#),
        "{calls:?}"
    );
    assert_eq!(db.row_count("tool_operations").await, 0);

    // Ordinary numbers pass both tools unchanged in value.
    for front in &mut fronts {
        for tool in ["raw__echo", "raw__record"] {
            for token in ORDINARY {
                id += 1;
                tag += 1;
                let answer = front
                    .call(id, &raw_call(id, tool, token, tag, &lease))
                    .await;
                let sent = answer["result"]["content"][0]["text"]
                    .as_str()
                    .unwrap_or_else(|| panic!("{} {tool} {token}: {answer}", front.name()));
                assert_eq!(
                    sent_value(sent),
                    serde_json::from_str::<Value>(token).unwrap(),
                    "{token}: {sent}"
                );
            }
        }
    }
    assert_eq!(
        setup.calls().len(),
        2 * DOUBLES_BEYOND_2_53.len() + 2 * 2 * ORDINARY.len()
    );
    assert_eq!(
        db.row_count("tool_operations").await,
        2 * ORDINARY.len() as i64,
        "one operation per gated call"
    );
    stdio.stop().await;
    proxy.stop().await;
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn under_as_double_such_numbers_go_on_as_the_doubles_json_rpc_reads(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let setup = Setup::new(&db.url, "as_double", "");
    let proxy = RunningProxy::start(&setup.config()).await;
    let mut stdio = StdioAgent::start(&setup.config()).await;
    let (lease, _) = db.running_run("agent", 60_000).await;
    let mut id = 100;
    let mut tag = 0;
    let mut fronts = [Front::Http(&proxy.url), Front::Stdio(&mut stdio)];
    for front in &mut fronts {
        for tool in ["raw__echo", "raw__record"] {
            for token in ALTERED {
                id += 1;
                tag += 1;
                let answer = front
                    .call(id, &raw_call(id, tool, token, tag, &lease))
                    .await;
                let sent = answer["result"]["content"][0]["text"]
                    .as_str()
                    .unwrap_or_else(|| panic!("{} {tool} {token}: {answer}", front.name()));
                let double: f64 = token.parse().unwrap();
                assert_eq!(sent_value(sent).as_f64(), Some(double), "{token}: {sent}");
                assert!(!sent.contains(token), "sent rounded: {sent}");
            }
        }
    }
    assert_eq!(setup.calls().len(), 2 * 2 * ALTERED.len());
    assert_eq!(
        db.row_count("tool_operations").await,
        2 * ALTERED.len() as i64
    );
    stdio.stop().await;
    proxy.stop().await;
}

/// `raw_tools.py`'s tools as it declares them, under their exposed names.
fn declared_tools() -> Vec<Value> {
    vec![
        json!({
            "name": "raw__echo",
            "title": "Echo",
            "description": "Answers with the request line as received.",
            "inputSchema": {"type": "object"},
            "annotations": {"readOnlyHint": true},
            "x-vendor": {"tier": "free"},
        }),
        json!({
            "name": "raw__record",
            "description": "Records the request line as received.",
            "inputSchema": {"type": "object", "properties": {"n": {"type": "number"}}},
            "annotations": {"readOnlyHint": false, "destructiveHint": false},
            "execution": {"taskSupport": "optional"},
            "x-vendor": {"tier": "gold", "limits": [1, 2.5, null], "nested": {"ok": true}},
            "_meta": {"example.dev/owner": "raw-tools"},
        }),
    ]
}

/// Every page of `tools/list` through `ask` (a cursor, or none, to the
/// answer's JSON-RPC message), with the number of pages.
async fn list_every_page<F, Fut>(mut ask: F) -> (Vec<Value>, usize)
where
    F: FnMut(Option<String>) -> Fut,
    Fut: std::future::Future<Output = Value>,
{
    let (mut tools, mut pages, mut cursor) = (Vec::new(), 0, None);
    loop {
        let answer = ask(cursor.take()).await;
        pages += 1;
        let result = &answer["result"];
        tools.extend(
            result["tools"]
                .as_array()
                .unwrap_or_else(|| panic!("a page of tools: {answer}"))
                .iter()
                .cloned(),
        );
        match result["nextCursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => return (tools, pages),
        }
    }
}

/// Every page of `tools/list` from the stateless front at `url`.
async fn list_stateless(url: &str) -> (Vec<Value>, usize) {
    list_every_page(|cursor| async move {
        let answer = http::post_mcp(url, &[], &tools_list(1, cursor)).await;
        assert_eq!(answer.status, 200, "{}", answer.body);
        json_rpc(&answer.body)
    })
    .await
}

fn tools_list(id: u64, cursor: Option<String>) -> String {
    let params = match cursor {
        Some(cursor) => json!({"cursor": cursor}),
        None => json!({}),
    };
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/list", "params": params}).to_string()
}

/// The JSON-RPC message of an MCP HTTP answer: the body, or the first SSE
/// event with data (a stream may open with an empty priming event).
fn json_rpc(body: &str) -> Value {
    let data = body
        .lines()
        .filter_map(|line| line.strip_prefix("data:"))
        .map(str::trim)
        .find(|data| !data.is_empty())
        .unwrap_or(body);
    serde_json::from_str(data).unwrap_or_else(|e| panic!("a JSON-RPC answer ({e}): {body}"))
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn tools_list_gives_the_upstreams_tool_objects_whole_on_every_front(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    // One tool per page on both sides: the upstream's pages and leasegate's.
    let stateless = Setup::new(&db.url, "reject", "tools_page_size = 1");
    let sessions = Setup::new(
        &db.url,
        "reject",
        "tools_page_size = 1\nhttp_sessions = true",
    );
    let stateless_proxy = RunningProxy::start(&stateless.config()).await;
    let sessions_proxy = RunningProxy::start(&sessions.config()).await;
    let mut stdio = StdioAgent::start(&stateless.config()).await;
    let expected = (declared_tools(), 2);

    let listed = list_stateless(&stateless_proxy.url).await;
    assert_eq!(listed, expected, "stateless HTTP");

    let client = reqwest::Client::new();
    let post = |body: String, session: Option<String>| {
        let mut request = client.post(&sessions_proxy.url).body(body);
        for (name, value) in http::MCP_HEADERS {
            request = request.header(name, value);
        }
        if let Some(session) = session {
            request = request.header("mcp-session-id", session);
        }
        async move {
            within("the session front to answer", request.send())
                .await
                .unwrap()
        }
    };
    let initialize = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "raw", "version": "1"}}});
    let opened = post(initialize.to_string(), None).await;
    let session = opened
        .headers()
        .get("mcp-session-id")
        .expect("a session id")
        .to_str()
        .unwrap()
        .to_owned();
    let initialized = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
    let accepted = post(initialized.to_owned(), Some(session.clone())).await;
    assert!(accepted.status().is_success(), "{}", accepted.status());
    let listed = list_every_page(|cursor| {
        let answer = post(tools_list(2, cursor), Some(session.clone()));
        async move { json_rpc(&answer.await.text().await.unwrap()) }
    })
    .await;
    assert_eq!(listed, expected, "HTTP sessions");

    let mut id = 10;
    let mut pages = Vec::new();
    let mut cursor = None;
    loop {
        id += 1;
        let answer = stdio.request(&tools_list(id, cursor.take()), id).await;
        let result = answer["result"].clone();
        pages.push(result["tools"].clone());
        match result["nextCursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => break,
        }
    }
    let tools: Vec<Value> = pages
        .iter()
        .flat_map(|page| page.as_array().cloned().unwrap_or_default())
        .collect();
    assert_eq!((tools, pages.len()), expected, "stdio");

    stdio.stop().await;
    sessions_proxy.stop().await;
    stateless_proxy.stop().await;
}

/// `raw_tools.py --http` on an ephemeral port, recording into `state`;
/// killed on drop.
async fn raw_http_server(state: &Path) -> (tokio::process::Child, String) {
    let mut child = tokio::process::Command::new("python3")
        .arg(RAW_TOOLS)
        .arg(state)
        .arg("--http")
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let url = within("raw_tools.py to listen", lines.next_line())
        .await
        .unwrap()
        .expect("raw_tools.py prints its URL");
    let url = url
        .strip_prefix("raw tools at ")
        .unwrap_or_else(|| panic!("raw_tools.py's URL: {url}"))
        .to_owned();
    (child, url)
}

/// A Streamable HTTP upstream's tool objects are listed whole too, whether
/// it answers a `tools/list` page as a JSON body (the first page, `echo`)
/// or as an event stream (the second, `record`): each carries a field
/// rmcp's model does not know.
#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn tools_list_gives_a_streamable_http_upstreams_tool_objects_whole(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let state = std::env::temp_dir().join(format!(
        "leasegate-raw-http-{}",
        uuid::Uuid::new_v4().simple()
    ));
    let (_server, upstream_url) = raw_http_server(&state).await;
    let setup = Setup::with_upstream(&db.url, "reject", "tools_page_size = 1", |_| {
        format!("transport = \"streamable_http\"\nurl = \"{upstream_url}\"")
    });
    let proxy = RunningProxy::start(&setup.config()).await;
    let listed = list_stateless(&proxy.url).await;
    assert_eq!(listed, (declared_tools(), 2), "HTTP upstream");

    // The tapped client still calls: a gated call reaches the tool once.
    let lease = db.running_run("agent-1", 60_000).await.0;
    let call = raw_call(5, "raw__record", "7", 1, &lease);
    let answer = http::post_mcp(&proxy.url, &[], &call).await;
    let answer = json_rpc(&answer.body);
    assert!(answer["result"]["isError"] != json!(true), "{answer}");
    let calls = std::fs::read_to_string(state.join("calls.jsonl")).unwrap_or_default();
    assert_eq!(calls.lines().count(), 1, "{calls}");
    proxy.stop().await;
    let _ = std::fs::remove_dir_all(&state);
}

/// A server that asks `roots/list` at start (as server-filesystem does),
/// outside any agent's call, gets an empty list rather than an error; the
/// upstream stays up and serves. Its adapter may have it refused instead.
#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn an_upstreams_roots_list_outside_any_call_is_answered_with_no_roots(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let (setup, proxy, reply) = asking_roots(&db.url, "").await;
    assert_eq!(
        reply,
        json!({"jsonrpc": "2.0", "id": "roots-1", "result": {"roots": []}})
    );
    let answer = http::post_mcp(&proxy.url, &[], &tools_list(1, None)).await;
    assert_eq!(
        json_rpc(&answer.body)["result"]["tools"]
            .as_array()
            .map(Vec::len),
        Some(2)
    );
    proxy.stop().await;
    drop(setup);

    // Under the adapter's `roots_outside_calls = "refuse"`: an error saying
    // why, for servers that ask again within a call.
    let (_setup, proxy, reply) = asking_roots(&db.url, "roots_outside_calls = \"refuse\"\n").await;
    let message = reply["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("no call is in flight"), "{reply}");
    proxy.stop().await;
}

/// `raw_tools.py --ask-roots` behind leasegate, `adapter_head` at the top
/// of its adapter file; the answer its `roots/list` at start got.
async fn asking_roots(database_url: &str, adapter_head: &str) -> (Setup, RunningProxy, Value) {
    let setup = Setup::with_upstream(database_url, "reject", "", |state| {
        format!(
            "transport = \"stdio\"\ncommand = \"python3\"\nargs = [\"{RAW_TOOLS}\", \"{}\", \"--ask-roots\"]",
            state.display()
        )
    });
    let adapter = setup.dir.join("adapters/raw.toml");
    let text = std::fs::read_to_string(&adapter).unwrap();
    std::fs::write(&adapter, format!("{adapter_head}{text}")).unwrap();
    let proxy = RunningProxy::start(&setup.config()).await;
    let replies = setup.dir.join("state/replies.jsonl");
    let reply = common::wait_until("raw_tools.py to get its roots/list answered", || async {
        std::fs::read_to_string(&replies)
            .ok()
            .and_then(|text| text.lines().next().map(str::to_owned))
    })
    .await;
    (setup, proxy, serde_json::from_str(&reply).unwrap())
}
