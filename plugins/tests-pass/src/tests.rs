use agl_plugin::Reward;
use agl_plugin::testing::{self, call, event, rollout};
use serde_json::{Value, json};

use crate::TestsPass;

/// A rollout of `steps` model calls (plus one failed call that produced no
/// tokens) graded with `payload`.
fn graded(steps: u32, payload: Value) -> agl_plugin::Rollout {
    let mut calls: Vec<_> = (0..steps).map(|i| call(i, &[1, 2], &[3])).collect();
    calls.push(call(steps, &[1, 2], &[]));
    let mut r = rollout(calls);
    r.events = vec![
        event("stdout", json!({"line": "running tests"})),
        event("reward", payload),
    ];
    r
}

fn grade(value: f64) -> Value {
    let failed: Vec<&str> = if value == 1.0 {
        vec![]
    } else {
        vec!["test_add"]
    };
    json!({"value": value, "tests": {"passed": ["test_sub"], "failed": failed},
        "exit_status": "Submitted"})
}

#[test]
fn the_grade_is_the_reward_without_shaping() {
    assert_eq!(TestsPass::reward(graded(3, grade(1.0))), Ok(Some(1.0)));
    assert_eq!(TestsPass::reward(graded(3, grade(0.0))), Ok(Some(0.0)));
    assert_eq!(TestsPass::reward(graded(1, json!(0.5))), Ok(Some(0.5)));
}

#[test]
fn the_step_penalty_counts_calls_with_tokens_on_solved_rollouts_only() {
    testing::set_config_json(r#"{"step_penalty": 0.125}"#);
    // 3 calls with tokens; the empty fourth is not a step.
    assert_eq!(TestsPass::reward(graded(3, grade(1.0))), Ok(Some(0.625)));
    assert_eq!(TestsPass::reward(graded(5, grade(1.0))), Ok(Some(0.375)));
    assert_eq!(TestsPass::reward(graded(3, grade(0.0))), Ok(Some(0.0)));
    assert_eq!(TestsPass::reward(graded(3, grade(0.5))), Ok(Some(0.5)));
}

#[test]
fn min_reward_floors_the_shaped_reward() {
    testing::set_config_json(r#"{"step_penalty": 0.125, "min_reward": 0.5}"#);
    assert_eq!(TestsPass::reward(graded(2, grade(1.0))), Ok(Some(0.75)));
    assert_eq!(TestsPass::reward(graded(30, grade(1.0))), Ok(Some(0.5)));
    // The floor only bounds the penalty; it does not lift a failure.
    assert_eq!(TestsPass::reward(graded(30, grade(0.0))), Ok(Some(0.0)));
}

#[test]
fn no_grade_is_no_reward_and_a_grade_without_value_is_an_error() {
    let mut r = graded(2, grade(1.0));
    r.events.pop();
    assert_eq!(TestsPass::reward(r), Ok(None));
    let err = TestsPass::reward(graded(2, json!({"tests": {"passed": ["t"]}}))).unwrap_err();
    assert!(err.contains("no numeric value"), "{err}");
}

#[test]
fn invalid_config_is_an_error() {
    for (config, needle) in [
        (r#"{"step_penalty": -0.1}"#, "step_penalty"),
        (r#"{"min_reward": 2.0}"#, "min_reward"),
        (r#"{"step_penalti": 0.1}"#, "step_penalti"),
    ] {
        testing::set_config_json(config);
        let err = TestsPass::reward(graded(1, grade(1.0))).unwrap_err();
        assert!(err.contains(needle), "{config}: {err}");
    }
}
