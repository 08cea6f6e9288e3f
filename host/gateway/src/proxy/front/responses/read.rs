//! Reading OpenAI Responses: a `/v1/responses` request's
//! `instructions`, `input` and `tools` into a [`Conversation`], and a parsed
//! model output back into `output` items.
//!
//! - `input`: a string (one user turn) or items: `message` (roles `user`,
//!   `system`, `developer`, `assistant`; content a string or `input_text` /
//!   `output_text` parts; `type` may be left out), `reasoning` (its
//!   `summary` / `content` texts), `function_call` and
//!   `function_call_output`. Consecutive assistant items (reasoning, an
//!   assistant message, function calls) are one assistant turn, as the
//!   model produced them;
//! - `tools`: `function` tools, as the function list templates expect.
//!
//! Other item, part and tool types (images, files, `custom_tool_call`,
//! `local_shell_call`, web search, ...) are refused with an error that names
//! them, never dropped.

use std::collections::HashSet;

use agl_wire::responses::{OutputContent, OutputItem, SummaryPart};
use serde_json::Value;

use agl_conversation::ConversationError;
use agl_conversation::message::{
    AssistantTurn, Conversation, Message, ToolCall, ToolChoice, function_tool, map_tools,
};

/// Reads a Responses request body.
pub fn conversation(body: &Value) -> Result<Conversation, ConversationError> {
    let mut messages = Vec::new();
    if let Some(i) = body.get("instructions").and_then(Value::as_str) {
        messages.push(Message::System(i.to_string()));
    }
    match body.get("input") {
        Some(Value::String(s)) => messages.push(Message::User(s.clone())),
        Some(Value::Array(items)) => read_items(items, &mut messages)?,
        _ => {
            return Err(ConversationError::unsupported(
                "`input` must be a string or a list of items",
            ));
        }
    }
    let tools = tools(body.get("tools"))?;
    let tool_choice = tool_choice(body.get("tool_choice"))?.checked(&tools)?;
    Ok(Conversation {
        messages,
        tools,
        tool_choice,
    })
}

fn read_items(items: &[Value], out: &mut Vec<Message>) -> Result<(), ConversationError> {
    let mut turn: Option<AssistantTurn> = None;
    let mut calls = HashSet::new();
    let flush = |turn: &mut Option<AssistantTurn>, out: &mut Vec<Message>| {
        if let Some(t) = turn.take() {
            out.push(Message::Assistant(t));
        }
    };
    for (i, item) in items.iter().enumerate() {
        let at = |what: String| ConversationError::unsupported(format!("input[{i}]: {what}"));
        let role = item.get("role").and_then(Value::as_str);
        let kind = item
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or(if role.is_some() { "message" } else { "(none)" });
        match (kind, role) {
            ("message", Some("assistant")) => {
                let text = parts(item.get("content"), i)?;
                let t = turn.get_or_insert_with(AssistantTurn::default);
                t.content.get_or_insert_with(String::new).push_str(&text);
            }
            ("message", Some(role)) => {
                flush(&mut turn, out);
                let text = parts(item.get("content"), i)?;
                out.push(match role {
                    "user" => Message::User(text),
                    "system" | "developer" => Message::System(text),
                    other => return Err(at(format!("role `{other}` is not supported"))),
                });
            }
            ("reasoning", _) => {
                let mut text = String::new();
                for key in ["summary", "content"] {
                    for p in item
                        .get(key)
                        .and_then(Value::as_array)
                        .into_iter()
                        .flatten()
                    {
                        text.push_str(p.get("text").and_then(Value::as_str).unwrap_or_default());
                    }
                }
                let t = turn.get_or_insert_with(AssistantTurn::default);
                t.reasoning.get_or_insert_with(String::new).push_str(&text);
            }
            ("function_call", _) => {
                let field = |k: &str| {
                    item.get(k)
                        .and_then(Value::as_str)
                        .ok_or_else(|| at(format!("a function_call needs `{k}`")))
                };
                let call_id = field("call_id")?;
                let name = field("name")?;
                let arguments = item
                    .get("arguments")
                    .and_then(Value::as_str)
                    .unwrap_or("{}");
                calls.insert(call_id.to_string());
                let t = turn.get_or_insert_with(AssistantTurn::default);
                t.tool_calls.push(ToolCall::new(
                    Some(call_id.to_string()),
                    name.to_string(),
                    arguments.to_string(),
                ));
            }
            ("function_call_output", _) => {
                flush(&mut turn, out);
                let call_id = item
                    .get("call_id")
                    .and_then(Value::as_str)
                    .ok_or_else(|| at("a function_call_output needs `call_id`".into()))?;
                if !calls.contains(call_id) {
                    return Err(at(format!(
                        "function_call_output for call_id `{call_id}`, which no earlier function_call holds"
                    )));
                }
                let content = match item.get("output") {
                    Some(Value::String(s)) => s.clone(),
                    other => parts(other, i)?,
                };
                out.push(Message::Tool {
                    call_id: Some(call_id.to_string()),
                    content,
                });
            }
            (other, _) => return Err(at(format!("item type `{other}` is not supported"))),
        }
    }
    flush(&mut turn, out);
    Ok(())
}

