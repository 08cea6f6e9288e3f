//! The training loop's state as Prometheus gauges and counters, rendered on
//! the gateway's `/metrics` next to its own.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;

use super::StepRecord;
use super::table::METRICS;
use agl_gateway::MetricsSource;

/// Latest step and running totals; [`TrainerGauges::set`] once per record.
#[derive(Default)]
pub struct TrainerGauges {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// The latest record, its validation reward the latest measured
    /// (validation runs only every few steps).
    last: Option<StepRecord>,
    /// Each counter of [`METRICS`] summed over the training steps.
    totals: BTreeMap<&'static str, f64>,
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
        if !r.is_baseline() {
            for m in METRICS {
                if let (Some(name), Some(v)) = (m.counter, m.value(r)) {
                    *st.totals.entry(name).or_default() += v;
                }
            }
            for (class, n) in &r.breaks {
                *st.breaks.entry(class.clone()).or_default() += n;
            }
        }
        let mut last = r.clone();
        if last.val_reward.is_none() {
            last.val_reward = st.last.as_ref().and_then(|l| l.val_reward);
        }
        st.last = Some(last);
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
        for m in METRICS {
            if let (Some(name), Some(v)) = (m.gauge, m.value(r).filter(|v| v.is_finite())) {
                let _ = writeln!(out, "# TYPE {name} gauge\n{name} {v}");
            }
        }
        for name in METRICS.iter().filter_map(|m| m.counter) {
            let n = st.totals.get(name).copied().unwrap_or(0.0);
            let _ = writeln!(out, "# TYPE {name} counter\n{name} {n}");
        }
        let _ = writeln!(out, "# TYPE agl_trainer_chain_breaks_total counter");
        for (class, n) in &st.breaks {
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
