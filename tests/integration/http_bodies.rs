//! Bodies the MCP front's HTTP listener cannot take whole, on one raw
//! HTTP/1.1 connection against a real `leasegate serve`: a body over the
//! limit is answered with a JSON-RPC error under its id and the same
//! connection serves the next request; a body beyond the drain cap is
//! answered and its connection closed; a body nested too deep is a parse
//! error under its id. Nothing reaches the ledger.

use crate::common;

use common::TestDb;
use common::proxy::RunningProxy;
use serde_json::{Value, json};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

const POLICY: &str = "claim_ttl = \"60s\"\n";

/// The MCP front's body limit with the default `max_arguments_bytes`.
const LIMIT: usize = 4 * 1024 * 1024 + 64 * 1024;

/// One answer read off the connection.
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn json(&self) -> Value {
        let text = String::from_utf8_lossy(&self.body);
        // A JSON answer, or an event stream's first data line.
        serde_json::from_str(&text).unwrap_or_else(|_| {
            text.lines()
                .find_map(|line| line.strip_prefix("data:"))
                .and_then(|data| serde_json::from_str(data.trim()).ok())
                .unwrap_or_else(|| panic!("no JSON in the answer: {text}"))
        })
    }
}

fn head(host: &str, length: usize) -> String {
    format!(
        "POST /mcp HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n\
         accept: application/json, text/event-stream\r\nmcp-protocol-version: 2025-11-25\r\n\
         content-length: {length}\r\n\r\n"
    )
}

async fn read_answer(reader: &mut BufReader<tokio::net::tcp::OwnedReadHalf>) -> Answer {
    let mut status_line = String::new();
    reader.read_line(&mut status_line).await.unwrap();
    let status = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {status_line:?}"));
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).await.unwrap();
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        let (name, value) = line.split_once(':').unwrap();
        headers.push((name.trim().to_owned(), value.trim().to_owned()));
    }
    let mut answer = Answer {
        status,
        headers,
        body: Vec::new(),
    };
    if let Some(length) = answer.header("content-length") {
        let mut body = vec![0; length.parse().unwrap()];
        reader.read_exact(&mut body).await.unwrap();
        answer.body = body;
    } else if answer
        .header("transfer-encoding")
        .is_some_and(|t| t.contains("chunked"))
    {
        loop {
            let mut size = String::new();
            reader.read_line(&mut size).await.unwrap();
            let size = usize::from_str_radix(size.trim(), 16).unwrap();
            let mut chunk = vec![0; size + 2];
            reader.read_exact(&mut chunk).await.unwrap();
            if size == 0 {
                break;
            }
            answer.body.extend_from_slice(&chunk[..size]);
        }
    }
    answer
}

