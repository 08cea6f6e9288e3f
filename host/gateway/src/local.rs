//! With auth off (no admin key: a local run), anyone who can reach the
//! port is the admin, and that includes any web page the user has open: a
//! browser will POST cross-site to `127.0.0.1` without asking. This guard
//! keeps browsers out:
//! - a request body must be `application/json` (or `application/wasm`, a
//!   plugin upload): a page cannot send either cross-site without a CORS
//!   preflight, which the gateway never answers;
//! - `Host` must name loopback (or the host of `public_base_url`), so a
//!   DNS-rebound name cannot reach the port;
//! - an `Origin` (browsers send it with every POST) must be one of those
//!   hosts too.

use axum::extract::{Request, State};
use axum::http::header::{CONTENT_LENGTH, CONTENT_TYPE, HOST, ORIGIN, TRANSFER_ENCODING};
use axum::http::{HeaderMap, Uri};
use axum::middleware::Next;
use axum::response::Response;

use super::error::ApiError;
use super::{AppState, proxy};

/// The hosts a local gateway answers to, besides loopback.
#[derive(Debug, Clone, Default)]
pub struct LocalHosts {
    /// Lower-cased host (no port) of `public_base_url`, when one is set.
    public: Option<String>,
}

impl LocalHosts {
    pub fn new(public_base_url: Option<&str>) -> LocalHosts {
        let public = public_base_url
            .and_then(|u| u.parse::<Uri>().ok())
            .and_then(|u| u.host().map(str::to_ascii_lowercase));
        LocalHosts { public }
    }

    /// `host` (no port; IPv6 in brackets) is loopback or the public host.
    fn allows(&self, host: &str) -> bool {
        let host = host.to_ascii_lowercase();
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        let loopback = bare == "localhost"
            || bare.ends_with(".localhost")
            || bare
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback());
        loopback || self.public.as_deref() == Some(host.as_str())
    }

    /// The host of an authority (`host[:port]`).
    fn allows_authority(&self, authority: &str) -> bool {
        authority
            .parse::<axum::http::uri::Authority>()
            .is_ok_and(|a| self.allows(a.host()))
    }
}

fn has_body(headers: &HeaderMap) -> bool {
    headers.contains_key(TRANSFER_ENCODING)
        || headers
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim() != "0")
}

/// The body types the gateway takes: JSON, and a Wasm component for
/// `POST /v1/plugins/{role}`. Neither is one a browser sends cross-site
/// without a preflight.
const BODY_TYPES: [&str; 2] = ["application/json", "application/wasm"];

fn has_body_type(headers: &HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|m| BODY_TYPES.iter().any(|t| m.trim().eq_ignore_ascii_case(t)))
}

/// Checks one request against the rules above.
pub fn check(hosts: &LocalHosts, uri: &Uri, headers: &HeaderMap) -> Result<(), ApiError> {
    let host = headers
        .get(HOST)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .or_else(|| uri.authority().map(|a| a.to_string()));
    if !host.as_deref().is_some_and(|h| hosts.allows_authority(h)) {
        return Err(ApiError::forbidden(
            "with auth off the gateway answers only to loopback hosts (or the host of \
             gateway.public_base_url); set gateway.admin_key to serve other hosts",
        ));
    }
    if let Some(origin) = headers.get(ORIGIN) {
        let allowed = origin
            .to_str()
            .ok()
            .and_then(|o| o.parse::<Uri>().ok())
            .and_then(|u| u.host().map(|h| hosts.allows(h)))
            .unwrap_or(false);
        if !allowed {
            return Err(ApiError::forbidden(
                "cross-site requests are refused while auth is off",
            ));
        }
    }
    if has_body(headers) && !has_body_type(headers) {
        return Err(ApiError::new(
            axum::http::StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "invalid_request_error",
            "with auth off a request body must be sent as Content-Type: application/json \
             (application/wasm for a plugin upload)",
        ));
    }
    Ok(())
}

/// Middleware form of [`check`], installed only while auth is off; a
/// refusal is in the error shape of the API the path belongs to.
pub async fn guard(State(st): State<AppState>, req: Request, next: Next) -> Response {
    match check(&st.local_hosts, req.uri(), req.headers()) {
        Ok(()) => next.run(req).await,
        Err(e) => proxy::error_for_path(req.uri().path(), e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn only_loopback_json_same_site_requests_pass() {
        let hosts = LocalHosts::new(Some("http://gw.svc:8400/"));
        let uri = Uri::from_static("/v1/engines");
        let ok = |pairs: &[(&'static str, &str)]| check(&hosts, &uri, &headers(pairs)).is_ok();
        assert!(ok(&[("host", "127.0.0.1:8400")]));
        assert!(ok(&[("host", "localhost")]));
        assert!(ok(&[("host", "[::1]:9")]));
        assert!(ok(&[("host", "GW.svc:8400")]));
        assert!(ok(&[
            ("host", "127.0.0.1"),
            ("content-type", "application/json; charset=utf-8"),
            ("content-length", "2")
        ]));
        assert!(ok(&[
            ("host", "127.0.0.1"),
            ("origin", "http://localhost:3000")
        ]));
        assert!(!ok(&[("host", "evil.example:8400")]));
        assert!(!ok(&[]));
        assert!(!ok(&[
            ("host", "127.0.0.1"),
            ("origin", "https://evil.example")
        ]));
        assert!(!ok(&[("host", "127.0.0.1"), ("origin", "null")]));
        assert!(!ok(&[
            ("host", "127.0.0.1"),
            ("content-type", "text/plain"),
            ("content-length", "5")
        ]));
        assert!(!ok(&[
            ("host", "127.0.0.1"),
            ("transfer-encoding", "chunked")
        ]));
        let no_public = LocalHosts::new(None);
        assert!(check(&no_public, &uri, &headers(&[("host", "gw.svc")])).is_err());
    }
}
