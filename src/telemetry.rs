//! Traces: leasegate's `tracing` spans as OpenTelemetry spans, exported over
//! OTLP (http/protobuf) when `[telemetry] otlp_endpoint` is set, and the W3C
//! trace context that ties agent → leasegate → tool into one trace.
//!
//! # Span tree of one gated call
//!
//! ```text
//! tools/call                      (parent: the agent's traceparent, from _meta or headers)
//! ├── ledger.operation_register_claim
//! └── dispatch                    (operation_id, run_id, epoch, tool, outcome)
//!     ├── upstream.attempt        (attempt n; the upstream's traceparent names this span)
//!     └── ledger.operation_settle | ledger.operation_mark_unknown | ledger.operation_release_unsent
//! ```
//!
//! Background loops open one span per activation (`outbox.pass`,
//! `claim_expiry.pass`, `reconciler.pass`) and one per reconcile step
//! (`reconcile.operation`). Run, operation, epoch, tool and outcome are span
//! attributes, never metric labels.
//!
//! # Invariants
//!
//! 1. Off unless configured: with no `otlp_endpoint` no OpenTelemetry layer
//!    is installed, and the upstream receives the agent's own `traceparent`
//!    unchanged (as before traces existed).
//! 2. With the layer installed, the upstream receives a `traceparent` whose
//!    parent span id is the span of the upstream attempt that sent it
//!    ([`upstream_trace_context`]); the agent's `tracestate` travels on.
//! 3. Only leasegate's own spans are exported (target `leasegate`): the
//!    libraries' spans (rmcp, sqlx, hyper) may carry message bodies.
//!
//! # Failure handling
//!
//! Export runs on the SDK's batch thread: an unreachable collector drops
//! spans (the SDK logs it) and never slows or fails a call. At shutdown
//! [`Tracing::shutdown`] flushes what is queued, bounded by the exporter's
//! timeout. If the process crashes, spans still queued are lost; the ledger,
//! not the trace, is the record of what happened.

use std::collections::HashMap;
use std::time::Duration;

use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The OTLP protocols leasegate can speak.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// OTLP over HTTP with protobuf bodies (`<endpoint>/v1/traces`).
    HttpProtobuf,
}

impl Protocol {
    pub fn parse(text: &str) -> Result<Self, String> {
        match text {
            "http/protobuf" => Ok(Self::HttpProtobuf),
            other => Err(format!(
                "{other:?} is not a supported protocol (expected \"http/protobuf\")"
            )),
        }
    }
}

/// `[telemetry]`, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// `None`: traces are off.
    pub otlp_endpoint: Option<String>,
    pub protocol: Protocol,
    /// `service.name` of every span.
    pub service_name: String,
    /// Fraction of new traces recorded (0.0–1.0); a trace the agent started
    /// follows the agent's sampled flag.
    pub sampling_ratio: f64,
    /// How long one export may take.
    pub export_timeout: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            otlp_endpoint: None,
            protocol: Protocol::HttpProtobuf,
            service_name: "leasegate".to_owned(),
            sampling_ratio: 1.0,
            export_timeout: Duration::from_secs(10),
        }
    }
}

/// Why traces could not be set up.
#[derive(Debug, thiserror::Error)]
#[error("telemetry: {0}")]
pub struct TelemetryError(String);

/// An installed tracer provider; [`Tracing::shutdown`] flushes it.
pub struct Tracing {
    provider: SdkTracerProvider,
}

impl Tracing {
    /// The OTLP exporter for `settings`, or `None` when traces are off.
    pub fn from_settings(settings: &Settings) -> Result<Option<Self>, TelemetryError> {
        let Some(endpoint) = &settings.otlp_endpoint else {
            return Ok(None);
        };
        use opentelemetry_otlp::WithExportConfig as _;
        let Protocol::HttpProtobuf = settings.protocol;
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .with_endpoint(traces_url(endpoint))
            .with_timeout(settings.export_timeout)
            .build()
            .map_err(|e| TelemetryError(format!("otlp exporter for {endpoint}: {e}")))?;
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_sampler(sampler(settings.sampling_ratio))
            .with_resource(resource(&settings.service_name))
            .build();
        Ok(Some(Self { provider }))
    }

