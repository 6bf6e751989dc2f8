//! Logging and trace context for the binaries: `tracing` to stderr, text or JSON lines, level
//! from `RUST_LOG`; and an OpenTelemetry tracer behind `tracing` (tracing-opentelemetry) with
//! the W3C TraceContext propagator, so a write's trace reaches the events it appends
//! (`trace_id`, `span_id`, `traceparent` attributes).
//!
//! Spans are exported over OTLP/HTTP when `telemetry.otlp_endpoint` is set ([`init`]); either
//! way the tracer gives them W3C ids, which is what the event attributes carry.

use opentelemetry::trace::{TraceContextExt as _, TracerProvider as _};
use std::sync::{Arc, OnceLock};
use tracing_opentelemetry::OpenTelemetrySpanExt as _;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::Layer;

/// Why span export could not be set up.
#[derive(Debug, thiserror::Error)]
#[error("telemetry.otlp_endpoint: {0}")]
pub struct TelemetryError(String);

/// The tracer provider for `config`: exporting in batches over OTLP/HTTP to
/// `telemetry.otlp_endpoint`, or exporting nothing when it is unset. `service` names the
/// process's spans (`service.name`).
pub fn tracer_provider(
    config: &crate::config::TelemetryConfig,
    service: &str,
) -> Result<opentelemetry_sdk::trace::SdkTracerProvider, TelemetryError> {
    use opentelemetry_otlp::WithExportConfig as _;
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name(service.to_string())
        .build();
    let builder = opentelemetry_sdk::trace::SdkTracerProvider::builder().with_resource(resource);
    let Some(endpoint) = &config.otlp_endpoint else {
        return Ok(builder.build());
    };
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_endpoint(endpoint.clone())
        .build()
        .map_err(|e| TelemetryError(e.to_string()))?;
    Ok(builder.with_batch_exporter(exporter).build())
}

/// [`init_logging`], exporting spans as `config` says; JSON log lines name Cloud Logging's
/// trace as one of `project`. Keep the returned provider until the process ends and shut it
/// down then, so the last spans are sent.
pub fn init(
    json: bool,
    default_level: &str,
    config: &crate::config::TelemetryConfig,
    service: &str,
    project: &str,
) -> Result<opentelemetry_sdk::trace::SdkTracerProvider, TelemetryError> {
    let provider = tracer_provider(config, service)?;
    install(json, default_level, provider.clone(), Some(project));
    Ok(provider)
}

/// Installs the global subscriber, exporting nothing; `default_level` applies when
/// `RUST_LOG` is unset.
pub fn init_logging(json: bool, default_level: &str) {
    install(
        json,
        default_level,
        opentelemetry_sdk::trace::SdkTracerProvider::builder().build(),
        None,
    );
}

fn install(
    json: bool,
    default_level: &str,
    provider: opentelemetry_sdk::trace::SdkTracerProvider,
    project: Option<&str>,
) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    let output = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let (output, dispatch) = if json {
        let (format, dispatch) = JsonWithTrace::new(project);
        (output.json().event_format(format).boxed(), Some(dispatch))
    } else {
        (output.boxed(), None)
    };
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(output)
        .with(dispatch)
        .with(trace_context_layer_with(provider))
        .try_init();
}

/// The layer that gives `tracing` spans OpenTelemetry trace context (W3C ids, parents taken
/// from incoming `traceparent` headers), and sets the W3C propagator as the global one. Every
/// process that writes events installs it (the binaries, the test kit).
pub fn trace_context_layer<S>() -> impl Layer<S>
where
    S: tracing::Subscriber + for<'span> tracing_subscriber::registry::LookupSpan<'span>,
{
    trace_context_layer_with(opentelemetry_sdk::trace::SdkTracerProvider::builder().build())
}

