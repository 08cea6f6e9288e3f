//! The step record's figures, one row each, as every view names them: the
//! TensorBoard / W&B tag ([`super::scalars`]), the Prometheus gauge and
//! counter ([`super::TrainerGauges`]), the column of the second step line
//! ([`super::summary_lines`]) and the series of `training.png`
//! ([`super::panels`]). A figure added to [`StepRecord`] reaches them all
//! by its row here (`metrics.jsonl` is the record itself). A statistic of
//! the update (`agl_rl::StepStats`) is its row alone: [`Value::Update`]
//! names its key in the record and reads it from the trainer's report.
//!
//! Chain breaks are not rows: their classes are open-ended (an adapter may
//! report its own), so each view lists them from `breaks`.

use plotters::style::RGBColor;
use plotters::style::colors::{BLACK, BLUE, GREEN, MAGENTA, RED};

use agl_rl::StepStats;

use super::StepRecord;

/// One figure of a [`StepRecord`].
pub struct Metric {
    /// The TensorBoard / W&B tag (`update/grad_norm`); `None` for a figure
    /// not exported as a scalar (the step itself, the exports' x axis).
    pub tag: Option<&'static str>,
    /// The `/metrics` gauge holding the latest record's value.
    pub gauge: Option<&'static str>,
    /// The `/metrics` counter summing the value over the training steps.
    pub counter: Option<&'static str>,
    /// Its place in the second step line: label and format.
    pub column: Option<(&'static str, Format)>,
    /// Its series in `training.png`: the panel (a title of [`PANELS`]),
    /// the legend label and the colour.
    pub series: Option<Series>,
    /// Measured by the baseline record (step 0) too; the other figures are
    /// training statistics, which the baseline does not have.
    pub baseline: bool,
    pub value: Value,
}

/// Where a figure's value comes from.
pub enum Value {
    /// A field of the record (or a figure derived from its fields); `None`
    /// (or non-finite) where it was not computed.
    Record(fn(&StepRecord) -> Option<f64>),
    /// A statistic of the update, kept in [`StepRecord::update`] under
    /// `key` (its `metrics.jsonl` key), copied there from what
    /// `train_step` reported by `read` ([`record_update`]).
    Update {
        key: &'static str,
        read: fn(&StepStats) -> f64,
    },
}

/// How a step line writes a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// That many decimals: `3.61`.
    Fixed(usize),
    /// One significant decimal in scientific notation: `3.2e-5`.
    Sci,
    /// A share in percent: `84%`, `0.4%`.
    Percent,
}

/// A line of the plot.
pub struct Series {
    pub panel: &'static str,
    pub label: &'static str,
    pub color: RGBColor,
}

/// A chart of `training.png`.
pub struct Panel {
    pub title: &'static str,
    /// Drawn only once the harness has reported a tool use in this run.
    pub tools_only: bool,
}

/// The plot's panels in drawing order. (The loss is not drawn: with one
/// optimizer step per batch it is ~0 by construction.)
pub const PANELS: &[Panel] = &[
    panel(REWARD),
    Panel {
        tools_only: true,
        ..panel(TOOL_USE)
    },
    panel(PER_ROLLOUT),
    panel("gradient norm (before clipping)"),
    panel("entropy (nats per token)"),
    panel(ENGINE_GAP),
];
const REWARD: &str = "reward";
const TOOL_USE: &str = "tool use (share of rollouts)";
const PER_ROLLOUT: &str = "per rollout";
const ENGINE_GAP: &str = "trainer vs engine";

const fn panel(title: &'static str) -> Panel {
    Panel {
        title,
        tools_only: false,
    }
}

impl Metric {
    /// The value in record `r`.
    pub fn value(&self, r: &StepRecord) -> Option<f64> {
        match self.value {
            Value::Record(of) => of(r),
            Value::Update { key, .. } => r.figure(key),
        }
    }

    /// A training statistic exported under `tag`.
    const fn tagged(tag: &'static str, value: fn(&StepRecord) -> Option<f64>) -> Metric {
        Metric {
            tag: Some(tag),
            ..Metric::untagged(value)
        }
    }

    /// A statistic of the update: `key` in the record, `tag` in the exports.
    const fn update(tag: &'static str, key: &'static str, read: fn(&StepStats) -> f64) -> Metric {
        Metric {
            tag: Some(tag),
            value: Value::Update { key, read },
            ..Metric::untagged(|_| None)
        }
    }

    const fn untagged(value: fn(&StepRecord) -> Option<f64>) -> Metric {
        Metric {
            tag: None,
            gauge: None,
            counter: None,
            column: None,
            series: None,
            baseline: false,
            value: Value::Record(value),
        }
    }

    /// Measured by the baseline as well.
    const fn baseline(self) -> Metric {
        Metric {
            baseline: true,
            ..self
        }
    }

