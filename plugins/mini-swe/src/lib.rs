//! Sample adapter `mini-swe` for mini-swe-agent (2.x, tool-calling or
//! text-based). Calls merge like `trajectory` (a prompt that starts with
//! the chain's prompt + response is appended: the new prompt tokens masked,
//! the response trained); a prompt that does not starts a new sample whose
//! `break_before` names the mini-swe-agent event behind it (see [`breaks`]).
//!
//! Config (`[plugin.mini-swe]` in `agl.toml`):
//! - `chain_by_agent` (default `true`): one chain per `x-agl-agent` tag.
//! - `extra_format_error_markers` (default `[]`): more texts that mark a
//!   user message as a format-error message, for a custom
//!   `format_error_template` (the built-in ones: [`breaks::FORMAT_ERROR_MARKERS`]).
//!
//! Calls with no response tokens (failed or cancelled upstream) are
//! skipped: they train nothing and would only break the chain.

use agl_plugin::{MergeOptions, Rollout, Sample};
use serde::Deserialize;

pub mod breaks;

#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Config {
    chain_by_agent: bool,
    extra_format_error_markers: Vec<String>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            chain_by_agent: true,
            extra_format_error_markers: Vec::new(),
        }
    }
}

/// The merge options and format-error markers, built once per plugin
/// instance from its config.
pub struct MiniSwe {
    options: MergeOptions,
    markers: breaks::Markers,
}

impl agl_plugin::StatefulAdapter for MiniSwe {
    fn new() -> Result<Self, String> {
        let config: Config = agl_plugin::config()?;
        if let Some(empty) = config
            .extra_format_error_markers
            .iter()
            .position(String::is_empty)
        {
            // An empty marker would match every user message.
            return Err(format!(
                "invalid plugin config: extra_format_error_markers[{empty}] is empty"
            ));
        }
        Ok(MiniSwe {
            options: MergeOptions {
                chain_by_agent: config.chain_by_agent,
                ..MergeOptions::default()
            },
            markers: breaks::Markers::new(&config.extra_format_error_markers),
        })
    }

    fn build_samples(&self, rollout: Rollout) -> Result<Vec<Sample>, String> {
        Ok(agl_plugin::merge_chains_with(
            &rollout,
            &self.options,
            |prev, next| breaks::classify(prev, next, &self.markers),
        ))
    }
}

agl_plugin::export_stateful_adapter!(MiniSwe);

#[cfg(test)]
mod tests;
