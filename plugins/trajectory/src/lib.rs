//! Built-in sample adapter `trajectory`: merges each agent's calls into as
//! few samples as exact token prefixes allow (see
//! [`agl_plugin::merge_chains`]); a prompt that does not continue its chain
//! starts a new sample whose `break_before` says why.
//!
//! Config (`[plugin.trajectory]` in `agl.toml`):
//! - `chain_by_agent` (default `true`): one chain per `x-agl-agent` tag, so
//!   interleaved sub-agents keep their own samples.
//!
//! Calls with no response tokens (failed or cancelled upstream) are
//! skipped: they train nothing and would only break the chain.

use agl_plugin::{Rollout, Sample};

pub struct Trajectory;

impl agl_plugin::SampleAdapter for Trajectory {
    fn build_samples(rollout: Rollout) -> Result<Vec<Sample>, String> {
        agl_plugin::merge_configured(&rollout)
    }
}

agl_plugin::export_adapter!(Trajectory);

#[cfg(test)]
mod tests;
