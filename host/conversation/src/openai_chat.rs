//! The OpenAI Chat Completions front-end: a request's `messages` and
//! `tools` into a [`Conversation`], and a parsed model output back into the
//! response `message`. Anything the conversation cannot hold (an image part,
//! an unknown role or key) is refused with an error that names it, never
//! dropped.

use agl_wire::openai;
use serde_json::{Value, json};

use crate::ConversationError;
use crate::message::{AssistantTurn, Conversation, Message, ToolCall, ToolChoice};

/// Message keys the front-end reads; others must be absent or null.
const KNOWN_KEYS: [&str; 9] = [
    "role",
    "content",
    "name",
    "tool_calls",
    "tool_call_id",
    "reasoning_content",
    "reasoning",
    "refusal",
    "function_call",
];

/// Reads a chat request body's `messages` and `tools`.
pub fn conversation(body: &Value) -> Result<Conversation, ConversationError> {
    let list = body
        .get("messages")
        .and_then(Value::as_array)
        .ok_or_else(|| ConversationError::unsupported("`messages` must be a list"))?;
    let messages = list
        .iter()
        .enumerate()
        .map(|(i, m)| message(i, m))
        .collect::<Result<Vec<_>, _>>()?;
    let tools = body.get("tools").filter(|t| !t.is_null()).cloned();
    if let Some(t) = &tools
        && !t.is_array()
    {
        return Err(ConversationError::unsupported("`tools` must be a list"));
    }
    let tool_choice = match body.get("tool_choice") {
        None | Some(Value::Null) => ToolChoice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "auto" => ToolChoice::Auto,
            "none" => ToolChoice::None,
            "required" => ToolChoice::Required,
            other => {
                return Err(ConversationError::unsupported(format!(
                    "`tool_choice` `{other}` is not one of auto, none, required"
                )));
            }
        },
        Some(v) => match v.pointer("/function/name").and_then(Value::as_str) {
            Some(name) if v.get("type").and_then(Value::as_str) == Some("function") => {
                ToolChoice::Function(name.to_string())
            }
            _ => {
                return Err(ConversationError::unsupported(
                    "`tool_choice` must be a string or {\"type\": \"function\", \"function\": {\"name\"}}",
                ));
            }
        },
    }
    .checked(&tools)?;
    Ok(Conversation {
        messages,
        tools,
        tool_choice,
    })
}

fn message(i: usize, m: &Value) -> Result<Message, ConversationError> {
    let at = |what: String| ConversationError::unsupported(format!("messages[{i}]: {what}"));
    let obj = m
        .as_object()
        .ok_or_else(|| at("must be an object".into()))?;
    if let Some((key, _)) = obj
        .iter()
        .find(|(k, v)| !KNOWN_KEYS.contains(&k.as_str()) && !v.is_null())
    {
        return Err(at(format!("field `{key}` is not supported")));
    }
    if obj.get("function_call").is_some_and(|v| !v.is_null()) {
        return Err(at(
            "the legacy `function_call` is not supported; send `tool_calls`".into(),
        ));
    }
    let role = obj.get("role").and_then(Value::as_str).unwrap_or_default();
    let content = || text(obj.get("content"), i);
    Ok(match role {
        "system" | "developer" => Message::System(content()?),
        "user" => Message::User(content()?),
        "tool" => Message::Tool {
            call_id: obj
                .get("tool_call_id")
                .and_then(Value::as_str)
                .map(str::to_string),
            content: content()?,
        },
        "assistant" => {
            let content = text(obj.get("content"), i)?;
            let reasoning = obj
                .get("reasoning_content")
                .or_else(|| obj.get("reasoning"))
                .and_then(Value::as_str)
                .map(str::to_string);
            let tool_calls = match obj.get("tool_calls") {
                None | Some(Value::Null) => Vec::new(),
                Some(Value::Array(calls)) => calls
                    .iter()
                    .enumerate()
                    .map(|(j, c)| tool_call(c).map_err(|e| at(format!("tool_calls[{j}]: {e}"))))
                    .collect::<Result<_, _>>()?,
                Some(_) => return Err(at("`tool_calls` must be a list".into())),
            };
            Message::Assistant(AssistantTurn {
                content: (!content.is_empty()).then_some(content),
                reasoning,
                tool_calls,
            })
        }
        other => return Err(at(format!("role `{other}` is not supported"))),
    })
}

