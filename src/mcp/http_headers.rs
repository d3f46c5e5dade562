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
