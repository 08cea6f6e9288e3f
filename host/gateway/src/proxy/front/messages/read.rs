//! Reading Anthropic Messages: a `/v1/messages` request into a
//! [`Conversation`], and a parsed model output back into the response
//! message's content blocks and `stop_reason`.
//!
//! - `system`: a string or text blocks (joined by a blank line; Claude
//!   Code's per-conversation `x-anthropic-billing-header:` first line left
//!   out), and `system` messages inside `messages` (Claude Code sends both);
//! - user content: a string or blocks: `text`, `tool_result` (content a
//!   string or text blocks; `is_error` marks it `Error: `), each tool result
//!   its own tool turn, in order;
//! - assistant content: `text`, `thinking` (the reasoning), `tool_use`
//!   (`input` is the arguments), `redacted_thinking` (opaque: nothing the
//!   template can render, so it holds no text);
//! - `tools`: custom tools (`name`, `description`, `input_schema`) as the
//!   OpenAI function list templates expect.
//!
//! Anything else (an image or document block, a server tool, a tool result
//! for a `tool_use` id the history does not hold) is refused with an error
//! that names it; block keys that carry no content for the model
//! (`cache_control`, `citations`, `signature`) are ignored.

use std::collections::HashSet;

use agl_wire::anthropic::ContentBlock;
use serde_json::{Value, json};

use agl_conversation::ConversationError;
use agl_conversation::message::{
    AssistantTurn, Conversation, Message, ToolCall, ToolChoice, function_tool, map_tools,
};

/// Reads a Messages request body's `system`, `messages` and `tools`.
pub fn conversation(body: &Value) -> Result<Conversation, ConversationError> {
    let mut messages = Vec::new();
    if let Some(system) = body.get("system").filter(|s| !s.is_null()) {
        let text = text_blocks(system, "system")?;
        messages.push(Message::System(without_billing_line(&text)));
    }
    let list = body
        .get("messages")
        .and_then(Value::as_array)
        .ok_or_else(|| ConversationError::unsupported("`messages` must be a list"))?;
    let mut tool_uses = HashSet::new();
    for (i, m) in list.iter().enumerate() {
        read_message(i, m, &mut messages, &mut tool_uses)?;
    }
    let tools = tools(body.get("tools"))?;
    let tool_choice = tool_choice(body.get("tool_choice"))?.checked(&tools)?;
    Ok(Conversation {
        messages,
        tools,
        tool_choice,
    })
}

fn read_message(
    i: usize,
    m: &Value,
    out: &mut Vec<Message>,
    tool_uses: &mut HashSet<String>,
) -> Result<(), ConversationError> {
    let at = |what: String| ConversationError::unsupported(format!("messages[{i}]: {what}"));
    let role = m.get("role").and_then(Value::as_str).unwrap_or_default();
    let content = m.get("content").unwrap_or(&Value::Null);
    match role {
        "system" => out.push(Message::System(text_blocks(
            content,
            &format!("messages[{i}]"),
        )?)),
        "user" => {
            let mut text = String::new();
            for (j, block) in blocks(content).iter().enumerate() {
                let at = |what: String| at(format!("content[{j}]: {what}"));
                match block_type(block) {
                    "text" => text.push_str(str_field(block, "text").map_err(at)?),
                    "tool_result" => {
                        let id = str_field(block, "tool_use_id").map_err(at)?;
                        if !tool_uses.contains(id) {
                            return Err(at(format!(
                                "tool_result for tool_use id `{id}`, which no earlier assistant turn holds"
                            )));
                        }
                        let mut result = match block.get("content") {
                            None | Some(Value::Null) => String::new(),
                            Some(c) => text_blocks(c, "tool_result content")
                                .map_err(|e| at(e.to_string()))?,
                        };
                        if block.get("is_error") == Some(&Value::Bool(true)) {
                            result = format!("Error: {result}");
                        }
                        out.push(Message::Tool {
                            call_id: Some(id.to_string()),
                            content: result,
                        });
                    }
                    other => return Err(at(unsupported_block(other))),
                }
            }
            if !text.is_empty() || blocks(content).is_empty() {
                out.push(Message::User(text));
            }
        }
        "assistant" => {
            let mut turn = AssistantTurn::default();
            let mut text = String::new();
            for (j, block) in blocks(content).iter().enumerate() {
                let at = |what: String| at(format!("content[{j}]: {what}"));
                match block_type(block) {
                    "text" => text.push_str(str_field(block, "text").map_err(at)?),
                    "thinking" => {
                        let thinking = str_field(block, "thinking").map_err(at)?;
                        turn.reasoning
                            .get_or_insert_with(String::new)
                            .push_str(thinking);
                    }
                    "redacted_thinking" => {}
                    "tool_use" => {
                        let id = str_field(block, "id").map_err(at)?;
                        let name = str_field(block, "name").map_err(at)?;
                        let input = block.get("input").cloned().unwrap_or_else(|| json!({}));
                        tool_uses.insert(id.to_string());
                        let mut call = ToolCall::new(
                            Some(id.to_string()),
                            name.to_string(),
                            input.to_string(),
                        );
                        call.arguments = input;
                        turn.tool_calls.push(call);
                    }
                    other => return Err(at(unsupported_block(other))),
                }
            }
            turn.content = (!text.is_empty()).then_some(text);
            out.push(Message::Assistant(turn));
        }
        other => return Err(at(format!("role `{other}` is not supported"))),
    }
    Ok(())
}

