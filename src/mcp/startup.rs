//! A `leasegate stdio` that cannot start still answers its client: the
//! requests the client sends (its `initialize`, or a protocol probe and
//! then `initialize`) each get a JSON-RPC error naming the cause and the
//! fix, instead of a closed pipe that every
//! client reports as "connection closed" (the same text goes to stderr, as
//! before). Raw JSON lines, since no MCP session was ever set up.

use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use super::convert::codes;

/// How long the client's next request is waited for.
const WAIT_FOR_REQUEST: Duration = Duration::from_secs(2);

/// Requests answered at most, so a client that keeps retrying cannot keep
/// the process.
const ANSWERS_AT_MOST: usize = 8;

/// Answers each request on stdin with `-31013` and `message`, until stdin
/// closes, [`WAIT_FOR_REQUEST`] passes without a request, or
/// [`ANSWERS_AT_MOST`] were answered; notifications are skipped. Not only
/// the first request: a client whose first is a protocol probe
/// (`server/discover`) falls back to `initialize` on an error and must hear
/// the cause there too, not a closed pipe. Never fails: the process exits
/// with its own code after this.
pub async fn refuse_startup_on_stdio(message: &str) {
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    let mut stdout = tokio::io::stdout();
    let mut answered = 0;
    while answered < ANSWERS_AT_MOST {
        let Ok(Ok(Some(line))) = tokio::time::timeout(WAIT_FOR_REQUEST, lines.next_line()).await
        else {
            return;
        };
        let Ok(request) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        let Some(id) = request
            .get("id")
            .filter(|_| request.get("method").is_some())
        else {
            continue;
        };
        let answer = json!({
            "jsonrpc": "2.0",
            "id": id,
            "error": {
                "code": codes::NOT_STARTED,
                "message": format!("leasegate could not start, nothing was sent: {message}"),
                "data": {"reason": "not_started"},
            },
        });
        let _ = stdout.write_all(format!("{answer}\n").as_bytes()).await;
        let _ = stdout.flush().await;
        answered += 1;
    }
}
