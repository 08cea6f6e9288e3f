//! Hermes-style tool calls: `<tool_call>{"name": ..., "arguments": ...}</tool_call>`
//! in the generated text become OpenAI `tool_calls`. Only the message shape
//! changes; the sampled token ids are reported untouched.

use serde_json::{Value, json};

pub const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

#[derive(Debug, PartialEq)]
pub struct ToolCall {
    pub name: String,
    /// JSON text, as OpenAI sends `function.arguments`.
    pub arguments: String,
}

/// The content outside the tool-call blocks (`None` if blank) and the calls;
/// no calls (and the text untouched) when any block is not a valid call.
pub fn parse(text: &str) -> (Option<String>, Vec<ToolCall>) {
    let untouched = || (Some(text.to_string()), Vec::new());
    let Some(first) = text.find(OPEN) else {
        return untouched();
    };
    let mut content = text[..first].to_string();
    let mut calls = Vec::new();
    let mut rest = &text[first..];
    while let Some(start) = rest.find(OPEN) {
        content.push_str(&rest[..start]);
        let inner = &rest[start + OPEN.len()..];
        // An unclosed last block (stopped at EOS) runs to the end.
        let (body, after) = match inner.find(CLOSE) {
            Some(end) => (&inner[..end], &inner[end + CLOSE.len()..]),
            None => (inner, ""),
        };
        match call_of(body) {
            Some(call) => calls.push(call),
            None => return untouched(),
        }
        rest = after;
    }
    content.push_str(rest);
    let content = content.trim();
    let content = (!content.is_empty()).then(|| content.to_string());
    (content, calls)
}

fn call_of(body: &str) -> Option<ToolCall> {
    let v: Value = serde_json::from_str(body.trim()).ok()?;
    let name = v.get("name")?.as_str()?.to_string();
    let arguments = match v.get("arguments").or_else(|| v.get("parameters")) {
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
        None => "{}".to_string(),
    };
    Some(ToolCall { name, arguments })
}

/// OpenAI `tool_calls` entries; `with_index` for stream deltas.
pub fn to_json(calls: &[ToolCall], id_prefix: &str, with_index: bool) -> Vec<Value> {
    calls
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let mut v = json!({"id": format!("call_{id_prefix}_{i}"), "type": "function",
                               "function": {"name": c.name, "arguments": c.arguments}});
            if with_index {
                v["index"] = json!(i);
            }
            v
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_hermes_blocks() {
        let text = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
        let (content, calls) = parse(text);
        assert_eq!(content.as_deref(), Some("Let me check."));
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].name, "get_weather");
        assert_eq!(calls[0].arguments, r#"{"city":"Paris"}"#);
        let two =
            "<tool_call>{\"name\":\"a\",\"arguments\":{}}</tool_call><tool_call>{\"name\":\"b\"}";
        let (content, calls) = parse(two);
        assert_eq!((content, calls.len()), (None, 2));
    }

    #[test]
    fn invalid_blocks_leave_text_alone() {
        let text = "<tool_call>not json</tool_call>";
        assert_eq!(parse(text), (Some(text.to_string()), Vec::new()));
        assert_eq!(parse("plain").1, Vec::new());
    }
}
