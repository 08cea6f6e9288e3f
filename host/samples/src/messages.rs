//! Comparing conversations across calls: does the next request continue
//! the previous one (its messages, then the assistant reply it got)?
//!
//! A harness echoes the assistant reply back in a slightly different JSON
//! shape than the API returned it, so messages are compared in a canonical
//! form that ignores differences which say nothing about the conversation:
//! - a key whose value is `null`, `""`, `[]` or `{}` equals an absent key
//!   (`"refusal": null`, `"annotations": []`, `"content": null` next to
//!   tool calls);
//! - reasoning fields (`reasoning_content`, `reasoning`, `reasoning_details`)
//!   and Anthropic `thinking` blocks are ignored: whether a template renders
//!   them again is a token-level question that the break classifier answers
//!   (`template`), not a sign of an edited history;
//! - a content array of text parts equals the string of their texts;
//! - tool-call `arguments` compare as parsed JSON (re-serialised arguments
//!   with other spacing or key order are the same call), and the streaming
//!   `index` of a tool call is ignored.
//!
//! Everything else (roles, texts, tool names and ids, message order) must
//! match exactly.

use serde_json::{Map, Value};

const REASONING_KEYS: [&str; 3] = ["reasoning_content", "reasoning", "reasoning_details"];
const THINKING_BLOCKS: [&str; 2] = ["thinking", "redacted_thinking"];

/// Whether two messages are the same turn (see the module docs).
pub fn same_message(a: &Value, b: &Value) -> bool {
    a == b || canonical_message(a) == canonical_message(b)
}

/// Checks that `next` starts with `prev` followed by `reply` (the assistant
/// message `prev` was answered with). `Err` says what differs.
pub fn messages_extend(prev: &[Value], reply: &Value, next: &[Value]) -> Result<(), String> {
    let expected = prev.iter().chain(std::iter::once(reply));
    for (i, (want, got)) in expected.zip(next).enumerate() {
        if !same_message(want, got) {
            let what = if i == prev.len() {
                "the previous assistant reply"
            } else {
                "an earlier message"
            };
            return Err(format!(
                "message {i} ({what}, role {}) was changed",
                role(got)
            ));
        }
    }
    let needed = prev.len() + 1;
    if next.len() < needed {
        return Err(format!(
            "the next request has {} messages, fewer than the {needed} of the previous turn",
            next.len()
        ));
    }
    Ok(())
}

fn role(message: &Value) -> &str {
    message.get("role").and_then(Value::as_str).unwrap_or("?")
}

/// The canonical form of a message that [`same_message`] compares.
pub fn canonical_message(message: &Value) -> Value {
    let Value::Object(fields) = message else {
        return message.clone();
    };
    let mut out = Map::new();
    for (key, value) in fields {
        if REASONING_KEYS.contains(&key.as_str()) {
            continue;
        }
        let value = match key.as_str() {
            "content" => canonical_content(value),
            "tool_calls" => canonical_tool_calls(value),
            _ => value.clone(),
        };
        if !is_empty(&value) {
            out.insert(key.clone(), value);
        }
    }
    Value::Object(out)
}

fn is_empty(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::String(s) => s.is_empty(),
        Value::Array(items) => items.is_empty(),
        Value::Object(fields) => fields.is_empty(),
        Value::Bool(_) | Value::Number(_) => false,
    }
}

/// Drops thinking blocks; text-only parts collapse to one string.
fn canonical_content(content: &Value) -> Value {
    let Value::Array(parts) = content else {
        return content.clone();
    };
    let kept: Vec<&Value> = parts.iter().filter(|p| !is_thinking(p)).collect();
    let texts: Option<Vec<&str>> = kept.iter().map(|p| crate::call::text_part(p)).collect();
    match texts {
        Some(texts) => Value::String(texts.concat()),
        None => Value::Array(kept.into_iter().map(without_empty_fields).collect()),
    }
}

fn is_thinking(part: &Value) -> bool {
    part.get("type")
        .and_then(Value::as_str)
        .is_some_and(|kind| THINKING_BLOCKS.contains(&kind))
}

fn canonical_tool_calls(calls: &Value) -> Value {
    let Value::Array(calls) = calls else {
        return calls.clone();
    };
    let canonical = calls.iter().map(|call| {
        let mut call = without_empty_fields(call);
        if let Value::Object(fields) = &mut call {
            fields.remove("index");
            if let Some(Value::Object(function)) = fields.get_mut("function") {
                parse_arguments(function);
            }
        }
        call
    });
    Value::Array(canonical.collect())
}

/// Replaces a JSON-text `arguments` with the value it encodes.
fn parse_arguments(function: &mut Map<String, Value>) {
    let parsed = match function.get("arguments") {
        Some(Value::String(text)) => serde_json::from_str::<Value>(text).ok(),
        _ => None,
    };
    if let Some(parsed) = parsed {
        function.insert("arguments".to_owned(), parsed);
    }
}

/// A shallow copy of an object without its empty fields.
fn without_empty_fields(value: &Value) -> Value {
    match value {
        Value::Object(fields) => Value::Object(
            fields
                .iter()
                .filter(|(_, v)| !is_empty(v))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        ),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn an_echoed_reply_with_extra_null_fields_is_the_same_message() {
        let returned = json!({"role": "assistant", "content": "hi", "refusal": null,
            "annotations": [], "reasoning_content": "let me think"});
        let echoed = json!({"role": "assistant", "content": [{"type": "text", "text": "hi"}]});
        assert!(same_message(&returned, &echoed));
    }

    #[test]
    fn re_serialised_tool_arguments_are_the_same_call() {
        let returned = json!({"role": "assistant", "content": null, "tool_calls": [
            {"index": 0, "id": "c1", "type": "function",
             "function": {"name": "ls", "arguments": "{\"path\":\".\",\"all\":true}"}}]});
        let echoed = json!({"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function",
             "function": {"name": "ls", "arguments": "{\"all\": true, \"path\": \".\"}"}}]});
        assert!(same_message(&returned, &echoed));
        let other_args = json!({"role": "assistant", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": "{\"path\": \"/\"}"}}]});
        assert!(!same_message(&returned, &other_args));
    }

    #[test]
    fn changed_text_or_role_is_a_different_message() {
        let a = json!({"role": "user", "content": "fix the bug"});
        assert!(!same_message(
            &a,
            &json!({"role": "user", "content": "fix the bugs"})
        ));
        assert!(!same_message(
            &a,
            &json!({"role": "system", "content": "fix the bug"})
        ));
    }

    #[test]
    fn messages_extend_names_the_changed_message() {
        let prev = [json!({"role": "user", "content": "q"})];
        let reply = json!({"role": "assistant", "content": "a"});
        let next = [
            prev[0].clone(),
            reply.clone(),
            json!({"role": "user", "content": "q2"}),
        ];
        assert_eq!(messages_extend(&prev, &reply, &next), Ok(()));

        let summarised = [
            json!({"role": "user", "content": "summary: q, a"}),
            next[2].clone(),
        ];
        let err = messages_extend(&prev, &reply, &summarised).unwrap_err();
        assert!(err.contains("message 0"), "{err}");

        let edited_reply = [
            prev[0].clone(),
            json!({"role": "assistant", "content": "b"}),
        ];
        let err = messages_extend(&prev, &reply, &edited_reply).unwrap_err();
        assert!(err.contains("previous assistant reply"), "{err}");

        let err = messages_extend(&prev, &reply, &prev).unwrap_err();
        assert!(err.contains("fewer"), "{err}");
    }
}
