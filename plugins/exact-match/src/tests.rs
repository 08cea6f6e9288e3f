use agl_plugin::testing::{self, CallExt, call, rollout};
use agl_plugin::{Rollout, StatefulReward};
use serde_json::json;

use crate::ExactMatch;

/// Scores `r` with an instance built from the current test config.
fn score(r: Rollout) -> Result<Option<f64>, String> {
    ExactMatch::new()?.reward(r)
}

/// A two-call rollout whose final reply is `final_text`.
fn answered(input: serde_json::Value, final_text: &str) -> Rollout {
    let reply = |text: &str| json!({"role": "assistant", "content": text});
    let mut r = rollout(vec![
        call(0, &[1], &[2]).chat(json!([]), reply("let me think: 41?")),
        call(1, &[1, 2, 3], &[4]).chat(json!([]), reply(final_text)),
    ]);
    r.input_json = input.to_string();
    r
}

#[test]
fn whole_text_matches_trimmed_and_case_insensitively() {
    assert_eq!(
        score(answered(json!({"answer": "Paris"}), "  paris\n")),
        Ok(Some(1.0))
    );
    assert_eq!(
        score(answered(json!({"answer": "Paris"}), "Lyon")),
        Ok(Some(0.0))
    );
    assert_eq!(
        score(answered(json!({"answer": "Paris"}), "The answer is Paris")),
        Ok(Some(0.0)),
        "without a pattern the whole text must match"
    );
}

#[test]
fn case_sensitive_config_is_honoured() {
    testing::set_config_json(r#"{"case_sensitive": true}"#);
    assert_eq!(
        score(answered(json!({"answer": "Paris"}), "paris")),
        Ok(Some(0.0))
    );
    assert_eq!(
        score(answered(json!({"answer": "Paris"}), "Paris")),
        Ok(Some(1.0))
    );
}

#[test]
fn pattern_extracts_the_last_match_and_numbers_compare_numerically() {
    let config = json!({"pattern": r"####\s*(-?[0-9.]+)", "answer_field": "target"});
    testing::set_config_json(config.to_string());
    let text = "#### 41 was wrong, so\n#### 42.0";
    assert_eq!(score(answered(json!({"target": 42}), text)), Ok(Some(1.0)));
    assert_eq!(score(answered(json!({"target": 41}), text)), Ok(Some(0.0)));
    assert_eq!(
        score(answered(json!({"target": 42}), "42")),
        Ok(Some(0.0)),
        "no match of the pattern scores 0"
    );
}

#[test]
fn a_pattern_without_a_group_uses_the_whole_match() {
    testing::set_config_json(r#"{"pattern": "[A-Z][a-z]+$"}"#);
    assert_eq!(
        score(answered(json!({"answer": "Rome"}), "It is Rome")),
        Ok(Some(1.0))
    );
}

#[test]
fn a_rollout_without_a_final_text_scores_zero() {
    let mut r = answered(json!({"answer": "x"}), "x");
    r.calls.truncate(0);
    assert_eq!(score(r), Ok(Some(0.0)));
}

#[test]
fn a_bad_pattern_is_a_clear_error() {
    testing::set_config_json(r#"{"pattern": "(unclosed"}"#);
    let err = score(answered(json!({"answer": "x"}), "x")).unwrap_err();
    assert!(err.contains("invalid `pattern`"), "{err}");
}

#[test]
fn a_missing_answer_field_is_an_error() {
    let err = score(answered(json!({"question": "?"}), "x")).unwrap_err();
    assert!(err.contains("no `answer` field"), "{err}");
}
