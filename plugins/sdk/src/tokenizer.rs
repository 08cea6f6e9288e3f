//! The policy's tokenizer, when the host has one. Natively there is none
//! unless a test installs a fake with [`crate::testing::set_tokenizer`].

#[cfg(target_arch = "wasm32")]
use crate::bindings::adapter::agl::adapter::tokenizer as host;

#[cfg(not(target_arch = "wasm32"))]
use crate::testing::tokenizer as host;

/// Whether a tokenizer is configured at all; every other function errs
/// without one.
pub fn available() -> bool {
    host::available()
}

/// Vocabulary size including added tokens.
pub fn vocab_size() -> Result<u32, String> {
    host::vocab_size()
}

pub fn encode(text: &str, add_special_tokens: bool) -> Result<Vec<u32>, String> {
    host::encode(text, add_special_tokens)
}

pub fn decode(ids: &[u32], skip_special_tokens: bool) -> Result<String, String> {
    host::decode(ids, skip_special_tokens)
}

/// Renders OpenAI-style `messages` (a JSON array) with the model's chat
/// template, as Hugging Face `apply_chat_template(tokenize=False)` would.
pub fn apply_chat_template(
    messages_json: &str,
    tools_json: Option<&str>,
    add_generation_prompt: bool,
) -> Result<String, String> {
    host::apply_chat_template(messages_json, tools_json, add_generation_prompt)
}
