//! One line of a run's `metrics.jsonl`: what one update did. Written by
//! `agl run`, read back by its report and served by the gateway
//! (`GET /v1/steps`, the viewer's runs page).

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize};
use utoipa::ToSchema;

use crate::api::LoadedPlugin;

/// Chain-break classes (keys of [`StepRecord::breaks`]).
pub const BREAK_RETOKENIZE: &str = "retokenize";
pub const BREAK_TEMPLATE: &str = "template";
pub const BREAK_OTHER: &str = "other";

/// What one training step did. Step 0 is the baseline validation before
/// any update (see the module docs). Missing fields read as their default,
/// so a log written by an older agl still loads.
///
/// Trainer statistics are `None` where they were not computed (step 0, a
/// step with nothing to train, entropy when disabled): JSON has no NaN, so
/// a NaN timing is written `null` (and read back as NaN).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct StepRecord {
    /// 1-based update number; 0 for the baseline.
    pub step: u64,
    /// The run's planned number of updates (for "step 3/20").
    pub total_steps: u64,
    /// Policy version after this update.
    pub weight_version: u64,
    /// Seconds since the run started (across resumes: the caller's clock).
    #[serde(deserialize_with = "f64_or_nan")]
    #[schema(value_type = Option<f64>)]
    pub elapsed_s: f64,
    /// Wall time of this step: `wait_s + train_s + drain_s` plus overheads.
    #[serde(deserialize_with = "f64_or_nan")]
    #[schema(value_type = Option<f64>)]
    pub step_s: f64,
    /// Waiting for enough finished rollouts.
    #[serde(deserialize_with = "f64_or_nan")]
    #[schema(value_type = Option<f64>)]
    pub wait_s: f64,
    /// Forward/backward/optimizer.
    #[serde(deserialize_with = "f64_or_nan")]
    #[schema(value_type = Option<f64>)]
    pub train_s: f64,
    /// Pausing the proxy, draining in-flight calls and loading weights.
    #[serde(deserialize_with = "f64_or_nan")]
    #[schema(value_type = Option<f64>)]
    pub drain_s: f64,
    /// Mean reward of the rollouts this update trained on.
    pub reward_mean: Option<f64>,
    /// Mean validation reward; only on validation steps (and step 0).
    pub val_reward: Option<f64>,
    pub val_rollouts: usize,
    pub groups: usize,
    pub rollouts: usize,
    pub samples: usize,
    /// Trainable tokens.
    pub tokens: usize,
    /// Model calls per scored rollout of this update: the harness's turns.
    pub calls_per_rollout: Option<f64>,
    /// Share of this update's scored rollouts whose harness reported using
    /// a tool (at least one [`TOOL_CALL`](crate::record::TOOL_CALL) event).
    pub tool_use: Option<f64>,
    /// The same two over the validation rollouts (validation steps only).
    pub val_calls_per_rollout: Option<f64>,
    pub val_tool_use: Option<f64>,
    /// Chain breaks by class ([`BREAK_RETOKENIZE`], [`BREAK_TEMPLATE`],
    /// [`BREAK_OTHER`]).
    pub breaks: BTreeMap<String, usize>,
    /// Rollouts left out because of an infrastructure failure.
    pub excluded_system: usize,
    pub excluded_no_reward: usize,
    pub plugin_failures: usize,
    /// Rollouts dropped for being too many versions behind.
    pub dropped_stale: usize,
    /// Under partial rollouts: trained tokens masked for having been
    /// sampled too many versions behind.
    pub stale_tokens: usize,
    /// Whole groups held back for a later update (update cap).
    pub carried_groups: usize,
    pub loss: Option<f64>,
    pub clip_fraction: Option<f64>,
    /// Share of trained tokens whose off-policy correction weight was
    /// truncated or masked (`[train] correction`).
    #[serde(alias = "tis_truncated_fraction")]
    pub corrected_fraction: Option<f64>,
    /// k3(old -> new) of the update: 0 by construction with one optimizer
    /// step per batch (old = new); see `engine_kl` for the engine gap.
    pub approx_kl: Option<f64>,
    /// Mean k3 estimate of KL(engine || trainer) over the trained tokens:
    /// how far the trainer's logprobs of the sampled tokens are from the
    /// engine's.
    pub engine_kl: Option<f64>,
    /// Mean and max `|log p_engine - log p_trainer|` over the trained tokens.
    pub mismatch_mean: Option<f64>,
    pub mismatch_max: Option<f64>,
    /// Shares of the trained tokens, and of their sequences, whose
    /// importance ratio lies outside `[correction_low, correction_high]`
    /// (above `correction_high` for truncated IS).
    pub outside_token_fraction: Option<f64>,
    pub outside_sequence_fraction: Option<f64>,
    pub ref_kl: Option<f64>,
    pub entropy: Option<f64>,
    pub grad_norm: Option<f64>,
    pub lr: Option<f64>,
    /// Share of padded positions in the packed micro-batches.
    pub padding_waste: Option<f64>,
    pub micro_batches: usize,
    /// Samples whose forward/backward was skipped: zero advantage (a group
    /// that scored alike) and no KL term, so no gradient.
    pub skipped_samples: usize,
    /// Mean `weight_version - sampled version` over the trained rollouts.
    #[serde(deserialize_with = "f64_or_nan")]
    #[schema(value_type = Option<f64>)]
    pub mean_staleness: f64,
    /// The plugins (role, name, version, content hash) that built and
    /// scored this update's rollouts: more than one per role when a swap
    /// landed while its rollouts were being collected.
    pub plugins: Vec<LoadedPlugin>,
}

