//! JSON helpers, config and the import stand-ins, natively.

use agl_plugin::testing::{self, CallExt, call, event, rollout, served};
use agl_plugin::{ApiKind, assistant_text, last_reward, request_messages, tag};
use serde::Deserialize;
use serde_json::json;

#[test]
fn assistant_text_reads_each_api_shape() {
    let chat = call(0, &[1], &[2]).chat(
        json!([]),
        json!({"role": "assistant", "content": "forty-two"}),
    );
    assert_eq!(assistant_text(&served(chat)).as_deref(), Some("forty-two"));

    let completion = call(0, &[1], &[2]).completion("Q:", " 42");
    assert_eq!(assistant_text(&served(completion)).as_deref(), Some(" 42"));

    let mut anthropic = call(0, &[1], &[2]);
    anthropic.api = ApiKind::AnthropicMessages;
    anthropic.response_json = json!({"content": [
        {"type": "thinking", "thinking": "hmm"}, {"type": "text", "text": "a"}, {"type": "text", "text": "b"}]})
    .to_string();
    assert_eq!(assistant_text(&served(anthropic)).as_deref(), Some("ab"));

    let mut responses = call(0, &[1], &[2]);
    responses.api = ApiKind::Responses;
    responses.response_json = json!({"output": [
        {"type": "reasoning", "summary": []},
        {"type": "message", "content": [{"type": "output_text", "text": "yes"}]}]})
    .to_string();
    assert_eq!(assistant_text(&served(responses)).as_deref(), Some("yes"));

    let tool_only =
        call(0, &[1], &[2]).chat(json!([]), json!({"role": "assistant", "content": null}));
    assert_eq!(assistant_text(&served(tool_only)), None);
}

#[test]
fn request_messages_prepends_the_anthropic_system_prompt() {
    let mut c = call(0, &[1], &[2]);
    c.api = ApiKind::AnthropicMessages;
    c.request_json =
        json!({"system": "be brief", "messages": [{"role": "user", "content": "hi"}]}).to_string();
    let messages = request_messages(&served(c)).expect("messages");
    assert_eq!(
        messages,
        [
            json!({"role": "system", "content": "be brief"}),
            json!({"role": "user", "content": "hi"})
        ]
    );
    assert_eq!(
        request_messages(&served(call(0, &[1], &[2]).completion("p", "t"))),
        None
    );
}

#[test]
fn a_rollout_hands_over_what_each_prompt_adds_and_serves_the_rest() {
    let r = rollout(vec![
        call(0, &[1, 2], &[3]).chat(json!([{"role": "user", "content": "a"}]), json!({})),
        call(1, &[1, 2, 3, 4], &[5]),
        // Re-rendered: shares [1, 2] only.
        call(2, &[1, 2, 9, 4, 5, 6], &[7]),
        call(3, &[8], &[9]),
    ]);
    let prompts: Vec<_> = r
        .calls
        .iter()
        .map(|c| (c.prompt.extends, c.prompt.shared, c.prompt.tail.clone()))
        .collect();
    assert_eq!(
        prompts,
        [
            (None, 0, vec![1, 2]),
            (Some(0), 3, vec![4]),
            (Some(1), 2, vec![9, 4, 5, 6]),
            (None, 0, vec![8]),
        ]
    );
    assert_eq!(
        agl_plugin::prompt_ids(&r.calls[2]).into_owned(),
        [1, 2, 9, 4, 5, 6]
    );
    assert_eq!(agl_plugin::prompt_len(&r.calls[1]), 4);
    let request = agl_plugin::request_json(&r.calls[0]).expect("served");
    assert!(request.contains("\"content\":\"a\""), "{request}");
    // A call of no rollout under way: a clear error.
    let stray = call(7, &[1], &[2]);
    let err = agl_plugin::response_json(&stray).unwrap_err();
    assert!(err.contains("call 7: the host has no response"), "{err}");
}

#[test]
fn tags_are_case_insensitive() {
    let c = call(0, &[1], &[2]).tag("x-agl-Agent", "main");
    assert_eq!(tag(&c, "X-AGL-AGENT"), Some("main"));
    assert_eq!(agl_plugin::agent(&c), Some("main"));
    assert_eq!(tag(&c, "x-agl-other"), None);
}

#[test]
fn last_reward_takes_the_last_reward_event() {
    let mut r = rollout(vec![]);
    assert_eq!(last_reward(&r), Ok(None));
    r.events = vec![
        event("reward", json!({"value": 0.25})),
        event("log", json!({"line": "x"})),
        event("reward", json!(1)),
    ];
    assert_eq!(last_reward(&r), Ok(Some(1.0)));
    r.events.push(event("reward", json!({"value": "high"})));
    assert!(last_reward(&r).is_err());
}

#[derive(Debug, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
struct Config {
    depth: u32,
}

impl Default for Config {
    fn default() -> Self {
        Config { depth: 3 }
    }
}

#[test]
fn config_defaults_parses_and_rejects_typos() {
    assert_eq!(agl_plugin::config::<Config>(), Ok(Config { depth: 3 }));
    testing::set_config_json(r#"{"depth": 5}"#);
    assert_eq!(agl_plugin::config::<Config>(), Ok(Config { depth: 5 }));
    testing::set_config_json(r#"{"detph": 5}"#);
    let err = agl_plugin::config::<Config>().unwrap_err();
    assert!(err.starts_with("invalid plugin config"), "{err}");
}

#[test]
fn the_native_tokenizer_is_absent_until_a_fake_is_installed() {
    assert!(!agl_plugin::tokenizer::available());
    assert!(agl_plugin::tokenizer::decode(&[1], false).is_err());
    testing::set_tokenizer(testing::FakeTokenizer::from_pieces(&[
        (1, "ab"),
        (2, "a"),
        (3, "b"),
    ]));
    assert!(agl_plugin::tokenizer::available());
    assert_eq!(agl_plugin::tokenizer::encode("abab", false), Ok(vec![1, 1]));
    assert_eq!(
        agl_plugin::tokenizer::decode(&[2, 3], false).as_deref(),
        Ok("ab")
    );
    assert_eq!(agl_plugin::tokenizer::vocab_size(), Ok(4));
    testing::clear_tokenizer();
    assert!(!agl_plugin::tokenizer::available());
}

#[test]
fn logs_are_kept_for_tests() {
    agl_plugin::log::warn("careful");
    let logs = testing::take_logs();
    assert_eq!(logs, [(agl_plugin::log::Level::Warn, "careful".to_owned())]);
}
