//! Traces (docs/telemetry.md): the `[telemetry]` section and the standard
//! `OTEL_EXPORTER_OTLP_*` / `OTEL_SERVICE_NAME` variables resolved into one exporter
//! (OTLP over HTTP/protobuf or gRPC), and the HTTP layer that starts each request's span,
//! continuing the caller's `traceparent`.
//!
//! Off by default: without `enabled = true` or an OTLP endpoint variable no exporter is
//! built and the engine makes no spans.

use crate::AppState;
use axum::extract::{MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::Response;
use opentelemetry::global::BoxedTracer;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig, WithTonicConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor;
use serde::Deserialize;
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;
use tollgate_core::TraceParent;
use tollgate_engine::config::ConfigError;
use tollgate_engine::telemetry::{TRACER_NAME, attr};

/// The W3C header a caller's trace position arrives in.
pub const TRACEPARENT_HEADER: &str = "traceparent";

/// The service name spans carry when neither `OTEL_SERVICE_NAME` nor
/// `[telemetry] service_name` gives one.
pub const DEFAULT_SERVICE_NAME: &str = "tollgate";

/// How spans travel to the collector.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
pub enum OtlpProtocol {
    /// OTLP/HTTP with protobuf bodies (`POST <endpoint>/v1/traces`), port 4318 by default.
    #[default]
    #[serde(rename = "http/protobuf")]
    HttpProtobuf,
    /// OTLP/gRPC (`TraceService/Export`), port 4317 by default.
    #[serde(rename = "grpc")]
    Grpc,
}

impl OtlpProtocol {
    fn parse(value: &str) -> Option<OtlpProtocol> {
        match value.trim() {
            "http/protobuf" => Some(OtlpProtocol::HttpProtobuf),
            "grpc" => Some(OtlpProtocol::Grpc),
            _ => None,
        }
    }

    fn default_endpoint(self) -> &'static str {
        match self {
            OtlpProtocol::HttpProtobuf => "http://localhost:4318",
            OtlpProtocol::Grpc => "http://localhost:4317",
        }
    }
}

/// `[telemetry]`: OpenTelemetry trace export.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetrySection {
    /// Export traces (also turned on by `OTEL_EXPORTER_OTLP_ENDPOINT` or
    /// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`).
    pub enabled: bool,
    /// The collector's base URL (`http://collector:4318`; for HTTP, `/v1/traces` is
    /// appended). Default: localhost on the protocol's standard port.
    pub endpoint: Option<String>,
    /// `http/protobuf` (default) or `grpc`.
    pub protocol: OtlpProtocol,
    /// Headers sent with every export (e.g. an API key of a hosted collector);
    /// `OTEL_EXPORTER_OTLP_HEADERS` adds to and overrides them.
    pub headers: BTreeMap<String, String>,
    /// The `service.name` resource attribute (default `tollgate`).
    pub service_name: Option<String>,
    /// Longest one export may take (default: `OTEL_EXPORTER_OTLP_TIMEOUT`, else 10 s).
    #[serde(with = "humantime_serde_opt")]
    pub timeout: Option<Duration>,
}

/// `timeout = "10s"` in the section.
mod humantime_serde_opt {
    use serde::{Deserialize, Deserializer};
    use std::time::Duration;

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        let text: Option<String> = Option::deserialize(d)?;
        text.map(|t| humantime::parse_duration(&t).map_err(serde::de::Error::custom))
            .transpose()
    }
}

/// The exporter to build: the section with the environment applied.
#[derive(Debug, Clone, PartialEq)]
pub struct ExportSettings {
    /// The full URL spans are sent to (HTTP: ending in `/v1/traces`).
    pub endpoint: String,
    /// The transport.
    pub protocol: OtlpProtocol,
    /// Headers from the configuration.
    pub headers: BTreeMap<String, String>,
    /// `service.name`.
    pub service_name: String,
    /// Longest one export may take (`None`: `OTEL_EXPORTER_OTLP_TIMEOUT`, else 10 s).
    pub timeout: Option<Duration>,
}

