//! Continuation with a real tokenizer (the byte-level fixture) under a
//! Hermes/Qwen-style template (`tests/python/tools_template.jinja`, the one
//! the template parity test renders like transformers).

use std::path::Path;
use std::sync::Arc;

use agl_conversation::{Chains, Message, Renderer, Served, ToolFormat, openai_chat};
use agl_tokenizer::Tokenizer;
use serde_json::{Value, json};

#[path = "../../../tests/support/policy.rs"]
mod policy;

/// The fixture tokenizer with the tools template beside it.
fn tokenizer(dir: &Path) -> Arc<Tokenizer> {
    policy::tools_policy(dir).0
}

fn eos(tok: &Tokenizer) -> u32 {
    tok.encode("<|im_end|>", false).unwrap()[0]
}

fn tools() -> Value {
    json!([{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}])
}

/// What the "model" samples: the text of a reply plus its end-of-turn token.
fn sample(tok: &Tokenizer, text: &str) -> Vec<u32> {
    let mut ids = tok.encode(text, false).unwrap();
    ids.push(eos(tok));
    ids
}

#[test]
fn a_tool_using_conversation_continues_token_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let tok = tokenizer(dir.path());
    let renderer = Renderer::new(tok.clone(), &[eos(&tok)]).unwrap();
    assert_eq!(renderer.family().tools, ToolFormat::Hermes);
    let mut chains = Chains::default();
    let mut messages = vec![
        json!({"role": "system", "content": "You run commands."}),
        json!({"role": "user", "content": "How many files?"}),
    ];
    let mut sequence: Vec<u32> = Vec::new();
    for turn in 0..6 {
        let body = json!({"messages": messages, "tools": tools()});
        let conv = openai_chat::conversation(&body).unwrap();
        let prompt = chains.prompt(&renderer, &conv).unwrap();
        if turn == 0 {
            assert_eq!(prompt.continues, None);
        } else {
            // Every later call continues the one before: its prompt starts
            // with everything served so far, token for token.
            assert_eq!(prompt.continues, Some(turn - 1));
            assert_eq!(&prompt.ids[..sequence.len()], &sequence[..], "turn {turn}");
        }
        // The model writes a call with compact JSON; the harness sends it
        // back re-serialised with spaces and another key order.
        let reply = format!(
            "<tool_call>\n{{\"name\": \"bash\", \"arguments\": {{\"cmd\":\"ls\",\"n\":{turn}}}}}\n</tool_call>"
        );
        let response = sample(&tok, &reply);
        let text = tok.decode(&response[..response.len() - 1], false).unwrap();
        let parsed = renderer.family().parse(&text);
        assert_eq!(parsed.tool_calls.len(), 1);
        chains.served(
            Served {
                call: turn,
                messages: conv.messages.clone(),
                tools: conv.tools.clone(),
                prompt_ids: prompt.ids.clone(),
                response_ids: response.clone(),
                reply: parsed,
            },
            prompt.continues,
        );
        assert_eq!(chains.len(), 1, "one chain");
        sequence = [prompt.ids, response].concat();
        messages.push(json!({"role": "assistant", "content": null, "tool_calls": [{
            "id": format!("c{turn}"), "type": "function",
            "function": {"name": "bash", "arguments": format!("{{\"n\": {turn}, \"cmd\": \"ls\"}}")}}]}));
        messages.push(json!({"role": "tool", "tool_call_id": format!("c{turn}"), "content": format!("{turn} files")}));
    }
    // The continued prompt is what a fresh render would give, except where
    // the harness re-serialised the model's calls: there it keeps the
    // sampled bytes.
    let conv = openai_chat::conversation(&json!({"messages": messages, "tools": tools()})).unwrap();
    let fresh = renderer.fresh(&conv).unwrap();
    let continued = chains.prompt(&renderer, &conv).unwrap();
    assert_ne!(fresh, continued.ids);
    let text = tok.decode(&continued.ids, false).unwrap();
    assert!(text.contains("{\"cmd\":\"ls\",\"n\":5}"), "{text}");
    assert!(
        text.ends_with(
            "<tool_response>\n5 files\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
        ),
        "{text}"
    );
}