fn unsupported_block(kind: &str) -> String {
    match kind {
        "image" | "document" => {
            format!("`{kind}` blocks are not supported: the policy reads text only")
        }
        _ => format!("block type `{kind}` is not supported"),
    }
}

/// A content value as blocks: a string is one text block.
fn blocks(content: &Value) -> Vec<Value> {
    match content {
        Value::String(s) => vec![json!({"type": "text", "text": s})],
        Value::Array(items) => items.clone(),
        _ => Vec::new(),
    }
}

fn block_type(block: &Value) -> &str {
    block
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("(none)")
}

fn str_field<'a>(block: &'a Value, key: &str) -> Result<&'a str, String> {
    block
        .get(key)
        .and_then(Value::as_str)
        .ok_or_else(|| format!("`{key}` must be a string"))
}

/// A string, or text blocks joined by a blank line.
fn text_blocks(value: &Value, what: &str) -> Result<String, ConversationError> {
    match value {
        Value::String(s) => Ok(s.clone()),
        Value::Array(items) => {
            let mut parts = Vec::new();
            for (j, block) in items.iter().enumerate() {
                match (block_type(block), block.get("text").and_then(Value::as_str)) {
                    ("text", Some(t)) => parts.push(t),
                    (kind, _) => {
                        return Err(ConversationError::unsupported(format!(
                            "{what}[{j}]: {}",
                            unsupported_block(kind)
                        )));
                    }
                }
            }
            Ok(parts.join("\n\n"))
        }
        _ => Err(ConversationError::unsupported(format!(
            "{what} must be a string or a list of text blocks"
        ))),
    }
}

/// What Claude Code puts first in its system prompt unless
/// `CLAUDE_CODE_ATTRIBUTION_HEADER=0`: a billing line whose version suffix
/// changes with the conversation.
const BILLING_LINE: &str = "x-anthropic-billing-header:";

/// The system prompt without Claude Code's billing line: it is no
/// instruction for the policy, and a line that differs per conversation
/// would make every rollout's prompt start differently (the record keeps
/// the request as sent).
fn without_billing_line(system: &str) -> String {
    if !system.starts_with(BILLING_LINE) {
        return system.to_string();
    }
    let rest = system.split_once('\n').map_or("", |(_, rest)| rest);
    rest.trim_start_matches('\n').to_string()
}

/// `tool_choice`: `{"type": "auto" | "any" | "none"}` or `{"type": "tool",
/// "name"}` (`disable_parallel_tool_use` changes nothing: the policy writes
/// what it writes).
fn tool_choice(choice: Option<&Value>) -> Result<ToolChoice, ConversationError> {
    let Some(choice) = choice.filter(|c| !c.is_null()) else {
        return Ok(ToolChoice::Auto);
    };
    match choice.get("type").and_then(Value::as_str) {
        Some("auto") => Ok(ToolChoice::Auto),
        Some("none") => Ok(ToolChoice::None),
        Some("any") => Ok(ToolChoice::Required),
        Some("tool") => match choice.get("name").and_then(Value::as_str) {
            Some(name) => Ok(ToolChoice::Function(name.to_string())),
            None => Err(ConversationError::unsupported(
                "`tool_choice` of type `tool` needs `name`",
            )),
        },
        other => Err(ConversationError::unsupported(format!(
            "`tool_choice` type `{}` is not one of auto, any, tool, none",
            other.unwrap_or("(none)")
        ))),
    }
}