/// A content string, or `input_text` / `output_text` parts joined.
fn parts(content: Option<&Value>, i: usize) -> Result<String, ConversationError> {
    match content {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(list)) => {
            let mut out = String::new();
            for (j, p) in list.iter().enumerate() {
                let kind = p.get("type").and_then(Value::as_str).unwrap_or("(none)");
                match (kind, p.get("text").and_then(Value::as_str)) {
                    ("input_text" | "output_text", Some(t)) => out.push_str(t),
                    _ => {
                        return Err(ConversationError::unsupported(format!(
                            "input[{i}].content[{j}]: part type `{kind}` is not supported"
                        )));
                    }
                }
            }
            Ok(out)
        }
        Some(_) => Err(ConversationError::unsupported(format!(
            "input[{i}].content must be a string or a list of parts"
        ))),
    }
}

/// `tool_choice`: `"auto" | "none" | "required"` or `{"type": "function",
/// "name"}`.
fn tool_choice(choice: Option<&Value>) -> Result<ToolChoice, ConversationError> {
    match choice {
        None | Some(Value::Null) => Ok(ToolChoice::Auto),
        Some(Value::String(s)) => match s.as_str() {
            "auto" => Ok(ToolChoice::Auto),
            "none" => Ok(ToolChoice::None),
            "required" => Ok(ToolChoice::Required),
            other => Err(ConversationError::unsupported(format!(
                "`tool_choice` `{other}` is not one of auto, none, required"
            ))),
        },
        Some(v) => match (
            v.get("type").and_then(Value::as_str),
            v.get("name").and_then(Value::as_str),
        ) {
            (Some("function"), Some(name)) => Ok(ToolChoice::Function(name.to_string())),
            (kind, _) => Err(ConversationError::unsupported(format!(
                "`tool_choice` of type `{}` is not supported; send auto, none, required or a function",
                kind.unwrap_or("(none)")
            ))),
        },
    }
}

/// Tools the API's server runs itself: nothing the policy could call, so
/// they are not offered to it (Codex always sends `web_search`).
const HOSTED_TOOLS: [&str; 6] = [
    "web_search",
    "web_search_preview",
    "file_search",
    "code_interpreter",
    "image_generation",
    "computer_use_preview",
];

/// The assistant turn a response's `output` items were (to compare what
/// the harness sends back with what it got, and to rebuild chains).
pub fn assistant_turn(output: &Value) -> Result<AssistantTurn, ConversationError> {
    let items = output
        .as_array()
        .ok_or_else(|| ConversationError::unsupported("`output` must be a list"))?;
    let mut messages = Vec::new();
    read_items(items, &mut messages)?;
    match messages.pop() {
        Some(Message::Assistant(turn)) if messages.is_empty() => Ok(turn),
        _ => Err(ConversationError::unsupported("not one assistant turn")),
    }
}

