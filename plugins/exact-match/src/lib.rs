//! Built-in reward `exact-match`: 1.0 when the final answer (the last
//! call's assistant text) equals the rollout input's answer, else 0.0.
//!
//! Config (`[plugin.exact-match]` in `agl.toml`):
//! - `pattern` (optional regex): extracts the answer from the text; its
//!   first capture group (or the whole match without one) of the LAST
//!   match counts, as a final answer usually comes last. No match scores
//!   0.0. Default: the whole text.
//! - `answer_field` (default `"answer"`): the input field holding the
//!   expected answer, a string or a number.
//! - `case_sensitive` (default `false`).
//!
//! Both sides are trimmed; answers that both parse as numbers also match
//! when numerically equal (`42` and `42.0`). A rollout without a final
//! text scores 0.0; an input without the answer field, or a bad pattern,
//! is an error.

mod answer;

use agl_plugin::Rollout;
use serde::Deserialize;

use crate::answer::{Extractor, expected_answer, matches};

#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Config {
    pattern: Option<String>,
    answer_field: String,
    case_sensitive: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            pattern: None,
            answer_field: "answer".to_owned(),
            case_sensitive: false,
        }
    }
}

/// The config and its compiled pattern, built once per plugin instance.
pub struct ExactMatch {
    config: Config,
    extractor: Extractor,
}

impl agl_plugin::StatefulReward for ExactMatch {
    fn new() -> Result<Self, String> {
        let config: Config = agl_plugin::config()?;
        let extractor = Extractor::new(config.pattern.as_deref())?;
        Ok(ExactMatch { config, extractor })
    }

    fn reward(&self, rollout: Rollout) -> Result<Option<f64>, String> {
        let input: serde_json::Value = agl_plugin::input(&rollout)?;
        let expected = expected_answer(&input, &self.config.answer_field)?;
        let text = rollout.calls.last().and_then(agl_plugin::assistant_text);
        let answer = text.as_deref().and_then(|t| self.extractor.extract(t));
        let hit = answer.is_some_and(|a| matches(a, &expected, self.config.case_sensitive));
        Ok(Some(if hit { 1.0 } else { 0.0 }))
    }
}

agl_plugin::export_stateful_reward!(ExactMatch);

#[cfg(test)]
mod tests;
