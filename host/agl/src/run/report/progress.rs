//! What the terminal shows while `agl run` goes: the step lines on stdout
//! (at most two per step, [`summary_lines`]) and one progress bar on stderr
//! for the step in flight (its rollouts, what the loop is doing, the run's
//! ETA), printed below the lines.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::{StepRecord, summary_lines};

/// Cheap to clone: clones drive the same bar.
#[derive(Clone)]
pub struct Progress {
    bar: ProgressBar,
    total_steps: u64,
    /// Failed rollouts of the step in flight.
    failed: Arc<AtomicU64>,
    /// Whether the harness has reported a tool use in this run: from then
    /// on the lines show the tool-use rate (a harness without tools never
    /// gets a `tool 0%` column).
    tools_seen: Arc<AtomicBool>,
    timing: Arc<Mutex<Timing>>,
}

/// For the ETA: when this process started stepping and how many steps it did.
struct Timing {
    since: Instant,
    first_step: u64,
    last_step: u64,
}

impl Progress {
    /// The bar is hidden when `hidden` or when stderr is not a terminal; the
    /// step lines are printed either way.
    pub fn new(total_steps: u64, hidden: bool) -> Progress {
        let target = if hidden || !std::io::stderr().is_terminal() {
            ProgressDrawTarget::hidden()
        } else {
            ProgressDrawTarget::stderr()
        };
        let bar = ProgressBar::with_draw_target(Some(0), target).with_style(style(
            "{prefix} {bar:30.cyan/blue} {pos}/{len} rollouts {msg} [{elapsed_precise}]",
        ));
        let p = Progress {
            bar,
            total_steps,
            failed: Arc::new(AtomicU64::new(0)),
            tools_seen: Arc::new(AtomicBool::new(false)),
            timing: Arc::new(Mutex::new(Timing {
                since: Instant::now(),
                first_step: 0,
                last_step: 0,
            })),
        };
        p.set_step(0);
        p
    }

    /// For a resumed run: updates already done before this process.
    pub fn resume_at(&self, step: u64) {
        if let Ok(mut t) = self.timing.lock() {
            *t = Timing {
                since: Instant::now(),
                first_step: step,
                last_step: step,
            };
        }
        self.set_step(step);
    }

    pub fn rollouts_launched(&self, n: u64) {
        self.bar.inc_length(n);
    }

    pub fn rollout_finished(&self, ok: bool) {
        if !ok {
            self.failed.fetch_add(1, Ordering::Relaxed);
        }
        self.bar.inc(1);
        self.set_phase("");
    }

    /// What the loop does now, shown after the rollout count (`training`,
    /// `validating`); empty while it waits for rollouts.
    pub fn set_phase(&self, phase: &str) {
        let failed = self.failed.load(Ordering::Relaxed);
        let parts = [
            (failed > 0).then(|| format!("({failed} failed)")),
            (!phase.is_empty()).then(|| phase.to_string()),
            self.eta_s()
                .map(|eta| format!("eta {}", super::text::duration(eta))),
        ];
        let msg: Vec<String> = parts.into_iter().flatten().collect();
        self.bar.set_message(msg.join(" · "));
    }

    /// Prints the step's lines above the bar and starts the bar over for
    /// the next step, keeping rollouts still in flight.
    pub fn step_done(&self, record: &StepRecord) {
        if [record.tool_use, record.val_tool_use]
            .iter()
            .any(|t| t.is_some_and(|t| t > 0.0))
        {
            self.tools_seen.store(true, Ordering::Relaxed);
        }
        self.println(&summary_lines(
            record,
            self.tools_seen.load(Ordering::Relaxed),
        ));
        if record.is_baseline() {
            return;
        }
        if let Ok(mut t) = self.timing.lock() {
            t.last_step = record.step;
        }
        let in_flight = self
            .bar
            .length()
            .unwrap_or(0)
            .saturating_sub(self.bar.position());
        self.bar.set_position(0);
        self.bar.set_length(in_flight);
        self.failed.store(0, Ordering::Relaxed);
        self.set_step(record.step);
    }

    /// Prints lines to stdout without garbling the bar.
    pub fn println(&self, lines: &str) {
        self.bar.suspend(|| println!("{lines}"));
    }

    /// Removes the bar.
    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }

    fn set_step(&self, done: u64) {
        let next = (done + 1).min(self.total_steps.max(1));
        self.bar
            .set_prefix(format!("step {next}/{}", self.total_steps));
        self.set_phase("");
    }

    /// Remaining steps at this process's mean step time so far.
    fn eta_s(&self) -> Option<f64> {
        let t = self.timing.lock().ok()?;
        let done = t.last_step.checked_sub(t.first_step).filter(|d| *d > 0)?;
        let per_step = t.since.elapsed().as_secs_f64() / done as f64;
        Some(per_step * self.total_steps.saturating_sub(t.last_step) as f64)
    }
}

fn style(template: &str) -> ProgressStyle {
    // The template is a constant; the fallback only guards a typo.
    ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_bar())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_done_keeps_in_flight_rollouts_and_moves_to_the_next_step() {
        let p = Progress::new(5, true);
        assert_eq!(p.bar.prefix(), "step 1/5");
        p.rollouts_launched(8);
        for ok in [true, true, false] {
            p.rollout_finished(ok);
        }
        assert_eq!(p.bar.message(), "(1 failed)");
        p.set_phase("training");
        assert_eq!(p.bar.message(), "(1 failed) · training");
        p.step_done(&StepRecord {
            step: 1,
            total_steps: 5,
            reward_mean: Some(0.5),
            ..StepRecord::default()
        });
        assert_eq!((p.bar.position(), p.bar.length()), (0, Some(5)));
        assert_eq!(p.bar.prefix(), "step 2/5");
        assert!(p.bar.message().starts_with("eta "), "{}", p.bar.message());
        assert!(!p.tools_seen.load(Ordering::Relaxed));
        p.step_done(&StepRecord {
            step: 2,
            total_steps: 5,
            tool_use: Some(0.25),
            ..StepRecord::default()
        });
        assert!(p.tools_seen.load(Ordering::Relaxed), "a tool use was seen");
        p.finish();
        assert!(p.bar.is_finished());
    }
}
