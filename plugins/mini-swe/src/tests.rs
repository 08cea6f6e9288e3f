//! Hand-built mini-swe-agent rollouts. Token ids follow a toy chat
//! template: `9` is the generation prompt (`<|im_start|>assistant\n`), `8`
//! ends a turn, every other id is message text.

use agl_plugin::testing::{self, CallExt, TestCall, call, rollout};
use agl_plugin::{ApiKind, BreakKind, Rollout, Sample, Span, StatefulAdapter};
use serde_json::{Value, json};

use crate::MiniSwe;
use crate::breaks::{Markers, classify};

/// Builds `r`'s samples with an instance made from the current test config.
fn build_rollout(r: Rollout) -> Result<Vec<Sample>, String> {
    MiniSwe::new()?.build_samples(r)
}

fn span(start: u32, end: u32) -> Span {
    Span { start, end }
}

fn system() -> Value {
    json!({"role": "system", "content": "You are a helpful assistant that can interact with a computer."})
}

fn task() -> Value {
    json!({"role": "user", "content": "Please solve this issue: add() subtracts."})
}

/// An assistant turn with one `bash` tool call, as litellm echoes it.
fn bash(id: &str, command: &str) -> Value {
    json!({"content": "Let me look.", "role": "assistant", "tool_calls": [{"function": {
        "arguments": json!({"command": command}).to_string(), "name": "bash"},
        "id": id, "type": "function"}]})
}

fn tool(id: &str, output: &str) -> Value {
    json!({"content": json!({"returncode": 0, "output": output}).to_string(),
        "tool_call_id": id, "role": "tool"})
}

/// mini.yaml's format-error message for a reply without tool calls.
fn no_tool_calls() -> Value {
    json!({"role": "user", "content": "Tool call error:\n\n<error>\nNo tool calls found in the response. \
        Every response MUST include at least one tool call.\n</error>\n\nHere is general guidance on how \
        to submit correct toolcalls:\n\nEvery response needs to use the 'bash' tool at least once to \
        execute commands."})
}

fn turn(
    index: u32,
    messages: &[Value],
    reply: Value,
    prompt: &[u32],
    response: &[u32],
) -> TestCall {
    call(index, prompt, response).chat(Value::Array(messages.to_vec()), reply)
}

fn build(calls: Vec<TestCall>) -> Vec<Sample> {
    build_rollout(rollout(calls)).expect("samples")
}

fn detail(sample: &Sample) -> &str {
    sample
        .break_before
        .as_ref()
        .map_or("", |b| b.detail.as_str())
}

/// Three tool-call turns: ls, cat, submit.
fn solved() -> Vec<TestCall> {
    let (a0, t0) = (bash("c0", "ls"), tool("c0", "calc.py"));
    let (a1, t1) = (bash("c1", "cat calc.py"), tool("c1", "add = a - b"));
    let a2 = bash("c2", "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT");
    vec![
        turn(
            0,
            &[system(), task()],
            a0.clone(),
            &[1, 2, 3, 9],
            &[10, 11, 8],
        )
        .logprobs(&[-0.1, -0.2, -0.3]),
        turn(
            1,
            &[system(), task(), a0.clone(), t0.clone()],
            a1.clone(),
            &[1, 2, 3, 9, 10, 11, 8, 20, 21, 9],
            &[12, 13, 8],
        )
        .logprobs(&[-0.4, -0.5, -0.6]),
        turn(
            2,
            &[system(), task(), a0, t0, a1, t1],
            a2,
            &[1, 2, 3, 9, 10, 11, 8, 20, 21, 9, 12, 13, 8, 22, 23, 9],
            &[14, 8],
        )
        .logprobs(&[-0.7, -0.8]),
    ]
}

