//! A streamed completion answered as Chat Completions chunks: reasoning
//! (`reasoning_content`) and content stream as they are generated; a
//! Hermes `<tool_call>` streams its name once it is complete and its
//! arguments (an object or list, as the model writes it) as they grow; a
//! Qwen3-coder call its name at `<function=NAME>` and its arguments one
//! `<parameter>` at a time; a Llama 3 JSON call its name and `parameters`
//! as they grow (a reply that may be one is held back as content until it
//! is known not to be); the rest of every call arrives with the finish
//! reason, with any content held back. Every chunk keeps its completion chunk's token ids and
//! logprobs, so the record assembles as for a passthrough stream.

use agl_wire::openai::{
    self, ChatCompletionChunk, ChunkChoice, Completion, Delta, ToolCall, ToolCallDelta,
};

use agl_conversation::family::coder_call_prefix;
use agl_conversation::{Family, ToolFormat, openai_chat};

use super::sampling::chat_logprobs;

const THINK_OPEN: &str = "<think>";
const THINK_CLOSE: &str = "</think>";
const CALL_OPEN: &str = "<tool_call>";
const CALL_CLOSE: &str = "</tool_call>";

/// How much of one tool call has been streamed.
#[derive(Default, Clone)]
struct CallSent {
    name: bool,
    /// Bytes of the arguments' text sent.
    args: usize,
}

