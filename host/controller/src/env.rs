//! The environment every agent gets, whatever runs it.

use std::collections::BTreeMap;

use serde_json::Value;

use agl_wire::api::RolloutView;

/// An agent exiting with this code reports a system failure (e.g. the
/// engine was unreachable): the attempt is retried, never scored.
/// 75 is `EX_TEMPFAIL` from sysexits.h.
pub const SYSTEM_FAILURE_EXIT_CODE: i32 = 75;

/// `OPENAI_BASE_URL`, `OPENAI_API_KEY`, `ANTHROPIC_BASE_URL`,
/// `ANTHROPIC_AUTH_TOKEN` (sent as a Bearer token by Claude Code and the
/// anthropic SDKs), `AGL_ROLLOUT_ID`, `AGL_ATTEMPT`,
/// `AGL_EVENT_URL`, `AGL_INPUT`, then one variable per `env_map` entry
/// (`NAME = "input.a.b"`: strings as they are, other JSON as JSON text,
/// missing paths as the empty string).
pub fn agent_env(
    rollout: &RolloutView,
    input: &Value,
    env_map: &BTreeMap<String, String>,
) -> Vec<(String, String)> {
    let mut env = vec![
        ("OPENAI_BASE_URL".into(), rollout.proxy_base_url.clone()),
        ("OPENAI_API_KEY".into(), rollout.token.clone()),
        (
            "ANTHROPIC_BASE_URL".into(),
            rollout.anthropic_base_url.clone(),
        ),
        ("ANTHROPIC_AUTH_TOKEN".into(), rollout.token.clone()),
        ("AGL_ROLLOUT_ID".into(), rollout.id.clone()),
        ("AGL_ATTEMPT".into(), rollout.attempt.to_string()),
        ("AGL_EVENT_URL".into(), rollout.events_url.clone()),
        ("AGL_INPUT".into(), rollout.input.to_string()),
        (
            "AGL_SYSTEM_FAILURE_EXIT_CODE".into(),
            SYSTEM_FAILURE_EXIT_CODE.to_string(),
        ),
    ];
    for (name, path) in env_map {
        let value = lookup(input, path).map_or_else(String::new, |v| match v {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        });
        env.push((name.clone(), value));
    }
    env
}

/// A dotted path from the rollout: `input.question`, `input.items.0`.
fn lookup<'a>(input: &'a Value, path: &str) -> Option<&'a Value> {
    let mut parts = path.split('.');
    if parts.next() != Some("input") {
        return None;
    }
    parts.try_fold(input, |v, key| match v {
        Value::Array(items) => key.parse::<usize>().ok().and_then(|i| items.get(i)),
        _ => v.get(key),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use agl_wire::rollout::{Mode, RolloutStatus};
    use serde_json::json;

    #[test]
    fn mapped_fields_are_strings_or_json_text() {
        let input = json!({"question": "1+1?", "n": {"a": [3, 4]}});
        let r = RolloutView {
            id: "r1".into(),
            group_id: String::new(),
            mode: Mode::Train,
            status: RolloutStatus::Queued,
            attempt: 2,
            reason: None,
            failure: None,
            input: (&input).into(),
            config: Default::default(),
            created_ms: 0,
            updated_ms: 0,
            proxy_base_url: "http://gw/proxy/r1/2/train/openai/v1".into(),
            anthropic_base_url: "http://gw/proxy/r1/2/train/anthropic".into(),
            events_url: "http://gw/ev".into(),
            token: "tok".into(),
            calls: None,
        };
        let map = BTreeMap::from([
            ("Q".to_string(), "input.question".to_string()),
            ("N".to_string(), "input.n".to_string()),
            ("A1".to_string(), "input.n.a.1".to_string()),
            ("NONE".to_string(), "input.missing".to_string()),
        ]);
        let env: BTreeMap<_, _> = agent_env(&r, &input, &map).into_iter().collect();
        assert_eq!(env["Q"], "1+1?");
        assert_eq!(env["N"], r#"{"a":[3,4]}"#);
        assert_eq!(env["A1"], "4");
        assert_eq!(env["NONE"], "");
        assert_eq!(env["AGL_ATTEMPT"], "2");
        assert_eq!(env["OPENAI_API_KEY"], "tok");
        assert_eq!(env["ANTHROPIC_AUTH_TOKEN"], "tok");
        assert_eq!(
            env["ANTHROPIC_BASE_URL"],
            "http://gw/proxy/r1/2/train/anthropic"
        );
        assert_eq!(env["AGL_EVENT_URL"], "http://gw/ev");
    }
}
