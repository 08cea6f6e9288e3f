//! The step record's figures, one row each, as the exports name them: the
//! TensorBoard / W&B tag ([`super::scalars`]) and the Prometheus gauge and
//! counter ([`super::TrainerGauges`]). A figure added to [`StepRecord`] is
//! exported by adding its row here.
//!
//! Chain breaks are not rows: their classes are open-ended (an adapter may
//! report its own), so each view lists them from `breaks`.

use super::StepRecord;

/// One figure of a [`StepRecord`].
pub struct Metric {
    /// The TensorBoard / W&B tag (`update/grad_norm`); `None` for the step
    /// itself, the exports' x axis.
    pub tag: Option<&'static str>,
    /// The `/metrics` gauge holding the latest record's value.
    pub gauge: Option<&'static str>,
    /// The `/metrics` counter summing the value over the training steps.
    pub counter: Option<&'static str>,
    /// Measured by the baseline record (step 0) too; the other figures are
    /// training statistics, which the baseline does not have.
    pub baseline: bool,
    /// The value; `None` (or non-finite) where it was not computed.
    pub value: fn(&StepRecord) -> Option<f64>,
}

const fn row(
    tag: &'static str,
    gauge: Option<&'static str>,
    value: fn(&StepRecord) -> Option<f64>,
) -> Metric {
    Metric {
        tag: Some(tag),
        gauge,
        counter: None,
        baseline: false,
        value,
    }
}

/// A training count: tagged, its latest value a gauge (`gauge`), its sum
/// over the run a counter (`counter`).
const fn count(
    tag: &'static str,
    gauge: Option<&'static str>,
    counter: Option<&'static str>,
    value: fn(&StepRecord) -> Option<f64>,
) -> Metric {
    Metric {
        counter,
        ..row(tag, gauge, value)
    }
}

/// A figure the baseline measures as well.
const fn baseline(
    tag: Option<&'static str>,
    gauge: Option<&'static str>,
    value: fn(&StepRecord) -> Option<f64>,
) -> Metric {
    Metric {
        tag,
        gauge,
        counter: None,
        baseline: true,
        value,
    }
}

