//! Per-call HTTP headers on Streamable HTTP upstreams.
//!
//! rmcp's HTTP client sends the same headers on every request of a
//! connection. An adapter may want the operation id in a header of the one
//! `tools/call` it belongs to (`Idempotency-Key: <operation_id>`, as HTTP
//! APIs with idempotency keys expect). Dispatch puts such headers into the
//! request's `_meta` under [`HTTP_HEADERS_META`]; [`PerCallHeaders`], the
//! HTTP client of every Streamable HTTP upstream, takes them out of `_meta`
//! (the upstream never sees that key) and sends them as headers of that
//! POST only. Everything else is reqwest's own client, with idle
//! connections kept for reuse only [`POOL_IDLE_TIMEOUT`].

use std::collections::HashMap;
use std::sync::Arc;

use futures::stream::BoxStream;
use http::{HeaderName, HeaderValue};
use rmcp::model::{ClientJsonRpcMessage, GetMeta, JsonRpcMessage};
use rmcp::transport::streamable_http_client::{
    SseError, StreamableHttpClient, StreamableHttpError, StreamableHttpPostResponse,
    StreamableHttpResponseLimits,
};
use serde_json::Value;

pub use crate::adapter::HTTP_HEADERS_META;

/// reqwest's client, plus the per-call headers of each message.
#[derive(Clone)]
pub struct PerCallHeaders {
    inner: reqwest::Client,
}

/// How long an idle connection to an upstream is kept for reuse: below the
/// 5 s after which common servers (Node's `http`, uvicorn) close idle
/// keep-alive connections, so that a request is not written onto a
/// connection the server is closing at that moment — a request that may
/// then have been received, answered "unknown" (reqwest keeps them 90 s).
pub const POOL_IDLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);

impl Default for PerCallHeaders {
    fn default() -> Self {
        let inner = reqwest::Client::builder()
            .pool_idle_timeout(POOL_IDLE_TIMEOUT)
            .build()
            .unwrap_or_else(|error| {
                tracing::warn!(%error, "HTTP client with a short idle timeout unavailable; reqwest's default used");
                reqwest::Client::new()
            });
        Self { inner }
    }
}

/// Moves the `_meta` headers of a request into `headers`.
fn take_headers(
    message: &mut ClientJsonRpcMessage,
    headers: &mut HashMap<HeaderName, HeaderValue>,
) {
    let JsonRpcMessage::Request(request) = message else {
        return;
    };
    let Some(Value::Object(wanted)) = request.request.get_meta_mut().remove(HTTP_HEADERS_META)
    else {
        return;
    };
    for (name, value) in wanted {
        let (Ok(name), Some(Ok(value))) = (
            HeaderName::from_bytes(name.as_bytes()),
            value.as_str().map(HeaderValue::from_str),
        ) else {
            tracing::warn!(header = %name, "invalid per-call header not sent");
            continue;
        };
        headers.insert(name, value);
    }
}

impl StreamableHttpClient for PerCallHeaders {
    type Error = reqwest::Error;

    async fn post_message(
        &self,
        uri: Arc<str>,
        mut message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        mut custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
        take_headers(&mut message, &mut custom_headers);
        self.inner
            .post_message(uri, message, session_id, auth_header, custom_headers)
            .await
    }

    async fn post_message_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        mut message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        mut custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
        take_headers(&mut message, &mut custom_headers);
        self.inner
            .post_message_with_max_sse_event_size(
                uri,
                message,
                session_id,
                auth_header,
                custom_headers,
                max_sse_event_size,
            )
            .await
    }

    async fn post_message_with_response_limits(
        &self,
        uri: Arc<str>,
        mut message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        mut custom_headers: HashMap<HeaderName, HeaderValue>,
        limits: StreamableHttpResponseLimits,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
        take_headers(&mut message, &mut custom_headers);
        self.inner
            .post_message_with_response_limits(
                uri,
                message,
                session_id,
                auth_header,
                custom_headers,
                limits,
            )
            .await
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), StreamableHttpError<Self::Error>> {
        self.inner
            .delete_session(uri, session_id, auth_header, custom_headers)
            .await
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<
        BoxStream<'static, Result<sse_stream::Sse, SseError>>,
        StreamableHttpError<Self::Error>,
    > {
        self.inner
            .get_stream(uri, session_id, last_event_id, auth_header, custom_headers)
            .await
    }

    async fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<
        BoxStream<'static, Result<sse_stream::Sse, SseError>>,
        StreamableHttpError<Self::Error>,
    > {
        self.inner
            .get_stream_with_max_sse_event_size(
                uri,
                session_id,
                last_event_id,
                auth_header,
                custom_headers,
                max_sse_event_size,
            )
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

    /// An HTTP/1.1 server that answers every request with an empty 200 and
    /// keeps connections open; counts the connections it accepted.
    async fn counting_server() -> (String, Arc<AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/mcp", listener.local_addr().unwrap());
        let accepted = Arc::new(AtomicUsize::new(0));
        let counter = accepted.clone();
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                counter.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let (read, mut write) = socket.into_split();
                    let mut reader = BufReader::new(read);
                    loop {
                        let mut length = 0usize;
                        loop {
                            let mut line = String::new();
                            if reader.read_line(&mut line).await.unwrap_or(0) == 0 {
                                return;
                            }
                            let line = line.trim_end().to_ascii_lowercase();
                            if line.is_empty() {
                                break;
                            }
                            if let Some(value) = line.strip_prefix("content-length:") {
                                length = value.trim().parse().unwrap_or(0);
                            }
                        }
                        let mut body = vec![0; length];
                        if reader.read_exact(&mut body).await.is_err() {
                            return;
                        }
                        let answer = "HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
                        if write.write_all(answer.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        (url, accepted)
    }

    /// A connection idle longer than [`POOL_IDLE_TIMEOUT`] is not reused
    /// (servers close theirs after 5 s, and a request written onto a
    /// connection being closed may have been received), one idle for less
    /// is.
    #[tokio::test]
    async fn idle_connections_are_reused_only_within_the_pool_idle_timeout() {
        let (url, accepted) = counting_server().await;
        let client = PerCallHeaders::default().inner;
        let post = || async {
            let answer = client.post(&url).body("{}").send().await.unwrap();
            assert_eq!(answer.status(), 200);
            answer.bytes().await.unwrap();
        };
        post().await;
        post().await;
        assert_eq!(accepted.load(Ordering::SeqCst), 1, "reused while fresh");
        // The idle time is what is tested here.
        tokio::time::sleep(POOL_IDLE_TIMEOUT + std::time::Duration::from_millis(500)).await;
        post().await;
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            2,
            "a new connection after the idle timeout"
        );
    }
}