#[derive(Clone)]
pub struct ChatChunks {
    family: Family,
    prompt_ids: Vec<u32>,
    id_prefix: String,
    text: String,
    sent_reasoning: usize,
    sent_content: usize,
    calls: Vec<CallSent>,
    first: bool,
    /// Alternatives per token the caller asked for.
    top_logprobs: usize,
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
            calls: Vec::new(),
            first: true,
            top_logprobs: 0,
        }
    }

    /// Streams `top` alternatives per token with each logprob.
    pub fn with_top_logprobs(mut self, top: usize) -> ChatChunks {
        self.top_logprobs = top;
        self
    }

    /// Starts from `text` as already written (and not yet streamed): a
    /// forced tool call's start in the prompt.
    pub fn with_text(mut self, text: &str) -> ChatChunks {
        self.text.push_str(text);
        self
    }

    /// The same translator for another choice, whose tool call ids are
    /// made of `id_prefix`.
    pub fn for_choice(&self, id_prefix: String) -> ChatChunks {
        ChatChunks {
            id_prefix,
            ..self.clone()
        }
    }

    /// The answer's text so far.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// One completions chunk in, the chat chunks it becomes out.
    pub fn push(&mut self, chunk: &Completion) -> Vec<ChatCompletionChunk> {
        let envelope = |choices: Vec<ChunkChoice>| ChatCompletionChunk {
            id: chunk.id.clone(),
            object: openai::CHAT_COMPLETION_CHUNK.to_string(),
            created: chunk.created,
            model: chunk.model.clone(),
            choices,
            // The engine's own weight version, for the record.
            weight_version: chunk.weight_version.clone(),
            ..ChatCompletionChunk::default()
        };
        let Some(choice) = chunk.choices.first() else {
            // The usage chunk (`stream_options.include_usage`).
            return vec![ChatCompletionChunk {
                usage: chunk.usage,
                ..envelope(Vec::new())
            }];
        };
        self.text.push_str(&choice.text);
        let mut delta = self.deltas();
        if self.first {
            delta.role = Some("assistant".to_string());
        }
        let mut out = envelope(vec![ChunkChoice {
            delta,
            logprobs: chat_logprobs(choice.logprobs.as_ref(), self.top_logprobs),
            token_ids: Some(choice.token_ids.clone().unwrap_or_default()),
            token_weight_versions: choice.token_weight_versions.clone(),
            ..ChunkChoice::default()
        }]);
        if std::mem::take(&mut self.first) {
            out.prompt_token_ids = Some(self.prompt_ids.clone());
        }
        let mut chunks = vec![out];
        if let Some(finish) = &choice.finish_reason {
            let turn = self.family.parse(&self.text);
            // Content held back (a half marker, a call that did not parse).
            let sent = self
                .regions()
                .1
                .and_then(|c| c.get(..self.sent_content))
                .unwrap_or("");
            let held = turn
                .content
                .as_deref()
                .and_then(|c| c.strip_prefix(sent))
                .filter(|rest| !rest.is_empty())
                .map(str::to_string);
            let message = openai_chat::response_message(&turn, &self.id_prefix);
            let finish = if message.tool_calls.is_empty() {
                finish.clone()
            } else {
                "tool_calls".to_string()
            };
            let delta = Delta {
                tool_calls: self.unsent(message.tool_calls),
                content: held,
                ..Delta::default()
            };
            chunks.push(envelope(vec![ChunkChoice {
                delta,
                finish_reason: Some(finish),
                ..ChunkChoice::default()
            }]));
        }
        chunks
    }

    /// What of the parsed calls has not been streamed yet.
    fn unsent(&self, calls: Vec<ToolCall>) -> Vec<ToolCallDelta> {
        calls
            .into_iter()
            .enumerate()
            .filter_map(|(i, call)| {
                let Some(sent) = self.calls.get(i).filter(|s| s.name) else {
                    return Some(ToolCallDelta::whole(i, call));
                };
                let rest = call.function.arguments.get(sent.args..).unwrap_or_default();
                (!rest.is_empty()).then(|| ToolCallDelta::arguments(i, rest.to_string()))
            })
            .collect()
    }

    /// Name and argument deltas of the calls in `calls_text` (the text
    /// from the first `<tool_call>` on).
    fn call_deltas(&mut self, calls_text: &str) -> Vec<ToolCallDelta> {
        let mut out = Vec::new();
        let blocks: Vec<&str> = match self.family.tools {
            ToolFormat::Llama3Json => llama_blocks(calls_text),
            _ => calls_text
                .split(CALL_OPEN)
                .skip(1)
                .map(|b| b.split(CALL_CLOSE).next().unwrap_or_default())
                .collect(),
        };
        for (i, block) in blocks.into_iter().enumerate() {
            if self.calls.len() <= i {
                self.calls.push(CallSent::default());
            }
            // The name, and the arguments text that is surely theirs.
            let (name, args) = match self.family.tools {
                ToolFormat::Qwen3Coder => match coder_call_prefix(block) {
                    Some((name, args)) => (Some(name), Some(args)),
                    None => (None, None),
                },
                _ => {
                    let args = value_start(block, "\"arguments\"")
                        .or_else(|| value_start(block, "\"parameters\""))
                        .map(|start| {
                            let value = &block[start..];
                            value[..structured_prefix(value)].to_string()
                        });
                    (string_after(block, "\"name\""), args)
                }
            };
            let sent = &mut self.calls[i];
            if !sent.name {
                let Some(name) = name else {
                    break;
                };
                sent.name = true;
                let id = format!("call_{}_{i}", self.id_prefix);
                out.push(ToolCallDelta::start(i, id, name));
            }
            let Some(args) = args else {
                continue;
            };
            // Only ever what extends what was sent: deltas add up to the
            // finished call's arguments.
            if args.len() > sent.args && args.is_char_boundary(sent.args) {
                out.push(ToolCallDelta::arguments(i, args[sent.args..].to_string()));
                sent.args = args.len();
            }
        }
        out
    }

    /// The reasoning, content and call deltas that can be sent now.
    fn deltas(&mut self) -> Delta {
        let mut delta = Delta::default();
        if self.family.tools != ToolFormat::None
            && let Some(calls_text) = self.calls_text().map(str::to_string)
        {
            delta.tool_calls = self.call_deltas(&calls_text);
        }
        let (reasoning, content) = self.regions();
        let (reasoning, content) = (reasoning.map(str::to_string), content.map(str::to_string));
        if let Some(r) = reasoning
            && r.len() > self.sent_reasoning
        {
            delta.reasoning_content = Some(r[self.sent_reasoning..].to_string());
            self.sent_reasoning = r.len();
        }
        if let Some(c) = content
            && c.len() > self.sent_content
        {
            delta.content = Some(c[self.sent_content..].to_string());
            self.sent_content = c.len();
        }
        delta
    }

    /// The text after any reasoning.
    fn reply_text(&self) -> Option<&str> {
        Some(match self.family.reasoning {
            true => &self.text[self.text.find(THINK_CLOSE)? + THINK_CLOSE.len()..],
            false => self.text.as_str(),
        })
    }

    /// The text from the first call on, once one has begun: from the first
    /// `<tool_call>`; for Llama 3, the reply when it is JSON calls.
    fn calls_text(&self) -> Option<&str> {
        let text = self.reply_text()?;
        match self.family.tools {
            ToolFormat::Llama3Json => {
                let body = text.trim_start();
                let body = body.strip_prefix(PYTHON_TAG).unwrap_or(body).trim_start();
                body.starts_with('{').then_some(body)
            }
            _ => text.find(CALL_OPEN).map(|i| &text[i..]),
        }
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
            ToolFormat::Llama3Json if may_be_llama_calls(text) => "",
            ToolFormat::None | ToolFormat::Llama3Json => text,
        };
        (reasoning, Some(content))
    }
}

const PYTHON_TAG: &str = "<|python_tag|>";

