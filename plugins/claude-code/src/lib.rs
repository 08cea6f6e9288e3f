//! Sample adapter `claude-code` for Claude Code (`claude -p`, 2.1.x) calling
//! the gateway's Messages API. The gateway links each call to the one it
//! continued, so the main agent and every sub-agent its Agent tool starts
//! (a conversation of its own: its own system prompt, its own first call)
//! are each one chain, all credited to the rollout; a chain grows by exact
//! token prefix. A call that starts a chain is classified against the
//! agent chain it follows: Claude Code's context compaction (a fresh history
//! opening with its summary text) is a `summary` break, another system
//! prompt or tool list a `sub-agent` break, anything else as
//! [`agl_plugin::classify_break`] says.
//!
//! Config (`[plugin.claude-code]` in `agl.toml`):
//! - `chain_by_agent` (default `true`): calls tagged `x-agl-agent` keep
//!   their own chains (Claude Code sends no such tag by itself).
//!
//! Calls with no response tokens (failed or cancelled upstream) are
//! skipped: they train nothing and would only break the chain.

use agl_plugin::breaks::marked_summary;
use agl_plugin::{ChainBreak, ModelCall, Rollout, Sample, classify_break};

/// The text Claude Code 2.1.328 opens a compacted conversation with
/// (read from the pinned binary).
pub const COMPACTION_MARKERS: [&str; 1] =
    ["This session is being continued from a previous conversation that ran out of context."];

/// Why `next` did not continue the chain `prev` ended.
pub fn classify(prev: &ModelCall, next: &ModelCall) -> ChainBreak {
    marked_summary(prev, next, &COMPACTION_MARKERS).unwrap_or_else(|| classify_break(prev, next))
}

pub struct ClaudeCode;

impl agl_plugin::SampleAdapter for ClaudeCode {
    fn build_samples(rollout: Rollout) -> Result<Vec<Sample>, String> {
        agl_plugin::merge_configured(&rollout, classify)
    }
}

agl_plugin::export_adapter!(ClaudeCode);

#[cfg(test)]
mod tests;
