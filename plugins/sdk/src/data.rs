//! The bulky parts of the rollout being processed, fetched from the host
//! when a plugin needs them (`rollout-data` in `wit/agl.wit`): a call's
//! request and response JSON and its whole prompt ids. The rollout itself
//! carries each prompt as what it adds to an earlier call
//! ([`crate::Prompt`]), so an adapter that only merges chains copies
//! neither the JSON nor a prompt twice. Natively the data is what
//! [`crate::testing::rollout`] registered on this thread.

use std::borrow::Cow;

use crate::ModelCall;

#[cfg(target_arch = "wasm32")]
use crate::bindings::adapter::agl::adapter::rollout_data as host;

#[cfg(not(target_arch = "wasm32"))]
use crate::testing::data as host;

/// The call's request body exactly as the harness sent it (JSON text).
/// Errs for a call that is not of the rollout under way (the host serves
/// only that one, and only during `build-samples` or `reward`).
pub fn request_json(call: &ModelCall) -> Result<String, String> {
    host::request_json(call.index).ok_or_else(|| missing(call, "request"))
}

/// The call's response body (JSON text; assembled if streamed).
pub fn response_json(call: &ModelCall) -> Result<String, String> {
    host::response_json(call.index).ok_or_else(|| missing(call, "response"))
}

/// The call's whole prompt ids: its `tail` when it extends no call, else
/// fetched from the host.
///
/// # Panics
/// For a call that is not of the rollout under way: that is a plugin bug
/// (a hand-made call, or a call kept from another rollout), and the panic
/// fails this rollout's plugin call with the message, never the host.
pub fn prompt_ids(call: &ModelCall) -> Cow<'_, [u32]> {
    if call.prompt.extends.is_none() {
        return Cow::Borrowed(&call.prompt.tail);
    }
    match host::prompt_ids(call.index) {
        Some(ids) => Cow::Owned(ids),
        None => panic!("{}", missing(call, "prompt")),
    }
}

/// The length of the call's whole prompt.
pub fn prompt_len(call: &ModelCall) -> usize {
    call.prompt.shared as usize + call.prompt.tail.len()
}

fn missing(call: &ModelCall, what: &str) -> String {
    format!(
        "call {}: the host has no {what} for it (it serves the calls of the rollout under way, \
         during build-samples or reward)",
        call.index
    )
}
