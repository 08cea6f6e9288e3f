//! The engine side: one pooled HTTP client per gateway, replica pinning and
//! retries with exponential backoff and jitter.

use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::header::CONTENT_TYPE;
use axum::http::{Method, Request, StatusCode};
use tower::ServiceExt;

use agl_store::Engine;

use super::engine_conn::EngineConns;

/// Tries per call, the first included.
const TRIES: u32 = 3;
const BACKOFF_BASE: Duration = Duration::from_millis(50);

#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("no engine is registered")]
    NoEngine,
    #[error("engine `{engine}` unreachable after {tries} tries: {message}")]
    Exhausted {
        engine: String,
        tries: u32,
        message: String,
    },
}

/// Base URL scheme of engines served in-process (see `inference::embed`).
pub const EMBEDDED: &str = "embedded://";

/// An engine's answer: over HTTP or from an in-process engine's router.
pub type EngineResponse = axum::http::Response<Body>;

/// Engines speak plain HTTP/1 on a trusted network: connections kept per
/// host and driven by the call holding them (`engine_conn.rs`), not a
/// convenience client (URL parsing with IDNA, redirects and header defaults
/// cost a tenth of the gateway's own work per call) nor hyper's pooled one
/// (a task per connection, handed each call).
#[derive(Clone, Default)]
pub struct Upstream {
    conns: EngineConns,
    /// In-process engines by name: `embedded://NAME/...` is dispatched to
    /// `NAME`'s router under `/v1/...`, without an HTTP hop.
    embedded: Arc<RwLock<HashMap<String, Router>>>,
}

/// The engine `rollout_id` is pinned to: chosen by a stable hash among the
/// engines sorted by name, so a rollout keeps hitting one replica (and its
/// prefix cache) while the set of engines is unchanged.
pub fn pick(mut engines: Vec<Engine>, rollout_id: &str) -> Option<Engine> {
    // One engine (the common case) needs no hash: it is every rollout's.
    if engines.len() <= 1 {
        return engines.pop();
    }
    engines.sort_by(|a, b| a.name.cmp(&b.name));
    let h = blake3::hash(rollout_id.as_bytes());
    let mut n = [0u8; 8];
    n.copy_from_slice(&h.as_bytes()[..8]);
    let i = (u64::from_le_bytes(n) % engines.len() as u64) as usize;
    Some(engines.swap_remove(i))
}

fn retryable(status: StatusCode) -> bool {
    status == StatusCode::REQUEST_TIMEOUT
        || status == StatusCode::TOO_MANY_REQUESTS
        || status.is_server_error()
}

/// `base * 2^try` plus up to half of that again, so clients retrying
/// together spread out.
fn backoff(try_no: u32) -> Duration {
    let d = BACKOFF_BASE * 2u32.saturating_pow(try_no);
    // A fresh `RandomState` is randomly keyed: a cheap source of jitter.
    let jitter = RandomState::new().hash_one(try_no) % (d.as_millis() as u64 / 2 + 1);
    d + Duration::from_millis(jitter)
}

impl Upstream {
    /// Serves `embedded://{name}` with `router` (which routes `/v1/...`).
    pub fn register_embedded(&self, name: &str, router: Router) {
        if let Ok(mut map) = self.embedded.write() {
            map.insert(name.to_string(), router);
        }
    }

    /// GET `url` over HTTP, answered within `timeout` with a success
    /// status; the body. (Asking an engine about itself.)
    pub async fn get(&self, url: &str, timeout: Duration) -> Result<Bytes, String> {
        let asked = async {
            let response = self.conns.request(Method::GET, url, Bytes::new()).await?;
            if !response.status().is_success() {
                return Err(format!("HTTP {}", response.status()));
            }
            axum::body::to_bytes(response.into_body(), usize::MAX)
                .await
                .map_err(|e| e.to_string())
        };
        tokio::time::timeout(timeout, asked)
            .await
            .map_err(|_| format!("no answer within {timeout:?}"))?
    }

    /// One try: over HTTP, or into an embedded engine's router.
    async fn try_once(&self, url: &str, body: Bytes) -> Result<EngineResponse, String> {
        let Some(rest) = url.strip_prefix(EMBEDDED) else {
            return self.conns.request(Method::POST, url, body).await;
        };
        let (name, path) = rest.split_once('/').unwrap_or((rest, ""));
        let router = self
            .embedded
            .read()
            .ok()
            .and_then(|m| m.get(name).cloned())
            .ok_or_else(|| format!("no embedded engine `{name}` in this process"))?;
        let request = Request::post(format!("/v1/{path}"))
            .header(CONTENT_TYPE, "application/json")
            .body(Body::from(body))
            .map_err(|e| e.to_string())?;
        let Ok(response) = router.oneshot(request).await;
        Ok(response)
    }

    /// POSTs `body` to `url` until the engine answers with something other
    /// than a connection error, 408, 429 or 5xx, or the tries run out. Only
    /// the response head is awaited, so nothing has reached the client yet.
    pub async fn send(
        &self,
        engine: &Engine,
        url: &str,
        body: Bytes,
    ) -> Result<EngineResponse, UpstreamError> {
        let mut message = String::new();
        for try_no in 0..TRIES {
            if try_no > 0 {
                tokio::time::sleep(backoff(try_no - 1)).await;
            }
            match self.try_once(url, body.clone()).await {
                Ok(resp) if !retryable(resp.status()) => return Ok(resp),
                Ok(resp) => message = format!("HTTP {}", resp.status()),
                Err(e) => message = e,
            }
            tracing::debug!(engine = %engine.name, try_no, %message, "upstream try failed");
        }
        Err(UpstreamError::Exhausted {
            engine: engine.name.clone(),
            tries: TRIES,
            message,
        })
    }
}

/// An error and its causes, one line: hyper's own says only "client
/// error (Connect)"; the cause says what failed ("Connection refused").
pub(super) fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        out.push_str(": ");
        out.push_str(&cause.to_string());
        source = cause.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn engine(name: &str) -> Engine {
        Engine {
            name: name.into(),
            base_url: format!("http://{name}"),
            model: "m".into(),
            created_ms: 0,
            render: Default::default(),
            api: Default::default(),
            policy: None,
            context_len: None,
        }
    }

    #[test]
    fn pinning_is_stable_and_spreads() {
        let all = vec![engine("a"), engine("b"), engine("c")];
        let reversed: Vec<Engine> = all.iter().rev().cloned().collect();
        let mut seen = std::collections::BTreeSet::new();
        for i in 0..64 {
            let id = format!("r{i}");
            let x = pick(all.clone(), &id).map(|e| e.name);
            assert_eq!(x, pick(reversed.clone(), &id).map(|e| e.name));
            seen.extend(x);
        }
        assert_eq!(seen.len(), 3);
        assert!(pick(Vec::new(), "r").is_none());
        let only = pick(vec![engine("a")], "r").map(|e| e.name);
        assert_eq!(only.as_deref(), Some("a"));
    }

    #[test]
    fn backoff_grows() {
        assert!(backoff(0) >= BACKOFF_BASE && backoff(0) <= BACKOFF_BASE * 2);
        assert!(backoff(2) >= BACKOFF_BASE * 4);
        assert!(retryable(StatusCode::SERVICE_UNAVAILABLE));
        assert!(!retryable(StatusCode::BAD_REQUEST));
    }
}