    const fn gauge(self, name: &'static str) -> Metric {
        Metric {
            gauge: Some(name),
            ..self
        }
    }

    /// A training count summed over the run (`NAME_total`).
    const fn counter(self, name: &'static str) -> Metric {
        Metric {
            counter: Some(name),
            ..self
        }
    }

    const fn column(self, label: &'static str, format: Format) -> Metric {
        Metric {
            column: Some((label, format)),
            ..self
        }
    }

    const fn plot(self, panel: &'static str, label: &'static str, color: RGBColor) -> Metric {
        Metric {
            series: Some(Series {
                panel,
                label,
                color,
            }),
            ..self
        }
    }
}

/// Every figure of a step record.
pub const METRICS: &[Metric] = &[
    Metric::untagged(|r| Some(r.step as f64))
        .baseline()
        .gauge("agl_trainer_step"),
    Metric::tagged("run/total_steps", |r| Some(r.total_steps as f64))
        .baseline()
        .gauge("agl_trainer_total_steps"),
    Metric::tagged("run/weight_version", |r| Some(r.weight_version as f64))
        .baseline()
        .gauge("agl_trainer_weight_version"),
    Metric::tagged("time/elapsed_s", |r| Some(r.elapsed_s))
        .baseline()
        .gauge("agl_trainer_elapsed_seconds"),
    Metric::tagged("val/rollouts", |r| {
        (r.val_reward.is_some() || r.val_rollouts > 0).then_some(r.val_rollouts as f64)
    })
    .baseline(),
    Metric::tagged("val/calls_per_rollout", |r| r.val_calls_per_rollout).baseline(),
    Metric::tagged("time/step_s", |r| Some(r.step_s)).gauge("agl_trainer_step_seconds"),
    Metric::tagged("time/wait_s", |r| Some(r.wait_s)).gauge("agl_trainer_wait_seconds"),
    Metric::tagged("time/train_s", |r| Some(r.train_s)).gauge("agl_trainer_train_seconds"),
    Metric::tagged("time/drain_s", |r| Some(r.drain_s)).gauge("agl_trainer_drain_seconds"),
    Metric::tagged("train/reward", |r| r.reward_mean)
        .gauge("agl_trainer_reward_mean")
        .plot(REWARD, "train (mean)", BLUE),
    Metric::tagged("train/calls_per_rollout", |r| r.calls_per_rollout)
        .gauge("agl_trainer_calls_per_rollout")
        .plot(PER_ROLLOUT, "model calls", BLUE),
    Metric::tagged("train/tool_use", |r| r.tool_use)
        .gauge("agl_trainer_tool_use")
        .plot(TOOL_USE, "train", BLUE),
    // After the train rows: a panel lists its series in table order.
    Metric::tagged("val/reward", |r| r.val_reward)
        .baseline()
        .gauge("agl_trainer_val_reward")
        .plot(REWARD, "validation", RED),
    Metric::tagged("val/tool_use", |r| r.val_tool_use)
        .baseline()
        .plot(TOOL_USE, "validation", RED),
    Metric::tagged("train/groups", |r| Some(r.groups as f64)),
    Metric::tagged("train/rollouts", |r| Some(r.rollouts as f64))
        .gauge("agl_trainer_rollouts")
        .counter("agl_trainer_rollouts_total"),
    Metric::tagged("train/samples", |r| Some(r.samples as f64))
        .gauge("agl_trainer_samples")
        .counter("agl_trainer_samples_total"),
    Metric::tagged("train/tokens", |r| Some(r.tokens as f64))
        .gauge("agl_trainer_tokens")
        .counter("agl_trainer_tokens_total"),
    Metric::tagged("train/carried_groups", |r| Some(r.carried_groups as f64)),
    Metric::tagged("train/stale_tokens", |r| Some(r.stale_tokens as f64)),
    Metric::tagged("train/excluded_system", |r| Some(r.excluded_system as f64))
        .counter("agl_trainer_excluded_system_total"),
    Metric::tagged("train/excluded_no_reward", |r| {
        Some(r.excluded_no_reward as f64)
    })
    .counter("agl_trainer_excluded_no_reward_total"),
    Metric::tagged("train/plugin_failures", |r| Some(r.plugin_failures as f64))
        .counter("agl_trainer_plugin_failures_total"),
    Metric::tagged("train/dropped_stale", |r| Some(r.dropped_stale as f64))
        .counter("agl_trainer_dropped_stale_total"),
    Metric::tagged("train/mean_staleness", |r| Some(r.mean_staleness))
        .gauge("agl_trainer_mean_staleness"),
    Metric::tagged("train/samples_per_rollout", |r| per_rollout(r, r.samples)).plot(
        PER_ROLLOUT,
        "samples",
        GREEN,
    ),
    // Breaks are listed by class in each view; their sum per rollout is
    // drawn only.
    Metric::untagged(|r| per_rollout(r, r.breaks.values().sum())).plot(
        PER_ROLLOUT,
        "chain breaks",
        RED,
    ),
    Metric::tagged("update/micro_batches", |r| Some(r.micro_batches as f64)),
    Metric::tagged("update/skipped_samples", |r| Some(r.skipped_samples as f64)),
    Metric::update("update/loss", "loss", |s| s.loss).gauge("agl_trainer_loss"),
    Metric::update("update/grad_norm", "grad_norm", |s| s.grad_norm)
        .gauge("agl_trainer_grad_norm")
        .column("grad", Format::Fixed(2))
        .plot("gradient norm (before clipping)", "grad norm", BLACK),
    Metric::update("update/entropy", "entropy", |s| s.entropy)
        .gauge("agl_trainer_entropy")
        .column("ent", Format::Fixed(2))
        .plot("entropy (nats per token)", "entropy", MAGENTA),
    Metric::update("update/engine_kl", "engine_kl", |s| s.engine_kl)
        .gauge("agl_trainer_engine_kl")
        .column("engine kl", Format::Sci)
        .plot(ENGINE_GAP, "KL(engine || trainer)", BLUE),
    Metric::update("update/mismatch_mean", "mismatch_mean", |s| s.mismatch_mean)
        .gauge("agl_trainer_mismatch_mean")
        .column("gap", Format::Sci)
        .plot(ENGINE_GAP, "mean |logprob gap|", BLACK),
    Metric::update("update/mismatch_max", "mismatch_max", |s| s.mismatch_max)
        .gauge("agl_trainer_mismatch_max")
        .column("max gap", Format::Sci),
    Metric::update(
        "update/outside_token_fraction",
        "outside_token_fraction",
        |s| s.outside_token_fraction,
    )
    .gauge("agl_trainer_outside_token_fraction")
    .column("outside", Format::Percent)
    .plot(ENGINE_GAP, "tokens outside bounds", MAGENTA),
    Metric::update(
        "update/outside_sequence_fraction",
        "outside_sequence_fraction",
        |s| s.outside_sequence_fraction,
    )
    .gauge("agl_trainer_outside_sequence_fraction")
    .column("outside seqs", Format::Percent),
    Metric::update("update/corrected_fraction", "corrected_fraction", |s| {
        s.corrected_fraction
    })
    .gauge("agl_trainer_corrected_fraction")
    .column("corrected", Format::Percent)
    .plot(ENGINE_GAP, "corrected share", RED),
    Metric::update("update/clip_fraction", "clip_fraction", |s| s.clip_fraction)
        .gauge("agl_trainer_clip_fraction"),
    Metric::update("update/approx_kl", "approx_kl", |s| s.approx_kl).gauge("agl_trainer_approx_kl"),
    Metric::update("update/ref_kl", "ref_kl", |s| s.ref_kl.unwrap_or(f64::NAN)),
    Metric::update("update/lr", "lr", |s| s.lr).gauge("agl_trainer_lr"),
    Metric::update("update/padding_waste", "padding_waste", |s| s.padding_waste)
        .gauge("agl_trainer_padding_waste"),
];

