//! Traces: the `tracing` spans of stagehand, sent to an OpenTelemetry
//! collector over OTLP/HTTP (protobuf) when `--otlp-endpoint`
//! (`STAGEHAND_OTLP_ENDPOINT`) is set. Unset, no layer is installed and
//! every helper here returns at its first line: nothing is spent on traces.
//!
//! One trace per submission: the `HTTP request` span of `POST
//! /api/sessions/{id}/submission` is its root, its W3C `traceparent` is
//! stored with the saga (`sagas.trace_context`, migration 17), and each run
//! of the saga, on whichever instance and however much later, opens its
//! `saga` span as a child of it ([`join_saga_trace`]). Under the `saga`
//! span: one span per step ([`step_span`]), and under the AI step one per
//! provider request, submit or poll ([`provider_call`]). A run that resumes
//! a lease that was lost or handed over, or that follows an operator's
//! retry, starts a new trace instead, with a span link to the earlier one
//! (the claim or the retry marks the stored context `link:`), and stores
//! its own context for the runs after it ([`remember_saga_trace`]).
//!
//! Spans are exported in batches from the SDK's own thread: a span that
//! ends only goes into a bounded queue (dropped when it is full), so a slow
//! or unreachable collector never holds up a request or a saga. A collector
//! that fails is said once in the logs, and again once it answers
//! ([`QuietExporter`]). [`Tracing::shutdown`] sends what is left, within a
//! bound.
//!
//! Incoming `traceparent` headers are not followed: participants' phones
//! are not trusted to choose trace ids.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{Status, TraceContextExt, TracerProvider as _};
use opentelemetry::KeyValue;
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, SdkTracer, SdkTracerProvider, SpanData, SpanExporter,
};
use opentelemetry_sdk::Resource;
use tracing::{Instrument, Span};
use tracing_opentelemetry::{OpenTelemetryLayer, OpenTelemetrySpanExt};
use tracing_subscriber::filter::{Filtered, Targets};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

use crate::ai::JobView;
use crate::domain::failure::AiFailure;
use crate::domain::saga::Step;
use crate::store::entities::sagas;
use crate::store::sagas::TRACE_LINK;
use crate::store::Store;

/// Bound of one export (connect, send, retries), and of the flush at
/// shutdown.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(5);

static ON: AtomicBool = AtomicBool::new(false);

/// Whether traces are exported (a layer was installed by [`Tracing::start`]).
pub fn enabled() -> bool {
    ON.load(Ordering::Relaxed)
}

/// Where traces go (`--otlp-endpoint`, `--otlp-batch-delay`).
#[derive(Debug, Clone)]
pub struct OtlpSettings {
    /// The collector's base URL (`http://collector:4318`), or its full
    /// traces URL (ending in `/v1/traces`).
    pub endpoint: String,
    /// How long finished spans wait to be sent in one batch (None: the
    /// SDK's default, 5 s or `OTEL_BSP_SCHEDULE_DELAY`).
    pub batch_delay: Option<Duration>,
}

impl OtlpSettings {
    /// The URL spans are posted to.
    pub fn traces_url(&self) -> String {
        let base = self.endpoint.trim().trim_end_matches('/');
        if base.ends_with("/v1/traces") {
            base.to_owned()
        } else {
            format!("{base}/v1/traces")
        }
    }
}

/// The layer that turns this crate's spans into OpenTelemetry spans (only
/// stagehand's own: the HTTP clients' spans, the exporter's among them,
/// are not traced).
pub type OtelLayer<S> = Filtered<OpenTelemetryLayer<S, SdkTracer>, Targets, S>;

/// The running exporter; [`Tracing::shutdown`] flushes it.
pub struct Tracing {
    provider: SdkTracerProvider,
    url: String,
}

