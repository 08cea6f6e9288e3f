//! Two progress bars on stderr (rollouts of the current step, updates with
//! an ETA) and the per-step summary lines on stdout, printed above the bars.

use std::io::IsTerminal;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::{StepRecord, summary_line};

/// Cheap to clone: clones drive the same bars (e.g. from rollout tasks).
#[derive(Clone)]
pub struct Progress {
    multi: MultiProgress,
    rollouts: ProgressBar,
    updates: ProgressBar,
    /// Failed rollouts since the last step.
    failed: Arc<AtomicU64>,
}

impl Progress {
    /// Bars are hidden when `hidden` or when stderr is not a terminal; the
    /// summary lines are printed either way.
    pub fn new(total_steps: u64, hidden: bool) -> Progress {
        let target = if hidden || !std::io::stderr().is_terminal() {
            ProgressDrawTarget::hidden()
        } else {
            ProgressDrawTarget::stderr()
        };
        let multi = MultiProgress::with_draw_target(target);
        let rollouts = multi.add(ProgressBar::new(0).with_style(style(
            "rollouts {bar:30.cyan/blue} {pos}/{len} finished {msg}",
        )));
        let updates = multi.add(ProgressBar::new(total_steps).with_style(style(
            "updates  {bar:30.green/blue} {pos}/{len} {elapsed_precise} eta {eta} {msg}",
        )));
        Progress {
            multi,
            rollouts,
            updates,
            failed: Arc::new(AtomicU64::new(0)),
        }
    }

    /// For a resumed run: updates already done before this process.
    pub fn resume_at(&self, step: u64) {
        self.updates.set_position(step);
        self.updates.reset_eta();
    }

    pub fn rollouts_launched(&self, n: u64) {
        self.rollouts.inc_length(n);
    }

    pub fn rollout_finished(&self, ok: bool) {
        if !ok {
            let failed = self.failed.fetch_add(1, Ordering::Relaxed) + 1;
            self.rollouts.set_message(format!("({failed} failed)"));
        }
        self.rollouts.inc(1);
    }

    /// Prints the step's [`summary_line`] above the bars and starts the
    /// rollout bar over for the next step, keeping rollouts still in flight.
    pub fn step_done(&self, record: &StepRecord) {
        self.println(&summary_line(record));
        if record.is_baseline() {
            return;
        }
        let in_flight = self
            .rollouts
            .length()
            .unwrap_or(0)
            .saturating_sub(self.rollouts.position());
        self.rollouts.set_position(0);
        self.rollouts.set_length(in_flight);
        self.failed.store(0, Ordering::Relaxed);
        self.rollouts.set_message("");
        self.updates.set_position(record.step);
        if let Some(r) = record.reward_mean {
            self.updates.set_message(format!("reward {r:.3}"));
        }
    }

    /// Prints a line to stdout without garbling the bars.
    pub fn println(&self, line: &str) {
        self.multi.suspend(|| println!("{line}"));
    }

    /// Removes the rollout bar and leaves the updates bar at its final state.
    pub fn finish(&self) {
        self.rollouts.finish_and_clear();
        self.updates.finish();
    }
}

fn style(template: &str) -> ProgressStyle {
    // The templates are constants; the fallback only guards a typo.
    ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_bar())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_done_keeps_in_flight_rollouts_and_advances_updates() {
        let p = Progress::new(5, true);
        p.rollouts_launched(8);
        for ok in [true, true, false] {
            p.rollout_finished(ok);
        }
        assert_eq!(p.rollouts.message(), "(1 failed)");
        p.step_done(&StepRecord {
            step: 1,
            total_steps: 5,
            reward_mean: Some(0.5),
            ..StepRecord::default()
        });
        assert_eq!((p.rollouts.position(), p.rollouts.length()), (0, Some(5)));
        assert_eq!(p.rollouts.message(), "");
        assert_eq!(p.updates.position(), 1);
        assert_eq!(p.updates.message(), "reward 0.500");
        p.finish();
        assert!(p.updates.is_finished());
    }
}