    /// Spans go to `exporter` as each one ends (tests: an in-memory exporter).
    pub fn with_exporter(
        exporter: impl opentelemetry_sdk::trace::SpanExporter + 'static,
        settings: &Settings,
    ) -> Self {
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(exporter)
            .with_sampler(sampler(settings.sampling_ratio))
            .with_resource(resource(&settings.service_name))
            .build();
        Self { provider }
    }

    /// The `tracing` layer that turns leasegate's spans into OpenTelemetry
    /// spans (invariant 3: only target `leasegate`).
    pub fn layer<S>(&self) -> impl tracing_subscriber::Layer<S> + use<S>
    where
        S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    {
        use tracing_subscriber::Layer as _;
        let tracer = self.provider.tracer("leasegate");
        tracing_opentelemetry::layer()
            .with_tracer(tracer)
            .with_error_events_to_status(false)
            .with_filter(
                tracing_subscriber::filter::Targets::new()
                    .with_target("leasegate", tracing::Level::INFO),
            )
    }

    /// Exports what is queued (bounded by the exporter's timeout).
    pub fn shutdown(&self) {
        if let Err(error) = self.provider.shutdown() {
            eprintln!("leasegate: telemetry: flushing spans at shutdown failed: {error}");
        }
    }
}

/// `<endpoint>/v1/traces`, unless the endpoint already names that path.
fn traces_url(endpoint: &str) -> String {
    let endpoint = endpoint.trim_end_matches('/');
    if endpoint.ends_with("/v1/traces") {
        endpoint.to_owned()
    } else {
        format!("{endpoint}/v1/traces")
    }
}

fn sampler(ratio: f64) -> Sampler {
    Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(ratio)))
}

fn resource(service_name: &str) -> opentelemetry_sdk::Resource {
    opentelemetry_sdk::Resource::builder()
        .with_service_name(service_name.to_owned())
        .build()
}

struct Carrier<'a>(&'a mut HashMap<String, String>);

impl Injector for Carrier<'_> {
    fn set(&mut self, key: &str, value: String) {
        self.0.insert(key.to_owned(), value);
    }
}

impl Extractor for Carrier<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(String::as_str).collect()
    }
}

/// Makes the agent's W3C trace context the parent of `span`. A missing or
/// malformed `traceparent` leaves `span` a root (a new trace).
pub fn set_parent(span: &tracing::Span, traceparent: Option<&str>, tracestate: Option<&str>) {
    let Some(traceparent) = traceparent else {
        return;
    };
    let mut fields = HashMap::new();
    fields.insert("traceparent".to_owned(), traceparent.to_owned());
    if let Some(state) = tracestate {
        fields.insert("tracestate".to_owned(), state.to_owned());
    }
    let context = TraceContextPropagator::new().extract(&Carrier(&mut fields));
    if context.span().span_context().is_valid() {
        // Fails only when the span is already started in OpenTelemetry
        // terms or no layer is installed; either way it stays a root.
        let _ = span.set_parent(context);
    }
}

/// The W3C trace context to send upstream from within `span`: its
/// `traceparent` (and `tracestate`), or `None` when no OpenTelemetry layer
/// is installed (invariant 1: the agent's own context is passed on then).
pub fn upstream_trace_context(span: &tracing::Span) -> Option<(String, Option<String>)> {
    let context = span.context();
    if !context.span().span_context().is_valid() {
        return None;
    }
    let mut fields = HashMap::new();
    TraceContextPropagator::new().inject_context(&context, &mut Carrier(&mut fields));
    let traceparent = fields.remove("traceparent")?;
    Some((traceparent, fields.remove("tracestate")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_traces_url_is_appended_once() {
        assert_eq!(
            traces_url("http://127.0.0.1:4318"),
            "http://127.0.0.1:4318/v1/traces"
        );
        assert_eq!(
            traces_url("http://c:4318/v1/traces/"),
            "http://c:4318/v1/traces"
        );
    }

    #[test]
    fn only_http_protobuf_is_spoken() {
        assert_eq!(
            Protocol::parse("http/protobuf").unwrap(),
            Protocol::HttpProtobuf
        );
        assert_eq!(
            Protocol::parse("grpc").unwrap_err(),
            "\"grpc\" is not a supported protocol (expected \"http/protobuf\")"
        );
    }

    #[test]
    fn without_a_layer_nothing_replaces_the_agents_context() {
        let span = tracing::info_span!("x");
        assert_eq!(upstream_trace_context(&span), None);
    }
}
