//! The HTTP client of Streamable HTTP upstreams: per-call headers, and the
//! raw answers of `tools/list`.
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
//!
//! rmcp's client decodes a JSON answer into its typed model before the
//! transport hands it on, which drops the tool fields that model does not
//! know. So a `tools/list` POST, when a [`ToolListTap`] is set, is sent
//! here: the same request, and each answer's raw bytes (the JSON body, or
//! each SSE event's data) go to the tap before rmcp decodes them.
//!
//! # Invariants
//!
//! 1. A `tools/list` POST is sent as rmcp's client sends it (method, URL,
//!    `Accept`, session and custom headers, JSON body) and its answer
//!    becomes what rmcp's client makes of it for the cases a request sees:
//!    202/204 accepted, 404 under a session `SessionExpired`, a 2xx JSON
//!    body (within `max_json_response_size`) one message, a 2xx event
//!    stream the stream (each event within `max_sse_event_size`), a
//!    JSON-RPC error body that error, 429 and 5xx their status; anything
//!    else an unexpected response naming the status or content type.
//! 2. The tap only reads: the bytes rmcp decodes are the bytes tapped.

use std::collections::HashMap;
use std::sync::Arc;

use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use http::{HeaderName, HeaderValue, StatusCode};
use rmcp::model::{
    ClientJsonRpcMessage, ClientRequest, GetMeta, JsonRpcMessage, ServerJsonRpcMessage,
};
use rmcp::transport::common::http_header::{
    EVENT_STREAM_MIME_TYPE, HEADER_SESSION_ID, JSON_MIME_TYPE,
};
use rmcp::transport::streamable_http_client::{
    HttpStatusError, SseError, StreamableHttpClient, StreamableHttpError,
    StreamableHttpPostResponse, StreamableHttpResponseLimits,
};
use serde_json::Value;

pub use crate::adapter::HTTP_HEADERS_META;

/// reqwest's client, plus the per-call headers of each message and the tap
/// of `tools/list` answers.
#[derive(Clone)]
pub struct PerCallHeaders {
    inner: reqwest::Client,
    tool_lists: Option<ToolListTap>,
}

/// Told the raw bytes of each message answering a `tools/list` POST (a JSON
/// body, an SSE event's data) before rmcp decodes them; it only reads
/// (invariant 2).
pub type ToolListTap = Arc<dyn Fn(&[u8]) + Send + Sync>;

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
        Self {
            inner,
            tool_lists: None,
        }
    }
}

