//! How a model family writes tool calls and reasoning in its output, and
//! parsing a finished output into an [`AssistantTurn`]:
//! - Hermes / Qwen2.5 / Qwen3: `<tool_call>{"name": .., "arguments": ..}</tool_call>`
//! - Qwen3-coder: `<tool_call><function=NAME><parameter=K>V</parameter></function></tool_call>`
//! - Llama 3.x: the whole reply is `{"name": .., "parameters": ..}` (after an
//!   optional `<|python_tag|>`), calls separated by `;`
//! - reasoning: `<think>...</think>` before the reply (the generation prompt
//!   may already have opened the block).
//!
//! The sampled token ids are never touched; only the message shape is read
//! out of their text. A block that does not parse leaves the text as
//! content, so nothing the model wrote is lost.

use serde_json::value::RawValue;
use serde_json::{Map, Value};

use crate::message::{AssistantTurn, ToolCall, ToolChoice};

/// How tool calls are written (named as in `[engine] tool_parser`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolFormat {
    None,
    Hermes,
    Qwen3Coder,
    Llama3Json,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Family {
    pub tools: ToolFormat,
    /// Outputs may open with `<think>...</think>`.
    pub reasoning: bool,
}

impl Family {
    /// The family a chat template writes for.
    pub fn detect(template: &str) -> Family {
        let tools = if template.contains("<function=") && template.contains("<parameter=") {
            ToolFormat::Qwen3Coder
        } else if template.contains("<tool_call>") {
            ToolFormat::Hermes
        } else if template.contains("<|python_tag|>") || template.contains("ipython") {
            ToolFormat::Llama3Json
        } else {
            ToolFormat::None
        };
        Family {
            tools,
            reasoning: template.contains("</think>"),
        }
    }

    /// The family an answer under `choice` is read with: `none` reads
    /// text only.
    pub fn under(self, choice: &ToolChoice) -> Family {
        match choice {
            ToolChoice::None => Family {
                tools: ToolFormat::None,
                ..self
            },
            _ => self,
        }
    }

    /// Whether a forced `choice` (`required` or a named tool) can be
    /// honoured: a family that writes no tool calls (a template without a
    /// tool-call format, and no `[engine] tool_parser`) can neither force a
    /// call nor read one back, so the request is refused rather than
    /// answered as if it were `auto`.
    pub fn check_forced(&self, choice: &ToolChoice) -> Result<(), crate::ConversationError> {
        let forced = matches!(choice, ToolChoice::Required | ToolChoice::Function(_));
        if forced && self.tools == ToolFormat::None {
            return Err(crate::ConversationError::unsupported(
                "`tool_choice` forces a tool call, but the policy's chat template writes no \
                 tool calls, so none can be forced or read back; set `[engine] tool_parser` \
                 (hermes, qwen3_coder or llama3_json) to the format the model writes, or send \
                 `tool_choice` auto",
            ));
        }
        Ok(())
    }

    /// The text a forced tool call starts with, written after the
    /// generation prompt so the model can only go on with a call (of the
    /// named tool): as its template writes calls. Empty when nothing is
    /// forced or the family writes no calls.
    pub fn forced_call(&self, choice: &ToolChoice) -> String {
        let name = |n: &str| serde_json::to_string(n).unwrap_or_default();
        match (self.tools, choice) {
            (ToolFormat::Hermes, ToolChoice::Required) => "<tool_call>\n{\"name\": ".into(),
            (ToolFormat::Hermes, ToolChoice::Function(n)) => {
                format!("<tool_call>\n{{\"name\": {}, \"arguments\": ", name(n))
            }
            (ToolFormat::Qwen3Coder, ToolChoice::Required) => "<tool_call>\n<function=".into(),
            (ToolFormat::Qwen3Coder, ToolChoice::Function(n)) => {
                format!("<tool_call>\n<function={n}>\n")
            }
            (ToolFormat::Llama3Json, ToolChoice::Required) => "{\"name\": ".into(),
            (ToolFormat::Llama3Json, ToolChoice::Function(n)) => {
                format!("{{\"name\": {}, \"parameters\": ", name(n))
            }
            _ => String::new(),
        }
    }

