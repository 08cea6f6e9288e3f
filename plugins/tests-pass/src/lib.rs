//! Reward `tests-pass`: the grade a test-running grader posted as the
//! rollout's last `reward` event (the mini-swe-agent example's grader posts
//! `{"value": 1.0, "tests": {"passed": [...], "failed": [...]},
//! "exit_status": "Submitted"}`; only `value` is required, a bare number
//! works too). No reward event: `None`, the rollout is excluded.
//!
//! Optional shaping (`[plugin.tests-pass]` in `agl.toml`), for solved
//! rollouts only (`value == 1.0`), so that among solutions the shorter one
//! wins while any solution still beats a failure:
//! - `step_penalty` (default `0.0`, `>= 0`): subtracted once per model call
//!   that produced tokens;
//! - `min_reward` (default `0.0`, `<= 1.0`): the penalty never takes the
//!   reward below this floor.
//!
//! A plugin's view of a rollout carries no train/validation mode, so the
//! shaping applies to validation rollouts too.

use agl_plugin::{Rollout, log};
use serde::Deserialize;

#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Config {
    step_penalty: f64,
    min_reward: f64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            step_penalty: 0.0,
            min_reward: 0.0,
        }
    }
}

impl Config {
    fn load() -> Result<Self, String> {
        let config: Config = agl_plugin::config()?;
        if !(config.step_penalty.is_finite() && config.step_penalty >= 0.0) {
            return Err(format!(
                "invalid plugin config: step_penalty must be a finite number >= 0, got {}",
                config.step_penalty
            ));
        }
        if !(config.min_reward.is_finite() && config.min_reward <= SOLVED) {
            return Err(format!(
                "invalid plugin config: min_reward must be a finite number <= {SOLVED}, got {}",
                config.min_reward
            ));
        }
        Ok(config)
    }
}

/// The value a grader posts when every test passes.
const SOLVED: f64 = 1.0;

pub struct TestsPass;

impl agl_plugin::Reward for TestsPass {
    fn reward(rollout: Rollout) -> Result<Option<f64>, String> {
        let config = Config::load()?;
        let Some(value) = agl_plugin::last_reward(&rollout)? else {
            return Ok(None);
        };
        if value != SOLVED || config.step_penalty == 0.0 {
            return Ok(Some(value));
        }
        // Failed or cancelled calls produced nothing: not a step.
        let steps = rollout
            .calls
            .iter()
            .filter(|c| !c.response_ids.is_empty())
            .count();
        let shaped = (value - config.step_penalty * steps as f64).max(config.min_reward);
        log::debug(format!(
            "rollout {}: solved in {steps} steps, reward {shaped}",
            rollout.id
        ));
        Ok(Some(shaped))
    }
}

agl_plugin::export_reward!(TestsPass);

#[cfg(test)]
mod tests;