/// [`trace_context_layer`] with spans going to `provider`'s processors (an exporter; tests
/// give it an in-memory one).
pub fn trace_context_layer_with<S>(
    provider: opentelemetry_sdk::trace::SdkTracerProvider,
) -> impl Layer<S>
where
    S: tracing::Subscriber + for<'span> tracing_subscriber::registry::LookupSpan<'span>,
{
    opentelemetry::global::set_text_map_propagator(
        opentelemetry_sdk::propagation::TraceContextPropagator::new(),
    );
    tracing_opentelemetry::layer().with_tracer(provider.tracer("courier"))
}

/// The W3C trace context of a span, as events carry it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceIds {
    /// 32 lowercase hex digits.
    pub trace_id: String,
    /// 16 lowercase hex digits.
    pub span_id: String,
    /// The whole `traceparent` header (`00-<trace_id>-<span_id>-<flags>`).
    pub traceparent: String,
}

/// The trace context of the current span, if it has one (the trace context layer is
/// installed and a span is entered).
pub fn current_trace() -> Option<TraceIds> {
    let context = tracing::Span::current().context();
    let span = context.span();
    let ids = span.span_context();
    if !ids.is_valid() {
        return None;
    }
    let mut headers = std::collections::HashMap::new();
    opentelemetry::global::get_text_map_propagator(|propagator| {
        propagator.inject_context(&context, &mut headers)
    });
    Some(TraceIds {
        trace_id: ids.trace_id().to_string(),
        span_id: ids.span_id().to_string(),
        traceparent: headers.remove("traceparent")?,
    })
}

/// The trace context a request's headers carry (W3C `traceparent`, through the global
/// propagator); an empty context when they carry none, so the request starts a trace.
pub fn extract_context(header: impl Fn(&str) -> Option<String>) -> opentelemetry::Context {
    let mut carrier = std::collections::HashMap::new();
    for name in ["traceparent", "tracestate"] {
        if let Some(value) = header(name) {
            carrier.insert(name.to_string(), value);
        }
    }
    opentelemetry::global::get_text_map_propagator(|propagator| propagator.extract(&carrier))
}

/// JSON log lines that carry the current span's trace: `trace_id`, `span_id`, and the
/// fields Cloud Logging joins a log line to its trace by (`logging.googleapis.com/trace` as
/// `projects/<project>/traces/<trace_id>`, `…/spanId`, `…/trace_sampled`).
///
/// A formatter cannot ask the dispatcher for the span's trace (tracing refuses re-entry while
/// it dispatches the event), so [`JsonWithTrace::new`] also returns a layer that hands it the
/// dispatcher when the subscriber is built; install both.
pub struct JsonWithTrace {
    json: tracing_subscriber::fmt::format::Format<tracing_subscriber::fmt::format::Json>,
    project: Option<String>,
    dispatch: Arc<OnceLock<tracing::dispatcher::WeakDispatch>>,
}

/// The layer that gives [`JsonWithTrace`] its dispatcher.
pub struct DispatchForLogs(Arc<OnceLock<tracing::dispatcher::WeakDispatch>>);

impl<S: tracing::Subscriber> Layer<S> for DispatchForLogs {
    fn on_register_dispatch(&self, subscriber: &tracing::Dispatch) {
        let _ = self.0.set(subscriber.downgrade());
    }
}

impl JsonWithTrace {
    pub fn new(project: Option<&str>) -> (Self, DispatchForLogs) {
        let dispatch = Arc::new(OnceLock::new());
        let format = Self {
            json: tracing_subscriber::fmt::format().json(),
            project: project.map(str::to_owned),
            dispatch: dispatch.clone(),
        };
        (format, DispatchForLogs(dispatch))
    }

    /// The trace of the span the event happened in.
    fn trace<S, N>(
        &self,
        ctx: &tracing_subscriber::fmt::FmtContext<'_, S, N>,
    ) -> Option<opentelemetry::trace::SpanContext>
    where
        S: tracing::Subscriber + for<'span> tracing_subscriber::registry::LookupSpan<'span>,
        N: for<'writer> tracing_subscriber::fmt::FormatFields<'writer> + 'static,
    {
        let span = ctx.lookup_current()?;
        let dispatch = self.dispatch.get()?.upgrade()?;
        let context = tracing_opentelemetry::get_otel_context(&span.id(), &dispatch)?;
        let ids = context.span().span_context().clone();
        ids.is_valid().then_some(ids)
    }
}

