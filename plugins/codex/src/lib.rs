//! Sample adapter `codex` for Codex (`codex exec`, 0.169) calling the
//! gateway's Responses API (Codex resends its whole history each turn,
//! `store: false`). The gateway links each call to the one it continued,
//! so the main agent and every sub-agent it spawns are each one chain, all
//! credited to the rollout; a chain grows by exact token prefix. A call
//! that starts a chain is classified against the agent chain it follows:
//! Codex's context compaction (a fresh history holding its summary text) is
//! a `summary` break, other instructions or tools a `sub-agent` break,
//! anything else as [`agl_plugin::classify_break`] says.
//!
//! Config (`[plugin.codex]` in `agl.toml`):
//! - `chain_by_agent` (default `true`): calls tagged `x-agl-agent` keep
//!   their own chains (Codex sends no such tag by itself).
//!
//! Calls with no response tokens (failed or cancelled upstream) are
//! skipped: they train nothing and would only break the chain.

use agl_plugin::breaks::marked_summary;
use agl_plugin::{ChainBreak, ModelCall, Rollout, Sample, classify_break};

/// The text Codex 0.169.0 opens its compaction summary with (read from the
/// pinned binary).
pub const COMPACTION_MARKERS: [&str; 1] =
    ["Another language model started to solve this problem and produced a summary"];

/// Why `next` did not continue the chain `prev` ended.
pub fn classify(prev: &ModelCall, next: &ModelCall) -> ChainBreak {
    marked_summary(prev, next, &COMPACTION_MARKERS).unwrap_or_else(|| classify_break(prev, next))
}

pub struct Codex;

impl agl_plugin::SampleAdapter for Codex {
    fn build_samples(rollout: Rollout) -> Result<Vec<Sample>, String> {
        agl_plugin::merge_configured(&rollout, classify)
    }
}

agl_plugin::export_adapter!(Codex);

#[cfg(test)]
mod tests;
