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
    /// The update's statistics (`loss`, `grad_norm`, `engine_kl`, ...) by
    /// their key, each a row of agl's metric table (`host/agl`,
    /// `run/report/table.rs`), which names, computes and shows them; a key
    /// absent was not computed (step 0, a step with nothing to train,
    /// entropy when disabled). Written inline, one key per figure.
    #[serde(flatten)]
    #[schema(value_type = BTreeMap<String, f64>)]
    pub update: Figures,
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

    /// The update statistic `key` ([`StepRecord::update`]).
    pub fn figure(&self, key: &str) -> Option<f64> {
        self.update.0.get(key).copied()
    }

    pub fn is_baseline(&self) -> bool {
        self.step == 0
    }

    /// Breaks of `class` (0 when none were recorded).
    pub fn breaks_of(&self, class: &str) -> usize {
        self.breaks.get(class).copied().unwrap_or(0)
    }
}

/// Finite figures by key. Read from the record's other keys: a number is
/// kept (a key renamed since is read under its new name), anything else
/// (`null` for a figure not computed, a field of a later agl) is passed
/// over, so no line an agl wrote stops a later read.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Figures(pub BTreeMap<String, f64>);

/// Figure keys renamed since, old -> new.
const RENAMED: &[(&str, &str)] = &[("tis_truncated_fraction", "corrected_fraction")];

impl Figures {
    /// Sets `key`, or leaves it out where `value` is not finite.
    pub fn set(&mut self, key: &str, value: f64) {
        if value.is_finite() {
            self.0.insert(key.to_owned(), value);
        }
    }
}

impl<'de> Deserialize<'de> for Figures {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let all = BTreeMap::<String, serde_json::Value>::deserialize(d)?;
        let mut figures = BTreeMap::new();
        for (key, value) in all {
            let key = match RENAMED.iter().find(|(old, _)| *old == key) {
                Some((_, new)) => (*new).to_owned(),
                None => key,
            };
            if let Some(v) = value.as_f64() {
                figures.entry(key).or_insert(v);
            }
        }
        Ok(Figures(figures))
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
        assert_eq!(
            (old.step, old.figure("loss"), old.rollouts),
            (5, Some(0.5), 0)
        );
    }

    #[test]
    fn figures_round_trip_inline_and_odd_keys_do_not_break_a_read() {
        let mut rec = StepRecord::default();
        rec.update.set("grad_norm", 3.5);
        rec.update.set("entropy", f64::NAN);
        let json = serde_json::to_value(&rec).unwrap();
        assert_eq!(json["grad_norm"], 3.5, "inline, as before: {json}");
        assert!(json.get("entropy").is_none(), "NaN is not computed");
        assert_eq!(serde_json::from_value::<StepRecord>(json).unwrap(), rec);

        let old: StepRecord = serde_json::from_str(
            r#"{"step": 4, "entropy": null, "tis_truncated_fraction": 0.25, "later": {"a": 1}}"#,
        )
        .unwrap();
        assert_eq!(old.figure("entropy"), None);
        assert_eq!(old.figure("corrected_fraction"), Some(0.25));
        assert_eq!(old.update.0.len(), 1, "{:?}", old.update);
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
