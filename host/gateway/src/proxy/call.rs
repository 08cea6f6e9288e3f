//! One proxied call after its checks passed: the context its record needs,
//! and committing that record to the store.

use std::collections::BTreeMap;
use std::time::Instant;

use serde_json::value::RawValue;

use super::dedup::{RetryKey, retry_key};
use super::front::Front;
use super::record::Tokens;
use super::serving::Serving;
use crate::control::now_ms;
use crate::{ApiError, AppState, CallGuard};
use agl_store::Engine;
use agl_wire::json;
use agl_wire::record::{CallStatus, ModelRequest};
use agl_wire::rollout::{Choice, JsonText};

/// Requests larger than this are not kept in the record of a call that
/// failed or was cancelled: it is not training data, and a refused 32 MiB
/// body should not cost 32 MiB of store.
const KEEP_UNUSED_REQUEST_BYTES: usize = 1 << 20;

/// How a call ended, for its record.
pub struct CallOutcome {
    pub status: CallStatus,
    pub response: JsonText,
    pub tokens: Tokens,
    pub error: Option<String>,
    pub upstream_status: Option<u16>,
}

impl CallOutcome {
    /// A failed call: no response, no tokens.
    pub fn failed(error: String, upstream_status: Option<u16>) -> Self {
        CallOutcome {
            status: CallStatus::Error,
            response: JsonText::default(),
            tokens: Tokens::default(),
            error: Some(error),
            upstream_status,
        }
    }

    /// An outcome whose response was assembled (a stream's, which can
    /// nest deeper than any one chunk did), checked against the depth the
    /// record keeps it at: one level down, as the request, which was
    /// checked at that depth before it was forwarded, so the payload is
    /// within the limit without a pass over all of it. A whole answer's
    /// body is checked as it is read (`record_body`).
    pub fn checked(mut self) -> Self {
        if let Err(e) = self.response.check(json::MAX_DEPTH - 1) {
            self.response = JsonText::default();
            self.status = CallStatus::Error;
            self.error = Some(format!("engine response cannot be kept: {e}"));
        }
        self
    }

    /// The client left before the answer was complete; `tokens` and
    /// `response` are what the engine had produced by then.
    pub fn cancelled(response: JsonText, tokens: Tokens, upstream_status: Option<u16>) -> Self {
        CallOutcome {
            status: CallStatus::Cancelled,
            response,
            tokens,
            error: Some("the client disconnected before the answer was complete".into()),
            upstream_status,
        }
    }
}

/// A committed record: its seq and retry key (for the delivery note).
pub struct Committed {
    pub seq: u64,
    pub retry: Option<RetryKey>,
}

pub struct Call {
    pub st: AppState,
    pub rollout_id: String,
    pub attempt: u32,
    pub front: &'static dyn Front,
    pub request: Box<RawValue>,
    pub engine: Engine,
    pub weight_version: u64,
    /// The temperature the gateway set on the request.
    pub temperature: f64,
    pub tags: BTreeMap<String, String>,
    pub started_ms: u64,
    pub started: Instant,
    /// Keeps the call in flight (for drain) until the record is committed.
    pub _guard: CallGuard,
    /// Passed through, or rendered by the gateway.
    pub serving: Serving,
    /// The engine was asked to sample under a constraint.
    pub constrained: bool,
    /// The choices asked for (`n`); each is recorded as its own call.
    pub choices: u32,
}

impl Call {
    /// Appends the call's `model_request` event; resolves once committed.
    pub async fn commit(&self, out: CallOutcome) -> Result<Committed, ApiError> {
        let mut committed = self.commit_choices(vec![out]).await?;
        Ok(committed.remove(0))
    }

