//! Hand-built Claude Code rollouts in the Messages shape the gateway
//! records (ids are toy ids: what matters is which prompts extend which).

use agl_plugin::testing::{CallExt, call, rollout};
use agl_plugin::{BreakKind, SampleAdapter};
use serde_json::{Value, json};

use crate::CodingAgent as ClaudeCode;

fn system(text: &str) -> Value {
    json!([{"type": "text", "text": text}])
}

fn tool_use(id: &str, name: &str, input: Value) -> Value {
    json!([{"type": "tool_use", "id": id, "name": name, "input": input}])
}

fn result(id: &str, text: &str) -> Value {
    json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": id, "content": text}]})
}

/// What the real sub-agent run recorded: the main agent starts the writer,
/// hears it launched, is told it finished; the writer runs Bash between.
#[test]
fn the_main_agent_and_its_sub_agent_are_two_chains_of_one_rollout() {
    let main = system("You are terse.");
    let task = json!({"role": "user", "content": "Have the writer write sub.txt"});
    let agent_call = tool_use(
        "toolu_1",
        "Agent",
        json!({"prompt": "Write sub to sub.txt."}),
    );
    let started = json!({"role": "assistant", "content": agent_call});
    let writer = system("You are the writer sub-agent.");
    let sub_task = json!({"role": "user", "content": "Write sub to sub.txt."});
    let bash = tool_use("toolu_2", "Bash", json!({"command": "echo sub > sub.txt"}));
    let r = rollout(vec![
        call(0, &[1, 2], &[3]).anthropic(main.clone(), json!([task]), agent_call.clone()),
        call(1, &[1, 2, 3, 4], &[5])
            .anthropic(
                main.clone(),
                json!([task, started, result("toolu_1", "launched")]),
                json!([{"type": "text", "text": "On it."}]),
            )
            .continues(0),
        call(2, &[20, 21], &[22]).anthropic(writer.clone(), json!([sub_task]), bash.clone()),
        call(3, &[20, 21, 22, 23], &[24])
            .anthropic(
                writer,
                json!([sub_task, {"role": "assistant", "content": bash}, result("toolu_2", "")]),
                json!([{"type": "text", "text": "Wrote sub.txt."}]),
            )
            .continues(2),
        call(4, &[1, 2, 3, 4, 5, 6], &[7])
            .anthropic(
                main,
                json!([task]),
                json!([{"type": "text", "text": "Done."}]),
            )
            .continues(1),
    ]);
    let samples = ClaudeCode::build_samples(r).expect("samples");
    let calls: Vec<&[u32]> = samples.iter().map(|s| s.source_calls.as_slice()).collect();
    assert_eq!(calls, [&[0, 1, 4][..], &[2, 3][..]]);
    assert_eq!(samples[0].break_before, None);
    let sub = samples[1].break_before.as_ref().expect("a break");
    assert_eq!(sub.kind, BreakKind::SubAgent, "{}", sub.detail);
    // Only what was sampled trains: 3, 5, 7 of the main chain.
    assert_eq!(samples[0].response_ids, [3, 4, 5, 6, 7]);
    let trained: Vec<(u32, u32)> = samples[0]
        .trainable
        .iter()
        .map(|s| (s.start, s.end))
        .collect();
    assert_eq!(trained, [(0, 1), (2, 3), (4, 5)]);
}

#[test]
fn a_compacted_history_is_a_summary_break() {
    let main = system("You are terse.");
    let task = json!({"role": "user", "content": "Fix the bug"});
    let summary = json!({"role": "user", "content": [{"type": "text", "text":
        "This session is being continued from a previous conversation that ran out of context. \
         The summary below covers the earlier portion of the conversation.\n\nThe user asked to fix a bug."}]});
    let r = rollout(vec![
        call(0, &[1, 2], &[3]).anthropic(
            main.clone(),
            json!([task]),
            json!([{"type": "text", "text": "Looking."}]),
        ),
        call(1, &[1, 40, 41], &[42]).anthropic(
            main,
            json!([summary]),
            json!([{"type": "text", "text": "Continuing."}]),
        ),
    ]);
    let samples = ClaudeCode::build_samples(r).expect("samples");
    assert_eq!(samples.len(), 2);
    let b = samples[1].break_before.as_ref().expect("a break");
    assert_eq!(b.kind, BreakKind::Summary, "{}", b.detail);
    assert!(
        b.detail.starts_with("summary: the history was compacted"),
        "{}",
        b.detail
    );
}