/// Custom tools as OpenAI function tools.
fn tools(tools: Option<&Value>) -> Result<Option<Value>, ConversationError> {
    map_tools(tools, |i, t| {
        let kind = t.get("type").and_then(Value::as_str).unwrap_or("custom");
        match (kind, t.get("name").and_then(Value::as_str)) {
            ("custom", Some(name)) => Ok(vec![function_tool(t, name, "input_schema")]),
            (_, None) => Err(ConversationError::unsupported(format!(
                "tools[{i}]: a tool needs `name`"
            ))),
            (kind, Some(_)) => Err(ConversationError::unsupported(format!(
                "tools[{i}]: server tool type `{kind}` is not supported; send custom tools"
            ))),
        }
    })
}

/// Why generation stopped, as Messages says it.
pub fn stop_reason(
    turn: &AssistantTurn,
    finish: Option<&str>,
    stop_sequence: Option<&str>,
) -> &'static str {
    if !turn.tool_calls.is_empty() {
        "tool_use"
    } else if finish == Some("length") {
        "max_tokens"
    } else if stop_sequence.is_some() {
        "stop_sequence"
    } else {
        "end_turn"
    }
}

/// The id of the answer's `i`th `tool_use` block (whole or streamed).
pub fn tool_use_id(id_prefix: &str, i: usize) -> String {
    format!("toolu_{id_prefix}_{i}")
}

/// The response's content blocks: thinking, text, then each tool call as a
/// `tool_use` (ids [`tool_use_id`] unless the call has one).
pub fn content_blocks(turn: &AssistantTurn, id_prefix: &str) -> Vec<ContentBlock> {
    let mut out = Vec::new();
    if let Some(r) = &turn.reasoning {
        out.push(ContentBlock::Thinking {
            thinking: r.clone(),
            signature: String::new(),
        });
    }
    if let Some(t) = &turn.content {
        out.push(ContentBlock::Text { text: t.clone() });
    }
    for (i, c) in turn.tool_calls.iter().enumerate() {
        let input = if c.arguments.is_object() {
            c.arguments.clone()
        } else {
            json!({})
        };
        out.push(ContentBlock::ToolUse {
            id: c.id.clone().unwrap_or_else(|| tool_use_id(id_prefix, i)),
            name: c.name.clone(),
            input,
        });
    }
    out
}

