//! The one conversation every front-end maps into: system, user, assistant
//! (text, reasoning, tool calls) and tool-result turns, plus the tool list.
//! Equality is on the parsed form: tool-call arguments compare as JSON
//! values, so a harness that re-serialises `{"command":"ls"}` as
//! `{"command": "ls"}` still holds the same conversation.

use serde_json::{Map, Value, json};

#[derive(Debug, Clone, PartialEq)]
pub struct Conversation {
    pub messages: Vec<Message>,
    /// The OpenAI `tools` list as sent (function schemas), if any.
    pub tools: Option<Value>,
    /// Whether the answer must (or must not) call a tool.
    pub tool_choice: ToolChoice,
}

/// What the harness asked of the answer's tool calls (each API names them
/// its own way: Chat and Responses `auto` / `none` / `required` / a
/// function, Messages `auto` / `none` / `any` / `tool`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ToolChoice {
    /// The model decides.
    #[default]
    Auto,
    /// No tool call: the answer is text (the tools stay in the prompt).
    None,
    /// Some tool call.
    Required,
    /// A call of this tool.
    Function(String),
}

impl ToolChoice {
    /// Checks a named tool against the request's tools.
    pub fn checked(self, tools: &Option<Value>) -> Result<ToolChoice, crate::ConversationError> {
        let names = || {
            tools
                .as_ref()
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|t| t.pointer("/function/name").and_then(Value::as_str))
        };
        match &self {
            ToolChoice::Function(name) if !names().any(|n| n == name) => {
                Err(crate::ConversationError::unsupported(format!(
                    "`tool_choice` names tool `{name}`, which `tools` does not hold"
                )))
            }
            ToolChoice::Required | ToolChoice::Function(_) if names().next().is_none() => {
                Err(crate::ConversationError::unsupported(
                    "`tool_choice` asks for a tool call, but `tools` is empty",
                ))
            }
            _ => Ok(self),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Message {
    /// `system` (or `developer`, which templates do not know).
    System(String),
    User(String),
    Assistant(AssistantTurn),
    Tool {
        call_id: Option<String>,
        content: String,
    },
}

/// What the model said in one turn, parsed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AssistantTurn {
    pub content: Option<String>,
    pub reasoning: Option<String>,
    pub tool_calls: Vec<ToolCall>,
}

#[derive(Debug, Clone)]
pub struct ToolCall {
    /// The client-visible id (`call_...`); not part of equality (harnesses
    /// and gateways mint their own).
    pub id: Option<String>,
    pub name: String,
    /// The arguments as a JSON value (a string that is not JSON stays a
    /// string).
    pub arguments: Value,
    /// The arguments as the harness sent them, for rendering as transformers
    /// would see them.
    pub arguments_text: String,
}

impl PartialEq for ToolCall {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name && self.arguments == other.arguments
    }
}

impl ToolCall {
    /// A call from its arguments' JSON text.
    pub fn new(id: Option<String>, name: String, arguments_text: String) -> ToolCall {
        let arguments = serde_json::from_str(&arguments_text)
            .unwrap_or_else(|_| Value::String(arguments_text.clone()));
        ToolCall {
            id,
            name,
            arguments,
            arguments_text,
        }
    }
}

impl AssistantTurn {
    /// Equal as the template renders it: blank content counts as none.
    pub fn same_as(&self, other: &AssistantTurn) -> bool {
        let text = |t: &Option<String>| {
            t.as_deref()
                .map(str::trim)
                .filter(|t| !t.is_empty())
                .map(str::to_string)
        };
        text(&self.content) == text(&other.content)
            && text(&self.reasoning) == text(&other.reasoning)
            && self.tool_calls == other.tool_calls
    }
}

