//! Builds the full call record out of SSE chunks as they pass through:
//! content (or text), tool calls, token ids, logprobs, finish reason, usage.

use agl_wire::openai::{
    self, ChatChoice, ChatCompletion, ChatLogprobs, ChatMessage, Completion, CompletionChoice,
    CompletionLogprobs, TokenLogprob, Usage,
};
use serde::Deserialize;
use serde_json::Value;

use super::record::{Tokens, ids, logprobs, version_text, versions};
use agl_wire::rollout::ApiKind;

#[derive(Default)]
struct ToolCall {
    id: String,
    name: String,
    arguments: String,
}

/// Most choices one stream is assembled into; an index beyond the choices
/// seen (or this) is garbage and ignored.
const MAX_CHOICES: usize = 128;

/// One choice's part of the stream.
#[derive(Default)]
struct ChoiceParts {
    text: String,
    /// Chat `reasoning_content` (or vLLM's `reasoning`) deltas.
    reasoning: String,
    tools: Vec<ToolCall>,
    /// Chat logprob entries (completions' sampled logprobs are the tokens').
    chat_logprobs: Vec<TokenLogprob>,
    tokens: Tokens,
}

/// A streamed answer put back together, one part per choice `index`.
pub struct Assembler {
    api: ApiKind,
    /// The first chunk's `id`, `created` and `model`.
    head: Option<(String, u64, String)>,
    /// vLLM sends prompt ids once: top level for chat, on a choice for
    /// completions; they are every choice's.
    prompt_ids: Vec<u32>,
    engine_weight_version: Option<String>,
    choices: Vec<ChoiceParts>,
    usage: Option<Usage>,
}

impl Assembler {
    pub fn new(api: ApiKind) -> Self {
        Assembler {
            api,
            head: None,
            prompt_ids: Vec::new(),
            engine_weight_version: None,
            choices: Vec::new(),
            usage: None,
        }
    }

    /// Folds one chunk (the JSON after `data: `) in.
    pub fn push(&mut self, chunk: &Value) {
        if self.head.is_none() {
            let text = |key: &str| match chunk.get(key) {
                Some(Value::String(s)) => s.clone(),
                Some(v) if !v.is_null() => v.to_string(),
                _ => String::new(),
            };
            let created = chunk.get("created").and_then(Value::as_u64).unwrap_or(0);
            self.head = Some((text("id"), created, text("model")));
        }
        if let Some(u) = chunk.get("usage").filter(|u| !u.is_null()) {
            self.usage = serde_json::from_value(u.clone()).ok();
        }
        if let Some(v) = chunk.get("weight_version").and_then(version_text) {
            self.engine_weight_version = Some(v);
        }
        if self.prompt_ids.is_empty() {
            self.prompt_ids = ids(chunk.get("prompt_token_ids"));
        }
        let choices = chunk.get("choices").and_then(Value::as_array);
        for choice in choices.into_iter().flatten() {
            if self.prompt_ids.is_empty() {
                self.prompt_ids = ids(choice.get("prompt_token_ids"));
            }
            let index = choice.get("index").and_then(Value::as_u64).unwrap_or(0) as usize;
            if index > self.choices.len() || index >= MAX_CHOICES {
                continue;
            }
            if index == self.choices.len() {
                self.choices.push(ChoiceParts::default());
            }
            self.choices[index].push(self.api, choice);
        }
    }

    /// How many choices the stream had (at least one, maybe empty).
    pub fn len(&self) -> usize {
        self.choices.len().max(1)
    }

    /// Choice `index` as a non-streamed call would have returned it (the
    /// body with that choice alone) and its token data.
    pub fn choice(&mut self, index: usize) -> (Value, Tokens) {
        let mut parts = self
            .choices
            .get_mut(index)
            .map(std::mem::take)
            .unwrap_or_default();
        let mut tokens = std::mem::take(&mut parts.tokens);
        tokens.prompt_ids = self.prompt_ids.clone();
        tokens.engine_weight_version = self.engine_weight_version.clone();
        let (id, created, model) = self.head.clone().unwrap_or_default();
        let body = match self.api {
            ApiKind::ChatCompletions => serde_json::to_value(ChatCompletion {
                id,
                object: openai::CHAT_COMPLETION.to_string(),
                created,
                model,
                prompt_token_ids: Some(tokens.prompt_ids.clone()),
                choices: vec![parts.chat_choice(index, &tokens)],
                usage: self.usage,
                weight_version: None,
            }),
            _ => serde_json::to_value(Completion {
                id,
                object: openai::TEXT_COMPLETION.to_string(),
                created,
                model,
                choices: vec![parts.completion_choice(index, &tokens)],
                usage: self.usage,
                weight_version: None,
            }),
        };
        (body.unwrap_or_default(), tokens)
    }
}

