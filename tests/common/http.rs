//! The one plain-HTTP client of the tests, for what an MCP client never
//! sends (malformed JSON-RPC) and for endpoints outside MCP (`/metrics`).

/// An HTTP answer: status and body text.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub body: String,
}

impl Answer {
    /// The JSON-RPC message an MCP endpoint answered: the first SSE `data:`
    /// line of a stream, or the body as it is.
    pub fn json_rpc(&self) -> serde_json::Value {
        let body = self
            .body
            .lines()
            .find_map(|line| line.strip_prefix("data:"))
            .unwrap_or(&self.body);
        serde_json::from_str(body.trim()).expect("a JSON-RPC answer")
    }
}

/// The message of the JSON-RPC error `answer` carries, after asserting the
/// error's `code` (`context` leads the failure message).
#[track_caller]
pub fn rpc_error_message<'a>(answer: &'a serde_json::Value, code: i64, context: &str) -> &'a str {
    assert_eq!(answer["error"]["code"], code, "{context}{answer}");
    answer["error"]["message"]
        .as_str()
        .unwrap_or_else(|| panic!("{context}an error without a message: {answer}"))
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(super::DEADLINE)
        .build()
        .expect("build an HTTP client")
}

/// `GET url`.
pub async fn get(url: &str) -> Answer {
    let response = client()
        .get(url)
        .send()
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e}"));
    answer(response).await
}

/// The headers a Streamable HTTP client sends with every JSON-RPC POST.
pub const MCP_HEADERS: [(&str, &str); 3] = [
    ("content-type", "application/json"),
    ("accept", "application/json, text/event-stream"),
    ("mcp-protocol-version", "2025-11-25"),
];

/// `POST url` of a JSON-RPC `body` as an MCP client sends it: the
/// [`MCP_HEADERS`], then `extra` (a name given twice is sent twice).
pub async fn post_mcp(url: &str, extra: &[(&str, &str)], body: &str) -> Answer {
    let mut headers = MCP_HEADERS.to_vec();
    headers.extend_from_slice(extra);
    post(url, &headers, body).await
}

/// `POST url` with `body` and `headers` (add `content-type` yourself).
pub async fn post(url: &str, headers: &[(&str, &str)], body: &str) -> Answer {
    let mut request = client().post(url).body(body.to_owned());
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request
        .send()
        .await
        .unwrap_or_else(|e| panic!("POST {url}: {e}"));
    answer(response).await
}

async fn answer(response: reqwest::Response) -> Answer {
    let status = response.status().as_u16();
    let body = response.text().await.expect("read the body");
    Answer { status, body }
}
