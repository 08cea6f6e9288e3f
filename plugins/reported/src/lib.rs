//! Built-in reward `reported`: the harness's own reward, i.e. the last
//! `reward` event it posted (payload `{"value": <number>}` or a bare
//! number). No reward event: `None` (the rollout is excluded, not scored
//! 0). A last reward event without a number is an error. No config.

use agl_plugin::Rollout;

pub struct Reported;

impl agl_plugin::Reward for Reported {
    fn reward(rollout: Rollout) -> Result<Option<f64>, String> {
        agl_plugin::last_reward(&rollout)
    }
}

agl_plugin::export_reward!(Reported);

#[cfg(test)]
mod tests {
    use agl_plugin::Reward;
    use agl_plugin::testing::{event, rollout};
    use serde_json::json;

    use super::Reported;

    #[test]
    fn the_last_reward_event_wins() {
        let mut r = rollout(vec![]);
        r.events = vec![
            event("reward", json!({"value": 0.5})),
            event("reward", json!({"value": -1})),
        ];
        assert_eq!(Reported::reward(r), Ok(Some(-1.0)));
    }

    #[test]
    fn a_bare_number_payload_is_accepted() {
        let mut r = rollout(vec![]);
        r.events = vec![
            event("reward", json!(0.75)),
            event("stdout", json!({"line": "done"})),
        ];
        assert_eq!(Reported::reward(r), Ok(Some(0.75)));
    }

    #[test]
    fn no_reward_event_is_no_reward() {
        let mut r = rollout(vec![]);
        r.events = vec![event("stdout", json!({"value": 1}))];
        assert_eq!(Reported::reward(r), Ok(None));
    }

    #[test]
    fn a_reward_event_without_a_number_is_an_error() {
        let mut r = rollout(vec![]);
        r.events = vec![event("reward", json!({"score": 1}))];
        assert!(Reported::reward(r).is_err());
    }
}