    /// Appends one `model_request` event per outcome, in one transaction:
    /// the choices of an `n` > 1 answer in index order, each a call of its
    /// own that names its choice. Resolves once committed.
    pub async fn commit_choices(&self, outs: Vec<CallOutcome>) -> Result<Vec<Committed>, ApiError> {
        let count = outs.len() as u32;
        let mut payloads = Vec::with_capacity(outs.len());
        let mut keys = Vec::with_capacity(outs.len());
        for (index, out) in (0..).zip(outs) {
            let choice = (count > 1).then_some(Choice { index, count });
            let (payload, key) = self.record(out, choice);
            payloads.push(payload);
            keys.push(key);
        }
        // A client retry of an earlier call supersedes it in the same
        // transaction, so a crash cannot leave both exported.
        let (retries, rollout_id) = (self.st.retries.clone(), self.rollout_id.clone());
        let observed = keys.clone();
        let seqs = self
            .st
            .store
            .append_calls(&self.rollout_id, self.attempt, payloads, move |seqs| {
                seqs.iter()
                    .zip(observed)
                    .filter_map(|(seq, key)| retries.observe(&rollout_id, key?, *seq))
                    .collect()
            })
            .await?;
        for _ in &seqs {
            self.st.metrics.event_written();
        }
        Ok(seqs
            .into_iter()
            .zip(keys)
            .map(|(seq, retry)| Committed { seq, retry })
            .collect())
    }

    /// The `model_request` payload of one outcome and its retry key (only
    /// a call that succeeded can be retried).
    fn record(&self, out: CallOutcome, choice: Option<Choice>) -> (JsonText, Option<RetryKey>) {
        match out.status {
            CallStatus::Ok => {}
            CallStatus::Error => self.st.metrics.upstream_error(),
            CallStatus::Cancelled => self.st.metrics.call_cancelled(),
        }
        let request: &RawValue = if out.status != CallStatus::Ok
            && self.request.get().len() > KEEP_UNUSED_REQUEST_BYTES
        {
            RawValue::NULL
        } else {
            &self.request
        };
        let response_versions = out.tokens.versions_to_record(self.weight_version);
        let record = ModelRequest::<&RawValue> {
            api: self.front.kind(),
            request,
            response: out.response,
            prompt_ids: out.tokens.prompt_ids,
            response_ids: out.tokens.response_ids,
            response_logprobs: out.tokens.response_logprobs,
            weight_version: self.weight_version,
            temperature: Some(self.temperature),
            response_versions,
            engine_weight_version: out.tokens.engine_weight_version,
            finish_reason: out.tokens.finish_reason,
            started_at_ms: self.started_ms,
            finished_at_ms: now_ms(),
            tags: self.tags.clone(),
            engine: self.engine.name.clone(),
            latency_ms: self.started.elapsed().as_millis() as u64,
            status: out.status,
            error: out.error,
            upstream_status: out.upstream_status,
            continues: self.serving.continues(),
            constrained: self.constrained,
            choice,
        };
        let payload = record.to_payload();
        let ok = record.status == CallStatus::Ok;
        let key = retry_key(self.attempt, &record.prompt_ids, choice).filter(|_| ok);
        (payload, key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nested(depth: usize) -> serde_json::Value {
        (0..depth).fold(serde_json::json!(1), |inner, _| serde_json::json!([inner]))
    }

    fn ok(response: serde_json::Value) -> CallOutcome {
        CallOutcome {
            status: CallStatus::Ok,
            response: JsonText::from(response),
            tokens: Tokens::default(),
            error: None,
            upstream_status: Some(200),
        }
    }

    #[test]
    fn an_assembled_response_too_deep_to_keep_is_recorded_as_an_error() {
        let within = ok(nested(json::MAX_DEPTH - 1)).checked();
        assert_eq!(within.status, CallStatus::Ok);
        assert_eq!(within.response, JsonText::from(nested(json::MAX_DEPTH - 1)));
        let deep = ok(nested(json::MAX_DEPTH)).checked();
        assert_eq!(deep.status, CallStatus::Error);
        assert_eq!(deep.response, JsonText::default());
        let error = deep.error.unwrap_or_default();
        assert!(error.contains("cannot be kept"), "{error}");
    }
}