impl ChoiceParts {
    fn push(&mut self, api: ApiKind, choice: &Value) {
        self.tokens
            .response_ids
            .extend(ids(choice.get("token_ids")));
        self.tokens
            .response_versions
            .extend(versions(choice.get("token_weight_versions")));
        let lp = choice.get("logprobs").filter(|v| !v.is_null());
        self.tokens.response_logprobs.extend(logprobs(api, lp));
        if let Some(entries) = lp.and_then(|v| v.get("content")).and_then(Value::as_array) {
            let typed = entries.iter().map(TokenLogprob::deserialize);
            self.chat_logprobs.extend(typed.filter_map(Result::ok));
        }
        if let Some(f) = choice.get("finish_reason").and_then(Value::as_str) {
            self.tokens.finish_reason = Some(f.to_string());
        }
        match api {
            ApiKind::ChatCompletions => self.push_delta(choice.get("delta")),
            _ => {
                if let Some(t) = choice.get("text").and_then(Value::as_str) {
                    self.text.push_str(t);
                }
            }
        }
    }

    fn push_delta(&mut self, delta: Option<&Value>) {
        let Some(delta) = delta else { return };
        if let Some(t) = delta.get("content").and_then(Value::as_str) {
            self.text.push_str(t);
        }
        let reasoning = delta
            .get("reasoning_content")
            .or_else(|| delta.get("reasoning"));
        if let Some(r) = reasoning.and_then(Value::as_str) {
            self.reasoning.push_str(r);
        }
        let calls = delta.get("tool_calls").and_then(Value::as_array);
        for call in calls.into_iter().flatten() {
            let index = call.get("index").and_then(Value::as_u64).unwrap_or(0) as usize;
            // An index far beyond the calls seen is garbage; do not allocate for it.
            if index > self.tools.len() {
                continue;
            }
            if index == self.tools.len() {
                self.tools.push(ToolCall::default());
            }
            let slot = &mut self.tools[index];
            if let Some(id) = call.get("id").and_then(Value::as_str) {
                slot.id = id.to_string();
            }
            let f = call.get("function");
            if let Some(n) = f.and_then(|f| f.get("name")).and_then(Value::as_str) {
                slot.name.push_str(n);
            }
            if let Some(a) = f.and_then(|f| f.get("arguments")).and_then(Value::as_str) {
                slot.arguments.push_str(a);
            }
        }
    }

    /// The chat choice of a whole answer.
    fn chat_choice(&self, index: usize, t: &Tokens) -> ChatChoice {
        let tool_calls: Vec<openai::ToolCall> = self
            .tools
            .iter()
            .map(|c| openai::ToolCall::function(c.id.clone(), c.name.clone(), c.arguments.clone()))
            .collect();
        let content = (!self.text.is_empty() || tool_calls.is_empty()).then(|| self.text.clone());
        ChatChoice {
            index,
            message: ChatMessage {
                content,
                reasoning_content: (!self.reasoning.is_empty()).then(|| self.reasoning.clone()),
                tool_calls,
                ..ChatMessage::default()
            },
            logprobs: Some(ChatLogprobs {
                content: self.chat_logprobs.clone(),
            }),
            finish_reason: t.finish_reason.clone(),
            stop_reason: None,
            token_ids: Some(t.response_ids.clone()),
            token_weight_versions: None,
        }
    }

    /// The completions choice of a whole answer.
    fn completion_choice(&self, index: usize, t: &Tokens) -> CompletionChoice {
        CompletionChoice {
            index,
            text: self.text.clone(),
            logprobs: Some(CompletionLogprobs {
                token_logprobs: t
                    .response_logprobs
                    .iter()
                    .map(|&lp| f64::from(lp))
                    .collect(),
                ..CompletionLogprobs::default()
            }),
            finish_reason: t.finish_reason.clone(),
            stop_reason: None,
            prompt_token_ids: Some(t.prompt_ids.clone()),
            token_ids: Some(t.response_ids.clone()),
            token_weight_versions: None,
        }
    }
}