impl<S, N> tracing_subscriber::fmt::FormatEvent<S, N> for JsonWithTrace
where
    S: tracing::Subscriber + for<'span> tracing_subscriber::registry::LookupSpan<'span>,
    N: for<'writer> tracing_subscriber::fmt::FormatFields<'writer> + 'static,
{
    fn format_event(
        &self,
        ctx: &tracing_subscriber::fmt::FmtContext<'_, S, N>,
        mut writer: tracing_subscriber::fmt::format::Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        let mut line = String::new();
        self.json.format_event(
            ctx,
            tracing_subscriber::fmt::format::Writer::new(&mut line),
            event,
        )?;
        if let (Some(ids), Some(end)) = (self.trace(ctx), line.rfind('}')) {
            let (trace_id, span_id) = (ids.trace_id(), ids.span_id());
            let mut fields = format!(r#","trace_id":"{trace_id}","span_id":"{span_id}""#);
            if let Some(project) = &self.project {
                fields.push_str(&format!(
                    r#","logging.googleapis.com/trace":"projects/{project}/traces/{trace_id}","logging.googleapis.com/spanId":"{span_id}","logging.googleapis.com/trace_sampled":{}"#,
                    ids.is_sampled()
                ));
            }
            line.insert_str(end, &fields);
        }
        writer.write_str(&line)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_traceparent_header_becomes_the_current_trace() {
        let subscriber = tracing_subscriber::registry().with(trace_context_layer());
        tracing::subscriber::with_default(subscriber, || {
            let parent = extract_context(|name| {
                (name == "traceparent")
                    .then(|| "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into())
            });
            let span = tracing::info_span!("request");
            let _ = span.set_parent(parent);
            let trace = span.in_scope(current_trace).expect("a trace");
            assert_eq!(trace.trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
            assert_ne!(trace.span_id, "00f067aa0ba902b7", "the request's own span");
            assert!(trace
                .traceparent
                .starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"));
            assert_eq!(current_trace(), None, "outside any span");
        });
    }

    #[test]
    fn json_log_lines_carry_the_trace_cloud_logging_joins_on() {
        #[derive(Clone, Default)]
        struct Lines(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
        impl std::io::Write for Lines {
            fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
                if let Ok(mut all) = self.0.lock() {
                    all.extend_from_slice(bytes);
                }
                Ok(bytes.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let lines = Lines::default();
        let writer = lines.clone();
        let (format, dispatch) = JsonWithTrace::new(Some("my-project"));
        let subscriber = tracing_subscriber::registry()
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .event_format(format)
                    .with_writer(move || writer.clone()),
            )
            .with(dispatch)
            .with(trace_context_layer());
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!("outside any span");
            let span = tracing::info_span!("request");
            let _ = span.set_parent(extract_context(|name| {
                (name == "traceparent")
                    .then(|| "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into())
            }));
            span.in_scope(|| tracing::info!(event_id = "e-1", "inside the request"));
        });
        let text = String::from_utf8(lines.0.lock().map(|l| l.clone()).unwrap_or_default())
            .unwrap_or_default();
        let parsed: Vec<serde_json::Value> = text
            .lines()
            .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
            .collect();
        assert_eq!(parsed.len(), 2, "{text}");
        assert!(parsed[0].get("trace_id").is_none(), "{text}");
        let inside = &parsed[1];
        assert_eq!(
            inside["trace_id"], "4bf92f3577b34da6a3ce929d0e0e4736",
            "{text}"
        );
        assert_eq!(
            inside["logging.googleapis.com/trace"],
            "projects/my-project/traces/4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(inside["logging.googleapis.com/spanId"], inside["span_id"]);
        assert_eq!(inside["logging.googleapis.com/trace_sampled"], true);
        assert_eq!(inside["fields"]["event_id"], "e-1", "{text}");
    }
}