/// Whether a Llama 3 reply may still turn out to be JSON calls: empty so
/// far, `<|python_tag|>` (or its start), or an object.
fn may_be_llama_calls(text: &str) -> bool {
    let t = text.trim_start();
    t.is_empty() || PYTHON_TAG.starts_with(t) || t.starts_with(PYTHON_TAG) || t.starts_with('{')
}

/// The `;`-separated JSON calls of a Llama 3 reply, the last one perhaps
/// still being generated.
fn llama_blocks(text: &str) -> Vec<&str> {
    let mut blocks = Vec::new();
    let mut rest = text;
    while rest.starts_with('{') {
        let end = structured_prefix(rest);
        blocks.push(&rest[..end]);
        let after = rest[end..].trim_start();
        match after.strip_prefix(';') {
            Some(next) => rest = next.trim_start(),
            None => break,
        }
    }
    blocks
}

/// Where the value after `"key":` starts in `block`.
fn value_start(block: &str, key: &str) -> Option<usize> {
    let at = block.find(key)? + key.len();
    let rest = &block[at..];
    let colon = rest.find(|c: char| !c.is_whitespace())?;
    if !rest[colon..].starts_with(':') {
        return None;
    }
    let after = &rest[colon + 1..];
    let value = after.find(|c: char| !c.is_whitespace())?;
    Some(at + colon + 1 + value)
}

/// The complete JSON string after `"key":`, once it has been generated.
fn string_after(block: &str, key: &str) -> Option<String> {
    let start = value_start(block, key)?;
    let mut values = serde_json::Deserializer::from_str(&block[start..]).into_iter::<String>();
    values.next()?.ok()
}

