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

use agl_plugin::{MergeOptions, Rollout, Sample};
use serde::Deserialize;

#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Config {
    chain_by_agent: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            chain_by_agent: true,
        }
    }
}

pub struct Trajectory;

impl agl_plugin::SampleAdapter for Trajectory {
    fn build_samples(rollout: Rollout) -> Result<Vec<Sample>, String> {
        let config: Config = agl_plugin::config()?;
        let options = MergeOptions {
            chain_by_agent: config.chain_by_agent,
            skip_empty_responses: true,
        };
        Ok(agl_plugin::merge_chains(&rollout, &options))
    }
}

agl_plugin::export_adapter!(Trajectory);

#[cfg(test)]
mod tests;
