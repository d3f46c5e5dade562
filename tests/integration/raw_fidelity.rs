//! What the agent wrote and what the tool declared, carried exactly, on
//! every front: numbers that JSON-RPC parsing would change are refused
//! before anything is registered or sent (or, under `integers =
//! "as_double"`, go on as doubles), and `tools/list` gives the agent every
//! field of the upstream's tool objects with only the name changed.
//!
//! The agents are raw (HTTP bodies and stdio lines written by hand: an SDK
//! would re-read the numbers itself); the tool server is
//! `tests/sdk/raw_tools.py`, which keeps each request line as received.

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
const ORDINARY: [&str; 7] = [
    "1",
    "-1",
    "0.5",
    "1e3",
    "9007199254740992",
    "1.5e300",
    "-0.000123",
];

/// A config with `raw_tools.py` as the stdio upstream `raw` (`echo`
/// read-only, `record` side-effecting) and `integers` as the policy's.
struct Setup {
    dir: PathBuf,
}

impl Setup {
    fn new(database_url: &str, integers: &str, extra_config: &str) -> Self {
        let dir =
            std::env::temp_dir().join(format!("leasegate-raw-{}", uuid::Uuid::new_v4().simple()));
        for sub in ["adapters", "policies", "state"] {
            std::fs::create_dir_all(dir.join(sub)).unwrap();
        }
        let config = format!(
            "{extra_config}\n{head}\n[upstreams.raw]\ntransport = \"stdio\"\ncommand = \"python3\"\nargs = [\"{RAW_TOOLS}\", \"{state}\"]\n",
            head = config_head(database_url, "off"),
            state = dir.join("state").display()
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
                let answer = front.call(id, &raw_call(id, tool, token, tag, &lease)).await;
                let context = format!("{} {tool} {token}: ", front.name());
                let message = http::rpc_error_message(&answer, -32602, &context);
                assert!(
                    message.starts_with(&format!(
                        "number {token} at $.n cannot be carried exactly"
                    )),
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
    assert!(setup.calls().is_empty(), "the tool saw nothing");
    assert_eq!(db.row_count("tool_operations").await, 0, "nothing registered");

    // `1.8446744073709552e19` is a double's own spelling: a read-only tool
    // gets it as written; a gated call refuses it by the ±2^53 rule (it
    // shares its digest with 2^64).
    for front in &mut fronts {
        id += 1;
        tag += 1;
        let line = raw_call(id, "raw__echo", "1.8446744073709552e19", tag, &lease);
        let answer = front.call(id, &line).await;
        assert!(answer.get("result").is_some(), "{answer}");
        id += 1;
        tag += 1;
        let line = raw_call(id, "raw__record", "1.8446744073709552e19", tag, &lease);
        let message =
            http::rpc_error_message(&front.call(id, &line).await, -32602, "").to_owned();
        assert!(
            message.starts_with("integer 1.8446744073709552e19 at $.n is beyond ±2^53"),
            "{message}"
        );
    }
    let calls = setup.calls();
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert!(
        calls
            .iter()
            .all(|line| line.contains(r#""n":1.8446744073709552e+19"#)),
        "{calls:?}"
    );
    assert_eq!(db.row_count("tool_operations").await, 0);

    // Ordinary numbers pass both tools unchanged in value.
    for front in &mut fronts {
        for tool in ["raw__echo", "raw__record"] {
            for token in ORDINARY {
                id += 1;
                tag += 1;
                let answer = front.call(id, &raw_call(id, tool, token, tag, &lease)).await;
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
    assert_eq!(setup.calls().len(), 2 + 2 * 2 * ORDINARY.len());
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
                let answer = front.call(id, &raw_call(id, tool, token, tag, &lease)).await;
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
