//! The gateway's management API over HTTP with the admin key: what the
//! controller calls (claim, finish, retry rollouts; post events) and what
//! `agl train` calls (create, watch, export and cancel rollouts; pause,
//! drain and resume the proxy; record weight versions; register the
//! engine). The same code path in-process (`agl run`) and remote.

use std::time::Duration;

use agl_wire::api::{
    AppendEvent, Changes, CreateRollouts, DrainRequest, Engine, EventList, EventRecord,
    LatestWeights, NewRollout, RecordWeightVersion, RegisterEngine, RolloutList, RolloutView,
    StatusPatch, WeightVersion,
};
use agl_wire::rollout::{JsonText, Rollout, RolloutStatus};
use agl_wire::urls::{self, encode_segment as urlencode};
use reqwest::{Method, StatusCode};
use serde::Serialize;
use serde_json::Value;

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

    /// The gateway's root URL.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// The URL an agent posts its events to, on this client's gateway
    /// address (the gateway also returns one with every rollout).
    pub fn events_url(&self, rollout_id: &str) -> String {
        urls::events_url(&self.base, rollout_id)
    }

    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<&(impl Serialize + ?Sized)>,
    ) -> Result<Value, ClientError> {
        self.call_within(method, path, body, REQUEST_TIMEOUT).await
    }

    /// [`Self::call`] with its own time limit (a request that waits on the
    /// gateway by design: a drain).
    async fn call_within(
        &self,
        method: Method,
        path: &str,
        body: Option<&(impl Serialize + ?Sized)>,
        timeout: Duration,
    ) -> Result<Value, ClientError> {
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.base))
            .timeout(timeout);
        if let Some(key) = &self.admin_key {
            req = req.bearer_auth(key);
        }
        if let Some(body) = body {
            req = req.json(body);
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
        let path = format!("/v1/rollouts?status={}&limit={limit}", status.as_str());
        let page: RolloutList = Self::parse(self.call(Method::GET, &path, NONE).await?)?;
        Ok(page.rollouts)
    }

    /// Every rollout of `status`, all pages.
    pub async fn list_all(&self, status: RolloutStatus) -> Result<Vec<RolloutView>, ClientError> {
        self.all_pages(&format!("status={}", status.as_str())).await
    }

    /// Every rollout of group `group_id`, in creation order, all pages.
    pub async fn list_group(&self, group_id: &str) -> Result<Vec<RolloutView>, ClientError> {
        self.all_pages(&format!("group_id={}", urlencode(group_id)))
            .await
    }

    /// Every page of `/v1/rollouts?{filter}`.
    async fn all_pages(&self, filter: &str) -> Result<Vec<RolloutView>, ClientError> {
        let mut out = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let mut path = format!("/v1/rollouts?{filter}&limit=1000");
            if let Some(c) = &cursor {
                path.push_str(&format!("&cursor={}", urlencode(c)));
            }
            let page: RolloutList = Self::parse(self.call(Method::GET, &path, NONE).await?)?;
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
                NONE,
            )
            .await?,
        )
    }

    /// Applies `patch` to `id`; [`ClientError::Conflict`] when the attempt
    /// is not current or the transition is illegal.
    pub async fn set_status(
        &self,
        id: &str,
        patch: &StatusPatch,
    ) -> Result<RolloutView, ClientError> {
        Self::parse(
            self.call(
                Method::PATCH,
                &format!("/v1/rollouts/{}", urlencode(id)),
                Some(patch),
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
                NONE,
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
        let body = AppendEvent {
            attempt: Some(attempt),
            kind: kind.to_string(),
            payload: JsonText::from(payload),
        };
        self.call(
            Method::POST,
            &format!("/v1/rollouts/{}/events", urlencode(id)),
            Some(&body),
        )
        .await
        .map(drop)
    }

    /// Every event of a rollout, all attempts, in order.
    pub async fn events(&self, id: &str) -> Result<Vec<EventRecord>, ClientError> {
        let mut out = Vec::new();
        let mut after = 0;
        loop {
            let path = format!(
                "/v1/rollouts/{}/events?after={after}&limit=1000",
                urlencode(id)
            );
            let page: EventList = Self::parse(self.call(Method::GET, &path, NONE).await?)?;
            let done = page.events.is_empty();
            out.extend(page.events);
            match page.last_seq {
                Some(last) if !done => after = last,
                _ => return Ok(out),
            }
        }
    }
}

impl GatewayClient {
    /// Creates `rollouts` (an id that exists returns the existing rollout).
    pub async fn create(&self, rollouts: Vec<NewRollout>) -> Result<Vec<RolloutView>, ClientError> {
        let body = CreateRollouts { rollouts };
        let page: RolloutList =
            Self::parse(self.call(Method::POST, "/v1/rollouts", Some(&body)).await?)?;
        Ok(page.rollouts)
    }

    pub async fn cancel(&self, id: &str) -> Result<RolloutView, ClientError> {
        let path = format!("/v1/rollouts/{}/cancel", urlencode(id));
        Self::parse(self.call(Method::POST, &path, NONE).await?)
    }

    /// The rollout as the trainer takes it (rollout JSONL shape).
    pub async fn export(&self, id: &str) -> Result<Rollout, ClientError> {
        let path = format!("/v1/rollouts/{}/export", urlencode(id));
        Self::parse(self.call(Method::GET, &path, NONE).await?)
    }

    pub async fn latest_weights(&self) -> Result<Option<WeightVersion>, ClientError> {
        let latest: LatestWeights =
            Self::parse(self.call(Method::GET, "/v1/weights", NONE).await?)?;
        Ok(latest.latest)
    }

    /// Records that the engine serves `version`; a version twice is a
    /// [`ClientError::Conflict`].
    pub async fn record_weights(
        &self,
        version: u64,
        meta: JsonText,
    ) -> Result<WeightVersion, ClientError> {
        let body = RecordWeightVersion { version, meta };
        Self::parse(self.call(Method::POST, "/v1/weights", Some(&body)).await?)
    }

    pub async fn pause(&self) -> Result<(), ClientError> {
        self.call(Method::POST, "/v1/proxy/pause", NONE)
            .await
            .map(drop)
    }

    pub async fn resume(&self) -> Result<(), ClientError> {
        self.call(Method::POST, "/v1/proxy/resume", NONE)
            .await
            .map(drop)
    }

    /// Waits up to `timeout` for the proxy's in-flight calls: how many
    /// were still in flight at the end.
    pub async fn drain(&self, timeout: Duration) -> Result<usize, ClientError> {
        let body = DrainRequest {
            timeout_ms: timeout.as_millis() as u64,
        };
        // The request outlives the drain it asks for.
        let limit = timeout + REQUEST_TIMEOUT;
        let v = self
            .call_within(Method::POST, "/v1/proxy/drain", Some(&body), limit)
            .await?;
        Ok(v["in_flight"].as_array().map_or(0, Vec::len))
    }

    /// Waits up to `wait` for the store's change counter to move from
    /// `after`; the counter now.
    pub async fn wait_change(&self, after: u64, wait: Duration) -> Result<u64, ClientError> {
        let path = format!("/v1/changes?after={after}&wait_ms={}", wait.as_millis());
        let limit = wait + REQUEST_TIMEOUT;
        let changes: Changes =
            Self::parse(self.call_within(Method::GET, &path, NONE, limit).await?)?;
        Ok(changes.generation)
    }

    pub async fn register_engine(&self, engine: &RegisterEngine) -> Result<Engine, ClientError> {
        Self::parse(self.call(Method::POST, "/v1/engines", Some(engine)).await?)
    }
}

/// No request body.
const NONE: Option<&()> = None;
