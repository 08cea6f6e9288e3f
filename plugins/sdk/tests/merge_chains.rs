//! `merge_chains` and `classify_break` on hand-built rollouts, asserting the
//! exact ids, spans, log-probs and break classes that come out.

use agl_plugin::testing::{self, CallExt, FakeTokenizer, call, rollout};
use agl_plugin::{BreakKind, MergeOptions, Sample, Span, merge_chains};
use serde_json::json;

fn span(start: u32, end: u32) -> Span {
    Span { start, end }
}

fn merge(calls: Vec<agl_plugin::testing::TestCall>) -> Vec<Sample> {
    merge_chains(&rollout(calls), &MergeOptions::default())
}

fn break_kind(sample: &Sample) -> Option<BreakKind> {
    sample.break_before.as_ref().map(|b| b.kind)
}

#[test]
fn three_calls_merge_into_one_sample_with_observations_masked() {
    let samples = merge(vec![
        call(0, &[1, 2, 3], &[10, 11])
            .logprobs(&[-0.1, -0.2])
            .weight_version(5),
        call(1, &[1, 2, 3, 10, 11, 20, 21], &[12])
            .logprobs(&[-0.3])
            .weight_version(6),
        call(2, &[1, 2, 3, 10, 11, 20, 21, 12, 22], &[13, 14])
            .logprobs(&[-0.4, -0.5])
            .weight_version(6),
    ]);
    assert_eq!(samples.len(), 1);
    let s = &samples[0];
    assert_eq!(s.prompt_ids, [1, 2, 3]);
    assert_eq!(s.response_ids, [10, 11, 20, 21, 12, 22, 13, 14]);
    assert_eq!(s.trainable, [span(0, 2), span(4, 5), span(6, 8)]);
    assert_eq!(s.logprobs, [-0.1, -0.2, 0.0, 0.0, -0.3, 0.0, -0.4, -0.5]);
    assert_eq!(s.source_calls, [0, 1, 2]);
    assert_eq!(s.weight_version, 5);
    assert_eq!(s.agent, None);
    assert_eq!(s.break_before, None);
}

#[test]
fn same_text_with_other_ids_is_a_retokenize_break() {
    testing::set_tokenizer(FakeTokenizer::from_pieces(&[
        (1, "<user>"),
        (2, "hi"),
        (10, "hel"),
        (11, "lo"),
        (12, "hello"),
        (20, "<user>ok"),
        (30, "bye"),
    ]));
    let first_messages = json!([{"role": "user", "content": "hi"}]);
    let reply = json!({"role": "assistant", "content": "hello"});
    let second_messages =
        json!([{"role": "user", "content": "hi"}, reply, {"role": "user", "content": "ok"}]);
    let samples = merge(vec![
        call(0, &[1, 2], &[10, 11]).chat(first_messages, reply.clone()),
        // "hel" + "lo" came back as the single token "hello".
        call(1, &[1, 2, 12, 20], &[30]).chat(
            second_messages,
            json!({"role": "assistant", "content": "bye"}),
        ),
    ]);
    assert_eq!(samples.len(), 2);
    assert_eq!(samples[1].prompt_ids, [1, 2, 12, 20]);
    assert_eq!(samples[1].source_calls, [1]);
    let chain_break = samples[1].break_before.as_ref().expect("a break");
    assert_eq!(chain_break.kind, BreakKind::Retokenize);
    assert_eq!(chain_break.call_index, 1);
    assert!(
        chain_break
            .detail
            .contains("at 2 (response position 0): previous 10, next 12"),
        "{}",
        chain_break.detail
    );
}

/// Qwen-style: the next prompt renders the previous turn without its
/// reasoning; the harness echoes the reply without `reasoning_content`.
fn reasoning_stripped_calls() -> Vec<agl_plugin::testing::TestCall> {
    let question = json!({"role": "user", "content": "2+2?"});
    let reply =
        json!({"role": "assistant", "content": "4", "reasoning_content": "add", "refusal": null});
    let echoed = json!({"role": "assistant", "content": "4"});
    vec![
        // response: <think> add </think> 4 <eos>
        call(0, &[1, 2], &[40, 41, 42, 4, 99]).chat(json!([question]), reply),
        call(1, &[1, 2, 4, 99, 3], &[5, 99]).chat(
            json!([question, echoed, {"role": "user", "content": "and 3+2?"}]),
            json!({"role": "assistant", "content": "5"}),
        ),
    ]
}