    /// What may follow [`Family::forced_call`]'s text, as a Lark grammar
    /// (llguidance's, vLLM's `structured_outputs.grammar`): the rest of one
    /// call of an offered tool (of the named one) whose arguments are valid
    /// against its `parameters` schema, written compactly as the family
    /// writes calls. `None` when nothing is forced, no offered tool fits,
    /// or the family's calls are not JSON (Qwen3-coder's XML).
    pub fn forced_grammar(&self, choice: &ToolChoice, tools: Option<&Value>) -> Option<String> {
        let offered: Vec<(&str, Value)> = tools?
            .as_array()?
            .iter()
            .filter_map(|t| {
                let f = t.get("function").unwrap_or(t);
                let name = f.get("name")?.as_str()?;
                let params = f
                    .get("parameters")
                    .or_else(|| f.get("input_schema"))
                    .cloned()
                    .unwrap_or_else(|| serde_json::json!({"type": "object"}));
                Some((name, compact_schema(params)))
            })
            .collect();
        let wanted: Vec<(usize, &(&str, Value))> = match choice {
            ToolChoice::Function(name) => offered
                .iter()
                .enumerate()
                .filter(|(_, (n, _))| n == name)
                .take(1)
                .collect(),
            ToolChoice::Required => offered.iter().enumerate().collect(),
            _ => return None,
        };
        if wanted.is_empty() {
            return None;
        }
        // A Lark string literal: JSON's quoting.
        let quote = |text: &str| serde_json::to_string(text).unwrap_or_default();
        let named = matches!(choice, ToolChoice::Function(_));
        let mut rules = Vec::new();
        let mut calls = Vec::new();
        for (i, (name, schema)) in wanted {
            calls.push(format!("call{i}"));
            match self.tools {
                ToolFormat::Hermes | ToolFormat::Llama3Json => {
                    let (close, key) = if self.tools == ToolFormat::Hermes {
                        ("}\n</tool_call>", "arguments")
                    } else {
                        ("}", "parameters")
                    };
                    // The prefix holds `{"name": ` (and the name, when named).
                    let head = if named {
                        String::new()
                    } else {
                        quote(&format!("{}, \"{key}\": ", quote(name)))
                    };
                    rules.push(rule(
                        &format!("call{i}"),
                        &[&head, &format!("args{i}"), &quote(close)],
                    ));
                    rules.push(format!("args{i}: %json {schema}"));
                }
                ToolFormat::Qwen3Coder => {
                    // The prefix holds `<function=` (and `NAME>\n`, when named).
                    let head = if named {
                        String::new()
                    } else {
                        quote(&format!("{name}>\n"))
                    };
                    let params = coder_params_grammar(i, schema, &mut rules, &quote);
                    let close = quote("</function>\n</tool_call>");
                    rules.push(rule(&format!("call{i}"), &[&head, &params, &close]));
                }
                ToolFormat::None => return None,
            }
        }
        Some(format!(
            "start: {}\n{}",
            calls.join(" | "),
            rules.join("\n")
        ))
    }

    /// Reads a finished output's text.
    pub fn parse(&self, text: &str) -> AssistantTurn {
        let (reasoning, rest) = if self.reasoning {
            split_reasoning(text)
        } else {
            (None, text)
        };
        let (content, tool_calls) = match self.tools {
            ToolFormat::None => (Some(rest.to_string()), Vec::new()),
            ToolFormat::Hermes => blocks(rest, hermes_call),
            ToolFormat::Qwen3Coder => blocks(rest, coder_call),
            ToolFormat::Llama3Json => llama_calls(rest),
        };
        // Text beside tool calls is trimmed (it sat between blocks); a plain
        // reply is kept as written, less the blank line after `</think>`.
        let content = match (content, tool_calls.is_empty(), reasoning.is_some()) {
            (Some(c), false, _) => Some(c.trim().to_string()),
            (Some(c), true, true) => Some(c.trim_start().to_string()),
            (c, _, _) => c,
        }
        .filter(|c| !c.is_empty());
        AssistantTurn {
            content,
            reasoning,
            tool_calls,
        }
    }
}

const THINK_OPEN: &str = "<think>";
const THINK_CLOSE: &str = "</think>";