/// Copies the update's statistics into `r.update`, each under its row's key
/// (NaN ones left out: not computed).
pub fn record_update(r: &mut StepRecord, s: &StepStats) {
    for m in METRICS {
        if let Value::Update { key, read } = m.value {
            r.update.set(key, read(s));
        }
    }
}

/// `n` per kept rollout; `None` without rollouts.
fn per_rollout(r: &StepRecord, n: usize) -> Option<f64> {
    (r.rollouts > 0).then(|| n as f64 / r.rollouts as f64)
}

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
    fn each_update_statistic_lands_under_its_key() {
        let stats = StepStats {
            grad_norm: 3.5,
            entropy: f64::NAN,
            ref_kl: Some(0.25),
            ..StepStats::default()
        };
        let mut r = StepRecord::default();
        record_update(&mut r, &stats);
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(
            (json["grad_norm"].as_f64(), json["ref_kl"].as_f64()),
            (Some(3.5), Some(0.25))
        );
        assert!(json.get("entropy").is_none(), "NaN: not computed");
        let keys: HashSet<_> = METRICS
            .iter()
            .filter_map(|m| match m.value {
                Value::Update { key, .. } => Some(key),
                Value::Record(_) => None,
            })
            .collect();
        assert_eq!(keys.len(), 14, "one key per statistic: {keys:?}");
    }

    #[test]
    fn each_series_is_drawn_on_a_panel() {
        for s in METRICS.iter().filter_map(|m| m.series.as_ref()) {
            assert!(
                PANELS.iter().any(|p| p.title == s.panel),
                "{}: no panel {:?}",
                s.label,
                s.panel
            );
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
