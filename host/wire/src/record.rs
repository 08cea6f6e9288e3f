//! Events with a fixed payload: the `model_request` record the proxy writes
//! for every call (and the export reads back), the `reward` event a
//! harness posts to report its own reward, and the `tool_call` event it
//! posts for each tool it runs.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::rollout::{ApiKind, Choice, JsonText, ModelCall};

/// The event kind the gateway records each proxied call as. Only the proxy
/// (or the admin) may write it.
pub const MODEL_REQUEST: &str = "model_request";

/// The event kind a harness posts to report its own reward.
pub const REWARD: &str = "reward";

/// The event kind a harness posts each time it runs one of its tools:
/// `{"name": <tool>, ...}`, other keys its own (input, output). agl only
/// counts them (a rollout's tool use in the step records); what a tool
/// call is, only the harness knows.
pub const TOOL_CALL: &str = "tool_call";

/// The `model_request` payload: a [`ModelCall`] without `index` (the export
/// numbers calls), plus what the gateway knows about serving it. `Req` is
/// the request body: borrowed raw JSON when written (the proxy never copies
/// or re-serialises a harness's history), [`JsonText`] when read. Reading
/// tolerates unknown keys and missing token fields (an errored call).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ModelRequest<Req = JsonText> {
    pub api: ApiKind,
    /// Verbatim: the body as the harness sent it.
    #[serde(default)]
    pub request: Req,
    /// The response body (assembled if streamed).
    #[serde(default)]
    pub response: JsonText,
    #[serde(default, serialize_with = "crate::ids::serialize")]
    pub prompt_ids: Vec<u32>,
    #[serde(default, serialize_with = "crate::ids::serialize")]
    pub response_ids: Vec<u32>,
    #[serde(default)]
    pub response_logprobs: Vec<f32>,
    #[serde(default)]
    pub weight_version: u64,
    /// The temperature the gateway sampled the call at (it sets every
    /// call's, `[gateway] train_temperature` or `val_temperature`): what the
    /// trainer scores the tokens at. `None` in records from before it was
    /// recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    /// The weight version that sampled each response token, when the
    /// engine reported one (agl's `token_weight_versions`) that is not
    /// `weight_version`: an update came while the call ran (partial
    /// rollouts). `None`: every token is of `weight_version`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_versions: Option<Vec<u64>>,
    /// The weight version the engine itself reported with its answer
    /// (SGLang's `meta_info.weight_version`), when it reports one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine_weight_version: Option<String>,
    #[serde(default)]
    pub finish_reason: Option<String>,
    #[serde(default)]
    pub started_at_ms: u64,
    #[serde(default)]
    pub finished_at_ms: u64,
    /// `x-agl-*` request headers, lower-cased.
    #[serde(default)]
    pub tags: BTreeMap<String, String>,
    /// The engine that served it.
    #[serde(default)]
    pub engine: String,
    #[serde(default)]
    pub latency_ms: u64,
    #[serde(default)]
    pub status: CallStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream_status: Option<u16>,
    /// The call (event seq) whose prompt and response this call's prompt
    /// continues token-exactly (gateway-rendered calls only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub continues: Option<u64>,
    /// The engine sampled under a constraint (`response_format` JSON,
    /// `structured_outputs`, a forced `tool_choice`): each logprob is under
    /// the masked distribution the token was drawn from, not the policy's.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub constrained: bool,
    /// Which choice of an `n` > 1 request this record holds (each choice
    /// is a record of its own; `response` holds that choice only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub choice: Option<Choice>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CallStatus {
    #[default]
    Ok,
    Error,
    /// The client went away before the answer reached it; the engine's
    /// work was stopped and the call is not part of the exported rollout.
    Cancelled,
}

impl ModelRequest<JsonText> {
    /// The call as exported at `index`; `continues` is the index of the
    /// exported call this one continues (the record names it by seq).
    pub fn into_call(self, index: u32, continues: Option<u32>) -> ModelCall {
        ModelCall {
            index,
            api: self.api,
            request: self.request,
            response: self.response,
            prompt_ids: self.prompt_ids,
            response_ids: self.response_ids,
            response_logprobs: self.response_logprobs,
            weight_version: self.weight_version,
            temperature: self.temperature,
            response_versions: self.response_versions,
            finish_reason: self.finish_reason,
            started_at_ms: self.started_at_ms,
            finished_at_ms: self.finished_at_ms,
            tags: self.tags,
            continues,
            constrained: self.constrained,
            choice: self.choice,
        }
    }
}

