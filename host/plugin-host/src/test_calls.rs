//! Hand-made call records for the unit tests.

use agl_wire::rollout::ModelCall;

/// A chat call with these ids, log-prob -0.1 per response id, `{}` bodies.
pub(crate) fn call(index: u32, prompt: &[u32], response: &[u32]) -> ModelCall {
    ModelCall::chat(
        index,
        Default::default(),
        (prompt.to_vec(), response.to_vec()),
        vec![-0.1; response.len()],
    )
}