/// `(reasoning, rest)`: text up to `</think>` is reasoning, whether or not
/// the output itself opened the block.
fn split_reasoning(text: &str) -> (Option<String>, &str) {
    let Some(end) = text.find(THINK_CLOSE) else {
        return (None, text);
    };
    let head = text[..end].trim_start();
    let head = head.strip_prefix(THINK_OPEN).unwrap_or(head);
    let reasoning = head.trim();
    let rest = &text[end + THINK_CLOSE.len()..];
    ((!reasoning.is_empty()).then(|| reasoning.to_string()), rest)
}

const CALL_OPEN: &str = "<tool_call>";
const CALL_CLOSE: &str = "</tool_call>";

/// Content outside `<tool_call>` blocks and the calls read from them; the
/// text untouched (no calls) when any block does not parse.
fn blocks(text: &str, read: fn(&str) -> Option<ToolCall>) -> (Option<String>, Vec<ToolCall>) {
    let untouched = || (Some(text.to_string()), Vec::new());
    let mut content = String::new();
    let mut calls = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find(CALL_OPEN) {
        content.push_str(&rest[..start]);
        let inner = &rest[start + CALL_OPEN.len()..];
        // An unclosed last block (stopped at EOS) runs to the end.
        let (body, after) = match inner.find(CALL_CLOSE) {
            Some(end) => (&inner[..end], &inner[end + CALL_CLOSE.len()..]),
            None => (inner, ""),
        };
        match read(body) {
            Some(call) => calls.push(call),
            None => return untouched(),
        }
        rest = after;
    }
    content.push_str(rest);
    (Some(content), calls)
}

/// `{"name": .., "arguments"|"parameters": ..}`; the arguments keep the
/// text the model wrote (so a streamed call's argument deltas add up to
/// them).
fn hermes_call(body: &str) -> Option<ToolCall> {
    #[derive(serde::Deserialize)]
    struct Call<'a> {
        name: String,
        #[serde(borrow)]
        arguments: Option<&'a RawValue>,
        #[serde(borrow)]
        parameters: Option<&'a RawValue>,
    }
    let call: Call = serde_json::from_str(body.trim()).ok()?;
    let arguments = match call.arguments.or(call.parameters) {
        // Arguments sent as a JSON string hold the JSON text.
        Some(raw) if raw.get().starts_with('"') => {
            serde_json::from_str::<String>(raw.get()).ok()?
        }
        Some(raw) => raw.get().to_string(),
        None => "{}".to_string(),
    };
    Some(ToolCall::new(None, call.name, arguments))
}

/// `<function=NAME><parameter=K>V</parameter>...</function>`; a value that
/// parses as JSON is kept as that value, else as a string.
fn coder_call(body: &str) -> Option<ToolCall> {
    let (name, rest) = coder_name(body)?;
    let (args, rest) = coder_params(rest)?;
    rest.trim().strip_prefix("</function>")?;
    let arguments = Value::Object(args).to_string();
    Some(ToolCall::new(None, name.to_string(), arguments))
}

/// `<function=NAME>` at the start of a call's body: the name and the rest.
fn coder_name(body: &str) -> Option<(&str, &str)> {
    let rest = body.trim().strip_prefix("<function=")?;
    let (name, rest) = rest.split_once('>')?;
    Some((name.trim(), rest))
}

/// The complete `<parameter=K>V</parameter>` blocks at the start of `rest`
/// (values read as JSON, else kept as text) and what follows them. `None`
/// if a parameter's name is unterminated.
fn coder_params(mut rest: &str) -> Option<(Map<String, Value>, &str)> {
    let mut args = Map::new();
    while let Some(start) = rest.find("<parameter=") {
        let after = &rest[start + "<parameter=".len()..];
        let (key, after) = after.split_once('>')?;
        let Some(end) = after.find("</parameter>") else {
            break;
        };
        let raw = after[..end].trim_matches('\n');
        let value = serde_json::from_str(raw).unwrap_or_else(|_| Value::String(raw.to_string()));
        args.insert(key.trim().to_string(), value);
        rest = &after[end + "</parameter>".len()..];
    }
    Some((args, rest))
}