/// How much of `value` (JSON being generated) is surely part of it: all of
/// an object or list still open, up to its closing bracket once closed; 0
/// for a string, number or literal (sent whole at the end).
fn structured_prefix(value: &str) -> usize {
    if !(value.starts_with('{') || value.starts_with('[')) {
        return 0;
    }
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for (i, c) in value.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if in_string => escaped = true,
            '"' => in_string = !in_string,
            '{' | '[' if !in_string => depth += 1,
            '}' | ']' if !in_string => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return i + 1;
                }
            }
            _ => {}
        }
    }
    value.len()
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
    use serde_json::{Value, json};

    fn chunk(text: &str, ids: &[u32], finish: Option<&str>) -> Completion {
        serde_json::from_value(
            json!({"id": "cmpl-1", "created": 1, "model": "m", "choices": [{
            "index": 0, "text": text, "token_ids": ids,
            "logprobs": {"tokens": ids.iter().map(|_| "t").collect::<Vec<_>>(),
                          "token_logprobs": ids.iter().map(|_| -0.5).collect::<Vec<_>>()},
            "finish_reason": finish}]}),
        )
        .unwrap()
    }

    /// The chat chunks one completions chunk becomes, as JSON.
    fn push(t: &mut ChatChunks, chunk: &Completion) -> Vec<Value> {
        t.push(chunk)
            .iter()
            .map(|c| serde_json::to_value(c).unwrap())
            .collect()
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
            for c in push(&mut t, &chunk(p, &[i as u32], last.then_some("stop"))) {
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
                    calls.extend(
                        tc.iter()
                            .filter(|c| c["function"].get("name").is_some())
                            .cloned(),
                    );
                }
                if last && !choice["finish_reason"].is_null() {
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
    fn hermes_call_names_and_arguments_stream_as_generated() {
        let family = Family {
            tools: ToolFormat::Hermes,
            reasoning: false,
        };
        let mut t = ChatChunks::new(family, vec![], "x");
        let pieces = [
            "<tool_call>\n{\"na",
            "me\": \"bash\", \"argu",
            "ments\": {\"cmd\": \"l",
            "s}\"}",
            "}\n</tool_call>",
        ];
        let mut deltas = Vec::new();
        for (i, p) in pieces.iter().enumerate() {
            let last = i == pieces.len() - 1;
            for c in push(&mut t, &chunk(p, &[], last.then_some("stop"))) {
                deltas.extend(
                    c["choices"][0]["delta"]["tool_calls"]
                        .as_array()
                        .cloned()
                        .unwrap_or_default(),
                );
            }
        }
        // The name arrives once, before the end; the arguments in pieces.
        assert_eq!(deltas[0]["function"]["name"], "bash");
        assert!(deltas.len() >= 3, "{deltas:?}");
        let args: String = deltas
            .iter()
            .filter_map(|d| d["function"]["arguments"].as_str())
            .collect();
        assert_eq!(args, r#"{"cmd": "ls}"}"#);
        let names = deltas
            .iter()
            .filter(|d| d["function"].get("name").is_some())
            .count();
        assert_eq!(names, 1);
    }

    #[test]
    fn qwen3_coder_arguments_stream_a_parameter_at_a_time() {
        let family = Family {
            tools: ToolFormat::Qwen3Coder,
            reasoning: false,
        };
        let mut t = ChatChunks::new(family, vec![], "x");
        let pieces = [
            "<tool_call>\n<function=bash>\n<para",
            "meter=cmd>\nls -la\n</parameter>\n",
            "<parameter=timeout>\n3",
            "0\n</parameter>\n</function>\n</tool_call>",
        ];
        // (pieces pushed, deltas by then)
        let mut seen = Vec::new();
        let mut deltas = Vec::new();
        for (i, p) in pieces.iter().enumerate() {
            let last = i == pieces.len() - 1;
            for c in push(&mut t, &chunk(p, &[], last.then_some("stop"))) {
                deltas.extend(
                    c["choices"][0]["delta"]["tool_calls"]
                        .as_array()
                        .cloned()
                        .unwrap_or_default(),
                );
            }
            let args: String = deltas
                .iter()
                .filter_map(|d| d["function"]["arguments"].as_str())
                .collect();
            seen.push(args);
        }
        assert_eq!(deltas[0]["function"]["name"], "bash");
        // Each parameter streams once complete; the whole call parses alike.
        assert_eq!(seen[0], "{");
        assert_eq!(seen[1], r#"{"cmd":"ls -la""#);
        assert_eq!(seen[2], r#"{"cmd":"ls -la""#);
        assert_eq!(seen[3], r#"{"cmd":"ls -la","timeout":30}"#);
        let parsed = family.parse(t.text());
        assert_eq!(parsed.tool_calls[0].arguments_text, seen[3]);
    }

    /// The chat deltas a list of completion pieces becomes: (content,
    /// tool-call deltas, finish reason).
    fn run(family: Family, pieces: &[&str]) -> (String, Vec<Value>, Value) {
        let mut t = ChatChunks::new(family, vec![], "x");
        let (mut content, mut calls, mut finish) = (String::new(), Vec::new(), Value::Null);
        for (i, p) in pieces.iter().enumerate() {
            let last = i == pieces.len() - 1;
            for c in push(&mut t, &chunk(p, &[], last.then_some("stop"))) {
                let choice = &c["choices"][0];
                content.push_str(choice["delta"]["content"].as_str().unwrap_or(""));
                calls.extend(
                    choice["delta"]["tool_calls"]
                        .as_array()
                        .cloned()
                        .unwrap_or_default(),
                );
                if !choice["finish_reason"].is_null() {
                    finish = choice["finish_reason"].clone();
                }
            }
        }
        (content, calls, finish)
    }

    #[test]
    fn llama_json_calls_stream_and_their_text_is_not_content() {
        let family = Family {
            tools: ToolFormat::Llama3Json,
            reasoning: false,
        };
        let (content, calls, finish) = run(
            family,
            &[
                "<|python",
                "_tag|>{\"name\": \"bash\", \"para",
                "meters\": {\"cmd\": \"l",
                "s\"}}",
            ],
        );
        assert_eq!(content, "", "the call's JSON is not content");
        assert_eq!(finish, "tool_calls");
        assert_eq!(calls[0]["function"]["name"], "bash");
        assert!(calls.len() >= 3, "arguments in pieces: {calls:?}");
        let args: String = calls
            .iter()
            .filter_map(|d| d["function"]["arguments"].as_str())
            .collect();
        assert_eq!(args, r#"{"cmd": "ls"}"#, "as the model wrote them");
        // A reply that only looked like one is sent as content at the end.
        let (content, calls, finish) = run(family, &["{not", " json}"]);
        assert_eq!(
            (content.as_str(), calls.len(), finish),
            ("{not json}", 0, json!("stop"))
        );
    }

    #[test]
    fn content_held_back_at_the_end_is_sent_with_the_finish() {
        let family = Family {
            tools: ToolFormat::Hermes,
            reasoning: false,
        };
        // Ends on what could have begun `<tool_call>`.
        let (content, calls, _) = run(family, &["1 < 2 and 2 <", "tool"]);
        assert_eq!(content, "1 < 2 and 2 <tool");
        assert!(calls.is_empty());
    }

    #[test]
    fn a_half_marker_is_held_back() {
        assert_eq!(structured_prefix(r#"{"a": "}", "b": [1]} trailing"#), 20);
        assert_eq!(structured_prefix(r#"{"a": "x"#), 8);
        assert_eq!(structured_prefix("12"), 0);
        assert_eq!(safe_end("abc <tool", CALL_OPEN), 4);
        assert_eq!(safe_end("abc", CALL_OPEN), 3);
        assert_eq!(safe_end("a<tool_call>b", CALL_OPEN), 1);
    }
}