impl PerCallHeaders {
    /// This client, with each `tools/list` answer told to `tap`.
    pub fn with_tool_list_tap(mut self, tap: ToolListTap) -> Self {
        self.tool_lists = Some(tap);
        self
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

fn is_tools_list(message: &ClientJsonRpcMessage) -> bool {
    matches!(message, JsonRpcMessage::Request(request)
        if matches!(request.request, ClientRequest::ListToolsRequest(_)))
}

/// Where and with what headers a POST goes, as rmcp's client hands it over.
struct Post {
    uri: Arc<str>,
    session_id: Option<Arc<str>>,
    auth_header: Option<String>,
    custom_headers: HashMap<HeaderName, HeaderValue>,
}

type HttpError = StreamableHttpError<reqwest::Error>;

/// The media type of a `Content-Type` value, lowercase, without parameters.
fn media_type(value: Option<&HeaderValue>) -> Option<String> {
    let value = value?.to_str().ok()?;
    let essence = value.split(';').next().unwrap_or(value);
    Some(essence.trim().to_ascii_lowercase())
}

impl PerCallHeaders {
    /// A `tools/list` POST, its answer's bytes told to `tap` (invariants 1
    /// and 2).
    async fn post_tools_list(
        &self,
        tap: &ToolListTap,
        post: Post,
        message: &ClientJsonRpcMessage,
        limits: StreamableHttpResponseLimits,
    ) -> Result<StreamableHttpPostResponse, HttpError> {
        let accept = format!("{EVENT_STREAM_MIME_TYPE}, {JSON_MIME_TYPE}");
        let mut request = self
            .inner
            .post(post.uri.as_ref())
            .header(http::header::ACCEPT, accept);
        if let Some(token) = post.auth_header {
            request = request.bearer_auth(token);
        }
        for (name, value) in post.custom_headers {
            request = request.header(name, value);
        }
        let in_session = post.session_id.is_some();
        if let Some(session) = post.session_id {
            request = request.header(HEADER_SESSION_ID, session.as_ref());
        }
        let response = request.json(message).send().await?;
        let status = response.status();
        if matches!(status, StatusCode::ACCEPTED | StatusCode::NO_CONTENT) {
            return Ok(StreamableHttpPostResponse::Accepted);
        }
        if status == StatusCode::NOT_FOUND && in_session {
            return Err(StreamableHttpError::SessionExpired);
        }
        let session = response
            .headers()
            .get(HEADER_SESSION_ID)
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned);
        let media = media_type(response.headers().get(http::header::CONTENT_TYPE));
        let retry_after = response
            .headers()
            .get(http::header::RETRY_AFTER)
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned);
        let is_json = media.as_deref() == Some(JSON_MIME_TYPE);
        if status.is_success() && media.as_deref() == Some(EVENT_STREAM_MIME_TYPE) {
            let tap = tap.clone();
            let bytes = bounded_events(response.bytes_stream(), limits.max_sse_event_size);
            let events = sse_stream::SseStream::from_bytes_stream(bytes)
                .inspect_ok(move |event| {
                    if let Some(data) = &event.data {
                        tap(data.as_bytes());
                    }
                })
                .boxed();
            return Ok(StreamableHttpPostResponse::Sse(events, session));
        }
        let answer = if is_json && status != StatusCode::TOO_MANY_REQUESTS {
            let body = read_bounded(response, limits.max_json_response_size).await?;
            if status.is_success() {
                tap(&body);
            }
            Some(serde_json::from_slice::<ServerJsonRpcMessage>(&body))
        } else {
            None
        };
        match answer {
            Some(Ok(message)) if status.is_success() => {
                Ok(StreamableHttpPostResponse::Json(message, session))
            }
            Some(Ok(error @ JsonRpcMessage::Error(_))) => {
                Ok(StreamableHttpPostResponse::Json(error, session))
            }
            Some(Err(error)) if status.is_success() => {
                Err(StreamableHttpError::UnexpectedServerResponse(
                    format!("could not parse the tools/list answer: {error}").into(),
                ))
            }
            _ if status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error() => {
                Err(HttpStatusError::new(status.as_u16(), retry_after).into())
            }
            _ if status.is_success() => Err(StreamableHttpError::UnexpectedContentType(media)),
            _ => Err(StreamableHttpError::UnexpectedServerResponse(
                format!("HTTP {status}").into(),
            )),
        }
    }
}