/// `function` tools (and the functions of a `namespace`, under their own
/// names) as the chat function list; hosted tools left out.
fn tools(tools: Option<&Value>) -> Result<Option<Value>, ConversationError> {
    map_tools(tools, |i, t| tool(t, &format!("tools[{i}]")))
}

fn tool(t: &Value, at: &str) -> Result<Vec<Value>, ConversationError> {
    let kind = t.get("type").and_then(Value::as_str).unwrap_or("(none)");
    let name = t.get("name").and_then(Value::as_str);
    match (kind, name) {
        ("function", Some(name)) => Ok(vec![function_tool(t, name, "parameters")]),
        ("namespace", _) => {
            let nested = t.get("tools").and_then(Value::as_array);
            let mut out = Vec::new();
            for (j, n) in nested.into_iter().flatten().enumerate() {
                out.extend(tool(n, &format!("{at}.tools[{j}]"))?);
            }
            Ok(out)
        }
        (hosted, _) if HOSTED_TOOLS.contains(&hosted) => Ok(Vec::new()),
        ("function", None) => Err(ConversationError::unsupported(format!(
            "{at}: a function tool needs `name`"
        ))),
        (kind, _) => Err(ConversationError::unsupported(format!(
            "{at}: tool type `{kind}` is not supported; send function tools"
        ))),
    }
}

/// The ids of a response's output items, from the response's own id (the
/// whole answer, its stream events and the record name them alike).
pub mod ids {
    pub fn reasoning(id: &str) -> String {
        format!("rs_{id}")
    }
    pub fn message(id: &str) -> String {
        format!("msg_{id}")
    }
    /// The `i`th function_call item.
    pub fn function_call(id: &str, i: usize) -> String {
        format!("fc_{id}_{i}")
    }
    /// The `i`th call's `call_id` (what its output names).
    pub fn call(id: &str, i: usize) -> String {
        format!("call_{id}_{i}")
    }
}

/// The reasoning output item.
pub fn reasoning_item(id: &str, text: &str) -> OutputItem {
    OutputItem::Reasoning {
        id: ids::reasoning(id),
        summary: vec![SummaryPart::SummaryText {
            text: text.to_string(),
        }],
    }
}

/// The assistant message output item.
pub fn message_item(id: &str, text: &str) -> OutputItem {
    OutputItem::Message {
        id: ids::message(id),
        role: "assistant".to_string(),
        status: COMPLETED.to_string(),
        content: vec![OutputContent::text(text)],
    }
}

/// The `i`th function_call output item.
pub fn function_call_item(
    id: &str,
    i: usize,
    call_id: &str,
    name: &str,
    arguments: &str,
) -> OutputItem {
    OutputItem::FunctionCall {
        id: ids::function_call(id, i),
        call_id: call_id.to_string(),
        name: name.to_string(),
        arguments: arguments.to_string(),
        status: COMPLETED.to_string(),
    }
}

const COMPLETED: &str = "completed";

