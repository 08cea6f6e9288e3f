//! A streamed completion answered as Chat Completions chunks: reasoning
//! (`reasoning_content`) and content stream as they are generated; text
//! from a `<tool_call>` on is held back and the parsed calls arrive with the
//! finish reason. Every chunk keeps its completion chunk's token ids and
//! logprobs, so the record assembles as for a passthrough stream.
//! (Streaming each call's name and argument deltas as generated is still to
//! come; today they arrive whole in the last chunk.)

use serde_json::{Value, json};

use agl_conversation::{Family, ToolFormat, openai_chat};

use super::chat_logprobs;

const THINK_OPEN: &str = "<think>";
const THINK_CLOSE: &str = "</think>";
const CALL_OPEN: &str = "<tool_call>";

pub struct ChatChunks {
    family: Family,
    prompt_ids: Vec<u32>,
    id_prefix: String,
    text: String,
    sent_reasoning: usize,
    sent_content: usize,
    first: bool,
}

impl ChatChunks {
    pub fn new(family: Family, prompt_ids: Vec<u32>, id_prefix: &str) -> ChatChunks {
        ChatChunks {
            family,
            prompt_ids,
            id_prefix: id_prefix.to_string(),
            text: String::new(),
            sent_reasoning: 0,
            sent_content: 0,
            first: true,
        }
    }