#[test]
fn a_re_rendered_previous_turn_is_a_template_break_without_a_tokenizer() {
    let samples = merge(reasoning_stripped_calls());
    assert_eq!(samples.len(), 2);
    assert_eq!(break_kind(&samples[0]), None);
    assert_eq!(break_kind(&samples[1]), Some(BreakKind::Template));
    let detail = &samples[1]
        .break_before
        .as_ref()
        .map(|b| b.detail.clone())
        .unwrap_or_default();
    assert!(
        detail.contains("(response position 0): previous 40, next 4"),
        "{detail}"
    );
}

#[test]
fn a_re_rendered_previous_turn_is_a_template_break_with_a_tokenizer() {
    testing::set_tokenizer(FakeTokenizer::from_pieces(&[
        (1, "<user>"),
        (2, "2+2?"),
        (3, "<user>and 3+2?"),
        (4, "4"),
        (5, "5"),
        (40, "<think>"),
        (41, "add"),
        (42, "</think>"),
        (99, "<eos>"),
    ]));
    let samples = merge(reasoning_stripped_calls());
    let chain_break = samples[1].break_before.as_ref().expect("a break");
    assert_eq!(chain_break.kind, BreakKind::Template);
    assert!(
        !chain_break.detail.contains("no tokenizer"),
        "{}",
        chain_break.detail
    );
}

#[test]
fn a_summarised_history_is_a_summary_break() {
    let reply = json!({"role": "assistant", "content": "looked at a.py"});
    let samples = merge(vec![
        call(0, &[1, 2, 3], &[10]).chat(json!([{"role": "user", "content": "fix a.py"}]), reply.clone()),
        call(1, &[1, 2, 3, 10, 4], &[11]).chat(
            json!([{"role": "user", "content": "fix a.py"}, reply, {"role": "user", "content": "ok"}]),
            json!({"role": "assistant", "content": "done"}),
        ),
        // The harness replaced the history with a summary.
        call(2, &[1, 7, 8], &[12]).chat(
            json!([{"role": "user", "content": "summary: fixing a.py, looked at it"}]),
            json!({"role": "assistant", "content": "continuing"}),
        ),
    ]);
    assert_eq!(samples.len(), 2);
    assert_eq!(samples[0].source_calls, [0, 1]);
    assert_eq!(samples[1].source_calls, [2]);
    let chain_break = samples[1].break_before.as_ref().expect("a break");
    assert_eq!(chain_break.kind, BreakKind::Summary);
    assert_eq!(chain_break.call_index, 2);
    assert!(
        chain_break.detail.starts_with("history edited: message 0"),
        "{}",
        chain_break.detail
    );
    assert!(
        chain_break.detail.contains("(prompt position 1)"),
        "{}",
        chain_break.detail
    );
}

#[test]
fn without_messages_a_changed_earlier_prompt_is_an_other_break() {
    let samples = merge(vec![
        call(0, &[1, 2, 3], &[10]),
        call(1, &[1, 9, 3, 10, 4], &[11]),
    ]);
    assert_eq!(break_kind(&samples[1]), Some(BreakKind::Other));
}

#[test]
fn completions_text_that_continues_is_a_retokenize_break_even_without_a_tokenizer() {
    let samples = merge(vec![
        call(0, &[1, 2], &[10, 11]).completion("Q: hi\nA:", " hello"),
        call(1, &[1, 2, 12, 5], &[13]).completion("Q: hi\nA: hello\nQ: more\nA:", " sure"),
        call(2, &[1, 6], &[14]).completion("Q: other\nA:", " no"),
    ]);
    assert_eq!(samples.len(), 3);
    assert_eq!(break_kind(&samples[1]), Some(BreakKind::Retokenize));
    assert_eq!(break_kind(&samples[2]), Some(BreakKind::Other));
}

