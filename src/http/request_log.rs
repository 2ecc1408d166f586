//! The span of each HTTP request, as `tracing_actix_web`'s default but
//! without the query string: display and operator sockets carry their token
//! in `?token=`, and no token may reach a log line. Everything else (method,
//! route, status) is kept. With traces on, the span is also named for
//! OpenTelemetry (`POST /api/sessions/{id}/submission`) and is a server
//! span; an incoming `traceparent` is not followed (see `crate::telemetry`).

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::Error;
use tracing::Span;
use tracing_actix_web::{DefaultRootSpanBuilder, RootSpanBuilder};

pub struct RedactedRootSpan;

impl RootSpanBuilder for RedactedRootSpan {
    fn on_request_start(request: &ServiceRequest) -> Span {
        let route = request.match_pattern().unwrap_or_default();
        if crate::telemetry::enabled() {
            // Traced: named `METHOD route` and a server span, as
            // OpenTelemetry's HTTP conventions have it.
            return tracing::info_span!(
                "HTTP request",
                otel.name = %format!("{} {route}", request.method()),
                otel.kind = "server",
                http.method = %request.method(),
                http.route = %route,
                http.target = %request.path(),
                http.status_code = tracing::field::Empty,
                otel.status_code = tracing::field::Empty,
                exception.message = tracing::field::Empty,
                exception.details = tracing::field::Empty,
            );
        }
        tracing::info_span!(
            "HTTP request",
            http.method = %request.method(),
            http.route = %route,
            http.target = %request.path(),
            http.status_code = tracing::field::Empty,
            otel.status_code = tracing::field::Empty,
            exception.message = tracing::field::Empty,
            exception.details = tracing::field::Empty,
        )
    }

    fn on_request_end<B: MessageBody>(span: Span, outcome: &Result<ServiceResponse<B>, Error>) {
        DefaultRootSpanBuilder::on_request_end(span, outcome);
    }
}
