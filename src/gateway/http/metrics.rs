//! Prometheus metrics of the gateway (`/metrics`, OpenMetrics text format):
//! tool calls by tool and outcome, tool call latency by tool, provider errors
//! by operation (recorded where the gateway turns an `E2bError` into a tool
//! error), and, read at scrape time, live sessions, owned and retained
//! sandboxes (from the `SessionRegistry`) and supervisor installs.
//!
//! Also the `/metrics` HTTP handler and the optional admin listener.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::Context;
use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};
use tokio_util::sync::CancellationToken;

use crate::gateway::sessions::SessionRegistry;

/// Prefix of every metric name.
pub const METRICS_PREFIX: &str = "sandbox_mcp";
/// Content type of the OpenMetrics text format (understood by Prometheus).
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

type ToolOutcomeLabels = [(&'static str, &'static str); 2];
type ToolLabels = [(&'static str, &'static str); 1];
type OpLabels = [(&'static str, &'static str); 1];

/// The gateway's metrics; cheap to update from any task.
pub struct GatewayMetrics {
    registry: Registry,
    tool_calls: Family<ToolOutcomeLabels, Counter>,
    tool_call_duration: Family<ToolLabels, Histogram, fn() -> Histogram>,
    provider_errors: Family<OpLabels, Counter>,
}

impl std::fmt::Debug for GatewayMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GatewayMetrics").finish_non_exhaustive()
    }
}

/// Latency buckets: 5 ms .. ~82 s (run_command may take minutes; the +Inf bucket catches those).
fn tool_call_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.005, 2.0, 15))
}

impl GatewayMetrics {
    /// Registers every metric; the gauges read `sessions` at each scrape.
    pub fn new(sessions: Arc<SessionRegistry>) -> Self {
        let mut registry = Registry::with_prefix(METRICS_PREFIX);
        let tool_calls = Family::<ToolOutcomeLabels, Counter>::default();
        registry.register("tool_calls", "MCP tool calls by tool and outcome (ok, error)", tool_calls.clone());
        let tool_call_duration =
            Family::<ToolLabels, Histogram, fn() -> Histogram>::new_with_constructor(tool_call_histogram);
        registry.register_with_unit(
            "tool_call_duration",
            "MCP tool call latency by tool",
            Unit::Seconds,
            tool_call_duration.clone(),
        );
        let provider_errors = Family::<OpLabels, Counter>::default();
        registry.register(
            "provider_errors",
            "Sandbox provider errors that became tool errors, by provider operation",
            provider_errors.clone(),
        );
        registry.register_collector(Box::new(LiveStateCollector { sessions }));
        Self { registry, tool_calls, tool_call_duration, provider_errors }
    }

    /// Counts one tool call; `duration` is None when the call was refused before its body ran.
    pub fn record_tool_call(&self, tool: &'static str, ok: bool, duration: Option<Duration>) {
        let outcome = if ok { "ok" } else { "error" };
        self.tool_calls.get_or_create(&[("tool", tool), ("outcome", outcome)]).inc();
        if let Some(duration) = duration {
            self.tool_call_duration.get_or_create(&[("tool", tool)]).observe(duration.as_secs_f64());
        }
    }

    /// Counts one provider error (by `E2bError::op()`) turned into a tool error.
    pub fn record_provider_error(&self, op: &'static str) {
        self.provider_errors.get_or_create(&[("op", op)]).inc();
    }

    /// The metrics in OpenMetrics text format.
    pub fn render(&self) -> Result<String, std::fmt::Error> {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)?;
        Ok(text)
    }
}

/// Values read at scrape time: sessions and sandboxes from the registry, supervisor installs.
struct LiveStateCollector {
    sessions: Arc<SessionRegistry>,
}

impl std::fmt::Debug for LiveStateCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveStateCollector").finish_non_exhaustive()
    }
}