impl StepRecord {
    /// The baseline record: validation of the initial weights.
    pub fn baseline(
        total_steps: u64,
        elapsed_s: f64,
        val_reward: Option<f64>,
        val_rollouts: usize,
    ) -> StepRecord {
        StepRecord {
            total_steps,
            elapsed_s,
            step_s: elapsed_s,
            val_reward,
            val_rollouts,
            ..StepRecord::default()
        }
    }

    pub fn is_baseline(&self) -> bool {
        self.step == 0
    }

    /// Breaks of `class` (0 when none were recorded).
    pub fn breaks_of(&self, class: &str) -> usize {
        self.breaks.get(class).copied().unwrap_or(0)
    }
}

/// A `metrics.jsonl` line that is not a step record (1-based `line`).
#[derive(Debug, thiserror::Error)]
#[error("line {line}: not a step record: {source}")]
pub struct BadRecord {
    pub line: usize,
    pub source: serde_json::Error,
}

/// Every record of a `metrics.jsonl`'s text. An unreadable last line is a
/// write torn by a crash and is skipped (its line number returned); a bad
/// line before it is an error.
pub fn parse_records(text: &str) -> Result<(Vec<StepRecord>, Option<usize>), BadRecord> {
    let lines: Vec<(usize, &str)> = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .collect();
    let mut records = Vec::with_capacity(lines.len());
    for (i, (n, line)) in lines.iter().enumerate() {
        match serde_json::from_str(line) {
            Ok(r) => records.push(r),
            Err(_) if i + 1 == lines.len() => return Ok((records, Some(n + 1))),
            Err(source) => {
                return Err(BadRecord {
                    line: n + 1,
                    source,
                });
            }
        }
    }
    Ok((records, None))
}

/// serde_json writes a non-finite f64 as `null`; read it back as NaN
/// instead of rejecting the whole line.
fn f64_or_nan<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nan_timing_survives_a_round_trip_and_missing_fields_default() {
        let rec = StepRecord {
            step: 2,
            step_s: f64::NAN,
            ..StepRecord::default()
        };
        let line = serde_json::to_string(&rec).unwrap();
        let back: StepRecord = serde_json::from_str(&line).unwrap();
        assert_eq!(back.step, 2);
        assert!(back.step_s.is_nan());

        let old: StepRecord = serde_json::from_str(r#"{"step": 5, "loss": 0.5}"#).unwrap();
        assert_eq!((old.step, old.loss, old.rollouts), (5, Some(0.5), 0));
    }

    #[test]
    fn a_nan_timing_is_null_in_the_json_and_its_schema() {
        use utoipa::PartialSchema;
        let rec = StepRecord {
            step_s: f64::NAN,
            ..StepRecord::default()
        };
        let json = serde_json::to_value(&rec).unwrap();
        assert!(json["step_s"].is_null());
        let schema = serde_json::to_value(StepRecord::schema()).unwrap();
        assert_eq!(
            schema["properties"]["step_s"]["type"],
            serde_json::json!(["number", "null"])
        );
    }

    #[test]
    fn a_torn_last_line_is_skipped_and_a_bad_earlier_one_refused() {
        let (records, torn) = parse_records("{\"step\": 1}\n\n{\"step\": 2}\n{\"ste").unwrap();
        assert_eq!(records.iter().map(|r| r.step).collect::<Vec<_>>(), [1, 2]);
        assert_eq!(torn, Some(4));
        let e = parse_records("{\"step\": 1}\nnope\n{\"step\": 2}").unwrap_err();
        assert_eq!(e.line, 2);
    }
}
