//! The controller's view of the gateway's management API, over HTTP with
//! the admin key: the same code path in-process (`agl run`) and remote.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::rollout::RolloutStatus;
use crate::store::state::status_str;

/// Per-request limit: a hung gateway must not stall the loop forever.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The store refused a status change (a 409): someone else moved it.
    #[error("conflict: {0}")]
    Conflict(String),
    #[error("gateway answered {status}: {body}")]
    Status { status: StatusCode, body: String },
    #[error("gateway unreachable: {0}")]
    Http(#[from] reqwest::Error),
}

/// A rollout as the management API shows it (the fields the controller uses).
#[derive(Debug, Clone, Deserialize)]
pub struct RolloutView {
    pub id: String,
    #[serde(default)]
    pub group_id: String,
    pub mode: String,
    pub status: RolloutStatus,
    pub attempt: u32,
    #[serde(default)]
    pub reason: Option<String>,
    #[serde(default)]
    pub input: Value,
    pub proxy_base_url: String,
    pub token: String,
}

#[derive(Debug, Clone, Deserialize)]
pub struct EventView {
    pub seq: u64,
    pub attempt: u32,
    pub kind: String,
    pub payload: Value,
}

#[derive(Deserialize)]
struct Page {
    rollouts: Vec<RolloutView>,
    next_cursor: Option<String>,
}

#[derive(Deserialize)]
struct EventPage {
    events: Vec<EventView>,
    last_seq: Option<u64>,
}

#[derive(Clone)]
pub struct GatewayClient {
    http: reqwest::Client,
    base: String,
    admin_key: Option<String>,
}

impl GatewayClient {
    /// `base` is the gateway's root URL (`http://127.0.0.1:8400`).
    pub fn new(base: &str, admin_key: Option<String>) -> Result<Self, ClientError> {
        let http = reqwest::Client::builder()
            .timeout(REQUEST_TIMEOUT)
            .build()?;
        Ok(GatewayClient {
            http,
            base: base.trim_end_matches('/').to_string(),
            admin_key,
        })
    }

    /// The URL an agent posts its events to.
    pub fn events_url(&self, rollout_id: &str) -> String {
        format!("{}/v1/rollouts/{}/events", self.base, urlencode(rollout_id))
    }

    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, ClientError> {
        let mut req = self.http.request(method, format!("{}{path}", self.base));
        if let Some(key) = &self.admin_key {
            req = req.bearer_auth(key);
        }
        if let Some(body) = body {
            req = req.json(&body);
        }
        let resp = req.send().await?;
        let status = resp.status();
        if status.is_success() {
            return Ok(resp.json().await?);
        }
        let body = resp.text().await.unwrap_or_default();
        if status == StatusCode::CONFLICT {
            return Err(ClientError::Conflict(body));
        }
        Err(ClientError::Status { status, body })
    }

    fn parse<T: serde::de::DeserializeOwned>(v: Value) -> Result<T, ClientError> {
        serde_json::from_value(v).map_err(|e| ClientError::Status {
            status: StatusCode::OK,
            body: format!("unexpected response shape: {e}"),
        })
    }

    /// Up to `limit` rollouts of `status`, oldest first.
    pub async fn list(
        &self,
        status: RolloutStatus,
        limit: u32,
    ) -> Result<Vec<RolloutView>, ClientError> {
        let path = format!("/v1/rollouts?status={}&limit={limit}", status_str(status));
        let page: Page = Self::parse(self.call(Method::GET, &path, None).await?)?;
        Ok(page.rollouts)
    }

    /// Every rollout of `status`, all pages.
    pub async fn list_all(&self, status: RolloutStatus) -> Result<Vec<RolloutView>, ClientError> {
        let mut out = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let mut path = format!("/v1/rollouts?status={}&limit=1000", status_str(status));
            if let Some(c) = &cursor {
                path.push_str(&format!("&cursor={}", urlencode(c)));
            }
            let page: Page = Self::parse(self.call(Method::GET, &path, None).await?)?;
            out.extend(page.rollouts);
            match page.next_cursor {
                Some(c) => cursor = Some(c),
                None => return Ok(out),
            }
        }
    }

    pub async fn get(&self, id: &str) -> Result<RolloutView, ClientError> {
        Self::parse(
            self.call(
                Method::GET,
                &format!("/v1/rollouts/{}", urlencode(id)),
                None,
            )
            .await?,
        )
    }

    /// Moves `attempt` of `id` to `status`; [`ClientError::Conflict`] when the
    /// attempt is not current or the transition is illegal.
    pub async fn set_status(
        &self,
        id: &str,
        attempt: u32,
        status: RolloutStatus,
        reason: Option<&str>,
    ) -> Result<RolloutView, ClientError> {
        let body = json!({"attempt": attempt, "status": status, "reason": reason});
        Self::parse(
            self.call(
                Method::PATCH,
                &format!("/v1/rollouts/{}", urlencode(id)),
                Some(body),
            )
            .await?,
        )
    }

    /// Re-queues a failed rollout as its next attempt.
    pub async fn retry(&self, id: &str) -> Result<RolloutView, ClientError> {
        Self::parse(
            self.call(
                Method::POST,
                &format!("/v1/rollouts/{}/retry", urlencode(id)),
                None,
            )
            .await?,
        )
    }

    pub async fn append_event(
        &self,
        id: &str,
        attempt: u32,
        kind: &str,
        payload: Value,
    ) -> Result<(), ClientError> {
        let body = json!({"attempt": attempt, "kind": kind, "payload": payload});
        self.call(
            Method::POST,
            &format!("/v1/rollouts/{}/events", urlencode(id)),
            Some(body),
        )
        .await
        .map(drop)
    }

    /// Every event of a rollout, all attempts, in order.
    pub async fn events(&self, id: &str) -> Result<Vec<EventView>, ClientError> {
        let mut out = Vec::new();
        let mut after = 0;
        loop {
            let path = format!(
                "/v1/rollouts/{}/events?after={after}&limit=1000",
                urlencode(id)
            );
            let page: EventPage = Self::parse(self.call(Method::GET, &path, None).await?)?;
            let done = page.events.is_empty();
            out.extend(page.events);
            match page.last_seq {
                Some(last) if !done => after = last,
                _ => return Ok(out),
            }
        }
    }
}

/// Percent-encodes a path segment or query value (rollout ids may hold any
/// character but `/`).
fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}
