//! Advantages, computed once per rollout from the rewards of its group.
//!
//! - GRPO: `A_i = (r_i - mean_g r) / (std_g r + eps)`, or `r_i - mean_g r`
//!   without std normalisation. `std_g` is the **sample** standard deviation
//!   (Bessel's `n - 1`), as `torch.std` computes it in TRL and verl.
//! - RLOO: `A_i = r_i - mean_{j != i} r_j` (leave-one-out baseline).
//!
//! A group of one rollout has no baseline: its advantage is 0 (it carries no
//! learning signal under either estimator). A group whose rewards are all
//! equal gets 0 everywhere too.

/// Which estimator turns a group's rewards into advantages.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Estimator {
    /// Group-relative: reward minus the group mean, optionally divided by
    /// the group's sample std plus `eps`.
    Grpo { normalize_std: bool, eps: f64 },
    /// Leave-one-out: reward minus the mean of the other rollouts' rewards.
    Rloo,
}

impl Default for Estimator {
    fn default() -> Self {
        Estimator::Grpo {
            normalize_std: true,
            eps: 1e-6,
        }
    }
}

/// The advantage of each reward of one group, in the same order.
pub fn group_advantages(rewards: &[f64], estimator: Estimator) -> Vec<f64> {
    let n = rewards.len();
    if n < 2 {
        return vec![0.0; n];
    }
    let nf = n as f64;
    let sum: f64 = rewards.iter().sum();
    let mean = sum / nf;
    match estimator {
        Estimator::Grpo { normalize_std, eps } => {
            let scale = if normalize_std {
                if rewards.iter().all(|r| *r == rewards[0]) {
                    // No signal; and rounding in the mean must not turn into
                    // +-1 advantages through a tiny std.
                    return vec![0.0; n];
                }
                let var = rewards.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / (nf - 1.0);
                1.0 / (var.sqrt() + eps)
            } else {
                1.0
            };
            rewards.iter().map(|r| (r - mean) * scale).collect()
        }
        Estimator::Rloo => rewards.iter().map(|r| r - (sum - r) / (nf - 1.0)).collect(),
    }
}
