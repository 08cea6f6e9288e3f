//! Hand-built Codex rollouts in the Responses shape the gateway records
//! (ids are toy ids: what matters is which prompts extend which).

use agl_plugin::testing::{CallExt, call, rollout};
use agl_plugin::{BreakKind, SampleAdapter};
use serde_json::{Value, json};

use crate::CodingAgent as Codex;

const INSTRUCTIONS: &str = "You are a coding agent running in the Codex CLI.";

fn user(text: &str) -> Value {
    json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]})
}

fn exec(call_id: &str, cmd: &str) -> Value {
    json!({"type": "function_call", "call_id": call_id, "name": "exec_command",
           "arguments": json!({"cmd": cmd}).to_string()})
}

fn said(text: &str) -> Value {
    json!([{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}])
}

#[test]
fn a_command_turn_and_its_answer_are_one_sample() {
    let first = exec("call_1", "echo hello > out.txt");
    let output = json!({"type": "function_call_output", "call_id": "call_1", "output": ""});
    let r = rollout(vec![
        call(0, &[1, 2], &[3]).responses(
            INSTRUCTIONS,
            json!([user("Write hello")]),
            json!([first]),
        ),
        call(1, &[1, 2, 3, 4], &[5])
            .responses(
                INSTRUCTIONS,
                json!([user("Write hello"), first, output]),
                said("Wrote out.txt."),
            )
            .continues(0),
    ]);
    let samples = Codex::build_samples(r).expect("samples");
    assert_eq!(samples.len(), 1);
    assert_eq!(samples[0].source_calls, [0, 1]);
    let trained: Vec<(u32, u32)> = samples[0]
        .trainable
        .iter()
        .map(|s| (s.start, s.end))
        .collect();
    assert_eq!(trained, [(0, 1), (2, 3)]);
}

#[test]
fn a_compacted_history_is_a_summary_break_and_a_spawned_agent_a_sub_agent() {
    let summary = user(
        "Another language model started to solve this problem and produced a summary of its \
         thinking process. ... The bug is in add().",
    );
    let r = rollout(vec![
        call(0, &[1, 2], &[3]).responses(
            INSTRUCTIONS,
            json!([user("Fix add()")]),
            said("Looking."),
        ),
        call(1, &[1, 40], &[41]).responses(INSTRUCTIONS, json!([summary]), said("Continuing.")),
        call(2, &[60, 61], &[62]).responses(
            "You are a reviewer sub-agent.",
            json!([user("Review add()")]),
            said("Fine."),
        ),
    ]);
    let samples = Codex::build_samples(r).expect("samples");
    let kinds: Vec<Option<BreakKind>> = samples
        .iter()
        .map(|s| s.break_before.as_ref().map(|b| b.kind))
        .collect();
    assert_eq!(
        kinds,
        [None, Some(BreakKind::Summary), Some(BreakKind::SubAgent)]
    );
}