    /// The completion's text so far.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// One completions chunk in, the chat chunks it becomes out.
    pub fn push(&mut self, chunk: &Value) -> Vec<Value> {
        let envelope = |choices: Value| {
            json!({
                "id": chunk.get("id").cloned().unwrap_or(Value::Null),
                "object": "chat.completion.chunk",
                "created": chunk.get("created").cloned().unwrap_or(json!(0)),
                "model": chunk.get("model").cloned().unwrap_or(Value::Null),
                "choices": choices,
            })
        };
        let Some(choice) = chunk.pointer("/choices/0") else {
            // The usage chunk (`stream_options.include_usage`).
            let mut out = envelope(json!([]));
            out["usage"] = chunk.get("usage").cloned().unwrap_or(Value::Null);
            return vec![out];
        };
        self.text.push_str(
            choice
                .get("text")
                .and_then(Value::as_str)
                .unwrap_or_default(),
        );
        let mut delta = self.deltas();
        if self.first {
            delta["role"] = json!("assistant");
        }
        let mut out = envelope(json!([{
            "index": 0,
            "delta": delta,
            "logprobs": chat_logprobs(choice.get("logprobs")),
            "token_ids": choice.get("token_ids").cloned().unwrap_or(json!([])),
            "finish_reason": null,
        }]));
        if std::mem::take(&mut self.first) {
            out["prompt_token_ids"] = json!(self.prompt_ids);
        }
        let mut chunks = vec![out];
        if let Some(finish) = choice.get("finish_reason").filter(|f| !f.is_null()) {
            let turn = self.family.parse(&self.text);
            let message = openai_chat::response_message(&turn, &self.id_prefix);
            let calls: Vec<Value> = message["tool_calls"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .enumerate()
                .map(|(i, mut c)| {
                    c["index"] = json!(i);
                    c
                })
                .collect();
            let finish = if calls.is_empty() {
                finish.clone()
            } else {
                json!("tool_calls")
            };
            let delta = if calls.is_empty() {
                json!({})
            } else {
                json!({"tool_calls": calls})
            };
            chunks.push(envelope(json!([{
                "index": 0, "delta": delta, "logprobs": null, "finish_reason": finish,
            }])));
        }
        chunks
    }

    /// The reasoning and content not yet sent that can be sent now.
    fn deltas(&mut self) -> Value {
        let mut delta = json!({});
        let (reasoning, content) = self.regions();
        let (reasoning, content) = (reasoning.map(str::to_string), content.map(str::to_string));
        if let Some(r) = reasoning
            && r.len() > self.sent_reasoning
        {
            delta["reasoning_content"] = json!(&r[self.sent_reasoning..]);
            self.sent_reasoning = r.len();
        }
        if let Some(c) = content
            && c.len() > self.sent_content
        {
            delta["content"] = json!(&c[self.sent_content..]);
            self.sent_content = c.len();
        }
        delta
    }

    /// What of the text so far is safely reasoning and content (no marker
    /// half-generated at the end, nothing from a tool call on).
    fn regions(&self) -> (Option<&str>, Option<&str>) {
        let mut text = self.text.as_str();
        let mut reasoning = None;
        if self.family.reasoning {
            match text.find(THINK_CLOSE) {
                None => {
                    let r = text.trim_start();
                    let r = r.strip_prefix(THINK_OPEN).unwrap_or(r).trim_start();
                    return (Some(&r[..safe_end(r, THINK_CLOSE)]), None);
                }
                Some(end) => {
                    let r = text[..end].trim_start();
                    reasoning = Some(r.strip_prefix(THINK_OPEN).unwrap_or(r).trim_start());
                    text = text[end + THINK_CLOSE.len()..].trim_start();
                }
            }
        }
        let content = match self.family.tools {
            ToolFormat::Hermes | ToolFormat::Qwen3Coder => &text[..safe_end(text, CALL_OPEN)],
            ToolFormat::None | ToolFormat::Llama3Json => text,
        };
        (reasoning, Some(content))
    }
}

/// Where text that may be followed by `marker` can be cut: before the
/// marker, or before a tail that could be its first half.
fn safe_end(text: &str, marker: &str) -> usize {
    if let Some(i) = text.find(marker) {
        return i;
    }
    (1..marker.len())
        .rev()
        .find(|&k| text.ends_with(&marker[..k]))
        .map_or(text.len(), |k| text.len() - k)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(text: &str, ids: &[u32], finish: Option<&str>) -> Value {
        json!({"id": "cmpl-1", "created": 1, "model": "m", "choices": [{
            "index": 0, "text": text, "token_ids": ids,
            "logprobs": {"tokens": ids.iter().map(|_| "t").collect::<Vec<_>>(),
                          "token_logprobs": ids.iter().map(|_| -0.5).collect::<Vec<_>>()},
            "finish_reason": finish}]})
    }

    #[test]
    fn reasoning_and_content_stream_and_calls_come_whole() {
        let family = Family {
            tools: ToolFormat::Hermes,
            reasoning: true,
        };
        let mut t = ChatChunks::new(family, vec![1, 2], "x");
        let mut reasoning = String::new();
        let mut content = String::new();
        let mut calls = Vec::new();
        let mut ids = Vec::new();
        let pieces = [
            "<think>\nlook",
            " first\n</th",
            "ink>\n\nSure.",
            " <tool_",
            "call>\n{\"name\": \"bash\", \"arguments\": {}}\n</tool_call>",
        ];
        for (i, p) in pieces.iter().enumerate() {
            let last = i == pieces.len() - 1;
            for c in t.push(&chunk(p, &[i as u32], last.then_some("stop"))) {
                let choice = &c["choices"][0];
                reasoning.push_str(choice["delta"]["reasoning_content"].as_str().unwrap_or(""));
                content.push_str(choice["delta"]["content"].as_str().unwrap_or(""));
                ids.extend(
                    choice["token_ids"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .cloned(),
                );
                if let Some(tc) = choice["delta"]["tool_calls"].as_array() {
                    calls.extend(tc.iter().cloned());
                    assert_eq!(choice["finish_reason"], "tool_calls");
                }
                if i == 0 {
                    assert_eq!(c["prompt_token_ids"], json!([1, 2]));
                }
            }
        }
        assert_eq!(reasoning, "look first\n");
        assert_eq!(content, "Sure. ");
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0]["function"]["name"], "bash");
        assert_eq!(ids, (0..5).map(|i| json!(i)).collect::<Vec<_>>());
    }

    #[test]
    fn a_half_marker_is_held_back() {
        assert_eq!(safe_end("abc <tool", CALL_OPEN), 4);
        assert_eq!(safe_end("abc", CALL_OPEN), 3);
        assert_eq!(safe_end("a<tool_call>b", CALL_OPEN), 1);
    }
}
