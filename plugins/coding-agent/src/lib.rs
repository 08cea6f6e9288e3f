//! Sample adapter `coding-agent` for the coding-agent CLIs agl trains:
//! Claude Code (`claude -p`, 2.1.x, the gateway's Messages API) and Codex
//! (`codex exec`, 0.169, the Responses API, resending its whole history
//! each turn). The gateway links each call to the one it continued, so the
//! main agent and every sub-agent it starts (a conversation of its own: its
//! own system prompt or instructions, its own first call) are each one
//! chain, all credited to the rollout; a chain grows by exact token prefix.
//! A call that starts a chain is classified against the agent chain it
//! follows: the CLI's context compaction (a fresh history opening with its
//! summary text) is a `summary` break, another system prompt or tool list a
//! `sub-agent` break, anything else as the host's rules say (the host
//! merges: [`agl_plugin::merge_chains`] with the harness's compaction text).
//!
//! Config (`[plugin.coding-agent]` in `agl.toml`):
//! - `harness` (`"claude-code"` or `"codex"`; unset: either): whose
//!   compaction text marks a summary;
//! - `chain_by_agent` (default `true`): calls tagged `x-agl-agent` keep
//!   their own chains (neither CLI sends such a tag by itself).
//!
//! Calls with no response tokens (failed or cancelled upstream) are
//! skipped: they train nothing and would only break the chain.

use agl_plugin::{MergeOptions, Rollout, Sample, merge_chains};

/// The text Claude Code 2.1.328 opens a compacted conversation with
/// (read from the pinned binary).
pub const CLAUDE_CODE_COMPACTION: &str =
    "This session is being continued from a previous conversation that ran out of context.";

/// The text Codex 0.169.0 opens its compaction summary with (read from the
/// pinned binary).
pub const CODEX_COMPACTION: &str =
    "Another language model started to solve this problem and produced a summary";

/// The CLI a rollout comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Harness {
    ClaudeCode,
    Codex,
}

#[derive(Debug, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Config {
    harness: Option<Harness>,
    chain_by_agent: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            harness: None,
            chain_by_agent: true,
        }
    }
}

/// The compaction texts that mark a summary for `harness` (every CLI's
/// when it is not said).
pub fn compaction_markers(harness: Option<Harness>) -> &'static [&'static str] {
    match harness {
        Some(Harness::ClaudeCode) => &[CLAUDE_CODE_COMPACTION],
        Some(Harness::Codex) => &[CODEX_COMPACTION],
        None => &[CLAUDE_CODE_COMPACTION, CODEX_COMPACTION],
    }
}

pub struct CodingAgent;

impl agl_plugin::SampleAdapter for CodingAgent {
    fn build_samples(rollout: Rollout) -> Result<Vec<Sample>, String> {
        let config: Config = agl_plugin::config()?;
        let options = MergeOptions {
            chain_by_agent: config.chain_by_agent,
            summary_markers: compaction_markers(config.harness)
                .iter()
                .map(|m| m.to_string())
                .collect(),
            ..MergeOptions::default()
        };
        Ok(merge_chains(&rollout, &options))
    }
}

agl_plugin::export_adapter!(CodingAgent);

#[cfg(test)]
mod tests {
    mod claude_code;
    mod codex;

    use super::*;

    #[test]
    fn the_harness_picks_whose_compaction_text_is_a_summary() {
        let config = |json: &str| serde_json::from_str::<Config>(json);
        let harness = |json: &str| config(json).unwrap().harness;
        assert_eq!(harness("{}"), None);
        assert_eq!(harness(r#"{"harness": "codex"}"#), Some(Harness::Codex));
        assert_eq!(compaction_markers(Some(Harness::Codex)), [CODEX_COMPACTION]);
        assert_eq!(
            compaction_markers(Some(Harness::ClaudeCode)),
            [CLAUDE_CODE_COMPACTION]
        );
        assert_eq!(compaction_markers(None).len(), 2);
        assert!(config(r#"{"harness": "cursor"}"#).is_err());
        assert!(
            config(r#"{"harnes": "codex"}"#).is_err(),
            "a typo is an error"
        );
    }
}