#[test]
fn interleaved_sub_agents_keep_their_own_chains() {
    let calls = vec![
        call(0, &[1, 2], &[3]).agent("main"),
        call(1, &[50, 51], &[52]).agent("searcher"),
        call(2, &[1, 2, 3, 4], &[5]).agent("main"),
        call(3, &[50, 51, 52, 53], &[54]).agent("searcher"),
        call(4, &[90], &[91]),
        call(5, &[1, 2, 3, 4, 5, 6], &[7]).agent("main"),
    ];
    let samples = merge(calls.clone());
    let chains: Vec<(Option<&str>, &[u32])> = samples
        .iter()
        .map(|s| (s.agent.as_deref(), s.source_calls.as_slice()))
        .collect();
    assert_eq!(
        chains,
        [
            (Some("main"), &[0, 2, 5][..]),
            (Some("searcher"), &[1, 3][..]),
            (None, &[4][..])
        ]
    );
    assert!(samples.iter().all(|s| s.break_before.is_none()));
    assert_eq!(samples[0].response_ids, [3, 4, 5, 6, 7]);
    assert_eq!(samples[0].trainable, [span(0, 1), span(2, 3), span(4, 5)]);
    assert_eq!(samples[1].response_ids, [52, 53, 54]);

    // One chain for everyone: every switch of agent breaks it.
    let options = MergeOptions {
        chain_by_agent: false,
        ..MergeOptions::default()
    };
    let single = merge_chains(&rollout(calls), &options);
    assert_eq!(single.len(), 6);
    assert!(
        single[1..]
            .iter()
            .all(|s| break_kind(s) == Some(BreakKind::Other))
    );
}

#[test]
fn calls_without_response_tokens_are_skipped_without_breaking_the_chain() {
    let samples = merge(vec![
        call(0, &[1], &[2]),
        call(1, &[1, 2, 3], &[]), // failed upstream: nothing sampled
        call(2, &[1, 2, 3], &[4]),
    ]);
    assert_eq!(samples.len(), 1);
    assert_eq!(samples[0].source_calls, [0, 2]);
    assert_eq!(samples[0].response_ids, [2, 3, 4]);
    assert_eq!(samples[0].trainable, [span(0, 1), span(2, 3)]);
}

#[test]
fn with_a_tokenizer_a_changed_earlier_prompt_is_an_other_break() {
    testing::set_tokenizer(FakeTokenizer::from_pieces(&[
        (1, "a"),
        (2, "b"),
        (3, "c"),
        (9, "z"),
    ]));
    let samples = merge(vec![call(0, &[1, 2], &[3]), call(1, &[1, 9, 3], &[2])]);
    let chain_break = samples[1].break_before.as_ref().expect("a break");
    assert_eq!(chain_break.kind, BreakKind::Other);
    assert_eq!(
        chain_break.detail,
        "the earlier prompt changed; ids first differ at 1 (prompt position 1): previous 2, next 9"
    );
}

#[test]
fn merge_chains_with_uses_the_given_classifier() {
    let calls = vec![
        call(0, &[1], &[2]),
        call(1, &[1, 2, 3], &[4]),
        call(2, &[7], &[8]),
    ];
    let samples =
        agl_plugin::merge_chains_with(&rollout(calls), &MergeOptions::default(), |prev, next| {
            agl_plugin::ChainBreak {
                kind: BreakKind::Template,
                call_index: next.index,
                detail: format!("custom after call {}", prev.index),
            }
        });
    let calls: Vec<&[u32]> = samples.iter().map(|s| s.source_calls.as_slice()).collect();
    assert_eq!(calls, [&[0, 1][..], &[2][..]]);
    let b = samples[1].break_before.as_ref().expect("a break");
    assert_eq!((b.kind, b.call_index), (BreakKind::Template, 2));
    assert_eq!(b.detail, "custom after call 1");
}

fn system(text: &str) -> serde_json::Value {
    json!({"role": "system", "content": text})
}