/// Every exported figure of a step record.
pub const METRICS: &[Metric] = &[
    baseline(None, Some("agl_trainer_step"), |r| Some(r.step as f64)),
    baseline(
        Some("run/total_steps"),
        Some("agl_trainer_total_steps"),
        |r| Some(r.total_steps as f64),
    ),
    baseline(
        Some("run/weight_version"),
        Some("agl_trainer_weight_version"),
        |r| Some(r.weight_version as f64),
    ),
    baseline(
        Some("time/elapsed_s"),
        Some("agl_trainer_elapsed_seconds"),
        |r| Some(r.elapsed_s),
    ),
    baseline(Some("val/rollouts"), None, |r| {
        (r.val_reward.is_some() || r.val_rollouts > 0).then_some(r.val_rollouts as f64)
    }),
    baseline(Some("val/reward"), Some("agl_trainer_val_reward"), |r| {
        r.val_reward
    }),
    baseline(Some("val/calls_per_rollout"), None, |r| {
        r.val_calls_per_rollout
    }),
    baseline(Some("val/tool_use"), None, |r| r.val_tool_use),
    row("time/step_s", Some("agl_trainer_step_seconds"), |r| {
        Some(r.step_s)
    }),
    row("time/wait_s", Some("agl_trainer_wait_seconds"), |r| {
        Some(r.wait_s)
    }),
    row("time/train_s", Some("agl_trainer_train_seconds"), |r| {
        Some(r.train_s)
    }),
    row("time/drain_s", Some("agl_trainer_drain_seconds"), |r| {
        Some(r.drain_s)
    }),
    row("train/reward", Some("agl_trainer_reward_mean"), |r| {
        r.reward_mean
    }),
    row(
        "train/calls_per_rollout",
        Some("agl_trainer_calls_per_rollout"),
        |r| r.calls_per_rollout,
    ),
    row("train/tool_use", Some("agl_trainer_tool_use"), |r| {
        r.tool_use
    }),
    count("train/groups", None, None, |r| Some(r.groups as f64)),
    count(
        "train/rollouts",
        Some("agl_trainer_rollouts"),
        Some("agl_trainer_rollouts_total"),
        |r| Some(r.rollouts as f64),
    ),
    count(
        "train/samples",
        Some("agl_trainer_samples"),
        Some("agl_trainer_samples_total"),
        |r| Some(r.samples as f64),
    ),
    count(
        "train/tokens",
        Some("agl_trainer_tokens"),
        Some("agl_trainer_tokens_total"),
        |r| Some(r.tokens as f64),
    ),
    count("train/carried_groups", None, None, |r| {
        Some(r.carried_groups as f64)
    }),
    count("train/stale_tokens", None, None, |r| {
        Some(r.stale_tokens as f64)
    }),
    count(
        "train/excluded_system",
        None,
        Some("agl_trainer_excluded_system_total"),
        |r| Some(r.excluded_system as f64),
    ),
    count(
        "train/excluded_no_reward",
        None,
        Some("agl_trainer_excluded_no_reward_total"),
        |r| Some(r.excluded_no_reward as f64),
    ),
    count(
        "train/plugin_failures",
        None,
        Some("agl_trainer_plugin_failures_total"),
        |r| Some(r.plugin_failures as f64),
    ),
    count(
        "train/dropped_stale",
        None,
        Some("agl_trainer_dropped_stale_total"),
        |r| Some(r.dropped_stale as f64),
    ),
    row(
        "train/mean_staleness",
        Some("agl_trainer_mean_staleness"),
        |r| Some(r.mean_staleness),
    ),
    row("train/samples_per_rollout", None, |r| {
        (r.rollouts > 0).then(|| r.samples as f64 / r.rollouts as f64)
    }),
    row("update/micro_batches", None, |r| {
        Some(r.micro_batches as f64)
    }),
    row("update/skipped_samples", None, |r| {
        Some(r.skipped_samples as f64)
    }),
    row("update/loss", Some("agl_trainer_loss"), |r| r.loss),
    row(
        "update/clip_fraction",
        Some("agl_trainer_clip_fraction"),
        |r| r.clip_fraction,
    ),
    row(
        "update/corrected_fraction",
        Some("agl_trainer_corrected_fraction"),
        |r| r.corrected_fraction,
    ),
    row("update/approx_kl", Some("agl_trainer_approx_kl"), |r| {
        r.approx_kl
    }),
    row("update/engine_kl", Some("agl_trainer_engine_kl"), |r| {
        r.engine_kl
    }),
    row(
        "update/mismatch_mean",
        Some("agl_trainer_mismatch_mean"),
        |r| r.mismatch_mean,
    ),
    row(
        "update/mismatch_max",
        Some("agl_trainer_mismatch_max"),
        |r| r.mismatch_max,
    ),
    row(
        "update/outside_token_fraction",
        Some("agl_trainer_outside_token_fraction"),
        |r| r.outside_token_fraction,
    ),
    row(
        "update/outside_sequence_fraction",
        Some("agl_trainer_outside_sequence_fraction"),
        |r| r.outside_sequence_fraction,
    ),
    row("update/ref_kl", None, |r| r.ref_kl),
    row("update/entropy", Some("agl_trainer_entropy"), |r| r.entropy),
    row("update/grad_norm", Some("agl_trainer_grad_norm"), |r| {
        r.grad_norm
    }),
    row("update/lr", Some("agl_trainer_lr"), |r| r.lr),
    row(
        "update/padding_waste",
        Some("agl_trainer_padding_waste"),
        |r| r.padding_waste,
    ),
];

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn each_name_is_used_once() {
        let mut seen = HashSet::new();
        for m in METRICS {
            for name in [m.tag, m.gauge, m.counter].into_iter().flatten() {
                assert!(seen.insert(name), "{name} twice");
            }
        }
    }

    #[test]
    fn counters_are_training_counts() {
        for m in METRICS.iter().filter(|m| m.counter.is_some()) {
            assert!(!m.baseline, "{:?}: the baseline trains nothing", m.counter);
            assert!(m.counter.is_some_and(|c| c.ends_with("_total")));
        }
    }
}