/// A Qwen3-coder call being generated (the text after `<tool_call>`): its
/// name once `<function=NAME>` is complete, and the arguments of the
/// parameters completed so far as the finished call's arguments begin
/// (its JSON text without the closing `}`), for streaming.
pub fn coder_call_prefix(body: &str) -> Option<(String, String)> {
    let (name, rest) = coder_name(body)?;
    let (args, _) = coder_params(rest)?;
    let mut text = Value::Object(args).to_string();
    text.pop();
    Some((name.to_string(), text))
}

/// Llama 3.x: a reply that is one or more `;`-separated JSON calls.
fn llama_calls(text: &str) -> (Option<String>, Vec<ToolCall>) {
    let untouched = || (Some(text.to_string()), Vec::new());
    let body = text.trim();
    let mut rest = body.strip_prefix("<|python_tag|>").unwrap_or(body).trim();
    if !rest.starts_with('{') {
        return untouched();
    }
    let mut calls = Vec::new();
    while !rest.is_empty() {
        let mut values = serde_json::Deserializer::from_str(rest).into_iter::<&RawValue>();
        let Some(Ok(v)) = values.next() else {
            return untouched();
        };
        // `{"name", "parameters"}`, the parameters kept as written.
        let Some(call) = hermes_call(v.get()) else {
            return untouched();
        };
        calls.push(call);
        let after = rest[values.byte_offset()..].trim_start();
        rest = after.strip_prefix(';').unwrap_or(after).trim_start();
    }
    (None, calls)
}

/// A Lark rule `name: part part ...`, empty parts left out.
fn rule(name: &str, parts: &[&str]) -> String {
    let parts: Vec<&str> = parts.iter().copied().filter(|p| !p.is_empty()).collect();
    format!("{name}: {}", parts.join(" "))
}

/// The `<parameter=K>\nV\n</parameter>\n` blocks of Qwen3-coder call `i`
/// as Lark rules (pushed to `rules`; the sequence returned): one per
/// property in schema order, optional unless required; a string value is
/// free text up to its closing tag (a lazy lexeme), any other value JSON
/// valid against its schema, as `coder_params` reads them back.
fn coder_params_grammar(
    i: usize,
    schema: &Value,
    rules: &mut Vec<String>,
    quote: &dyn Fn(&str) -> String,
) -> String {
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let properties = schema.get("properties").and_then(Value::as_object);
    let mut sequence = Vec::new();
    for (j, (key, prop)) in properties.into_iter().flatten().enumerate() {
        let open = quote(&format!("<parameter={key}>\n"));
        let text = prop.get("type").and_then(Value::as_str) == Some("string")
            && prop.get("enum").is_none();
        if text {
            rules.push(format!("p{i}_{j}[lazy]: /(.|\\n)*\\n<\\/parameter>\\n/"));
            rules.push(format!("param{i}_{j}: {open} p{i}_{j}"));
        } else {
            let close = quote("\n</parameter>\n");
            rules.push(format!("v{i}_{j}: %json {}", compact_schema(prop.clone())));
            rules.push(format!("param{i}_{j}: {open} v{i}_{j} {close}"));
        }
        let optional = if required.contains(&key.as_str()) {
            ""
        } else {
            "?"
        };
        sequence.push(format!("param{i}_{j}{optional}"));
    }
    if sequence.is_empty() {
        return "\"\"".to_string();
    }
    sequence.join(" ")
}

