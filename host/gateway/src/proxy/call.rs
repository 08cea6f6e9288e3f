//! One proxied call after its checks passed: the context its record needs,
//! and committing that record to the store.

use std::collections::BTreeMap;
use std::time::Instant;

use serde_json::value::RawValue;

use super::dedup::retry_key;
use super::record::Tokens;
use crate::control::now_ms;
use crate::{ApiError, AppState, CallGuard};
use agl_store::Engine;
use agl_wire::record::{CallStatus, ModelRequest};
use agl_wire::rollout::{ApiKind, JsonText};

/// How a call ended, for its record.
pub struct CallOutcome {
    pub response: JsonText,
    pub tokens: Tokens,
    pub error: Option<String>,
    pub upstream_status: Option<u16>,
}

impl CallOutcome {
    /// A failed call: no response, no tokens.
    pub fn failed(error: String, upstream_status: Option<u16>) -> Self {
        CallOutcome {
            response: JsonText::default(),
            tokens: Tokens::default(),
            error: Some(error),
            upstream_status,
        }
    }
}

pub struct Call {
    pub st: AppState,
    pub rollout_id: String,
    pub attempt: u32,
    pub api: ApiKind,
    pub request: Box<RawValue>,
    pub engine: Engine,
    pub weight_version: u64,
    pub tags: BTreeMap<String, String>,
    pub started_ms: u64,
    pub started: Instant,
    /// Keeps the call in flight (for drain) until the record is committed.
    pub _guard: CallGuard,
}

impl Call {
    /// Appends the call's `model_request` event; resolves once committed.
    pub async fn commit(&self, out: CallOutcome) -> Result<u64, ApiError> {
        if out.error.is_some() {
            self.st.metrics.upstream_error();
        }
        let ok = out.error.is_none();
        let record = ModelRequest::<&RawValue> {
            api: self.api,
            request: &self.request,
            response: out.response,
            prompt_ids: out.tokens.prompt_ids,
            response_ids: out.tokens.response_ids,
            response_logprobs: out.tokens.response_logprobs,
            weight_version: self.weight_version,
            finish_reason: out.tokens.finish_reason,
            started_at_ms: self.started_ms,
            finished_at_ms: now_ms(),
            tags: self.tags.clone(),
            engine: self.engine.name.clone(),
            latency_ms: self.started.elapsed().as_millis() as u64,
            status: if ok {
                CallStatus::Ok
            } else {
                CallStatus::Error
            },
            error: out.error,
            upstream_status: out.upstream_status,
        };
        // A client retry of an earlier call supersedes it in the same
        // transaction, so a crash cannot leave both exported.
        let retry = retry_key(self.attempt, &record.prompt_ids).filter(|_| ok);
        let (retries, rollout_id) = (self.st.retries.clone(), self.rollout_id.clone());
        let seq = self
            .st
            .store
            .append_call(
                &self.rollout_id,
                self.attempt,
                record.to_payload(),
                move |seq| retry.and_then(|key| retries.observe(&rollout_id, key, seq)),
            )
            .await?;
        self.st.metrics.event_written();
        Ok(seq)
    }
}