impl Tracing {
    /// Builds the exporter and the layer to install in the subscriber.
    /// Call it outside an async runtime (the blocking HTTP client must not
    /// be dropped inside one), before the subscriber is installed.
    pub fn start<S>(settings: &OtlpSettings) -> Result<(Tracing, OtelLayer<S>), String>
    where
        S: tracing::Subscriber + for<'span> LookupSpan<'span>,
    {
        let url = settings.traces_url();
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(format!(
                "STAGEHAND_OTLP_ENDPOINT must be an http:// or https:// URL, not {:?}",
                settings.endpoint
            ));
        }
        // An https collector needs the TLS provider reqwest is built without.
        crate::ai::client::ensure_crypto_provider();
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(url.clone())
            .with_timeout(EXPORT_TIMEOUT)
            .build()
            .map_err(|e| format!("cannot build the OTLP exporter for {url}: {e}"))?;
        let mut batch = BatchConfigBuilder::default();
        if let Some(delay) = settings.batch_delay {
            batch = batch.with_scheduled_delay(delay.max(Duration::from_millis(1)));
        }
        let processor = BatchSpanProcessor::builder(QuietExporter::new(exporter, url.clone()))
            .with_batch_config(batch.build())
            .build();
        let mut resource = Resource::builder();
        if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
            resource = resource.with_service_name("stagehand");
        }
        let provider = SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_resource(resource.build())
            .build();
        let layer = tracing_opentelemetry::layer()
            .with_tracer(provider.tracer("stagehand"))
            .with_filter(Targets::new().with_target("stagehand", tracing::Level::INFO));
        ON.store(true, Ordering::Relaxed);
        Ok((Tracing { provider, url }, layer))
    }

    /// The URL spans are posted to.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Sends the spans still queued (within a few seconds) and stops the
    /// exporter. Call it outside an async runtime, after the server
    /// stopped.
    pub fn shutdown(self) {
        ON.store(false, Ordering::Relaxed);
        if let Err(e) = self.provider.shutdown_with_timeout(EXPORT_TIMEOUT) {
            tracing::warn!(error = %e, "the last traces could not all be sent");
        }
    }
}

/// The OTLP exporter, saying in the logs when export starts failing (once)
/// and when it works again, instead of once per batch.
#[derive(Debug)]
pub struct QuietExporter<E> {
    inner: E,
    url: String,
    failing: AtomicBool,
}

impl<E> QuietExporter<E> {
    pub fn new(inner: E, url: String) -> Self {
        QuietExporter {
            inner,
            url,
            failing: AtomicBool::new(false),
        }
    }
}

impl<E: SpanExporter> SpanExporter for QuietExporter<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let spans = batch.len();
        let outcome = self.inner.export(batch).await;
        match &outcome {
            Ok(()) => {
                if self.failing.swap(false, Ordering::Relaxed) {
                    tracing::info!(endpoint = %self.url, "OTLP export works again");
                }
            }
            Err(e) => {
                if !self.failing.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        endpoint = %self.url, error = %e, spans,
                        "OTLP export failed; spans are dropped until the collector answers (said once)"
                    );
                }
            }
        }
        outcome
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource)
    }
}

/// The W3C `traceparent` of `span` (None when traces are off or the span
/// is not traced).
pub fn traceparent_of(span: &Span) -> Option<String> {
    if !enabled() {
        return None;
    }
    let cx = span.context();
    if !cx.span().span_context().is_valid() {
        return None;
    }
    let mut carrier: HashMap<String, String> = HashMap::new();
    TraceContextPropagator::new().inject_context(&cx, &mut carrier);
    carrier.remove("traceparent")
}

/// The context a stored `traceparent` names (None when it names none).
fn context_of(traceparent: &str) -> Option<opentelemetry::Context> {
    let carrier = HashMap::from([("traceparent".to_owned(), traceparent.trim().to_owned())]);
    let cx = TraceContextPropagator::new().extract(&carrier);
    cx.span().span_context().is_valid().then_some(cx)
}

/// Puts a run's `saga` span (just created, not entered yet) in its trace,
/// by the saga's stored context: a child of the submission's request (or
/// of the run that started the current trace), or, after a resume or a
/// retry (`link:`), the root of a new trace linked to the earlier one. The
/// OpenTelemetry attributes `saga.id`, `session.id`, `experience` and
/// `saga.recoveries` are set on it. Returns the context to store for the
/// runs after this one (see [`remember_saga_trace`]) when it started a new
/// trace.
pub fn join_saga_trace(span: &Span, saga: &sagas::Model) -> Option<String> {
    if !enabled() {
        return None;
    }
    let stored = saga.trace_context.as_deref();
    let linked = match stored.and_then(|s| s.strip_prefix(TRACE_LINK)) {
        Some(earlier) => {
            if let Some(cx) = context_of(earlier) {
                span.add_link_with_attributes(
                    cx.span().span_context().clone(),
                    vec![KeyValue::new("link.reason", "resumed or retried")],
                );
            }
            true
        }
        None => {
            if let Some(cx) = stored.and_then(context_of) {
                let _ = span.set_parent(cx);
            }
            false
        }
    };
    span.set_attribute("saga.id", saga.id.clone());
    span.set_attribute("session.id", saga.session_id.clone());
    span.set_attribute("experience", saga.experience_id.clone());
    span.set_attribute("saga.recoveries", i64::from(saga.recoveries));
    if linked {
        traceparent_of(span)
    } else {
        None
    }
}

