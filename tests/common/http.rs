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