#[test]
fn tool_call_turns_merge_and_only_model_tokens_are_trainable() {
    let samples = build(solved());
    assert_eq!(samples.len(), 1);
    let s = &samples[0];
    assert_eq!(s.prompt_ids, [1, 2, 3, 9]);
    assert_eq!(
        s.response_ids,
        [10, 11, 8, 20, 21, 9, 12, 13, 8, 22, 23, 9, 14, 8]
    );
    // Model tokens (each reply up to its end-of-turn) trainable; tool
    // output and the generation prompt masked.
    assert_eq!(s.trainable, [span(0, 3), span(6, 9), span(12, 14)]);
    assert_eq!(
        s.logprobs,
        [
            -0.1, -0.2, -0.3, 0.0, 0.0, 0.0, -0.4, -0.5, -0.6, 0.0, 0.0, 0.0, -0.7, -0.8
        ]
    );
    assert_eq!(s.source_calls, [0, 1, 2]);
    assert_eq!(s.break_before, None);
}

/// Call 1 answers without a tool call; mini drops that reply and sends
/// call 2 with its format-error message instead; call 3 continues call 2.
fn format_error() -> Vec<TestCall> {
    let (a0, t0) = (bash("c0", "ls"), tool("c0", "calc.py"));
    let prose = json!({"role": "assistant", "content": "I think the bug is in calc.py."});
    let (a1, t1) = (bash("c1", "cat calc.py"), tool("c1", "add = a - b"));
    let after_error = [system(), task(), a0.clone(), t0.clone(), no_tool_calls()];
    let p2 = [1, 2, 3, 9, 10, 11, 8, 20, 21, 40, 41, 9];
    let mut p3 = p2.to_vec();
    p3.extend([12, 13, 8, 22, 23, 9]);
    let mut continued = after_error.to_vec();
    continued.extend([a1.clone(), t1]);
    vec![
        turn(
            0,
            &[system(), task()],
            a0.clone(),
            &[1, 2, 3, 9],
            &[10, 11, 8],
        ),
        turn(
            1,
            &[system(), task(), a0, t0],
            prose,
            &[1, 2, 3, 9, 10, 11, 8, 20, 21, 9],
            &[30, 31, 8],
        ),
        turn(2, &after_error, a1, &p2, &[12, 13, 8]).logprobs(&[-0.4, -0.5, -0.6]),
        turn(
            3,
            &continued,
            bash("c2", "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"),
            &p3,
            &[14, 8],
        )
        .logprobs(&[-0.7, -0.8]),
    ]
}