fn user(text: &str) -> serde_json::Value {
    json!({"role": "user", "content": text})
}

fn assistant(text: &str) -> serde_json::Value {
    json!({"role": "assistant", "content": text})
}

/// A main agent (calls 0, 1, 4) and a sub-agent it started (calls 2, 3),
/// with no `x-agl-agent` tags: only the gateway's links tell them apart.
fn main_and_sub_agent(linked: bool) -> Vec<agl_plugin::testing::TestCall> {
    let main = [system("main"), user("fix a.py")];
    let sub = [system("explorer"), user("find a.py")];
    let mut calls = vec![
        call(0, &[1, 2], &[10]).chat(json!(main), assistant("spawn")),
        call(1, &[1, 2, 10, 3], &[11]).chat(
            json!([main[0], main[1], assistant("spawn"), user("r1")]),
            assistant("wait"),
        ),
        call(2, &[5, 6], &[20]).chat(json!(sub), assistant("ls")),
        call(3, &[5, 6, 20, 7], &[21]).chat(
            json!([sub[0], sub[1], assistant("ls"), user("a.py")]),
            assistant("found"),
        ),
        call(4, &[1, 2, 10, 3, 11, 4], &[12]).chat(
            json!([
                main[0],
                main[1],
                assistant("spawn"),
                user("r1"),
                assistant("wait"),
                user("found")
            ]),
            assistant("done"),
        ),
    ];
    if linked {
        calls[1] = calls[1].clone().continues(0);
        calls[3] = calls[3].clone().continues(2);
        calls[4] = calls[4].clone().continues(1);
    }
    calls
}

#[test]
fn recorded_links_bring_a_call_back_to_its_chain_after_a_sub_agent() {
    let samples = merge(main_and_sub_agent(true));
    let chains: Vec<&[u32]> = samples.iter().map(|s| s.source_calls.as_slice()).collect();
    assert_eq!(chains, [&[0, 1, 4][..], &[2, 3][..]]);
    assert_eq!(samples[0].response_ids, [10, 3, 11, 4, 12]);
    assert_eq!(samples[0].trainable, [span(0, 1), span(2, 3), span(4, 5)]);
    let b = samples[1].break_before.as_ref().expect("a break");
    assert_eq!(
        (b.kind, b.call_index),
        (BreakKind::SubAgent, 2),
        "{}",
        b.detail
    );
    assert_eq!(samples[0].break_before, None);

    // Without the links the main agent's return is tested against the
    // sub-agent's chain (the latest one) and breaks again.
    let samples = merge(main_and_sub_agent(false));
    let chains: Vec<&[u32]> = samples.iter().map(|s| s.source_calls.as_slice()).collect();
    assert_eq!(chains, [&[0, 1][..], &[2, 3][..], &[4][..]]);
    assert_eq!(break_kind(&samples[2]), Some(BreakKind::SubAgent));
}

#[test]
fn a_summary_that_keeps_the_system_prompt_is_a_summary_break_and_a_new_chain() {
    let start = [system("agent"), user("fix a.py")];
    let samples = merge(vec![
        call(0, &[1, 2], &[10]).chat(json!(start), assistant("cat a.py")),
        call(1, &[1, 2, 10, 3], &[11])
            .chat(
                json!([start[0], start[1], assistant("cat a.py"), user("x=1")]),
                assistant("edit"),
            )
            .continues(0),
        // Compaction: the turns so far become one summary message.
        call(2, &[1, 2, 8], &[12]).chat(
            json!([start[0], start[1], user("summary: read a.py, edited it")]),
            assistant("test"),
        ),
        call(3, &[1, 2, 8, 12, 4], &[13])
            .chat(
                json!([
                    start[0],
                    start[1],
                    user("summary: read a.py, edited it"),
                    assistant("test"),
                    user("ok")
                ]),
                assistant("done"),
            )
            .continues(2),
    ]);
    let chains: Vec<&[u32]> = samples.iter().map(|s| s.source_calls.as_slice()).collect();
    assert_eq!(chains, [&[0, 1][..], &[2, 3][..]]);
    let b = samples[1].break_before.as_ref().expect("a break");
    assert_eq!(
        (b.kind, b.call_index),
        (BreakKind::Summary, 2),
        "{}",
        b.detail
    );
}

