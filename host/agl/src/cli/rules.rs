//! `agl plugin rules` (hidden): the host's sample rules
//! (`agl:adapter/samples`) over one rollout read as JSON from stdin, for
//! the Python SDK's native stand-in of that import (`agl_plugin.testing`):
//! a Python plugin's own tests merge by the rules the host runs it under.
//!
//! stdin: `{"rollout": <a rollout JSONL row>, "merge": {"chain_by_agent",
//! "skip_empty_responses", "summary_markers"}}`, answered with
//! `[{"sample": <sample>, "after": <call or null>}, ...]`; or `{"rollout":
//! ..., "classify": [prev, next]}`, answered with the break.

use std::io::Read;
use std::process::ExitCode;

use anyhow::Context;
use serde::Deserialize;
use serde_json::json;

use agl_plugin_host::samples;
use agl_wire::rollout::Rollout;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Request {
    rollout: Rollout,
    merge: Option<MergeOptions>,
    classify: Option<(u32, u32)>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MergeOptions {
    chain_by_agent: bool,
    skip_empty_responses: bool,
    summary_markers: Vec<String>,
}

pub fn run() -> anyhow::Result<ExitCode> {
    let mut text = String::new();
    std::io::stdin().read_to_string(&mut text)?;
    let request: Request = serde_json::from_str(&text).context("reading the request on stdin")?;
    let answer = match (request.merge, request.classify) {
        (Some(o), None) => {
            let options = agl_samples::MergeOptions {
                chain_by_agent: o.chain_by_agent,
                skip_empty_responses: o.skip_empty_responses,
                summary_markers: o.summary_markers,
            };
            let merged = samples::merge_calls(&request.rollout, None, &options, None);
            let merged = merged
                .into_iter()
                .map(|m| json!({"sample": m.sample, "after": m.after}));
            serde_json::Value::Array(merged.collect())
        }
        (None, Some((prev, next))) => {
            let b = samples::classify(&request.rollout, prev, next, None)
                .map_err(anyhow::Error::msg)?;
            serde_json::to_value(b)?
        }
        _ => anyhow::bail!("the request names one of `merge` and `classify`"),
    };
    println!("{answer}");
    Ok(ExitCode::SUCCESS)
}
