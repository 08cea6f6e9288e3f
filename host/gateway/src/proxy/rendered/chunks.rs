//! A streamed completion answered as Chat Completions chunks: reasoning
//! (`reasoning_content`) and content stream as they are generated; a
//! Hermes `<tool_call>` streams its name once it is complete and its
//! arguments (an object or list, as the model writes it) as they grow; a
//! Qwen3-coder call its name at `<function=NAME>` and its arguments one
//! `<parameter>` at a time; the rest of every call (all of a Llama call)
//! arrives with the finish reason. Every chunk keeps its completion chunk's token ids and
//! logprobs, so the record assembles as for a passthrough stream.

use serde_json::{Value, json};

use agl_conversation::family::coder_call_prefix;
use agl_conversation::{Family, ToolFormat, openai_chat};

use super::chat_logprobs;

const THINK_OPEN: &str = "<think>";
const THINK_CLOSE: &str = "</think>";
const CALL_OPEN: &str = "<tool_call>";
const CALL_CLOSE: &str = "</tool_call>";

/// How much of one tool call has been streamed.
#[derive(Default)]
struct CallSent {
    name: bool,
    /// Bytes of the arguments' text sent.
    args: usize,
}

pub struct ChatChunks {
    family: Family,
    prompt_ids: Vec<u32>,
    id_prefix: String,
    text: String,
    sent_reasoning: usize,
    sent_content: usize,
    calls: Vec<CallSent>,
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
            calls: Vec::new(),
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
            let calls = self.unsent(calls);
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

    /// What of the parsed calls has not been streamed yet.
    fn unsent(&self, calls: Vec<Value>) -> Vec<Value> {
        calls
            .into_iter()
            .enumerate()
            .filter_map(|(i, call)| {
                let Some(sent) = self.calls.get(i).filter(|s| s.name) else {
                    return Some(call);
                };
                let args = call["function"]["arguments"].as_str().unwrap_or_default();
                let rest = args.get(sent.args..).unwrap_or_default();
                (!rest.is_empty()).then(|| json!({"index": i, "function": {"arguments": rest}}))
            })
            .collect()
    }

    /// Name and argument deltas of the calls in `calls_text` (the text
    /// from the first `<tool_call>` on).
    fn call_deltas(&mut self, calls_text: &str) -> Vec<Value> {
        let mut out = Vec::new();
        for (i, block) in calls_text.split(CALL_OPEN).skip(1).enumerate() {
            let block = block.split(CALL_CLOSE).next().unwrap_or_default();
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
                    let args = value_start(block, "\"arguments\"").map(|start| {
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
                out.push(
                    json!({"index": i, "id": format!("call_{}_{i}", self.id_prefix),
                                "type": "function", "function": {"name": name, "arguments": ""}}),
                );
            }
            let Some(args) = args else {
                continue;
            };
            // Only ever what extends what was sent: deltas add up to the
            // finished call's arguments.
            if args.len() > sent.args && args.is_char_boundary(sent.args) {
                out.push(json!({"index": i, "function": {"arguments": &args[sent.args..]}}));
                sent.args = args.len();
            }
        }
        out
    }

    /// The reasoning, content and call deltas that can be sent now.
    fn deltas(&mut self) -> Value {
        let mut delta = json!({});
        if matches!(
            self.family.tools,
            ToolFormat::Hermes | ToolFormat::Qwen3Coder
        ) && let Some(calls_text) = self.calls_text().map(str::to_string)
        {
            let calls = self.call_deltas(&calls_text);
            if !calls.is_empty() {
                delta["tool_calls"] = json!(calls);
            }
        }
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

    /// The text from the first `<tool_call>` on, once one has begun.
    fn calls_text(&self) -> Option<&str> {
        let text = match self.family.reasoning {
            true => &self.text[self.text.find(THINK_CLOSE)? + THINK_CLOSE.len()..],
            false => self.text.as_str(),
        };
        text.find(CALL_OPEN).map(|i| &text[i..])
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
            for c in t.push(&chunk(p, &[], last.then_some("stop"))) {
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
            for c in t.push(&chunk(p, &[], last.then_some("stop"))) {
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
