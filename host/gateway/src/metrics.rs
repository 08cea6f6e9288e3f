//! Prometheus metrics, rendered as text by hand: a few counters, one latency
//! histogram and gauges read from the proxy control at scrape time.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::Response;

use super::AppState;
use super::control::ProxyControl;

/// Upper bounds of the request latency histogram, in seconds.
const BUCKETS: [f64; 12] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 2.5,
];

#[derive(Default)]
struct Histogram {
    counts: [u64; BUCKETS.len()],
    count: u64,
    sum: f64,
}

/// Metrics owned by something else in the process (the training loop),
/// rendered after the gateway's own on every scrape.
pub trait MetricsSource: Send + Sync {
    /// Appends Prometheus text lines to `out`.
    fn render(&self, out: &mut String);
}

#[derive(Default)]
pub struct Metrics {
    /// (route, method, status) -> count.
    requests: Mutex<BTreeMap<(String, String, u16), u64>>,
    latency: Mutex<BTreeMap<String, Histogram>>,
    events_written: AtomicU64,
    upstream_errors: AtomicU64,
    connections: Arc<AtomicU64>,
    cancelled_calls: AtomicU64,
}

/// Counts one open connection until dropped.
pub struct OpenConnection(Arc<AtomicU64>);

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Metrics {
    pub fn record_request(&self, route: &str, method: &str, status: u16, elapsed: Duration) {
        if let Ok(mut m) = self.requests.lock() {
            *m.entry((route.to_string(), method.to_string(), status))
                .or_default() += 1;
        }
        if let Ok(mut m) = self.latency.lock() {
            let h = m.entry(route.to_string()).or_default();
            let secs = elapsed.as_secs_f64();
            for (bound, n) in BUCKETS.iter().zip(h.counts.iter_mut()) {
                if secs <= *bound {
                    *n += 1;
                }
            }
            h.count += 1;
            h.sum += secs;
        }
    }

    pub fn event_written(&self) {
        self.events_written.fetch_add(1, Ordering::Relaxed);
    }

    /// For the proxy: an upstream engine call failed.
    pub fn upstream_error(&self) {
        self.upstream_errors.fetch_add(1, Ordering::Relaxed);
    }

    /// For the server loop: a connection was accepted.
    pub fn connection_opened(&self) -> OpenConnection {
        self.connections.fetch_add(1, Ordering::Relaxed);
        OpenConnection(self.connections.clone())
    }

    /// Connections held open now.
    pub fn open_connections(&self) -> u64 {
        self.connections.load(Ordering::Relaxed)
    }

    /// For the proxy: a call's client left before its answer was complete.
    pub fn call_cancelled(&self) {
        self.cancelled_calls.fetch_add(1, Ordering::Relaxed);
    }

    pub fn render(&self, control: &ProxyControl) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "# TYPE agl_http_requests_total counter");
        if let Ok(m) = self.requests.lock() {
            for ((route, method, status), n) in m.iter() {
                let _ = writeln!(
                    out,
                    "agl_http_requests_total{{route=\"{}\",method=\"{method}\",status=\"{status}\"}} {n}",
                    escape(route)
                );
            }
        }
        let _ = writeln!(out, "# TYPE agl_http_request_duration_seconds histogram");
        if let Ok(m) = self.latency.lock() {
            for (route, h) in m.iter() {
                let route = escape(route);
                for (bound, n) in BUCKETS.iter().zip(h.counts.iter()) {
                    let _ = writeln!(
                        out,
                        "agl_http_request_duration_seconds_bucket{{route=\"{route}\",le=\"{bound}\"}} {n}"
                    );
                }
                let _ = writeln!(
                    out,
                    "agl_http_request_duration_seconds_bucket{{route=\"{route}\",le=\"+Inf\"}} {}\n\
                     agl_http_request_duration_seconds_sum{{route=\"{route}\"}} {}\n\
                     agl_http_request_duration_seconds_count{{route=\"{route}\"}} {}",
                    h.count, h.sum, h.count
                );
            }
        }
        let gauges = [
            (
                "agl_events_written_total",
                "counter",
                self.events_written.load(Ordering::Relaxed),
            ),
            (
                "agl_upstream_errors_total",
                "counter",
                self.upstream_errors.load(Ordering::Relaxed),
            ),
            (
                "agl_proxy_cancelled_calls_total",
                "counter",
                self.cancelled_calls.load(Ordering::Relaxed),
            ),
            (
                "agl_http_open_connections",
                "gauge",
                self.open_connections(),
            ),
            (
                "agl_proxy_inflight_calls",
                "gauge",
                control.in_flight_count() as u64,
            ),
            ("agl_proxy_paused", "gauge", u64::from(control.paused())),
        ];
        for (name, kind, value) in gauges {
            let _ = writeln!(out, "# TYPE {name} {kind}\n{name} {value}");
        }
        out
    }
}

fn escape(label: &str) -> String {
    label
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Middleware: counts every request by its route template (never the raw
/// path, which would make one series per rollout id).
pub async fn track(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "unmatched".to_string());
    let method = req.method().to_string();
    let start = Instant::now();
    let resp = next.run(req).await;
    state
        .metrics
        .record_request(&route, &method, resp.status().as_u16(), start.elapsed());
    resp
}
