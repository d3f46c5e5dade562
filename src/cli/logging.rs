//! Logging set-up for the commands that log (`serve`, `stdio`, `migrate`,
//! `secrets rotate`, `init`): stderr, text or one JSON object per line
//! (`LEASEGATE_LOG_FORMAT=json`), spans to OpenTelemetry when
//! `[telemetry]` asks. Set up once per process; the operator commands print
//! only their answer and set up none.

use crate::telemetry::Tracing;

/// Logs to stderr; `LEASEGATE_LOG_FORMAT=json`: one JSON object per line,
/// span fields (run_id, owner, epoch, operation_id, tool) included.
/// `default`: the filter when `RUST_LOG` is not set.
///
/// Argument and result values never reach the log, whatever `RUST_LOG`
/// says: the libraries that print whole messages below `info` (rmcp prints
/// every request and response at `debug`; the HTTP stacks at `trace`) are
/// held at `info`, unless `LEASEGATE_LOG_BODIES=1` says otherwise — the one
/// explicit, documented setting for debugging with bodies in the log.
pub(super) fn init_logging(default: &str, traces: Option<&Tracing>) {
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let bodies = log_bodies();
    let no_bodies = tracing_subscriber::filter::filter_fn(move |meta| {
        bodies
            || (!rmcp_error_answer(meta)
                && (*meta.level() <= tracing::Level::INFO || !prints_bodies(meta.target())))
    });
    // One filter: RUST_LOG (or the default), and never bodies.
    let filter = tracing_subscriber::filter::FilterExt::and(filter, no_bodies);
    let layer = tracing_subscriber::fmt::layer()
        .with_writer(|| CappedStderr)
        .with_ansi(false);
    // Spans to OpenTelemetry (only leasegate's own: `telemetry`), when
    // `[telemetry] otlp_endpoint` is set.
    let registry = tracing_subscriber::registry().with(traces.map(Tracing::layer));
    if std::env::var("LEASEGATE_LOG_FORMAT").is_ok_and(|format| format == "json") {
        let layer = layer
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_filter(filter);
        registry.with(layer).init();
    } else {
        registry.with(layer.with_filter(filter)).init();
    }
    if bodies {
        tracing::warn!(
            "LEASEGATE_LOG_BODIES is set: tool arguments and results may be logged in full"
        );
    }
}

/// `LEASEGATE_LOG_BODIES=1` (or `true`): let libraries log whole messages.
fn log_bodies() -> bool {
    std::env::var("LEASEGATE_LOG_BODIES").is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"))
}

/// rmcp's warning for every error answer it sends (`response error`,
/// the whole error as `Debug`): leasegate logs each refusal itself, once
/// and clipped, and the error's data may quote the request.
fn rmcp_error_answer(meta: &tracing::Metadata<'_>) -> bool {
    meta.is_event()
        && *meta.level() == tracing::Level::WARN
        && meta.target().split("::").eq(["rmcp", "service"])
        && meta.fields().field("error").is_some()
        && meta.fields().field("id").is_some()
}

/// Targets that log whole MCP messages or HTTP bodies below `info`.
fn prints_bodies(target: &str) -> bool {
    ["rmcp", "hyper", "hyper_util", "h2", "reqwest", "sse_stream"]
        .iter()
        .any(|name| target == *name || target.starts_with(&format!("{name}::")))
}

/// stderr, one log event at a time, each cut at
/// `logfield::max_line_bytes` (a backstop for text dependencies log whole;
/// leasegate's own sites clip request-controlled fields).
struct CappedStderr;

impl std::io::Write for CappedStderr {
    fn write(&mut self, event: &[u8]) -> std::io::Result<usize> {
        std::io::stderr().write_all(&crate::logfield::cap_line(event))?;
        Ok(event.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}