/// A response body of at most `max` bytes.
async fn read_bounded(response: reqwest::Response, max: usize) -> Result<Vec<u8>, HttpError> {
    let too_large = StreamableHttpError::ResponseBodyTooLarge { max_size: max };
    if response
        .content_length()
        .is_some_and(|length| length > max as u64)
    {
        return Err(too_large);
    }
    let mut stream = response.bytes_stream();
    let mut body = Vec::new();
    while let Some(chunk) = stream.try_next().await? {
        if chunk.len() > max - body.len() {
            return Err(too_large);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// Why the event stream of a `tools/list` answer ended early.
#[derive(Debug, thiserror::Error)]
enum EventStreamError {
    #[error(transparent)]
    Read(#[from] reqwest::Error),
    #[error("an SSE event of the tools/list answer exceeded {max} bytes")]
    TooLarge { max: usize },
}

/// `bytes` as an SSE body whose events (the bytes between blank lines) are
/// at most `max` bytes each; a longer one ends the stream with an error.
fn bounded_events<S>(
    bytes: S,
    max: usize,
) -> impl futures::Stream<Item = Result<bytes::Bytes, EventStreamError>>
where
    S: futures::Stream<Item = Result<bytes::Bytes, reqwest::Error>>,
{
    // (bytes of the event before this line, bytes of this line, ended)
    let state = (0usize, 0usize, false);
    bytes.scan(state, move |(event, line, ended), chunk| {
        let item = if *ended {
            None
        } else {
            let checked = chunk.map_err(EventStreamError::from).and_then(|chunk| {
                for &byte in chunk.iter() {
                    match byte {
                        b'\n' if *line == 0 => *event = 0,
                        b'\n' => (*event, *line) = (*event + *line + 1, 0),
                        b'\r' => {}
                        _ => *line += 1,
                    }
                    if *event + *line > max {
                        return Err(EventStreamError::TooLarge { max });
                    }
                }
                Ok(chunk)
            });
            *ended = checked.is_err();
            Some(checked)
        };
        std::future::ready(item)
    })
}

impl StreamableHttpClient for PerCallHeaders {
    type Error = reqwest::Error;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
        self.post_message_with_response_limits(
            uri,
            message,
            session_id,
            auth_header,
            custom_headers,
            StreamableHttpResponseLimits::default(),
        )
        .await
    }

    async fn post_message_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
        let mut limits = StreamableHttpResponseLimits::default();
        limits.max_sse_event_size = max_sse_event_size;
        self.post_message_with_response_limits(
            uri,
            message,
            session_id,
            auth_header,
            custom_headers,
            limits,
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
        if let Some(tap) = &self.tool_lists
            && is_tools_list(&message)
        {
            let post = Post {
                uri,
                session_id,
                auth_header,
                custom_headers,
            };
            return self.post_tools_list(tap, post, &message, limits).await;
        }
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

    /// An HTTP/1.1 server that answers every request with `answer` (a
    /// whole response) and keeps connections open; counts the connections
    /// it accepted.
    async fn answering(answer: &'static str) -> (String, Arc<AtomicUsize>) {
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
                        if write.write_all(answer.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        (url, accepted)
    }

    /// [`answering`] with an empty 200.
    async fn counting_server() -> (String, Arc<AtomicUsize>) {
        answering("HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n").await
    }

    /// A `tools/list` POST sent here answers as rmcp's client would
    /// (invariant 1) where it is not a message to tap.
    #[tokio::test]
    async fn a_tools_list_post_that_is_not_answered_with_a_message_reads_as_rmcp_reads_it() {
        let seen = Arc::new(AtomicUsize::new(0));
        let counter = seen.clone();
        let client = PerCallHeaders::default().with_tool_list_tap(Arc::new(move |_: &[u8]| {
            counter.fetch_add(1, Ordering::SeqCst);
        }));
        let list: ClientJsonRpcMessage = serde_json::from_value(serde_json::json!(
            {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}))
        .unwrap();
        let post = |answer: &'static str| {
            let client = client.clone();
            let list = list.clone();
            async move {
                let (url, _) = answering(answer).await;
                client
                    .post_message(url.into(), list, Some("s-1".into()), None, HashMap::new())
                    .await
            }
        };
        let gone = post("HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n").await;
        assert!(matches!(gone, Err(StreamableHttpError::SessionExpired)));
        let busy =
            post("HTTP/1.1 503 Service Unavailable\r\nretry-after: 7\r\ncontent-length: 0\r\n\r\n")
                .await;
        let Err(StreamableHttpError::HttpStatus(status)) = busy else {
            panic!("503 is an HTTP status error");
        };
        assert_eq!(
            (status.status, status.retry_after.as_deref()),
            (503, Some("7"))
        );
        let refused = post(
            "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: 66\r\n\r\n\
             {\"jsonrpc\":\"2.0\",\"id\":1,\"error\":{\"code\":-32602,\"message\":\"no\"}}   ",
        )
        .await;
        assert!(
            matches!(
                refused,
                Ok(StreamableHttpPostResponse::Json(
                    JsonRpcMessage::Error(_),
                    _
                ))
            ),
            "a JSON-RPC error body is that error"
        );
        let text =
            post("HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 2\r\n\r\nhi")
                .await;
        assert!(matches!(
            text,
            Err(StreamableHttpError::UnexpectedContentType(Some(ref t))) if t == "text/plain"
        ));
        let broken = post(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}",
        )
        .await;
        assert!(matches!(
            broken,
            Err(StreamableHttpError::UnexpectedServerResponse(_))
        ));
        assert_eq!(
            seen.load(Ordering::SeqCst),
            1,
            "only the 2xx JSON body is tapped"
        );
    }

    /// An event stream passes unchanged while each event (the bytes
    /// between blank lines) is within the bound; a longer event ends it
    /// with an error and nothing after.
    #[tokio::test]
    async fn events_over_the_bound_end_the_stream() {
        use futures::StreamExt;
        let chunks = |parts: &[&'static str]| {
            futures::stream::iter(
                parts
                    .iter()
                    .map(|part| Ok(bytes::Bytes::from_static(part.as_bytes())))
                    .collect::<Vec<Result<_, reqwest::Error>>>(),
            )
        };
        let within = ["data: 12345\n", "\n", "data: 1234", "5\r\n\r\n"];
        let passed: Vec<_> = bounded_events(chunks(&within), 12).collect().await;
        assert_eq!(passed.len(), 4);
        assert!(passed.iter().all(Result::is_ok));

        let over = ["data: 1\n", "data: 2345\n", "\n", "data: 1\n\n"];
        let ended: Vec<_> = bounded_events(chunks(&over), 12).collect().await;
        assert_eq!(ended.len(), 2, "the stream ends at the long event");
        assert!(ended[0].is_ok());
        assert!(matches!(
            ended[1],
            Err(EventStreamError::TooLarge { max: 12 })
        ));
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