/// Splits complete SSE events off the front of `buf`; returns their `data`
/// payloads (multi-line data joined by `\n`). A partial event stays in `buf`.
pub fn take_events(buf: &mut Vec<u8>) -> Vec<String> {
    let mut out = Vec::new();
    loop {
        let Some((end, sep)) = find_boundary(buf) else {
            return out;
        };
        let event: Vec<u8> = buf.drain(..end + sep).collect();
        let text = String::from_utf8_lossy(&event[..end]);
        let data: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .map(|d| d.strip_prefix(' ').unwrap_or(d))
            .collect();
        if !data.is_empty() {
            out.push(data.join("\n"));
        }
    }
}

/// Position and length of the first blank-line separator.
fn find_boundary(buf: &[u8]) -> Option<(usize, usize)> {
    let lf = buf.windows(2).position(|w| w == b"\n\n").map(|p| (p, 2));
    let crlf = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|p| (p, 4));
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(if a.0 <= b.0 { a } else { b }),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn splits_events_and_keeps_partials() {
        let mut buf = b"data: {\"a\":1}\n\ndata: [DONE]\n\ndata: {\"b\"".to_vec();
        assert_eq!(take_events(&mut buf), vec!["{\"a\":1}", "[DONE]"]);
        assert_eq!(buf, b"data: {\"b\"");
    }

    #[test]
    fn assembles_tool_calls_and_ids() {
        let mut a = Assembler::new(ApiKind::ChatCompletions);
        a.push(&json!({"id": "c", "prompt_token_ids": [1], "choices": [{"delta": {"role": "assistant"}}]}));
        a.push(&json!({"choices": [{"delta": {"tool_calls": [{"index": 0, "id": "t", "function": {"name": "f", "arguments": "{"}}]},
            "token_ids": [5], "logprobs": {"content": [{"logprob": -0.1}]}}]}));
        a.push(&json!({"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": "}"}}]},
            "token_ids": [6], "logprobs": {"content": [{"logprob": -0.2}]}, "finish_reason": "tool_calls"}]}));
        assert_eq!(a.len(), 1);
        let (r, tokens) = a.choice(0);
        assert_eq!(
            r["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"],
            "{}"
        );
        assert_eq!(tokens.prompt_ids, vec![1]);
        assert_eq!(tokens.response_ids, vec![5, 6]);
        assert_eq!(tokens.response_logprobs, vec![-0.1, -0.2]);
        assert_eq!(tokens.finish_reason.as_deref(), Some("tool_calls"));
    }

    #[test]
    fn interleaved_choices_assemble_apart() {
        let mut a = Assembler::new(ApiKind::Completions);
        let chunk = |i: usize, text: &str, id: u32| {
            json!({"id": "c", "choices": [{"index": i, "text": text, "token_ids": [id],
                   "prompt_token_ids": [1, 2], "logprobs": {"token_logprobs": [-0.5]}}]})
        };
        for (i, text, id) in [(0, "a", 10), (1, "x", 20), (1, "y", 21), (0, "b", 11)] {
            a.push(&chunk(i, text, id));
        }
        // An index past the choices seen is garbage.
        a.push(&chunk(5, "?", 99));
        assert_eq!(a.len(), 2);
        let (second, tokens) = a.choice(1);
        assert_eq!(second["choices"][0]["text"], "xy");
        assert_eq!(second["choices"][0]["index"], 1);
        assert_eq!(tokens.response_ids, vec![20, 21]);
        assert_eq!(tokens.prompt_ids, vec![1, 2]);
        let (first, tokens) = a.choice(0);
        assert_eq!(first["choices"][0]["text"], "ab");
        assert_eq!(tokens.response_ids, vec![10, 11]);

        // Per-token versions, chunk by chunk (a partial rollout).
        let mut a = Assembler::new(ApiKind::Completions);
        for (id, v) in [(1, 3), (2, 3), (3, 4)] {
            a.push(
                &json!({"choices": [{"index": 0, "text": "x", "token_ids": [id],
                           "token_weight_versions": [v]}]}),
            );
        }
        let (_, tokens) = a.choice(0);
        assert_eq!(tokens.response_versions, vec![3, 3, 4]);
    }
}