/// The response's `output` items for a turn: reasoning, the message, then
/// each call (`call_id` [`ids::call`] unless the call has one).
pub fn output_items(turn: &AssistantTurn, id: &str) -> Vec<OutputItem> {
    let mut out = Vec::new();
    if let Some(r) = &turn.reasoning {
        out.push(reasoning_item(id, r));
    }
    if let Some(t) = &turn.content {
        out.push(message_item(id, t));
    }
    for (i, c) in turn.tool_calls.iter().enumerate() {
        let call_id = c.id.clone().unwrap_or_else(|| ids::call(id, i));
        out.push(function_call_item(
            id,
            i,
            &call_id,
            &c.name,
            &c.arguments_text,
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A Codex-like second request: developer message, user, the first
    /// answer's items sent back, the call's output.
    fn codex_like() -> Value {
        json!({
            "model": "policy",
            "instructions": "You are a coding agent.",
            "tools": [{"type": "function", "name": "shell", "description": "Run a command",
                       "parameters": {"type": "object", "properties": {"cmd": {"type": "array"}}}, "strict": false}],
            "input": [
                {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "sandbox: workspace-write"}]},
                {"role": "user", "content": "fix the bug"},
                {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "look first"}]},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Listing."}]},
                {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "shell", "arguments": "{\"cmd\":[\"ls\"]}"},
                {"type": "function_call_output", "call_id": "call_1", "output": "a.py"},
            ],
        })
    }

    #[test]
    fn items_become_turns_and_consecutive_assistant_items_one_turn() {
        let c = conversation(&codex_like()).unwrap();
        assert_eq!(
            c.messages[0],
            Message::System("You are a coding agent.".into())
        );
        assert_eq!(
            c.messages[1],
            Message::System("sandbox: workspace-write".into())
        );
        assert_eq!(c.messages[2], Message::User("fix the bug".into()));
        let Message::Assistant(turn) = &c.messages[3] else {
            panic!("{:?}", c.messages[3])
        };
        assert_eq!(turn.reasoning.as_deref(), Some("look first"));
        assert_eq!(turn.content.as_deref(), Some("Listing."));
        assert_eq!(turn.tool_calls[0].arguments, json!({"cmd": ["ls"]}));
        assert_eq!(
            c.messages[4],
            Message::Tool {
                call_id: Some("call_1".into()),
                content: "a.py".into()
            }
        );
        assert_eq!(c.messages.len(), 5);
        assert_eq!(c.tools.unwrap()[0]["function"]["name"], "shell");
        // A plain string input is one user turn.
        let c = conversation(&json!({"input": "hi"})).unwrap();
        assert_eq!(c.messages, [Message::User("hi".into())]);
    }

    #[test]
    fn the_answer_items_read_back_as_the_same_turn() {
        let c = conversation(&codex_like()).unwrap();
        let Message::Assistant(turn) = &c.messages[3] else {
            panic!()
        };
        let mut input = vec![json!({"role": "user", "content": "fix the bug"})];
        input.extend(
            output_items(turn, "r1")
                .iter()
                .map(|i| serde_json::to_value(i).unwrap()),
        );
        let again = conversation(&json!({"input": input})).unwrap();
        let Message::Assistant(back) = &again.messages[1] else {
            panic!("{:?}", again.messages)
        };
        assert!(back.same_as(turn), "{back:?} vs {turn:?}");
    }

    #[test]
    fn namespace_functions_are_offered_and_hosted_tools_left_out() {
        let body = json!({"input": "x", "tools": [
            {"type": "function", "name": "exec_command", "parameters": {"type": "object"}},
            {"type": "namespace", "name": "multi_agent_v1", "description": "Sub-agents.",
             "tools": [{"type": "function", "name": "spawn_agent", "parameters": {"type": "object"}}]},
            {"type": "web_search", "external_web_access": true},
        ]});
        let tools = conversation(&body).unwrap().tools.unwrap();
        let names: Vec<&Value> = tools
            .as_array()
            .unwrap()
            .iter()
            .map(|t| &t["function"]["name"])
            .collect();
        assert_eq!(names, [&json!("exec_command"), &json!("spawn_agent")]);
    }

    #[test]
    fn what_it_cannot_hold_is_refused_by_name() {
        let cases = [
            (
                json!({"input": [{"type": "local_shell_call", "call_id": "x"}]}),
                "input[0]: item type `local_shell_call`",
            ),
            (
                json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}),
                "part type `input_image`",
            ),
            (
                json!({"input": [{"type": "function_call_output", "call_id": "nope", "output": "x"}]}),
                "call_id `nope`",
            ),
            (
                json!({"input": "x", "tools": [{"type": "custom", "name": "apply_patch"}]}),
                "tool type `custom`",
            ),
            (json!({"input": 3}), "`input` must be a string"),
        ];
        for (body, want) in cases {
            let e = conversation(&body).unwrap_err().to_string();
            assert!(e.contains(want), "{e}");
        }
    }
}
