//! The engine's deterministic "tokenizer" and logprob scheme.
//!
//! One token per UTF-8 byte, id = byte + [`ID_OFFSET`], so a test can compute
//! the exact ids any prompt or reply must produce.

use std::fmt;
use std::sync::Arc;

use serde_json::Value;

type Encode = dyn Fn(&str) -> Vec<u32> + Send + Sync;
type Decode = dyn Fn(&[u32]) -> String + Send + Sync;

/// How the engine turns text into token ids and back: one id per byte by
/// default ([`encode`], [`decode`]), or a real tokenizer's, so that a
/// gateway rendering with that tokenizer and this engine agree on ids.
#[derive(Clone)]
pub struct Codec {
    encode: Arc<Encode>,
    decode: Arc<Decode>,
}

impl Codec {
    pub fn new(
        encode: impl Fn(&str) -> Vec<u32> + Send + Sync + 'static,
        decode: impl Fn(&[u32]) -> String + Send + Sync + 'static,
    ) -> Self {
        Codec {
            encode: Arc::new(encode),
            decode: Arc::new(decode),
        }
    }

    pub fn encode(&self, text: &str) -> Vec<u32> {
        (self.encode)(text)
    }

    pub fn decode(&self, ids: &[u32]) -> String {
        (self.decode)(ids)
    }
}

impl Default for Codec {
    fn default() -> Self {
        Codec::new(encode, decode)
    }
}

impl fmt::Debug for Codec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Codec")
    }
}

/// Added to each byte so ids never collide with small literal numbers in tests.
pub const ID_OFFSET: u32 = 1000;

/// Token ids of `text`: its UTF-8 bytes plus [`ID_OFFSET`].
pub fn encode(text: &str) -> Vec<u32> {
    text.bytes().map(|b| u32::from(b) + ID_OFFSET).collect()
}

/// Byte of a token id; ids outside the byte range map to `?`.
pub fn id_byte(id: u32) -> u8 {
    id.checked_sub(ID_OFFSET)
        .and_then(|b| u8::try_from(b).ok())
        .unwrap_or(b'?')
}

/// Text of token ids (lossy: a split multi-byte character becomes U+FFFD).
pub fn decode(ids: &[u32]) -> String {
    let bytes: Vec<u8> = ids.iter().map(|&id| id_byte(id)).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Logprob of the sampled token at position `i` of a completion.
pub fn logprob(i: usize) -> f64 {
    -0.01 * ((i % 7) + 1) as f64
}

/// Logprob of the `rank`-th alternative (rank 0 = the sampled token).
pub fn top_logprob(i: usize, rank: usize) -> f64 {
    logprob(i) - rank as f64
}

/// Token of the `rank`-th alternative to `id` (rank 0 = `id` itself).
pub fn alternative(id: u32, rank: usize) -> u32 {
    let byte = (usize::from(id_byte(id)) + rank) % 256;
    byte as u32 + ID_OFFSET
}

/// Display string of one token (lossy for bytes that are not ASCII).
pub fn token_str(id: u32) -> String {
    String::from_utf8_lossy(&[id_byte(id)]).into_owned()
}

/// Prompt text of a chat request: `role: content\n` per message, then
/// `tools: <json>\n` when tools are given. Tool calls of a message follow
/// its content as JSON so a multi-turn prompt still changes with them.
pub fn render_chat(messages: &[Value], tools: Option<&Value>) -> String {
    let mut out = String::new();
    for message in messages {
        let role = message.get("role").and_then(Value::as_str).unwrap_or("");
        out.push_str(role);
        out.push_str(": ");
        out.push_str(&content_text(message.get("content")));
        if let Some(calls) = message.get("tool_calls").filter(|c| !c.is_null()) {
            out.push_str(&calls.to_string());
        }
        out.push('\n');
    }
    if let Some(tools) = tools.filter(|t| !t.is_null()) {
        out.push_str("tools: ");
        out.push_str(&tools.to_string());
        out.push('\n');
    }
    out
}

/// Text of a message's content: a string, or the `text` of each part.
fn content_text(content: Option<&Value>) -> String {
    match content {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect(),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn encode_decode_round_trip() {
        let ids = encode("hé");
        assert_eq!(ids, vec![1104, 1195, 1169]);
        assert_eq!(decode(&ids), "hé");
        assert_eq!(decode(&ids[..2]), "h\u{FFFD}");
    }

    #[test]
    fn chat_rendering_includes_tools() {
        let msgs = vec![json!({"role": "user", "content": [{"type": "text", "text": "hi"}]})];
        let tools = json!([{"type": "function"}]);
        assert_eq!(
            render_chat(&msgs, Some(&tools)),
            "user: hi\ntools: [{\"type\":\"function\"}]\n"
        );
    }
}