/// A JSON schema whose output is written as models write JSON, `{"a": 1,
/// "b": 2}` with no other whitespace (llguidance's `x-guidance` options,
/// whose default lets whitespace run on, which a sampling model does until
/// `max_tokens`); the schema's own `x-guidance` wins.
pub fn compact_schema(mut schema: Value) -> Value {
    if let Some(fields) = schema.as_object_mut() {
        fields.entry("x-guidance").or_insert(serde_json::json!({
            "whitespace_flexible": false, "item_separator": ", ", "key_separator": ": ",
        }));
    }
    schema
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const HERMES: Family = Family {
        tools: ToolFormat::Hermes,
        reasoning: true,
    };

    #[test]
    fn detects_families_from_templates() {
        assert_eq!(
            Family::detect("{{ '<tool_call>' }}").tools,
            ToolFormat::Hermes
        );
        assert_eq!(
            Family::detect("<tool_call>\n<function={{ n }}>\n<parameter={{ k }}>").tools,
            ToolFormat::Qwen3Coder
        );
        assert_eq!(
            Family::detect("<|python_tag|>{{ x }}").tools,
            ToolFormat::Llama3Json
        );
        let plain = Family::detect("{{ m.content }}");
        assert_eq!((plain.tools, plain.reasoning), (ToolFormat::None, false));
        assert!(Family::detect("<think>\n{{ r }}\n</think>").reasoning);
    }

    #[test]
    fn a_forced_call_needs_a_tool_format() {
        let plain = Family::detect("{{ m.content }}");
        for forced in [ToolChoice::Required, ToolChoice::Function("bash".into())] {
            let err = plain.check_forced(&forced).expect_err("no format to force");
            assert!(err.to_string().contains("tool_parser"), "{err}");
            assert!(HERMES.check_forced(&forced).is_ok());
        }
        for free in [ToolChoice::Auto, ToolChoice::None] {
            assert!(plain.check_forced(&free).is_ok());
        }
    }

    #[test]
    fn hermes_calls_and_reasoning() {
        let out = "<think>\nlook first\n</think>\n\nLet me check.\n<tool_call>\n{\"name\": \"bash\", \"arguments\": {\"cmd\": \"ls\"}}\n</tool_call>";
        let turn = HERMES.parse(out);
        assert_eq!(turn.reasoning.as_deref(), Some("look first"));
        assert_eq!(turn.content.as_deref(), Some("Let me check."));
        assert_eq!(turn.tool_calls.len(), 1);
        assert_eq!(turn.tool_calls[0].name, "bash");
        assert_eq!(turn.tool_calls[0].arguments, json!({"cmd": "ls"}));
        assert_eq!(
            turn.tool_calls[0].arguments_text, r#"{"cmd": "ls"}"#,
            "as written"
        );
        // The generation prompt opened the block: only its end is sampled.
        let turn = HERMES.parse("planning\n</think>\n\nDone.");
        assert_eq!(
            (turn.reasoning.as_deref(), turn.content.as_deref()),
            (Some("planning"), Some("Done."))
        );
        // A block that is not a call stays text.
        let bad = "<tool_call>not json</tool_call>";
        assert_eq!(HERMES.parse(bad).content.as_deref(), Some(bad));
        // Two calls, the last unclosed (stopped at EOS).
        let two =
            "<tool_call>{\"name\":\"a\",\"arguments\":{}}</tool_call><tool_call>{\"name\":\"b\"}";
        let turn = HERMES.parse(two);
        assert_eq!((turn.content, turn.tool_calls.len()), (None, 2));
    }

    #[test]
    fn qwen3_coder_and_llama_calls() {
        let coder = Family {
            tools: ToolFormat::Qwen3Coder,
            reasoning: false,
        };
        let out = "I'll run it.\n<tool_call>\n<function=bash>\n<parameter=command>\nls -la\n</parameter>\n<parameter=timeout>\n30\n</parameter>\n</function>\n</tool_call>";
        let turn = coder.parse(out);
        assert_eq!(turn.content.as_deref(), Some("I'll run it."));
        assert_eq!(turn.tool_calls[0].name, "bash");
        assert_eq!(
            turn.tool_calls[0].arguments,
            json!({"command": "ls -la", "timeout": 30})
        );
        let llama = Family {
            tools: ToolFormat::Llama3Json,
            reasoning: false,
        };
        let turn = llama.parse("<|python_tag|>{\"name\": \"get\", \"parameters\": {\"q\": 1}}; {\"name\": \"put\", \"parameters\": {}}");
        assert_eq!(turn.tool_calls.len(), 2);
        assert_eq!(turn.tool_calls[0].arguments, json!({"q": 1}));
        assert_eq!(
            llama.parse("plain answer").content.as_deref(),
            Some("plain answer")
        );
        // A plain reply is kept as written.
        assert_eq!(
            HERMES.parse(" two\n\n").content.as_deref(),
            Some(" two\n\n")
        );
    }

    #[test]
    fn a_forced_call_prefix_parses_as_a_call_of_that_tool() {
        for tools in [
            ToolFormat::Hermes,
            ToolFormat::Qwen3Coder,
            ToolFormat::Llama3Json,
        ] {
            let family = Family {
                tools,
                reasoning: false,
            };
            let choice = ToolChoice::Function("bash".into());
            let prefix = family.forced_call(&choice);
            let rest = match tools {
                ToolFormat::Hermes => "{\"cmd\": \"ls\"}}\n</tool_call>",
                ToolFormat::Qwen3Coder => {
                    "<parameter=cmd>\nls\n</parameter>\n</function>\n</tool_call>"
                }
                _ => "{\"cmd\": \"ls\"}}",
            };
            let turn = family.parse(&format!("{prefix}{rest}"));
            assert_eq!(turn.tool_calls.len(), 1, "{tools:?}: {turn:?}");
            assert_eq!(turn.tool_calls[0].name, "bash");
            assert_eq!(
                turn.tool_calls[0].arguments,
                serde_json::json!({"cmd": "ls"})
            );
            assert!(!family.forced_call(&ToolChoice::Required).is_empty());
            assert!(family.forced_call(&ToolChoice::Auto).is_empty());
        }
        let hermes = Family {
            tools: ToolFormat::Hermes,
            reasoning: false,
        };
        let text = "<tool_call>\n{\"name\": \"bash\", \"arguments\": {}}\n</tool_call>";
        let as_text = hermes.under(&ToolChoice::None).parse(text);
        assert!(as_text.tool_calls.is_empty());
        assert_eq!(as_text.content.as_deref(), Some(text));
    }

    #[test]
    fn a_forced_call_continues_as_a_grammar_of_its_tools_schemas() {
        let tools = serde_json::json!([
            {"type": "function", "function": {"name": "ls", "parameters": {"type": "object"}}},
            {"name": "cat", "input_schema": {"type": "object", "required": ["path"],
             "properties": {"path": {"type": "string"}, "n": {"type": "integer"}}}},
        ]);
        let family = |tools| Family {
            tools,
            reasoning: false,
        };
        let hermes = family(ToolFormat::Hermes);
        let named = hermes
            .forced_grammar(&ToolChoice::Function("cat".into()), Some(&tools))
            .unwrap();
        assert!(
            named.starts_with("start: call1\ncall1: args1 \"}\\n</tool_call>\"\nargs1: %json {"),
            "{named}"
        );
        assert!(named.contains(r#""required":["path"]"#) && named.contains("whitespace_flexible"));
        let any = hermes
            .forced_grammar(&ToolChoice::Required, Some(&tools))
            .unwrap();
        assert!(any.starts_with("start: call0 | call1\n"), "{any}");
        assert!(
            any.contains(r#"call1: "\"cat\", \"arguments\": " args1"#),
            "{any}"
        );
        let llama = family(ToolFormat::Llama3Json);
        let any = llama
            .forced_grammar(&ToolChoice::Required, Some(&tools))
            .unwrap();
        assert!(
            any.contains(r#"\"parameters\": "#) && any.contains(r#" "}""#),
            "{any}"
        );
        // Qwen3-coder: a text parameter up to its closing tag, a JSON one
        // valid against its schema, optional unless required.
        let coder = family(ToolFormat::Qwen3Coder);
        let call = coder
            .forced_grammar(&ToolChoice::Function("cat".into()), Some(&tools))
            .unwrap();
        assert!(
            call.contains(r#"p1_0[lazy]: /(.|\n)*\n<\/parameter>\n/"#),
            "{call}"
        );
        assert!(
            call.contains(r#"param1_1: "<parameter=n>\n" v1_1 "\n</parameter>\n""#),
            "{call}"
        );
        assert!(
            call.contains(r#"call1: param1_0 param1_1? "</function>\n</tool_call>""#),
            "{call}"
        );
        let any = coder
            .forced_grammar(&ToolChoice::Required, Some(&tools))
            .unwrap();
        assert!(any.contains(r#"call0: "ls>\n" "" "</function>"#), "{any}");
        assert_eq!(
            hermes.forced_grammar(&ToolChoice::Function("rm".into()), Some(&tools)),
            None
        );
        assert_eq!(hermes.forced_grammar(&ToolChoice::Auto, Some(&tools)), None);
        assert_eq!(
            family(ToolFormat::None).forced_grammar(&ToolChoice::Required, Some(&tools)),
            None
        );
    }
}