/// The assistant message a Messages response's `content` was (to compare
/// what the harness sends back with what it got).
pub fn assistant_turn(content: &Value) -> Result<AssistantTurn, ConversationError> {
    let mut messages = Vec::new();
    let m = json!({"role": "assistant", "content": content});
    read_message(0, &m, &mut messages, &mut HashSet::new())?;
    match messages.pop() {
        Some(Message::Assistant(turn)) => Ok(turn),
        _ => Err(ConversationError::unsupported("not an assistant message")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claude_code_like() -> Value {
        json!({
            "model": "policy",
            "max_tokens": 512,
            "system": [
                {"type": "text", "text": "x-anthropic-billing-header: cc_version=2"},
                {"type": "text", "text": "You are a coding agent.", "cache_control": {"type": "ephemeral"}},
            ],
            "tools": [{"name": "Bash", "description": "Run a command",
                       "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}}}],
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "fix the bug"}]},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "look first", "signature": "sig"},
                    {"type": "text", "text": "Listing."},
                    {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls"}},
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "a.py"}]},
                    {"type": "text", "text": "go on"},
                ]},
                {"role": "system", "content": "Be brief."},
            ],
        })
    }

    #[test]
    fn claude_codes_billing_line_is_not_part_of_the_system_prompt() {
        let body = |suffix: &str| {
            json!({"system": [
                {"type": "text", "text": format!("x-anthropic-billing-header: cc_version=2.1.328.{suffix}; cc_entrypoint=sdk-cli;")},
                {"type": "text", "text": "You are terse."}],
                "messages": [{"role": "user", "content": "hi"}]})
        };
        let a = conversation(&body("ce7")).unwrap();
        let b = conversation(&body("f00")).unwrap();
        assert_eq!(a.messages[0], Message::System("You are terse.".into()));
        assert_eq!(a.messages, b.messages);
        // Only as the first line: elsewhere it is the harness's text.
        let kept = json!({"system": "Be brief.\nx-anthropic-billing-header: x",
                          "messages": [{"role": "user", "content": "hi"}]});
        let c = conversation(&kept).unwrap();
        assert_eq!(
            c.messages[0],
            Message::System("Be brief.\nx-anthropic-billing-header: x".into())
        );
    }

    #[test]
    fn maps_system_blocks_tool_use_results_and_tools() {
        let c = conversation(&claude_code_like()).unwrap();
        // The billing line left out, the blocks joined.
        assert_eq!(
            c.messages[0],
            Message::System("You are a coding agent.".into())
        );
        assert_eq!(c.messages[1], Message::User("fix the bug".into()));
        let Message::Assistant(turn) = &c.messages[2] else {
            panic!("{:?}", c.messages[2])
        };
        assert_eq!(turn.reasoning.as_deref(), Some("look first"));
        assert_eq!(turn.content.as_deref(), Some("Listing."));
        assert_eq!(turn.tool_calls[0].arguments, json!({"command": "ls"}));
        assert_eq!(
            c.messages[3],
            Message::Tool {
                call_id: Some("toolu_1".into()),
                content: "a.py".into()
            }
        );
        assert_eq!(c.messages[4], Message::User("go on".into()));
        assert_eq!(c.messages[5], Message::System("Be brief.".into()));
        let tools = c.tools.unwrap();
        assert_eq!(tools[0]["function"]["name"], "Bash");
        assert_eq!(
            tools[0]["function"]["parameters"]["properties"]["command"]["type"],
            "string"
        );
    }

    #[test]
    fn the_same_history_through_chat_completions_is_the_same_conversation() {
        let messages = json!({
            "system": "be brief",
            "tools": [{"name": "bash", "input_schema": {"type": "object"}}],
            "messages": [
                {"role": "user", "content": "list files"},
                {"role": "assistant", "content": [
                    {"type": "tool_use", "id": "t1", "name": "bash", "input": {"cmd": "ls"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "a.txt"}]},
            ],
        });
        let chat = json!({
            "tools": [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}],
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "list files"},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "c9", "type": "function", "function": {"name": "bash", "arguments": "{\"cmd\": \"ls\"}"}}]},
                {"role": "tool", "tool_call_id": "t1", "content": "a.txt"},
            ],
        });
        let a = conversation(&messages).unwrap();
        let c = agl_conversation::openai_chat::conversation(&chat).unwrap();
        assert_eq!(a.tools, c.tools);
        assert_eq!(a.messages.len(), c.messages.len());
        for (x, y) in a.messages.iter().zip(&c.messages) {
            assert!(x.same_as(y), "{x:?} vs {y:?}");
        }
    }

    #[test]
    fn what_it_cannot_hold_is_refused_by_name() {
        let cases = [
            (
                json!({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}),
                "messages[0]: content[0]: `image` blocks are not supported",
            ),
            (
                json!({"messages": [{"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "nope", "content": "x"}]}]}),
                "tool_use id `nope`",
            ),
            (
                json!({"messages": [], "tools": [{"type": "web_search_20250305", "name": "web_search"}]}),
                "server tool type `web_search_20250305`",
            ),
            (
                json!({"messages": [{"role": "assistant", "content": [{"type": "server_tool_use"}]}]}),
                "block type `server_tool_use`",
            ),
            (
                json!({"messages": [{"role": "critic", "content": "x"}]}),
                "role `critic`",
            ),
            (json!({"messages": "hi"}), "`messages` must be a list"),
        ];
        for (body, want) in cases {
            let e = conversation(&body).unwrap_err().to_string();
            assert!(e.contains(want), "{e}");
        }
    }

    #[test]
    fn an_error_result_is_marked_and_the_reply_round_trips() {
        let mut body = claude_code_like();
        body["messages"][2]["content"][0]["is_error"] = json!(true);
        let c = conversation(&body).unwrap();
        assert!(
            matches!(&c.messages[3], Message::Tool { content, .. } if content == "Error: a.py")
        );
        // The blocks the gateway answers with read back as the same turn.
        let Message::Assistant(turn) = &c.messages[2] else {
            panic!()
        };
        let blocks = serde_json::to_value(content_blocks(turn, "r1")).unwrap();
        assert!(assistant_turn(&blocks).unwrap().same_as(turn));
        assert_eq!(stop_reason(turn, Some("stop"), None), "tool_use");
        let plain = AssistantTurn {
            content: Some("done".into()),
            ..Default::default()
        };
        assert_eq!(stop_reason(&plain, Some("length"), None), "max_tokens");
        assert_eq!(
            stop_reason(&plain, Some("stop"), Some("END")),
            "stop_sequence"
        );
        assert_eq!(stop_reason(&plain, Some("stop"), None), "end_turn");
    }
}