impl Collector for LiveStateCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let counts = self.sessions.sandbox_counts();
        let gauges = [
            ("sessions", "Live MCP sessions", counts.sessions),
            ("sandboxes_owned", "Sandboxes created by live sessions (retained ones included)", counts.owned),
            (
                "sandboxes_retained",
                "Sandboxes kept past their session's end (a task was started in them)",
                counts.retained,
            ),
        ];
        for (name, help, value) in gauges {
            let gauge = ConstGauge::new(i64::try_from(value).unwrap_or(i64::MAX));
            let metric = encoder.encode_descriptor(name, help, None, gauge.metric_type())?;
            gauge.encode(metric)?;
        }
        let counters = [
            (
                "supervisor_installs",
                "Task supervisor installs into sandboxes",
                crate::tasks::SUPERVISOR_INSTALLS.load(Ordering::Relaxed),
            ),
            (
                "task_channel_starts",
                "start_task calls answered through a sandbox's task channel",
                crate::tasks::channel::CHANNEL_STARTS.load(Ordering::Relaxed),
            ),
        ];
        for (name, help, value) in counters {
            let counter = ConstCounter::new(value);
            let metric = encoder.encode_descriptor(name, help, None, counter.metric_type())?;
            counter.encode(metric)?;
        }
        Ok(())
    }
}

/// `GET /metrics`.
pub async fn serve_metrics(State(metrics): State<Arc<GatewayMetrics>>) -> Response {
    match metrics.render() {
        Ok(text) => ([(header::CONTENT_TYPE, CONTENT_TYPE)], text).into_response(),
        Err(_) => (StatusCode::INTERNAL_SERVER_ERROR, "cannot encode the metrics\n").into_response(),
    }
}

/// Router with only `/metrics` (for the admin listener; no auth).
pub fn admin_router(metrics: Arc<GatewayMetrics>) -> Router {
    Router::new().route("/metrics", get(serve_metrics)).with_state(metrics)
}

/// Binds `metrics.listen` and serves `/metrics` there (no auth) until `stop`.
pub async fn start_admin_listener(
    listen: &str,
    metrics: Arc<GatewayMetrics>,
    limits: crate::listen::ListenLimits,
    stop: CancellationToken,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let addr: SocketAddr = listen
        .parse()
        .with_context(|| format!("metrics.listen {listen:?} is not an address (expected e.g. 127.0.0.1:9090)"))?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr} (metrics.listen)"))?;
    let bound = listener.local_addr().context("reading the metrics listening address")?;
    if !bound.ip().is_loopback() {
        tracing::warn!(%bound, "metrics admin listener on a non-loopback address: /metrics there has no authentication");
    }
    tracing::info!(addr = %bound, "metrics admin listener serving /metrics (no auth)");
    Ok(tokio::spawn(crate::listen::serve("admin", listener, admin_router(metrics), limits, stop.cancelled_owned())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_labels_and_live_gauges() {
        let sessions = SessionRegistry::new();
        sessions.register("s1");
        sessions
            .with_session("s1", "acme", |s| {
                s.owned.insert("a".into());
                s.owned.insert("b".into());
            })
            .unwrap();
        sessions.retain("s1", "acme", "b").unwrap();
        let metrics = GatewayMetrics::new(Arc::clone(&sessions));
        metrics.record_tool_call("run_command", true, Some(Duration::from_millis(20)));
        metrics.record_tool_call("run_command", false, None);
        metrics.record_provider_error("process.Start");
        let text = metrics.render().unwrap();
        assert!(text.contains("sandbox_mcp_tool_calls_total{tool=\"run_command\",outcome=\"ok\"} 1"), "{text}");
        assert!(text.contains("sandbox_mcp_tool_calls_total{tool=\"run_command\",outcome=\"error\"} 1"), "{text}");
        assert!(text.contains("sandbox_mcp_tool_call_duration_seconds_count{tool=\"run_command\"} 1"), "{text}");
        assert!(text.contains("sandbox_mcp_provider_errors_total{op=\"process.Start\"} 1"), "{text}");
        assert!(text.contains("sandbox_mcp_sessions 1"), "{text}");
        assert!(text.contains("sandbox_mcp_sandboxes_owned 2"), "{text}");
        assert!(text.contains("sandbox_mcp_sandboxes_retained 1"), "{text}");
        assert!(text.contains("sandbox_mcp_supervisor_installs_total "), "{text}");
    }
}