#[test]
fn a_summary_or_a_sub_agent_starts_a_new_chain() {
    let dir = tempfile::tempdir().unwrap();
    let tok = tokenizer(dir.path());
    let renderer = Renderer::new(tok.clone(), &[eos(&tok)]).unwrap();
    let mut chains = Chains::default();
    let first = json!({"messages": [{"role": "user", "content": "Task: count."}]});
    let conv = openai_chat::conversation(&first).unwrap();
    let prompt = chains.prompt(&renderer, &conv).unwrap();
    let response = sample(&tok, "Working on it.");
    chains.served(
        Served {
            call: 1,
            messages: conv.messages.clone(),
            tools: None,
            prompt_ids: prompt.ids,
            response_ids: response,
            reply: renderer.family().parse("Working on it."),
        },
        None,
    );
    let extend = |assistant: &str| {
        json!({"messages": [
            {"role": "user", "content": "Task: count."},
            {"role": "assistant", "content": assistant},
            {"role": "user", "content": "go on"}]})
    };
    // The same reply (whitespace aside) continues.
    let conv = openai_chat::conversation(&extend("Working on it.\n")).unwrap();
    assert_eq!(chains.prompt(&renderer, &conv).unwrap().continues, Some(1));
    // A history whose middle was replaced (a summary) does not.
    let conv = openai_chat::conversation(&extend("Summary: counted 3.")).unwrap();
    assert_eq!(chains.prompt(&renderer, &conv).unwrap().continues, None);
    // Nor does another agent's own history, or the same call with other tools.
    let sub = json!({"messages": [{"role": "user", "content": "Sub-task: list."}]});
    let conv = openai_chat::conversation(&sub).unwrap();
    assert_eq!(chains.prompt(&renderer, &conv).unwrap().continues, None);
    let mut with_tools = extend("Working on it.");
    with_tools["tools"] = tools();
    let conv = openai_chat::conversation(&with_tools).unwrap();
    assert_eq!(chains.prompt(&renderer, &conv).unwrap().continues, None);
    assert!(matches!(conv.messages[2], Message::User(_)));
}

/// The choices of one call each end a chain; the next call continues the
/// one whose reply the harness kept, and a call's choices count as one of
/// the chains an attempt keeps.
#[test]
fn the_next_call_continues_the_choice_the_harness_kept() {
    let dir = tempfile::tempdir().unwrap();
    let tok = tokenizer(dir.path());
    let renderer = Renderer::new(tok.clone(), &[eos(&tok)]).unwrap();
    let mut chains = Chains::default();
    let ask = |task: &str| json!({"messages": [{"role": "user", "content": task}]});
    let serve_choices = |chains: &mut Chains, task: &str, first_call: u64, replies: &[&str]| {
        let conv = openai_chat::conversation(&ask(task)).unwrap();
        let prompt = chains.prompt(&renderer, &conv).unwrap();
        let served = (first_call..)
            .zip(replies)
            .map(|(call, reply)| Served {
                call,
                messages: conv.messages.clone(),
                tools: None,
                prompt_ids: prompt.ids.clone(),
                response_ids: sample(&tok, reply),
                reply: renderer.family().parse(reply),
            })
            .collect();
        chains.served_choices(served, prompt.continues);
    };
    let replies = ["One.", "Two.", "Three."];
    serve_choices(&mut chains, "Count.", 10, &replies);
    assert_eq!(chains.len(), 3);
    for (call, reply) in (10..).zip(replies) {
        let kept = json!({"messages": [
            {"role": "user", "content": "Count."},
            {"role": "assistant", "content": reply},
            {"role": "user", "content": "go on"}]});
        let conv = openai_chat::conversation(&kept).unwrap();
        let prompt = chains.prompt(&renderer, &conv).unwrap();
        assert_eq!(prompt.continues, Some(call), "kept {reply}");
    }
    // Seven more calls of three choices each: the first call's choices are
    // still kept (8 calls), one more drops them.
    for i in 0..7 {
        serve_choices(&mut chains, &format!("Task {i}."), 100 + 10 * i, &replies);
    }
    assert_eq!(chains.len(), 24);
    serve_choices(&mut chains, "Task 7.", 200, &replies);
    assert_eq!(chains.len(), 24);
    let kept = json!({"messages": [
        {"role": "user", "content": "Count."},
        {"role": "assistant", "content": "Two."},
        {"role": "user", "content": "go on"}]});
    let conv = openai_chat::conversation(&kept).unwrap();
    assert_eq!(chains.prompt(&renderer, &conv).unwrap().continues, None);
}