impl<Req: Serialize> ModelRequest<Req> {
    pub fn to_payload(&self) -> JsonText {
        // Plain data with string keys always serialises.
        serde_json::value::to_raw_value(self)
            .map(JsonText::from_raw)
            .unwrap_or_default()
    }
}

/// The `reward` event's payload: `{"value": <number>, ...}`; other keys are
/// the harness's own (e.g. `tests_passed`) and are kept for people reading
/// the rollout. The last `reward` event of an attempt is the harness's
/// reward.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RewardEvent {
    pub value: f64,
    #[serde(flatten)]
    pub extra: serde_json::Map<String, Value>,
}

impl RewardEvent {
    /// Reads a payload: `{"value": x, ...}`, or a bare number `x` (accepted
    /// for harnesses that post just the number). Anything else is an error
    /// naming the payload, never a silent zero.
    pub fn read(payload: &str) -> Result<f64, String> {
        let v: Value = serde_json::from_str(payload)
            .map_err(|e| format!("reward event payload is not JSON: {e}"))?;
        let value = match &v {
            Value::Object(fields) => fields.get("value"),
            n @ Value::Number(_) => Some(n),
            _ => None,
        };
        value
            .and_then(Value::as_f64)
            .ok_or_else(|| format!("reward event payload has no numeric `value`: {v}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reward_payloads() {
        assert_eq!(RewardEvent::read(r#"{"value": 0.5, "tests": 3}"#), Ok(0.5));
        assert_eq!(RewardEvent::read("1"), Ok(1.0));
        assert!(RewardEvent::read(r#"{"reward": 1}"#).is_err());
        assert!(RewardEvent::read(r#""1""#).is_err());
    }

    #[test]
    fn a_record_reads_back_as_the_call_it_wrote() {
        let raw = serde_json::value::to_raw_value(&serde_json::json!({"messages": []})).unwrap();
        let written = ModelRequest::<&serde_json::value::RawValue> {
            api: ApiKind::ChatCompletions,
            request: &raw,
            response: JsonText::from(serde_json::json!({"id": "x"})),
            prompt_ids: vec![1, 2],
            response_ids: vec![3, 8],
            response_logprobs: vec![-0.25, -0.5],
            weight_version: 4,
            temperature: Some(0.7),
            // The second token came after an update (a partial rollout).
            response_versions: Some(vec![4, 5]),
            engine_weight_version: Some("4".into()),
            finish_reason: Some("stop".into()),
            started_at_ms: 10,
            finished_at_ms: 20,
            tags: BTreeMap::from([("x-agl-agent".into(), "main".into())]),
            engine: "e".into(),
            latency_ms: 10,
            status: CallStatus::Ok,
            error: None,
            upstream_status: None,
            continues: None,
            constrained: false,
            choice: Some(Choice { index: 1, count: 3 }),
        };
        let read: ModelRequest = serde_json::from_str(written.to_payload().as_str()).unwrap();
        let call = read.into_call(7, None);
        assert_eq!(call.index, 7);
        assert_eq!(call.request.as_str(), raw.get());
        assert_eq!(call.response_logprobs, vec![-0.25, -0.5]);
        assert_eq!(call.temperature, Some(0.7), "the temperature sampled at");
        assert_eq!(call.token_versions(), vec![4, 5]);
        assert_eq!(call.tags["x-agl-agent"], "main");
        assert_eq!(call.choice, Some(Choice { index: 1, count: 3 }));
        // An errored call without token fields still reads.
        let failed: ModelRequest =
            serde_json::from_str(r#"{"api": "completions", "status": "error", "extra": 1}"#)
                .unwrap();
        assert_eq!(failed.status, CallStatus::Error);
        assert!(failed.prompt_ids.is_empty());
        // A call without per-token versions is all of its one version.
        let mut whole = call.clone();
        whole.response_versions = None;
        assert_eq!(whole.token_versions(), vec![4, 4]);
    }
}