impl Message {
    /// The message as chat templates take it (OpenAI's dict shape, with
    /// `reasoning_content` as Qwen and DeepSeek templates read it).
    pub fn to_template(&self) -> Value {
        match self {
            Message::System(text) => json!({"role": "system", "content": text}),
            Message::User(text) => json!({"role": "user", "content": text}),
            Message::Tool { call_id, content } => {
                let mut m = json!({"role": "tool", "content": content});
                if let Some(id) = call_id {
                    m["tool_call_id"] = json!(id);
                }
                m
            }
            Message::Assistant(turn) => {
                let mut m = Map::new();
                m.insert("role".into(), json!("assistant"));
                m.insert(
                    "content".into(),
                    json!(turn.content.clone().unwrap_or_default()),
                );
                if let Some(r) = &turn.reasoning {
                    m.insert("reasoning_content".into(), json!(r));
                }
                if !turn.tool_calls.is_empty() {
                    let calls: Vec<Value> = turn
                        .tool_calls
                        .iter()
                        .enumerate()
                        .map(|(i, c)| {
                            json!({
                                "id": c.id.clone().unwrap_or_else(|| format!("call_{i}")),
                                "type": "function",
                                "function": {"name": c.name, "arguments": c.arguments_text},
                            })
                        })
                        .collect();
                    m.insert("tool_calls".into(), Value::Array(calls));
                }
                Value::Object(m)
            }
        }
    }

    /// Two messages the template renders alike: assistant turns compare
    /// on their parsed form, the rest exactly.
    pub fn same_as(&self, other: &Message) -> bool {
        match (self, other) {
            (Message::Assistant(a), Message::Assistant(b)) => a.same_as(b),
            (a, b) => a == b,
        }
    }
}

impl Conversation {
    /// The `messages` list a chat template renders.
    pub fn template_messages(&self) -> Value {
        Value::Array(self.messages.iter().map(Message::to_template).collect())
    }
}

/// A request's tool list mapped tool by tool (each into none, one or more
/// functions) into the OpenAI function list templates expect; absent or
/// null is no tools.
pub fn map_tools(
    tools: Option<&Value>,
    one: impl Fn(usize, &Value) -> Result<Vec<Value>, crate::ConversationError>,
) -> Result<Option<Value>, crate::ConversationError> {
    let Some(list) = tools.filter(|t| !t.is_null()) else {
        return Ok(None);
    };
    let list = list
        .as_array()
        .ok_or_else(|| crate::ConversationError::unsupported("`tools` must be a list"))?;
    let out = list
        .iter()
        .enumerate()
        .map(|(i, t)| one(i, t))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Some(Value::Array(out.concat())))
}

/// A flat tool definition (`name`, `description`, its schema under
/// `schema_key`) as an OpenAI function tool.
pub fn function_tool(t: &Value, name: &str, schema_key: &str) -> Value {
    let mut function = Map::new();
    function.insert("name".into(), json!(name));
    if let Some(d) = t.get("description").filter(|d| !d.is_null()) {
        function.insert("description".into(), d.clone());
    }
    let schema = t
        .get(schema_key)
        .cloned()
        .unwrap_or_else(|| json!({"type": "object"}));
    function.insert("parameters".into(), schema);
    json!({"type": "function", "function": function})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_calls_compare_as_json_values() {
        let a = ToolCall::new(None, "bash".into(), r#"{"command":"ls","n":1}"#.into());
        let b = ToolCall::new(
            Some("x".into()),
            "bash".into(),
            r#"{"n": 1, "command": "ls"}"#.into(),
        );
        assert_eq!(a, b);
        let c = ToolCall::new(None, "bash".into(), r#"{"command":"ls -l"}"#.into());
        assert_ne!(a, c);
        let raw = ToolCall::new(None, "bash".into(), "not json".into());
        assert_eq!(raw.arguments, json!("not json"));
        let turn = |content: &str| AssistantTurn {
            content: Some(content.into()),
            ..Default::default()
        };
        assert!(turn(" hi\n").same_as(&turn("hi")));
        assert!(AssistantTurn::default().same_as(&turn("")));
        assert!(!turn("hi").same_as(&turn("ho")));
    }
}