/// A `tools/call` body of exactly `length` bytes whose id comes first.
fn call_of(id: u64, length: usize) -> Vec<u8> {
    let start = format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"payments__charge","arguments":{{"pad":""#
    );
    let end = r#""}}}"#;
    let mut body = start.into_bytes();
    body.resize(length - end.len(), b'x');
    body.extend_from_slice(end.as_bytes());
    body
}

#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn an_oversized_body_is_a_json_rpc_error_on_a_connection_that_stays_usable(
    pool: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let db = TestDb::new(pool, connect).await;
    let (_scenario, proxy) = RunningProxy::serve(&db.url, POLICY).await;
    let host = proxy
        .url
        .trim_start_matches("http://")
        .split('/')
        .next()
        .unwrap()
        .to_owned();
    let operations = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM tool_operations")
            .fetch_one(&db.admin)
            .await
            .unwrap()
    };

    // Twice the limit: drained, answered 413 with the JSON-RPC error under
    // the request's id, and the same connection answers the next request.
    let stream = TcpStream::connect(&host).await.unwrap();
    let (read, mut write) = stream.into_split();
    let mut reader = BufReader::new(read);
    let body = call_of(31, 2 * LIMIT);
    let first_head = head(&host, body.len());
    let writer = tokio::spawn(async move {
        write.write_all(first_head.as_bytes()).await?;
        write.write_all(&body).await?;
        Ok::<_, std::io::Error>(write)
    });
    let answer = common::within("the oversized call's answer", read_answer(&mut reader)).await;
    let mut write = writer
        .await
        .unwrap()
        .expect("the whole body was taken (drained)");
    assert_eq!(answer.status, 413);
    assert_ne!(answer.header("connection"), Some("close"));
    let error = answer.json();
    assert_eq!(error["id"], 31, "{error}");
    assert_eq!(error["error"]["code"], -32600, "{error}");
    assert_eq!(
        error["error"]["data"]["reason"], "body_too_large",
        "{error}"
    );
    assert_eq!(error["error"]["data"]["limit_bytes"], LIMIT, "{error}");
    let message = error["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("max_arguments_bytes") && message.contains(&LIMIT.to_string()),
        "{message}"
    );
    let ping = json!({"jsonrpc": "2.0", "id": 32, "method": "ping"}).to_string();
    write
        .write_all(format!("{}{ping}", head(&host, ping.len())).as_bytes())
        .await
        .unwrap();
    let answer = common::within("the ping on the same connection", read_answer(&mut reader)).await;
    assert_eq!(answer.status, 200);
    let pong = answer.json();
    assert_eq!(
        (pong["id"].clone(), pong.get("result").is_some()),
        (json!(32), true),
        "{pong}"
    );

    // A body nested too deep on the same connection: -32700 under its id.
    let deep = format!(
        r#"{{"jsonrpc":"2.0","id":33,"method":"tools/call","params":{{"name":"payments__charge","arguments":{{"a":{}1{}}}}}}}"#,
        "[".repeat(200),
        "]".repeat(200)
    );
    write
        .write_all(format!("{}{deep}", head(&host, deep.len())).as_bytes())
        .await
        .unwrap();
    let error = common::within("the deep call's answer", read_answer(&mut reader))
        .await
        .json();
    assert_eq!(error["id"], 33, "{error}");
    assert_eq!(error["error"]["code"], -32700, "{error}");

    // Beyond the drain cap (four times the limit): answered, then closed.
    let stream = TcpStream::connect(&host).await.unwrap();
    let (read, mut write) = stream.into_split();
    let mut reader = BufReader::new(read);
    let length = 5 * LIMIT;
    let head_text = head(&host, length);
    let writer = tokio::spawn(async move {
        // The server stops reading past the cap: this write may fail.
        let _ = write.write_all(head_text.as_bytes()).await;
        let _ = write.write_all(&call_of(34, length)).await;
    });
    let answer = common::within("the answer past the cap", read_answer(&mut reader)).await;
    assert_eq!(answer.status, 413);
    assert_eq!(answer.header("connection"), Some("close"));
    assert_eq!(answer.json()["id"], 34);
    // Closed: the read ends (end of stream, or a reset) within the deadline.
    let mut rest = Vec::new();
    let _ = common::within("the connection to close", reader.read_to_end(&mut rest)).await;
    assert!(rest.is_empty(), "nothing follows the answer");
    writer.abort();

    assert_eq!(operations().await, 0, "nothing reached the ledger");
    proxy.stop().await;
}

/// A client whose `Accept` takes anything (`*/*`) accepts both answers
/// Streamable HTTP gives: served, not 406.
#[sqlx::test(migrator = "leasegate::ledger::MIGRATOR")]
async fn an_accept_of_anything_is_served(pool: PgPoolOptions, connect: PgConnectOptions) {
    let db = TestDb::new(pool, connect).await;
    let (_scenario, proxy) = RunningProxy::serve(&db.url, "").await;
    let client = reqwest::Client::builder()
        .timeout(common::DEADLINE)
        .build()
        .unwrap();
    for accept in ["*/*", "application/*, text/*"] {
        let answer = client
            .post(&proxy.url)
            .header("content-type", "application/json")
            .header("accept", accept)
            .header("mcp-protocol-version", "2025-11-25")
            .body(r#"{"jsonrpc":"2.0","id":7,"method":"tools/list","params":{}}"#)
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 200, "{accept}");
        let body = answer.text().await.unwrap();
        assert!(body.contains("\"tools\""), "{accept}: {body}");
    }
    proxy.stop().await;
}