/// Stores the context a run that started a new trace returned from
/// [`join_saga_trace`], fenced on its lock token, so the saga's next runs
/// (after a backoff) join that trace. Failing costs only that: they link
/// to the earlier trace again.
pub async fn remember_saga_trace(
    store: &Store,
    saga_id: &str,
    token: &str,
    traceparent: Option<String>,
) {
    let Some(traceparent) = traceparent else {
        return;
    };
    if let Err(e) = store.set_trace_context(saga_id, token, &traceparent).await {
        tracing::debug!(error = %e, "could not store the saga's new trace context");
    }
}

/// The span of one step of a saga's run (a child of the `saga` span), with
/// the attributes `saga.id`, `session.id`, `experience`, `step`, the
/// provider, and `ai.job_id` when a job is already known. A disabled span
/// when traces are off.
pub fn step_span(saga: &sagas::Model, step: Step, provider: &str) -> Span {
    if !enabled() || step.is_final() {
        return Span::none();
    }
    let span = tracing::info_span!(
        "saga step",
        otel.name = %format!("saga step {}", step.as_str()),
        step = step.as_str()
    );
    common_attributes(&span, saga, provider);
    span.set_attribute("step", step.as_str());
    if step == Step::AiPending {
        if let Some(job_id) = &saga.ai_job_id {
            span.set_attribute("ai.job_id", job_id.clone());
        }
    }
    span
}

fn common_attributes(span: &Span, saga: &sagas::Model, provider: &str) {
    span.set_attribute("saga.id", saga.id.clone());
    span.set_attribute("session.id", saga.session_id.clone());
    span.set_attribute("experience", saga.experience_id.clone());
    span.set_attribute("ai.provider", provider.to_owned());
}

/// Records the AI job of `span` (a step's or a call's).
pub fn record_job_id(span: &Span, job_id: &str) {
    if enabled() {
        span.set_attribute("ai.job_id", job_id.to_owned());
    }
}

/// One request to the AI provider (`what`: `submit` or `poll`) as a span
/// under the current one (the AI step's), with the saga's attributes, the
/// provider, the call's index, `ai.job_id` (known for a poll, recorded
/// from the answer of a submit) and, on failure, an error status. Just
/// `request` when traces are off.
pub async fn provider_call<F, E>(
    what: &'static str,
    saga: &sagas::Model,
    provider: &str,
    call: i32,
    job_id: Option<&str>,
    request: F,
) -> Result<Result<JobView, AiFailure>, E>
where
    F: Future<Output = Result<Result<JobView, AiFailure>, E>>,
{
    if !enabled() {
        return request.await;
    }
    let span = tracing::info_span!(
        "AI request",
        otel.name = %format!("AI {what}"),
        otel.kind = "client",
    );
    common_attributes(&span, saga, provider);
    span.set_attribute("step", Step::AiPending.as_str());
    span.set_attribute("ai.request", what);
    span.set_attribute("ai.call", i64::from(call));
    if let Some(job_id) = job_id {
        span.set_attribute("ai.job_id", job_id.to_owned());
    }
    let answer = request.instrument(span.clone()).await;
    match &answer {
        Ok(Ok(view)) => {
            span.set_attribute("ai.job_id", view.job_id.clone());
            span.set_attribute("ai.job_status", format!("{:?}", view.status));
        }
        Ok(Err(failure)) => span.set_status(Status::error(failure.to_string())),
        Err(_) => span.set_status(Status::error("the AI actor is unreachable")),
    }
    answer
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traces_url_of_an_endpoint() {
        let url = |endpoint: &str| {
            OtlpSettings {
                endpoint: endpoint.to_owned(),
                batch_delay: None,
            }
            .traces_url()
        };
        assert_eq!(url("http://c:4318"), "http://c:4318/v1/traces");
        assert_eq!(url("http://c:4318/"), "http://c:4318/v1/traces");
        assert_eq!(url("https://c/otlp"), "https://c/otlp/v1/traces");
        assert_eq!(url("http://c:4318/v1/traces"), "http://c:4318/v1/traces");
    }

    #[test]
    fn stored_contexts_are_read_back() {
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let cx = context_of(tp).expect("a valid traceparent");
        assert_eq!(
            cx.span().span_context().trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert!(context_of("garbage").is_none());
        assert!(context_of("00-00000000000000000000000000000000-00f067aa0ba902b7-01").is_none());
    }
}
