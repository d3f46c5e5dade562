//! A `leasegate stdio` that cannot start still answers its client: the
//! requests the client already sent (its `initialize`) get one JSON-RPC
//! error naming the cause and the fix, instead of a closed pipe that every
//! client reports as "connection closed" (the same text goes to stderr, as
//! before). Raw JSON lines, since no MCP session was ever set up.

use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use super::convert::codes;

/// How long a client that has sent nothing yet is waited for.
const WAIT_FOR_REQUEST: Duration = Duration::from_secs(2);

/// Answers the first request on stdin (waiting at most [`WAIT_FOR_REQUEST`]
/// for it) with `-31013` and `message`; notifications before it are
/// skipped. Never fails: the process exits with its own code after this.
pub async fn refuse_startup_on_stdio(message: &str) {
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    let mut stdout = tokio::io::stdout();
    let _ = tokio::time::timeout(WAIT_FOR_REQUEST, async {
        while let Ok(Some(line)) = lines.next_line().await {
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
            return;
        }
    })
    .await;
}
