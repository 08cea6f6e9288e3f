use agl_plugin::testing::{self, CallExt, call, rollout};
use agl_plugin::{BreakKind, SampleAdapter, Span};

use crate::Trajectory;

#[test]
fn merges_a_clean_three_call_rollout_into_one_sample() {
    let r = rollout(vec![
        call(0, &[1, 2], &[3, 4]).logprobs(&[-0.1, -0.2]),
        call(1, &[1, 2, 3, 4, 5], &[6]).logprobs(&[-0.3]),
        call(2, &[1, 2, 3, 4, 5, 6, 7, 8], &[9]).logprobs(&[-0.4]),
    ]);
    let samples = Trajectory::build_samples(r).expect("samples");
    assert_eq!(samples.len(), 1);
    let s = &samples[0];
    assert_eq!(s.prompt_ids, [1, 2]);
    assert_eq!(s.response_ids, [3, 4, 5, 6, 7, 8, 9]);
    assert_eq!(
        s.trainable,
        [
            Span { start: 0, end: 2 },
            Span { start: 3, end: 4 },
            Span { start: 6, end: 7 }
        ]
    );
    assert_eq!(s.logprobs, [-0.1, -0.2, 0.0, -0.3, 0.0, 0.0, -0.4]);
    assert_eq!(s.source_calls, [0, 1, 2]);
}

fn interleaved() -> agl_plugin::Rollout {
    rollout(vec![
        call(0, &[1], &[2]).agent("main"),
        call(1, &[50], &[51]).agent("sub"),
        call(2, &[1, 2, 3], &[4]).agent("main"),
    ])
}

#[test]
fn sub_agents_keep_their_own_chains_by_default() {
    let samples = Trajectory::build_samples(interleaved()).expect("samples");
    let calls: Vec<&[u32]> = samples.iter().map(|s| s.source_calls.as_slice()).collect();
    assert_eq!(calls, [&[0, 2][..], &[1][..]]);
    assert_eq!(samples[1].agent.as_deref(), Some("sub"));
}

#[test]
fn chain_by_agent_false_makes_one_chain() {
    testing::set_config_json(r#"{"chain_by_agent": false}"#);
    let samples = Trajectory::build_samples(interleaved()).expect("samples");
    assert_eq!(samples.len(), 3);
    let kinds: Vec<Option<BreakKind>> = samples
        .iter()
        .map(|s| s.break_before.as_ref().map(|b| b.kind))
        .collect();
    assert_eq!(
        kinds,
        [None, Some(BreakKind::Other), Some(BreakKind::Other)]
    );
}

#[test]
fn an_unknown_config_key_is_an_error() {
    testing::set_config_json(r#"{"chain_by_agents": false}"#);
    let err = Trajectory::build_samples(interleaved()).unwrap_err();
    assert!(err.contains("chain_by_agents"), "{err}");
}
