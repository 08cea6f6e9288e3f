//! Prometheus metrics, rendered as text by hand: a few counters, one latency
//! histogram and gauges read from the proxy control at scrape time.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
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

/// One route's counts: by (method, status), and its latency histogram.
#[derive(Default)]
struct RouteStats {
    /// A route sees a handful of (method, status) pairs: a short list.
    requests: Vec<(String, u16, u64)>,
    latency: Histogram,
}

#[derive(Default)]
pub struct Metrics {
    /// Route template -> its stats. Looked up by `&str`, so a request to a
    /// route seen before allocates nothing.
    routes: Mutex<BTreeMap<String, RouteStats>>,
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
        let mut routes = self.routes();
        // Only a route's first request pays for its name.
        if !routes.contains_key(route) {
            routes.insert(route.to_owned(), RouteStats::default());
        }
        let Some(stats) = routes.get_mut(route) else {
            return; // inserted just above
        };
        match stats
            .requests
            .iter_mut()
            .find(|(m, s, _)| m == method && *s == status)
        {
            Some((_, _, n)) => *n += 1,
            None => stats.requests.push((method.to_owned(), status, 1)),
        }
        let h = &mut stats.latency;
        let secs = elapsed.as_secs_f64();
        for (bound, n) in BUCKETS.iter().zip(h.counts.iter_mut()) {
            if secs <= *bound {
                *n += 1;
            }
        }
        h.count += 1;
        h.sum += secs;
    }

    /// The counters hold no invariant a panic could have broken halfway
    /// that matters more than losing every later count.
    fn routes(&self) -> MutexGuard<'_, BTreeMap<String, RouteStats>> {
        self.routes.lock().unwrap_or_else(PoisonError::into_inner)
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
        let routes = self.routes();
        let _ = writeln!(out, "# TYPE agl_http_requests_total counter");
        for (route, stats) in routes.iter() {
            let mut requests: Vec<_> = stats.requests.iter().collect();
            requests.sort();
            for (method, status, n) in requests {
                let _ = writeln!(
                    out,
                    "agl_http_requests_total{{route=\"{}\",method=\"{method}\",status=\"{status}\"}} {n}",
                    escape(route)
                );
            }
        }
        let _ = writeln!(out, "# TYPE agl_http_request_duration_seconds histogram");
        for (route, stats) in routes.iter() {
            let (route, h) = (escape(route), &stats.latency);
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
        drop(routes);
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
    // Both clones are reference counts, not copies of the text.
    let route = req.extensions().get::<MatchedPath>().cloned();
    let method = req.method().clone();
    let start = Instant::now();
    let resp = next.run(req).await;
    let route = route.as_ref().map_or("unmatched", MatchedPath::as_str);
    state.metrics.record_request(
        route,
        method.as_str(),
        resp.status().as_u16(),
        start.elapsed(),
    );
    resp
}
