//! Hand-made call records for the unit tests.

use agl_wire::rollout::{ApiKind, ModelCall};

/// A chat call with these ids, log-prob -0.1 per response id, `{}` bodies.
pub(crate) fn call(index: u32, prompt: &[u32], response: &[u32]) -> ModelCall {
    ModelCall {
        index,
        api: ApiKind::ChatCompletions,
        request: Default::default(),
        response: Default::default(),
        prompt_ids: prompt.to_vec(),
        response_ids: response.to_vec(),
        response_logprobs: vec![-0.1; response.len()],
        weight_version: 0,
        response_versions: None,
        finish_reason: None,
        started_at_ms: 0,
        finished_at_ms: 0,
        tags: Default::default(),
        continues: None,
        constrained: false,
        choice: None,
    }
}