#[test]
fn dropped_turns_without_new_text_are_an_other_break() {
    let start = [system("agent"), user("task")];
    let samples = merge(vec![
        call(0, &[1, 2], &[10]).chat(json!(start), assistant("a")),
        call(1, &[1, 2, 10, 3], &[11]).chat(
            json!([start[0], start[1], assistant("a"), user("o1")]),
            assistant("b"),
        ),
        // Truncated: the first exchange dropped, nothing new added.
        call(2, &[1, 2, 11], &[12]).chat(json!([start[0], start[1]]), assistant("c")),
    ]);
    assert_eq!(samples.len(), 2);
    assert_eq!(break_kind(&samples[1]), Some(BreakKind::Other));
}

/// A request with three choices after one plain call; the harness keeps
/// choice `kept` and goes on from it.
fn three_choices(kept: usize, linked: bool) -> Vec<agl_plugin::testing::TestCall> {
    let replies: [&[u32]; 3] = [&[30, 31], &[40], &[50, 51, 52]];
    let mut calls = vec![call(0, &[1, 2], &[10])];
    for (i, reply) in replies.iter().enumerate() {
        let mut c = call(1 + i as u32, &[1, 2, 10, 20], reply).choice(i as u32, 3);
        if linked {
            c = c.continues(0);
        }
        calls.push(c);
    }
    let mut prompt = vec![1, 2, 10, 20];
    prompt.extend_from_slice(replies[kept]);
    prompt.push(21);
    let mut next = call(4, &prompt, &[60]);
    if linked {
        next = next.continues(1 + kept as u32);
    }
    calls.push(next);
    calls
}

#[test]
fn each_choice_is_a_sample_and_the_kept_one_goes_on() {
    for linked in [false, true] {
        for kept in 0..3 {
            let why = format!("kept {kept}, linked {linked}");
            let samples = merge(three_choices(kept, linked));
            assert_eq!(samples.len(), 3, "{why}");
            // Choice 0 joins the first call's chain; the others fork off
            // with their own prompt (nothing trained twice), no break.
            assert_eq!(samples[0].source_calls[..2], [0, 1], "{why}");
            assert_eq!(samples[0].prompt_ids, [1, 2], "{why}");
            for (s, call) in samples[1..].iter().zip([2, 3]) {
                assert_eq!(s.source_calls[0], call, "{why}");
                assert_eq!(s.prompt_ids, [1, 2, 10, 20], "{why}");
            }
            assert!(samples.iter().all(|s| s.break_before.is_none()), "{why}");
            // The next call extends the chain of the choice it kept.
            let with_next = samples
                .iter()
                .position(|s| s.source_calls.contains(&4))
                .expect("call 4 is merged");
            assert_eq!(with_next, kept, "{why}");
            let trained: usize = samples
                .iter()
                .flat_map(|s| &s.trainable)
                .map(|t| (t.end - t.start) as usize)
                .sum();
            assert_eq!(
                trained,
                1 + 2 + 1 + 3 + 1,
                "{why}: every sampled token once"
            );
        }
    }
}

#[test]
fn a_call_that_continues_no_choice_breaks_against_the_closest() {
    let mut calls = three_choices(2, false);
    // The harness edited the kept reply [50, 51, 52] to [50, 51, 99].
    calls[4].set_prompt_ids(&[1, 2, 10, 20, 50, 51, 99, 21]);
    let samples = merge(calls);
    assert_eq!(samples.len(), 4);
    let b = samples[3].break_before.as_ref().expect("a break");
    assert_eq!(b.call_index, 4);
    assert_eq!(b.kind, BreakKind::Template, "{}", b.detail);
    // Compared with the choice it shares the most with (choice 2).
    assert!(b.detail.contains("previous 52, next 99"), "{}", b.detail);
}
