//! Writes the plugin fixtures under `examples/fixtures/`: a small BPE
//! tokenizer with a ChatML template, and `rollouts.jsonl`, rollouts recorded
//! the way the gateway records them (prompt ids = the rendered, re-tokenised
//! history; response ids = what the "model" sampled). Each rollout exercises
//! one case the sample adapters must get right.
//!
//! Run: `cargo run -p agl --example make_fixtures` (output is committed; the
//! tests read it, so rerun only when a scenario changes).

use std::collections::BTreeMap;
use std::path::Path;

use agl_tokenizer::Tokenizer;
use agl_wire::rollout::{Event, ModelCall, Rollout, RolloutStatus};
use serde_json::{Value, json};

const TEMPLATE: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n\
{% if m.content %}{{ m.content }}{% endif %}\
{% if m.tool_calls %}{% for tc in m.tool_calls %}<tool_call>{\"name\": \"{{ tc.function.name }}\", \"arguments\": {{ tc.function.arguments }}}</tool_call>{% endfor %}{% endif %}\
<|im_end|>\n{% endfor %}\
{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

const SPECIAL: [&str; 4] = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<unk>"];
/// Merges that make "the", "answer", "result" etc. single tokens, so that a
/// model sampling them letter by letter produces retokenisation drift.
const MERGES: [(&str, &str); 14] = [
    ("t", "h"),
    ("th", "e"),
    ("a", "n"),
    ("an", "s"),
    ("w", "e"),
    ("we", "r"),
    ("ans", "wer"),
    ("r", "e"),
    ("re", "s"),
    ("u", "l"),
    ("ul", "t"),
    ("res", "ult"),
    ("i", "s"),
    (" ", "the"),
];

fn tokenizer_json() -> Value {
    let mut vocab = serde_json::Map::new();
    for (i, s) in SPECIAL.iter().enumerate() {
        vocab.insert(s.to_string(), json!(i));
    }
    let chars = std::iter::once('\n').chain((32u8..127).map(char::from));
    for c in chars {
        let n = vocab.len();
        vocab.insert(c.to_string(), json!(n));
    }
    for (a, b) in MERGES {
        let n = vocab.len();
        vocab.insert(format!("{a}{b}"), json!(n));
    }
    let added: Vec<Value> = SPECIAL
        .iter()
        .enumerate()
        .map(|(i, s)| {
            json!({"id": i, "content": s, "single_word": false, "lstrip": false,
                   "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": added,
        "normalizer": null, "pre_tokenizer": null, "post_processor": null,
        "decoder": {"type": "Fuse"},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": "<unk>",
            "continuing_subword_prefix": null, "end_of_word_suffix": null,
            "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
            "vocab": vocab,
            "merges": MERGES.iter().map(|(a, b)| json!([a, b])).collect::<Vec<_>>(),
        }
    })
}

/// A harness conversation replayed through a fake engine.
struct Recorder<'a> {
    tok: &'a Tokenizer,
    calls: Vec<ModelCall>,
    clock: u64,
}

struct Turn<'a> {
    messages: &'a [Value],
    tools: Option<&'a Value>,
    /// What the model sampled, as text (the assistant turn as the template
    /// renders it, tool-call markup included).
    sampled: &'a str,
    /// Sampled ids when they differ from `encode(sampled)` (drift cases).
    sampled_ids: Option<Vec<u32>>,
    /// The assistant message the engine parsed from `sampled`.
    message: Value,
    agent: Option<&'a str>,
}

impl<'a> Turn<'a> {
    /// The model answered with plain text.
    fn text(messages: &'a [Value], sampled: &'a str) -> Self {
        Turn {
            messages,
            tools: None,
            sampled,
            sampled_ids: None,
            message: text_msg(sampled),
            agent: None,
        }
    }

    /// The model called the calc tool with `args`, rendered as `sampled`.
    fn tool_call(messages: &'a [Value], tools: &'a Value, sampled: &'a str, args: &str) -> Self {
        Turn {
            tools: Some(tools),
            message: tool_call_msg(args),
            ..Turn::text(messages, sampled)
        }
    }
}

impl<'a> Recorder<'a> {
    fn new(tok: &'a Tokenizer, clock: u64) -> Self {
        Recorder {
            tok,
            calls: vec![],
            clock,
        }
    }

    fn encode(&self, text: &str) -> Vec<u32> {
        self.tok.encode(text, false).expect("encode")
    }

