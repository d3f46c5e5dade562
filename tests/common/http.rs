//! The one plain-HTTP client of the tests, for what an MCP client never
//! sends (malformed JSON-RPC) and for endpoints outside MCP (`/metrics`).

/// An HTTP answer: status and body text.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub body: String,
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
