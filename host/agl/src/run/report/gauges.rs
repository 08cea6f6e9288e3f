//! The training loop's state as Prometheus gauges and counters, rendered on
//! the gateway's `/metrics` next to its own.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;

use super::StepRecord;
use agl_gateway::MetricsSource;

/// Latest step and running totals; [`TrainerGauges::set`] once per record.
#[derive(Default)]
pub struct TrainerGauges {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    last: Option<StepRecord>,
    /// The latest validation reward (validation runs only every few steps).
    val_reward: Option<f64>,
    totals: Totals,
}

#[derive(Default)]
struct Totals {
    rollouts: usize,
    samples: usize,
    tokens: usize,
    excluded_system: usize,
    excluded_no_reward: usize,
    plugin_failures: usize,
    dropped_stale: usize,
    breaks: BTreeMap<String, usize>,
}

impl TrainerGauges {
    pub fn new() -> TrainerGauges {
        TrainerGauges::default()
    }

    /// Records one step; totals add up the counts of every training step
    /// set (the baseline, step 0, only sets the validation reward).
    pub fn set(&self, r: &StepRecord) {
        let Ok(mut st) = self.state.lock() else {
            return;
        };
        if r.val_reward.is_some() {
            st.val_reward = r.val_reward;
        }
        if !r.is_baseline() {
            let t = &mut st.totals;
            t.rollouts += r.rollouts;
            t.samples += r.samples;
            t.tokens += r.tokens;
            t.excluded_system += r.excluded_system;
            t.excluded_no_reward += r.excluded_no_reward;
            t.plugin_failures += r.plugin_failures;
            t.dropped_stale += r.dropped_stale;
            for (class, n) in &r.breaks {
                *t.breaks.entry(class.clone()).or_default() += n;
            }
        }
        st.last = Some(r.clone());
    }

    /// Appends the Prometheus text of every known value (nothing before the
    /// first `set`; a value not computed this step is left out).
    pub fn render(&self, out: &mut String) {
        let Ok(st) = self.state.lock() else {
            return;
        };
        let Some(r) = &st.last else {
            return;
        };
        let t = &st.totals;
        let gauges: [(&str, Option<f64>); 29] = [
            ("agl_trainer_step", Some(r.step as f64)),
            ("agl_trainer_total_steps", Some(r.total_steps as f64)),
            ("agl_trainer_weight_version", Some(r.weight_version as f64)),
            ("agl_trainer_elapsed_seconds", Some(r.elapsed_s)),
            ("agl_trainer_step_seconds", Some(r.step_s)),
            ("agl_trainer_wait_seconds", Some(r.wait_s)),
            ("agl_trainer_train_seconds", Some(r.train_s)),
            ("agl_trainer_drain_seconds", Some(r.drain_s)),
            ("agl_trainer_reward_mean", r.reward_mean),
            ("agl_trainer_val_reward", st.val_reward),
            ("agl_trainer_rollouts", Some(r.rollouts as f64)),
            ("agl_trainer_samples", Some(r.samples as f64)),
            ("agl_trainer_tokens", Some(r.tokens as f64)),
            ("agl_trainer_calls_per_rollout", r.calls_per_rollout),
            ("agl_trainer_tool_use", r.tool_use),
            ("agl_trainer_loss", r.loss),
            ("agl_trainer_clip_fraction", r.clip_fraction),
            ("agl_trainer_corrected_fraction", r.corrected_fraction),
            ("agl_trainer_approx_kl", r.approx_kl),
            ("agl_trainer_engine_kl", r.engine_kl),
            ("agl_trainer_mismatch_mean", r.mismatch_mean),
            ("agl_trainer_mismatch_max", r.mismatch_max),
            (
                "agl_trainer_outside_token_fraction",
                r.outside_token_fraction,
            ),
            (
                "agl_trainer_outside_sequence_fraction",
                r.outside_sequence_fraction,
            ),
            ("agl_trainer_entropy", r.entropy),
            ("agl_trainer_grad_norm", r.grad_norm),
            ("agl_trainer_lr", r.lr),
            ("agl_trainer_padding_waste", r.padding_waste),
            ("agl_trainer_mean_staleness", Some(r.mean_staleness)),
        ];
        for (name, value) in gauges {
            if let Some(v) = value.filter(|v| v.is_finite()) {
                let _ = writeln!(out, "# TYPE {name} gauge\n{name} {v}");
            }
        }
        let counters = [
            ("agl_trainer_rollouts_total", t.rollouts),
            ("agl_trainer_samples_total", t.samples),
            ("agl_trainer_tokens_total", t.tokens),
            ("agl_trainer_excluded_system_total", t.excluded_system),
            ("agl_trainer_excluded_no_reward_total", t.excluded_no_reward),
            ("agl_trainer_plugin_failures_total", t.plugin_failures),
            ("agl_trainer_dropped_stale_total", t.dropped_stale),
        ];
        for (name, n) in counters {
            let _ = writeln!(out, "# TYPE {name} counter\n{name} {n}");
        }
        let _ = writeln!(out, "# TYPE agl_trainer_chain_breaks_total counter");
        for (class, n) in &t.breaks {
            // Debug quotes and escapes `"`, `\` and newlines as Prometheus wants.
            let _ = writeln!(out, "agl_trainer_chain_breaks_total{{class={class:?}}} {n}");
        }
    }
}

impl MetricsSource for TrainerGauges {
    fn render(&self, out: &mut String) {
        TrainerGauges::render(self, out);
    }
}