/// An assistant `message` (a response's, or a request's) as a turn.
pub fn assistant_turn(message: &Value) -> Result<AssistantTurn, ConversationError> {
    let mut m = message.clone();
    m["role"] = json!("assistant");
    match self::message(0, &m)? {
        Message::Assistant(turn) => Ok(turn),
        _ => Err(ConversationError::unsupported("not an assistant message")),
    }
}

/// A content string, or a list of `text` parts joined.
fn text(content: Option<&Value>, i: usize) -> Result<String, ConversationError> {
    match content {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut out = String::new();
            for (j, part) in parts.iter().enumerate() {
                let kind = part.get("type").and_then(Value::as_str).unwrap_or("(none)");
                match (kind, part.get("text").and_then(Value::as_str)) {
                    ("text", Some(t)) => out.push_str(t),
                    _ => {
                        return Err(ConversationError::unsupported(format!(
                            "messages[{i}].content[{j}]: part type `{kind}` is not supported"
                        )));
                    }
                }
            }
            Ok(out)
        }
        Some(_) => Err(ConversationError::unsupported(format!(
            "messages[{i}].content must be a string or a list of parts"
        ))),
    }
}

fn tool_call(c: &Value) -> Result<ToolCall, String> {
    let function = c.get("function").ok_or("a call needs `function`")?;
    let name = function
        .get("name")
        .and_then(Value::as_str)
        .ok_or("a call needs `function.name`")?;
    let arguments = match function.get("arguments") {
        Some(Value::String(s)) => s.clone(),
        None | Some(Value::Null) => "{}".to_string(),
        Some(other) => other.to_string(),
    };
    let id = c.get("id").and_then(Value::as_str).map(str::to_string);
    Ok(ToolCall::new(id, name.to_string(), arguments))
}

/// The response `message` for a parsed output; tool calls get ids
/// `call_{prefix}_{i}`.
pub fn response_message(turn: &AssistantTurn, id_prefix: &str) -> openai::ChatMessage {
    let tool_calls = turn
        .tool_calls
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let id =
                c.id.clone()
                    .unwrap_or_else(|| format!("call_{id_prefix}_{i}"));
            openai::ToolCall::function(id, c.name.clone(), c.arguments_text.clone())
        })
        .collect();
    openai::ChatMessage {
        content: turn.content.clone(),
        reasoning_content: turn.reasoning.clone(),
        tool_calls,
        ..openai::ChatMessage::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_roles_parts_and_tool_calls() {
        let body = json!({"messages": [
            {"role": "developer", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "list "}, {"type": "text", "text": "files"}]},
            {"role": "assistant", "content": null, "reasoning_content": "use ls",
             "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{\"cmd\":\"ls\"}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "a.txt"},
        ], "tools": [{"type": "function", "function": {"name": "bash"}}]});
        let c = conversation(&body).unwrap();
        assert_eq!(c.messages[0], Message::System("be brief".into()));
        assert_eq!(c.messages[1], Message::User("list files".into()));
        let Message::Assistant(turn) = &c.messages[2] else {
            panic!()
        };
        assert_eq!(turn.reasoning.as_deref(), Some("use ls"));
        assert_eq!(turn.tool_calls[0].arguments, json!({"cmd": "ls"}));
        assert!(matches!(&c.messages[3], Message::Tool { call_id: Some(id), .. } if id == "c1"));
        assert!(c.tools.is_some());
        let rendered = c.template_messages();
        assert_eq!(
            rendered[2]["tool_calls"][0]["function"]["arguments"],
            "{\"cmd\":\"ls\"}"
        );
    }

    #[test]
    fn what_it_cannot_hold_is_refused_by_name() {
        let cases = [
            (
                json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}),
                "messages[0].content[0]: part type `image_url`",
            ),
            (
                json!({"messages": [{"role": "critic", "content": "x"}]}),
                "role `critic`",
            ),
            (
                json!({"messages": [{"role": "user", "content": "x", "audio": {"id": "a"}}]}),
                "field `audio`",
            ),
            (json!({"messages": "hi"}), "`messages` must be a list"),
        ];
        for (body, want) in cases {
            let e = conversation(&body).unwrap_err().to_string();
            assert!(e.contains(want), "{e}");
        }
        // Null optional fields are fine.
        let ok =
            json!({"messages": [{"role": "user", "content": "x", "name": null, "audio": null}]});
        assert!(conversation(&ok).is_ok());
    }
}