    fn call(&mut self, turn: Turn<'_>) {
        let messages = Value::Array(turn.messages.to_vec());
        let prompt = self
            .tok
            .apply_chat_template(
                &messages.to_string(),
                turn.tools.map(|t| t.to_string()).as_deref(),
                true,
            )
            .expect("render");
        let prompt_ids = self.encode(&prompt);
        let mut response_ids = turn
            .sampled_ids
            .unwrap_or_else(|| self.encode(turn.sampled));
        response_ids.push(1); // <|im_end|>: the engine returns the stop token it sampled
        let response_logprobs: Vec<f32> = (0..response_ids.len())
            .map(|i| -0.05 - 0.01 * (i % 10) as f32)
            .collect();
        let index = self.calls.len() as u32;
        let finish = if turn.message.get("tool_calls").is_some() {
            "tool_calls"
        } else {
            "stop"
        };
        let mut request = json!({"model": "policy", "messages": messages});
        if let Some(tools) = turn.tools {
            request["tools"] = tools.clone();
        }
        let mut tags = BTreeMap::new();
        if let Some(agent) = turn.agent {
            tags.insert("x-agl-agent".to_string(), agent.to_string());
        }
        self.clock += 1000;
        let response = json!({
            "id": format!("chatcmpl-{index}"), "object": "chat.completion", "model": "policy",
            "choices": [{"index": 0, "message": turn.message, "finish_reason": finish}],
            "usage": {"prompt_tokens": prompt_ids.len(), "completion_tokens": response_ids.len()},
        });
        self.calls.push(ModelCall {
            finish_reason: Some(finish.to_string()),
            started_at_ms: self.clock,
            finished_at_ms: self.clock + 400,
            tags,
            ..ModelCall::chat(
                index,
                (request.into(), response.into()),
                (prompt_ids, response_ids),
                response_logprobs,
            )
        });
    }

    fn finish(self, id: &str, input: Value, reward: Option<f64>) -> Rollout {
        let events = reward
            .map(|r| Event {
                kind: "reward".into(),
                payload: json!({"value": r}).into(),
                timestamp_ms: self.clock + 500,
            })
            .into_iter()
            .collect();
        Rollout {
            id: id.to_string(),
            group_id: format!("g-{id}"),
            attempt: 0,
            input: input.into(),
            status: RolloutStatus::Succeeded,
            failure: None,
            calls: self.calls,
            events,
        }
    }
}

fn calc_tools() -> Value {
    json!([{"type": "function", "function": {"name": "calc", "description": "Evaluate arithmetic",
        "parameters": {"type": "object", "properties": {"expr": {"type": "string"}}}}}])
}

fn tool_call_msg(args: &str) -> Value {
    json!({"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
        "function": {"name": "calc", "arguments": args}}]})
}

fn tool_markup(args: &str) -> String {
    format!("<tool_call>{{\"name\": \"calc\", \"arguments\": {args}}}</tool_call>")
}

fn text_msg(content: &str) -> Value {
    json!({"role": "assistant", "content": content})
}

/// Three calls whose prompts extend each other: one sample, two observations masked.
fn clean(tok: &Tokenizer) -> Rollout {
    let tools = calc_tools();
    let mut r = Recorder::new(tok, 1_764_000_000_000);
    let mut msgs = vec![
        json!({"role": "system", "content": "You solve arithmetic with the calc tool."}),
        json!({"role": "user", "content": "What is 12*7+3?"}),
    ];
    let args1 = r#"{"expr":"12*7"}"#;
    r.call(Turn::tool_call(&msgs, &tools, &tool_markup(args1), args1));
    msgs.push(tool_call_msg(args1));
    msgs.push(json!({"role": "tool", "tool_call_id": "call_1", "content": "84"}));
    let args2 = r#"{"expr":"84+3"}"#;
    r.call(Turn::tool_call(&msgs, &tools, &tool_markup(args2), args2));
    msgs.push(tool_call_msg(args2));
    msgs.push(json!({"role": "tool", "tool_call_id": "call_1", "content": "87"}));
    let answer = "the answer is 87";
    r.call(Turn {
        tools: Some(&tools),
        ..Turn::text(&msgs, answer)
    });
    r.finish(
        "clean",
        json!({"question": "What is 12*7+3?", "answer": "87"}),
        Some(1.0),
    )
}

/// The model sampled "the" letter by letter; the re-rendered history encodes
/// the same text as one token: same text, different ids.
fn retokenize(tok: &Tokenizer) -> Rollout {
    let mut r = Recorder::new(tok, 1_764_000_100_000);
    let mut msgs = vec![json!({"role": "user", "content": "Say the result of 2+2, then confirm."})];
    let first = "the result: 4";
    let letters: Vec<u32> = "the".chars().map(|c| r.encode(&c.to_string())[0]).collect();
    let mut sampled_ids = letters;
    sampled_ids.extend(r.encode(&first[3..]));
    r.call(Turn {
        sampled_ids: Some(sampled_ids),
        ..Turn::text(&msgs, first)
    });
    msgs.push(text_msg(first));
    msgs.push(json!({"role": "user", "content": "Confirm."}));
    let second = "4 is the answer";
    r.call(Turn::text(&msgs, second));
    r.finish(
        "retokenize",
        json!({"question": "2+2", "answer": "4"}),
        Some(1.0),
    )
}