#[test]
fn a_format_error_drop_starts_a_new_chain_named_in_the_detail() {
    let samples = build(format_error());
    let calls: Vec<&[u32]> = samples.iter().map(|s| s.source_calls.as_slice()).collect();
    assert_eq!(calls, [&[0, 1][..], &[2, 3][..]]);
    assert_eq!(samples[0].trainable, [span(0, 3), span(6, 9)]);

    let s = &samples[1];
    let b = s.break_before.as_ref().expect("a break");
    assert_eq!((b.kind, b.call_index), (BreakKind::Other, 2));
    assert!(
        b.detail.starts_with("format-error-drop: message 4 "),
        "{}",
        b.detail
    );
    assert!(
        b.detail.contains(r#"matched "Tool call error:""#),
        "{}",
        b.detail
    );
    // The ids part: they first differ where call 1's generation prompt was.
    assert!(
        b.detail
            .contains("ids first differ at 9 (prompt position 9)"),
        "{}",
        b.detail
    );
    assert_eq!(s.prompt_ids, [1, 2, 3, 9, 10, 11, 8, 20, 21, 40, 41, 9]);
    assert_eq!(s.response_ids, [12, 13, 8, 22, 23, 9, 14, 8]);
    assert_eq!(s.trainable, [span(0, 3), span(6, 8)]);
    assert_eq!(s.logprobs, [-0.4, -0.5, -0.6, 0.0, 0.0, 0.0, -0.7, -0.8]);
}

/// The break between a call on `[system, task]` and one whose request is
/// that plus `after` (and prompt ids that do not continue).
fn break_after(after: Value) -> agl_plugin::ChainBreak {
    let prev = turn(
        0,
        &[system(), task()],
        bash("c0", "ls"),
        &[1, 2, 9],
        &[10, 8],
    );
    let next = turn(
        1,
        &[system(), task(), after],
        bash("c1", "ls"),
        &[1, 2, 40, 9],
        &[10, 8],
    );
    let r = rollout(vec![prev, next]);
    classify(&r.calls[0], &r.calls[1], &Markers::new(&[]))
}

#[test]
fn every_format_error_text_mini_renders_is_recognised() {
    let texts = [
        // mini.yaml, finish_reason=length
        "Your previous response reached the output token limit (finish_reason=length) before you \
         produced a tool call, so it was cut off. Respond more concisely and finish with exactly one \
         bash tool call. If you need to think more, do so briefly.",
        // default `{{ error }}` template, bad arguments and unknown tool
        "Error parsing tool call arguments: Expecting value: line 1 column 1 (char 0).Unknown tool \
         'python'.Missing 'command' argument in bash tool call.",
        "Unknown tool 'python'.",
        "Missing 'command' argument in bash tool call.",
        "No tool calls found in the response. Every response MUST include at least one tool call.",
        // default.yaml / mini_textbased.yaml (text mode)
        "Format error:\n\n<error>\nExpected exactly 1 action, found 2.\n</error>\n\nHere is general \
         guidance on how to format your response:",
        // LitellmTextbasedModel's default template
        "Please always provide EXACTLY ONE action in triple backticks, found 0 actions.",
        "Expected exactly 1 action, found 0.",
    ];
    for text in texts {
        let b = break_after(json!({"role": "user", "content": text}));
        assert!(
            b.detail.starts_with("format-error-drop: "),
            "{text}: {}",
            b.detail
        );
        assert_eq!(b.kind, BreakKind::Other);
    }
    // Content as parts (the Responses-API shape of the same message).
    let parts = json!({"type": "message", "role": "user",
        "content": [{"type": "input_text", "text": "Tool call error:\n\n<error>\nUnknown tool 'x'.\n</error>"}]});
    assert!(break_after(parts).detail.starts_with("format-error-drop: "));
}

#[test]
fn a_user_message_without_format_error_text_is_a_dropped_reply() {
    let nudge = json!({"role": "user", "content": "Please continue working on the task."});
    let b = break_after(nudge.clone());
    assert!(
        b.detail.starts_with("reply-dropped: message 2 "),
        "{}",
        b.detail
    );
    // An observation in the reply's place (its tool call never echoed).
    let b = break_after(tool("c0", "calc.py"));
    assert!(
        b.detail.starts_with("reply-dropped: message 2 (role tool)"),
        "{}",
        b.detail
    );

    // A custom format_error_template is recognised through the config.
    testing::set_config_json(r#"{"extra_format_error_markers": ["Please continue"]}"#);
    let prev = turn(
        0,
        &[system(), task()],
        bash("c0", "ls"),
        &[1, 2, 9],
        &[10, 8],
    );
    let next = turn(
        1,
        &[system(), task(), nudge],
        bash("c1", "ls"),
        &[1, 2, 40, 9],
        &[10, 8],
    );
    let samples = build(vec![prev, next]);
    assert_eq!(samples.len(), 2);
    assert!(
        detail(&samples[1]).starts_with("format-error-drop: ")
            && detail(&samples[1]).contains("Please continue"),
        "{}",
        detail(&samples[1])
    );
}

#[test]
fn a_resent_request_is_a_retry() {
    let first = turn(
        0,
        &[system(), task()],
        bash("c0", "ls"),
        &[1, 2, 9],
        &[10, 8],
    );
    let again = turn(
        1,
        &[system(), task()],
        bash("c1", "ls -la"),
        &[1, 2, 9],
        &[15, 8],
    );
    let samples = build(vec![first, again]);
    assert_eq!(samples.len(), 2);
    let b = samples[1].break_before.as_ref().expect("a break");
    assert_eq!((b.kind, b.call_index), (BreakKind::Other, 1));
    assert!(b.detail.starts_with("retry: "), "{}", b.detail);
    assert!(b.detail.contains("response position 0"), "{}", b.detail);
}

#[test]
fn a_summarised_history_is_a_summary_break() {
    let mut calls = solved();
    calls[2] = turn(
        2,
        &[
            system(),
            json!({"role": "user", "content": "Summary so far: add() is in calc.py."}),
        ],
        bash("c2", "sed -i s/-/+/ calc.py"),
        &[1, 2, 50, 51, 9],
        &[16, 8],
    );
    let samples = build(calls);
    assert_eq!(samples.len(), 2);
    let b = samples[1].break_before.as_ref().expect("a break");
    assert_eq!((b.kind, b.call_index), (BreakKind::Summary, 2));
    assert!(
        b.detail.starts_with("summary: history edited: message 1 "),
        "{}",
        b.detail
    );
}

#[test]
fn a_re_rendered_reply_keeps_the_generic_template_class() {
    let mut calls = solved();
    // Same conversation, but the template rendered call 1's reply with
    // other ids in call 2's prompt (e.g. reasoning stripped).
    calls[2].set_prompt_ids(&[1, 2, 3, 9, 10, 11, 8, 20, 21, 9, 13, 8, 22, 23, 9]);
    let samples = build(calls);
    assert_eq!(samples.len(), 2);
    let b = samples[1].break_before.as_ref().expect("a break");
    assert_eq!(b.kind, BreakKind::Template);
    assert!(b.detail.starts_with("template: "), "{}", b.detail);
}

#[test]
fn agents_keep_their_chains_or_break_as_an_agent_switch() {
    let calls = || {
        let mut c: Vec<TestCall> = solved().into_iter().map(|c| c.agent("main")).collect();
        c[2].index = 3;
        let sub = turn(2, &[task()], bash("s0", "ls"), &[3, 9], &[17, 8]).agent("explorer");
        c.insert(2, sub);
        c
    };
    let samples = build(calls());
    let chains: Vec<&[u32]> = samples.iter().map(|s| s.source_calls.as_slice()).collect();
    assert_eq!(chains, [&[0, 1, 3][..], &[2][..]]);
    assert_eq!(samples[1].agent.as_deref(), Some("explorer"));

    testing::set_config_json(r#"{"chain_by_agent": false}"#);
    let samples = build(calls());
    let chains: Vec<&[u32]> = samples.iter().map(|s| s.source_calls.as_slice()).collect();
    assert_eq!(chains, [&[0, 1][..], &[2][..], &[3][..]]);
    assert!(
        detail(&samples[1])
            .starts_with(r#"agent-switch: agent Some("main") then Some("explorer")"#),
        "{}",
        detail(&samples[1])
    );
    assert!(
        detail(&samples[2])
            .starts_with(r#"agent-switch: agent Some("explorer") then Some("main")"#)
    );
}

#[test]
fn completions_calls_fall_back_to_the_generic_classes() {
    let first = call(0, &[1, 2], &[10]).completion("Q:", " ls");
    let second = call(1, &[5, 6], &[11]).completion("Summary:", " cat");
    assert_eq!(second.api, ApiKind::Completions);
    let samples = build(vec![first, second]);
    assert!(
        detail(&samples[1]).starts_with("history-rewrite: "),
        "{}",
        detail(&samples[1])
    );
}

#[test]
fn config_errors_are_reported() {
    testing::set_config_json(r#"{"extra_format_error_marker": ["x"]}"#);
    let err = build_rollout(rollout(solved())).unwrap_err();
    assert!(err.contains("extra_format_error_marker"), "{err}");
    testing::set_config_json(r#"{"extra_format_error_markers": ["ok", ""]}"#);
    let err = build_rollout(rollout(solved())).unwrap_err();
    assert!(
        err.contains("extra_format_error_markers[1] is empty"),
        "{err}"
    );
}

#[test]
fn format_error_text_after_the_echoed_reply_is_not_a_format_error_drop() {
    // Text mode: observations are user messages after the reply. Output
    // that happens to contain a marker, with the reply re-rendered.
    let reply = json!({"role": "assistant", "content": "```mswea_bash_command\ngrep -r 'Format error:' .\n```"});
    let observation = json!({"role": "user",
        "content": "<returncode>0</returncode>\n<output>\nlog.txt: Format error: bad line\n</output>"});
    let prev = turn(
        0,
        &[system(), task()],
        reply.clone(),
        &[1, 2, 9],
        &[10, 11, 8],
    );
    let next = turn(
        1,
        &[system(), task(), reply, observation],
        bash("c1", "ls"),
        &[1, 2, 9, 12, 8, 40, 9],
        &[13, 8],
    );
    let b = classify(&prev, &next, &Markers::new(&[]));
    assert_eq!(b.kind, BreakKind::Template);
    assert!(b.detail.starts_with("template: "), "{}", b.detail);
}
