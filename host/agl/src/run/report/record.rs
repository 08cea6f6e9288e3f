//! Filling a [`StepRecord`] (`agl_wire::metrics`, one line of
//! `metrics.jsonl`) from what the trainer reported.

use agl_rl::{BatchStats, StepStats};
pub use agl_wire::metrics::{BREAK_OTHER, BREAK_RETOKENIZE, BREAK_TEMPLATE, StepRecord};

/// The trainer's statistics copied into a step record.
pub trait TrainerStats {
    /// Copies what `build_update` kept, excluded and carried.
    fn set_batch_stats(&mut self, s: &BatchStats);
    /// Copies what `train_step` reported; NaN statistics become `None`.
    fn set_step_stats(&mut self, s: &StepStats);
}

impl TrainerStats for StepRecord {
    fn set_batch_stats(&mut self, s: &BatchStats) {
        self.groups = s.groups;
        self.rollouts = s.rollouts;
        self.samples = s.samples;
        self.excluded_system = s.excluded_system_failure;
        self.excluded_no_reward = s.excluded_no_reward;
        self.carried_groups = s.carried_groups;
        self.stale_tokens = s.stale_tokens;
        self.reward_mean = (s.rollouts > 0).then_some(s.mean_reward).and_then(finite);
    }

    fn set_step_stats(&mut self, s: &StepStats) {
        self.tokens = s.trainable_tokens;
        self.samples = s.samples;
        self.micro_batches = s.micro_batches;
        self.skipped_samples = s.skipped_samples;
        if s.skipped_samples >= s.samples {
            // Nothing ran (every group scored alike): no loss, gradient or
            // token statistics to report, not zeros.
            return;
        }
        super::table::record_update(self, s);
    }
}

fn finite(x: f64) -> Option<f64> {
    x.is_finite().then_some(x)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trainer_stats_map_nan_to_none() {
        let mut rec = StepRecord::default();
        rec.set_step_stats(&StepStats {
            loss: 0.25,
            entropy: f64::NAN,
            trainable_tokens: 300,
            samples: 7,
            micro_batches: 2,
            padding_waste: 0.1,
            ..StepStats::default()
        });
        assert_eq!(rec.figure("loss"), Some(0.25));
        assert_eq!(rec.figure("entropy"), None);
        assert_eq!((rec.tokens, rec.samples, rec.micro_batches), (300, 7, 2));

        rec.set_batch_stats(&BatchStats {
            groups: 4,
            rollouts: 0,
            mean_reward: 0.0,
            excluded_system_failure: 3,
            ..BatchStats::default()
        });
        assert_eq!(rec.reward_mean, None, "no kept rollout, no mean");
        assert_eq!((rec.groups, rec.excluded_system), (4, 3));
    }
}