/// The harness re-serialised the tool-call arguments (`{"a":1}` -> `{"a": 1}`),
/// so the previous assistant turn renders differently in the next prompt.
fn template(tok: &Tokenizer) -> Rollout {
    let tools = calc_tools();
    let mut r = Recorder::new(tok, 1_764_000_200_000);
    let mut msgs = vec![json!({"role": "user", "content": "What is 6*7?"})];
    let sampled_args = r#"{"expr":"6*7"}"#;
    r.call(Turn::tool_call(
        &msgs,
        &tools,
        &tool_markup(sampled_args),
        sampled_args,
    ));
    msgs.push(tool_call_msg(r#"{"expr": "6*7"}"#));
    msgs.push(json!({"role": "tool", "tool_call_id": "call_1", "content": "42"}));
    let answer = "the answer is 42";
    r.call(Turn {
        tools: Some(&tools),
        ..Turn::text(&msgs, answer)
    });
    r.finish(
        "template",
        json!({"question": "What is 6*7?", "answer": "42"}),
        Some(1.0),
    )
}

/// A main agent and a search sub-agent interleave their calls; tagged with
/// `x-agl-agent`, each keeps its own chain.
fn subagents(tok: &Tokenizer) -> Rollout {
    let mut r = Recorder::new(tok, 1_764_000_300_000);
    let mut main = vec![
        json!({"role": "system", "content": "You are the planner."}),
        json!({"role": "user", "content": "Find the result of 3*3."}),
    ];
    let mut sub = vec![
        json!({"role": "system", "content": "You are a helper."}),
        json!({"role": "user", "content": "Compute 3*3."}),
    ];
    let steps = [
        ("main", "ask helper"),
        ("helper", "3*3 is 9"),
        ("main", "wait"),
        ("helper", "done"),
        ("main", "the result is 9"),
    ];
    for (agent, text) in steps {
        let msgs = if agent == "main" { &mut main } else { &mut sub };
        r.call(Turn {
            agent: Some(agent),
            ..Turn::text(msgs, text)
        });
        msgs.push(text_msg(text));
        msgs.push(json!({"role": "user", "content": "ok"}));
    }
    r.finish(
        "subagents",
        json!({"question": "3*3", "answer": "9"}),
        Some(1.0),
    )
}

/// After two calls the harness replaces the history with a summary: the third
/// prompt does not extend the second, a break of class `other`.
fn summary(tok: &Tokenizer) -> Rollout {
    let mut r = Recorder::new(tok, 1_764_000_400_000);
    let system = json!({"role": "system", "content": "Be brief."});
    let mut msgs = vec![
        system.clone(),
        json!({"role": "user", "content": "Add 1+2, then 3."}),
    ];
    for text in ["1+2 is 3", "3+3 is 6"] {
        r.call(Turn::text(&msgs, text));
        msgs.push(text_msg(text));
        msgs.push(json!({"role": "user", "content": "go on"}));
    }
    let summarised = vec![
        system,
        json!({"role": "user", "content": "Summary so far: the result is 6. Give the answer."}),
    ];
    let answer = "the answer is 6";
    r.call(Turn::text(&summarised, answer));
    r.finish(
        "summary",
        json!({"question": "1+2+3", "answer": "6"}),
        Some(0.0),
    )
}

fn main() -> anyhow::Result<()> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/fixtures");
    let tok_dir = root.join("tokenizer");
    std::fs::create_dir_all(&tok_dir)?;
    std::fs::write(
        tok_dir.join("tokenizer.json"),
        serde_json::to_string_pretty(&tokenizer_json())?,
    )?;
    std::fs::write(
        tok_dir.join("tokenizer_config.json"),
        serde_json::to_string_pretty(&json!({
            "bos_token": null, "eos_token": "<|im_end|>", "chat_template": TEMPLATE,
        }))?,
    )?;
    let tok = Tokenizer::from_file(&tok_dir.join("tokenizer.json"))?;
    let rollouts = [
        clean(&tok),
        retokenize(&tok),
        template(&tok),
        subagents(&tok),
        summary(&tok),
    ];
    let mut out = String::new();
    for r in &rollouts {
        out.push_str(&serde_json::to_string(r)?);
        out.push('\n');
    }
    std::fs::write(root.join("rollouts.jsonl"), out)?;
    println!("wrote {} rollouts to {}", rollouts.len(), root.display());
    Ok(())
}