impl TelemetrySection {
    /// What to export, reading the standard variables through `env`: `None` when traces
    /// are off (`OTEL_SDK_DISABLED=true` and `OTEL_TRACES_EXPORTER=none` turn them off
    /// whatever the file says). The variables win over the file: the signal's own
    /// endpoint (`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, used as it is), then the base
    /// endpoint (`OTEL_EXPORTER_OTLP_ENDPOINT`), the protocol
    /// (`OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`, `OTEL_EXPORTER_OTLP_PROTOCOL`) and
    /// `OTEL_SERVICE_NAME`.
    pub fn resolve(
        &self,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<ExportSettings>, ConfigError> {
        let var = |name: &str| env(name).filter(|v| !v.trim().is_empty());
        if var("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
            || var("OTEL_TRACES_EXPORTER").is_some_and(|v| v.trim() == "none")
        {
            return Ok(None);
        }
        let signal_endpoint = var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT");
        let base_endpoint = var("OTEL_EXPORTER_OTLP_ENDPOINT");
        if !self.enabled && signal_endpoint.is_none() && base_endpoint.is_none() {
            return Ok(None);
        }
        let protocol = match var("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
            .map(|v| ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", v))
            .or_else(|| {
                var("OTEL_EXPORTER_OTLP_PROTOCOL").map(|v| ("OTEL_EXPORTER_OTLP_PROTOCOL", v))
            }) {
            Some((name, value)) => OtlpProtocol::parse(&value).ok_or_else(|| {
                ConfigError::at(
                    name,
                    format!("{value:?} is not supported: use `http/protobuf` or `grpc`"),
                )
            })?,
            None => self.protocol,
        };
        let endpoint = match signal_endpoint {
            Some(full) => full.trim().to_string(),
            None => {
                let base = base_endpoint
                    .or_else(|| self.endpoint.clone())
                    .unwrap_or_else(|| protocol.default_endpoint().to_string());
                signal_url(base.trim(), protocol)
            }
        };
        if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
            return Err(ConfigError::at(
                "telemetry.endpoint",
                format!("{endpoint:?} is not an http:// or https:// URL"),
            ));
        }
        let service_name = var("OTEL_SERVICE_NAME")
            .or_else(|| self.service_name.clone())
            .unwrap_or_else(|| DEFAULT_SERVICE_NAME.to_string());
        Ok(Some(ExportSettings {
            endpoint,
            protocol,
            headers: self.headers.clone(),
            service_name,
            timeout: self.timeout,
        }))
    }
}

/// The URL spans go to from a base endpoint: HTTP appends `/v1/traces`; gRPC uses the
/// base as it is (the service path is the protocol's).
fn signal_url(base: &str, protocol: OtlpProtocol) -> String {
    match protocol {
        OtlpProtocol::HttpProtobuf => format!("{}/v1/traces", base.trim_end_matches('/')),
        OtlpProtocol::Grpc => base.to_string(),
    }
}

/// The running exporter: flushes and stops on [`TraceExport::shutdown`].
#[derive(Debug)]
pub struct TraceExport {
    provider: SdkTracerProvider,
}

impl TraceExport {
    /// Builds the exporter (inside the Tokio runtime: spans are batched and sent by a
    /// task of it) and returns it with the tracer to give the engine.
    pub fn start(settings: &ExportSettings) -> Result<(TraceExport, BoxedTracer), String> {
        let exporter = match settings.protocol {
            OtlpProtocol::HttpProtobuf => {
                let mut builder = opentelemetry_otlp::SpanExporter::builder()
                    .with_http()
                    .with_protocol(Protocol::HttpBinary)
                    .with_endpoint(settings.endpoint.clone())
                    .with_headers(
                        settings
                            .headers
                            .iter()
                            .map(|(k, v)| (k.clone(), v.clone()))
                            .collect::<HashMap<_, _>>(),
                    );
                if let Some(timeout) = settings.timeout {
                    builder = builder.with_timeout(timeout);
                }
                builder.build()
            }
            OtlpProtocol::Grpc => {
                let mut builder = opentelemetry_otlp::SpanExporter::builder()
                    .with_tonic()
                    .with_protocol(Protocol::Grpc)
                    .with_endpoint(settings.endpoint.clone())
                    .with_metadata(tonic_metadata(&settings.headers)?);
                if let Some(timeout) = settings.timeout {
                    builder = builder.with_timeout(timeout);
                }
                builder.build()
            }
        }
        .map_err(|e| format!("cannot build the OTLP exporter: {e}"))?;
        let processor =
            BatchSpanProcessor::builder(exporter, opentelemetry_sdk::runtime::Tokio).build();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_resource(
                Resource::builder()
                    .with_service_name(settings.service_name.clone())
                    .build(),
            )
            .build();
        let tracer = BoxedTracer::new(Box::new(provider.tracer(TRACER_NAME)));
        Ok((TraceExport { provider }, tracer))
    }

    /// Sends the spans still batched and stops the exporter (off the async threads: the
    /// SDK waits for its export task, which runs on them).
    pub async fn shutdown(self) {
        let provider = self.provider;
        match tokio::task::spawn_blocking(move || provider.shutdown()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "the trace exporter did not shut down cleanly")
            }
            Err(e) => tracing::warn!(error = %e, "the trace exporter did not shut down cleanly"),
        }
    }
}

fn tonic_metadata(
    headers: &BTreeMap<String, String>,
) -> Result<tonic::metadata::MetadataMap, String> {
    let mut map = axum::http::HeaderMap::new();
    for (name, value) in headers {
        let name = axum::http::HeaderName::from_bytes(name.to_ascii_lowercase().as_bytes())
            .map_err(|e| format!("telemetry.headers: {name:?}: {e}"))?;
        let value = axum::http::HeaderValue::from_str(value)
            .map_err(|e| format!("telemetry.headers: {name}: {e}"))?;
        map.insert(name, value);
    }
    Ok(tonic::metadata::MetadataMap::from_headers(map))
}

/// Routes that are not traced: probes, metrics and the dashboard's files.
fn untraced(route: &str) -> bool {
    matches!(route, "/healthz" | "/readyz" | "/metrics") || route.starts_with("/ui")
}

/// Middleware: one server span per request, named `<METHOD> <route>`, a child of the
/// caller's `traceparent` when it sent a valid one (an invalid one is ignored, as the
/// W3C rules say: the request starts a new trace). Engine work done for the request
/// (submission, admission) becomes its children.
pub(crate) async fn layer(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let traces = state.tollgate.traces();
    if !traces.enabled() {
        return next.run(request).await;
    }
    let route = match request.extensions().get::<MatchedPath>() {
        Some(p) if untraced(p.as_str()) => return next.run(request).await,
        Some(p) => p.as_str().to_string(),
        None => "unmatched".to_string(),
    };
    let caller = request
        .headers()
        .get(TRACEPARENT_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| TraceParent::parse(v).ok());
    let method = request.method().to_string();
    let span = traces.server_span(format!("{method} {route}"), caller);
    span.set("http.request.method", method.clone());
    span.set("http.route", route.clone());
    span.set("url.path", request.uri().path().to_string());
    let request_id = crate::request_id::current();
    span.set(attr::REQUEST_ID, request_id.clone());
    // docs/telemetry.md, "Logs": every line logged while serving the request (the
    // engine's too) carries the request id and the trace id.
    let trace_id = span
        .trace_parent()
        .map(|p| p.trace_id_hex())
        .unwrap_or_default();
    let log = tracing::info_span!("request", request_id = %request_id, trace_id = %trace_id);
    let response =
        tracing::Instrument::instrument(span.in_scope(next.run(request)), log.clone()).await;
    let status = response.status();
    log.in_scope(|| {
        tracing::debug!(method = %method, route = %route, status = status.as_u16(), "request served")
    });
    span.set("http.response.status_code", i64::from(status.as_u16()));
    if status.is_server_error() {
        span.error(status.to_string());
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| vars.get(k).cloned()
    }

    #[test]
    fn off_by_default() {
        let section = TelemetrySection::default();
        assert_eq!(section.resolve(env(&[])).unwrap(), None);
    }

    #[test]
    fn enabled_section_defaults_to_local_http() {
        let section = TelemetrySection {
            enabled: true,
            ..Default::default()
        };
        let s = section.resolve(env(&[])).unwrap().unwrap();
        assert_eq!(s.endpoint, "http://localhost:4318/v1/traces");
        assert_eq!(s.protocol, OtlpProtocol::HttpProtobuf);
        assert_eq!(s.service_name, "tollgate");
    }

    #[test]
    fn the_standard_variables_turn_traces_on_and_win_over_the_file() {
        let section = TelemetrySection {
            endpoint: Some("http://file:4318".into()),
            service_name: Some("from-file".into()),
            ..Default::default()
        };
        let s = section
            .resolve(env(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317/"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
                ("OTEL_SERVICE_NAME", "billing"),
            ]))
            .unwrap()
            .unwrap();
        assert_eq!(s.endpoint, "http://collector:4317/");
        assert_eq!(s.protocol, OtlpProtocol::Grpc);
        assert_eq!(s.service_name, "billing");
        let s = section
            .resolve(env(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://base:4318/"),
                (
                    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                    "http://signal:9999/custom",
                ),
            ]))
            .unwrap()
            .unwrap();
        assert_eq!(s.endpoint, "http://signal:9999/custom");
        let s = section
            .resolve(env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://base:4318/")]))
            .unwrap()
            .unwrap();
        assert_eq!(s.endpoint, "http://base:4318/v1/traces");
    }

    #[test]
    fn the_sdk_switches_turn_traces_off() {
        let section = TelemetrySection {
            enabled: true,
            ..Default::default()
        };
        for vars in [
            [("OTEL_SDK_DISABLED", "true")],
            [("OTEL_TRACES_EXPORTER", "none")],
        ] {
            assert_eq!(section.resolve(env(&vars)).unwrap(), None);
        }
    }

    #[test]
    fn unsupported_protocols_and_endpoints_are_refused() {
        let section = TelemetrySection {
            enabled: true,
            ..Default::default()
        };
        let e = section
            .resolve(env(&[("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")]))
            .unwrap_err();
        assert!(e.to_string().contains("OTEL_EXPORTER_OTLP_PROTOCOL"), "{e}");
        let section = TelemetrySection {
            enabled: true,
            endpoint: Some("collector:4318".into()),
            ..Default::default()
        };
        let e = section.resolve(env(&[])).unwrap_err();
        assert!(e.to_string().contains("telemetry.endpoint"), "{e}");
    }
}
