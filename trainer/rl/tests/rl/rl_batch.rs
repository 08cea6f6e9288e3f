//! RL inputs without a model: advantages, exclusion, the update cap, the
//! fixed token weights, packing and the LR schedule.

use agl_rl::{
    BatchConfig, Estimator, LossNorm, LrDecay, LrSchedule, Outcome, Packing, Sample, ScoredRollout,
    StaleTokens, UpdateCap, build_update, group_advantages, pack_ffd, pack_in_order,
};

fn close(a: &[f64], b: &[f64]) {
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(b) {
        assert!((x - y).abs() < 1e-9, "{a:?} vs {b:?}");
    }
}

const GRPO_STD: Estimator = Estimator::Grpo {
    normalize_std: true,
    eps: 0.0,
};
const GRPO_MEAN: Estimator = Estimator::Grpo {
    normalize_std: false,
    eps: 0.0,
};

#[test]
fn grpo_divides_by_the_sample_std() {
    // mean 7/3; squared deviations 16/9, 1/9, 25/9; sample var = (42/9) / 2 = 7/3.
    let std = (7.0f64 / 3.0).sqrt();
    let got = group_advantages(&[1.0, 2.0, 4.0], GRPO_STD);
    close(
        &got,
        &[(-4.0 / 3.0) / std, (-1.0 / 3.0) / std, (5.0 / 3.0) / std],
    );
    // Not the population std (sqrt(14/9)).
    let population = (14.0f64 / 9.0).sqrt();
    assert!((got[2] - (5.0 / 3.0) / population).abs() > 0.1);
    // eps is added to the std.
    let with_eps = group_advantages(
        &[1.0, 2.0, 4.0],
        Estimator::Grpo {
            normalize_std: true,
            eps: 0.5,
        },
    );
    close(
        &with_eps,
        &[
            (-4.0 / 3.0) / (std + 0.5),
            (-1.0 / 3.0) / (std + 0.5),
            (5.0 / 3.0) / (std + 0.5),
        ],
    );
}

#[test]
fn grpo_without_std_and_rloo() {
    close(
        &group_advantages(&[1.0, 2.0, 4.0], GRPO_MEAN),
        &[-4.0 / 3.0, -1.0 / 3.0, 5.0 / 3.0],
    );
    // Leave-one-out means: (2+4)/2, (1+4)/2, (1+2)/2.
    close(
        &group_advantages(&[1.0, 2.0, 4.0], Estimator::Rloo),
        &[-2.0, -0.5, 2.5],
    );
}

#[test]
fn singleton_and_equal_groups_have_zero_advantage() {
    for est in [GRPO_STD, GRPO_MEAN, Estimator::Rloo, Estimator::default()] {
        close(&group_advantages(&[0.7], est), &[0.0]);
        close(&group_advantages(&[0.1, 0.1, 0.1], est), &[0.0, 0.0, 0.0]);
        assert!(group_advantages(&[], est).is_empty());
    }
}

fn sample(prompt: usize, response: usize, trained: std::ops::Range<usize>) -> Sample {
    Sample {
        prompt_ids: vec![1; prompt],
        response_ids: vec![2; response],
        mask: Sample::mask_from_spans(response, &[trained]),
        engine_logprobs: vec![-1.0; response],
        weight_version: 0,
        token_versions: None,
        ref_logprobs: None,
    }
}

fn rollout(
    id: &str,
    group: &str,
    reward: Option<f64>,
    outcome: Outcome,
    samples: Vec<Sample>,
) -> ScoredRollout {
    ScoredRollout {
        id: id.into(),
        group_id: group.into(),
        reward,
        outcome,
        samples,
    }
}

fn ok(id: &str, group: &str, reward: f64, samples: Vec<Sample>) -> ScoredRollout {
    rollout(id, group, Some(reward), Outcome::Succeeded, samples)
}

#[test]
fn mask_from_spans_marks_exactly_the_spans() {
    assert_eq!(
        Sample::mask_from_spans(6, &[0..2, 4..9]),
        [true, true, false, false, true, true]
    );
}

#[test]
fn system_failures_and_missing_rewards_are_excluded_and_counted() {
    let rollouts = vec![
        ok("a", "g", 1.0, vec![sample(3, 4, 0..4)]),
        rollout(
            "b",
            "g",
            Some(1.0),
            Outcome::SystemFailure,
            vec![sample(3, 4, 0..4)],
        ),
        rollout(
            "c",
            "g",
            Some(0.0),
            Outcome::AgentFailure,
            vec![sample(3, 4, 0..4)],
        ),
        rollout("d", "g", None, Outcome::Succeeded, vec![sample(3, 4, 0..4)]),
    ];
    let cfg = BatchConfig {
        estimator: Estimator::Rloo,
        ..BatchConfig::default()
    };
    let p = build_update(rollouts, &cfg).unwrap();
    assert_eq!(p.stats.excluded_system_failure, 1);
    assert_eq!(p.stats.excluded_no_reward, 1);
    assert_eq!(p.stats.rollouts, 2);
    assert_eq!(p.batch.rollouts, 2);
    // Only a (1.0) and the agent failure c (0.0) form the group: RLOO +1 / -1.
    let adv: Vec<f64> = p.batch.samples.iter().map(|s| s.advantage as f64).collect();
    close(&adv, &[1.0, -1.0]);
    assert!((p.stats.mean_reward - 0.5).abs() < 1e-12);
}

#[test]
fn every_rollout_gets_the_same_total_weight() {
    // r1: three samples with 2 + 5 + 1 trainable tokens; r2: one sample, 3 tokens.
    let rollouts = vec![
        ok(
            "r1",
            "g",
            1.0,
            vec![sample(2, 4, 0..2), sample(3, 6, 1..6), sample(1, 3, 2..3)],
        ),
        ok("r2", "g", 0.0, vec![sample(4, 5, 0..3)]),
    ];
    let p = build_update(rollouts, &BatchConfig::default()).unwrap();
    assert_eq!(p.batch.samples.len(), 4);
    let total = |r: usize| -> f64 {
        p.batch
            .samples
            .iter()
            .filter(|s| s.rollout == r)
            .flat_map(|s| &s.weights)
            .map(|&w| w as f64)
            .sum()
    };
    assert!((total(0) - 0.5).abs() < 1e-6, "{}", total(0));
    assert!((total(1) - 0.5).abs() < 1e-6, "{}", total(1));
    // Masked-out (context) tokens weigh nothing: r1's first sample trains 0..2 of 4.
    assert_eq!(p.batch.samples[0].weights[2..], [0.0, 0.0]);
    assert!((p.batch.samples[0].weights[0] - 1.0 / 16.0).abs() < 1e-9);
}

#[test]
fn untrainable_rollouts_stay_in_the_baseline_but_not_in_n() {
    let rollouts = vec![
        ok("a", "g", 1.0, vec![sample(2, 3, 0..3)]),
        ok("b", "g", 0.0, vec![sample(2, 3, 0..0)]),
    ];
    let p = build_update(
        rollouts,
        &BatchConfig {
            estimator: GRPO_MEAN,
            ..BatchConfig::default()
        },
    )
    .unwrap();
    assert_eq!(p.batch.rollouts, 1);
    assert_eq!(p.stats.untrainable_rollouts, 1);
    assert_eq!(p.batch.samples.len(), 1);
    assert!((p.batch.samples[0].advantage - 0.5).abs() < 1e-7);
    let total: f32 = p.batch.samples[0].weights.iter().sum();
    assert!((total - 1.0).abs() < 1e-6);
}

#[test]
fn the_update_cap_keeps_groups_whole() {
    // Groups interleaved in the input: g1 (2 rollouts x 1 sample), g2 (3 rollouts,
    // one with 2 samples), g3 (1 rollout).
    let s = || sample(2, 2, 0..2);
    let rollouts = vec![
        ok("a1", "g1", 1.0, vec![s()]),
        ok("b1", "g2", 1.0, vec![s(), s()]),
        ok("a2", "g1", 0.0, vec![s()]),
        ok("b2", "g2", 0.0, vec![s()]),
        ok("c1", "g3", 0.0, vec![s()]),
        ok("b3", "g2", 0.5, vec![s()]),
    ];
    let capped = |cap: UpdateCap| {
        build_update(
            rollouts.clone(),
            &BatchConfig {
                estimator: GRPO_STD,
                cap,
                ..BatchConfig::default()
            },
        )
        .unwrap()
    };

    // 5 samples fit g1 (2) but not g1 + g2 (6): g2 and g3 are carried whole, in order.
    let p = capped(UpdateCap {
        max_samples: Some(5),
        ..UpdateCap::default()
    });
    assert_eq!(p.stats.groups, 1);
    assert_eq!(p.batch.rollouts, 2);
    assert_eq!(p.stats.carried_groups, 2);
    let ids: Vec<Vec<&str>> = p
        .carried
        .iter()
        .map(|g| g.iter().map(|r| r.id.as_str()).collect())
        .collect();
    assert_eq!(ids, [vec!["b1", "b2", "b3"], vec!["c1"]]);
    assert_eq!(
        p.carried[0],
        vec![
            rollouts[1].clone(),
            rollouts[3].clone(),
            rollouts[5].clone()
        ]
    );

    // Tokens: each sample is 4 tokens; g1 + g2 = 24 <= 25 < 28.
    let p = capped(UpdateCap {
        max_tokens: Some(25),
        ..UpdateCap::default()
    });
    assert_eq!(
        (
            p.stats.groups,
            p.stats.carried_groups,
            p.batch.samples.len()
        ),
        (2, 1, 6)
    );

    let p = capped(UpdateCap {
        max_groups: Some(2),
        ..UpdateCap::default()
    });
    assert_eq!((p.stats.groups, p.stats.carried_groups), (2, 1));

    // A first group larger than the cap is trained alone rather than carried forever.
    let p = capped(UpdateCap {
        max_samples: Some(1),
        ..UpdateCap::default()
    });
    assert_eq!(
        (p.stats.groups, p.stats.carried_groups, p.batch.rollouts),
        (1, 2, 2)
    );
}

#[test]
fn malformed_samples_are_rejected() {
    let mut bad = sample(2, 3, 0..3);
    bad.engine_logprobs.pop();
    let err =
        build_update(vec![ok("x", "g", 1.0, vec![bad])], &BatchConfig::default()).unwrap_err();
    assert!(err.to_string().contains("rollout x sample 0"), "{err}");
    let empty_prompt = sample(0, 3, 0..3);
    assert!(
        build_update(
            vec![ok("y", "g", 1.0, vec![empty_prompt])],
            &BatchConfig::default()
        )
        .is_err()
    );
    let nan = ok("z", "g", f64::NAN, vec![sample(1, 1, 0..1)]);
    assert!(build_update(vec![nan], &BatchConfig::default()).is_err());
}

fn check_partition(p: &Packing, n: usize, budget: usize) {
    let mut seen: Vec<usize> = p.micro_batches.iter().flat_map(|m| m.samples()).collect();
    seen.sort();
    assert_eq!(seen, (0..n).collect::<Vec<_>>());
    for mb in &p.micro_batches {
        assert!(mb.slots() <= budget || mb.rows.len() == 1, "{mb:?}");
    }
}

#[test]
fn ffd_packs_under_the_budget_with_less_padding() {
    let lengths = [4, 2];
    let p = pack_ffd(&lengths, 100);
    assert_eq!(p.micro_batches.len(), 1);
    assert!((p.padding_waste() - 0.25).abs() < 1e-12); // 8 slots, 6 real

    // A length mix in the worst order for in-order packing.
    let lengths: Vec<usize> = (0..40)
        .map(|i| if i % 2 == 0 { 20 + i } else { 200 - i })
        .collect();
    let ffd = pack_ffd(&lengths, 800);
    let naive = pack_in_order(&lengths, 800);
    check_partition(&ffd, lengths.len(), 800);
    check_partition(&naive, lengths.len(), 800);
    assert!(
        ffd.padding_waste() < naive.padding_waste(),
        "{} vs {}",
        ffd.padding_waste(),
        naive.padding_waste()
    );

    // Longer than the budget: alone.
    let p = pack_ffd(&[10, 3, 3], 8);
    check_partition(&p, 3, 8);
    assert_eq!(p.micro_batches[0].rows, [[0]]);
}

#[test]
fn lr_warms_up_linearly_then_decays() {
    let constant = LrSchedule {
        peak_lr: 1e-3,
        warmup_steps: 4,
        decay: LrDecay::Constant,
    };
    let lrs: Vec<f64> = (0..6).map(|s| constant.lr_at(s)).collect();
    close(&lrs, &[2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3, 1e-3]);
    let cosine = LrSchedule {
        peak_lr: 1e-3,
        warmup_steps: 2,
        decay: LrDecay::Cosine {
            total_steps: 6,
            min_lr: 1e-4,
        },
    };
    // After warm-up: progress 0, 1/4, 1/2, 1 over 4 steps.
    let mid = 1e-4 + 0.5 * 9e-4;
    close(
        &[
            cosine.lr_at(2),
            cosine.lr_at(4),
            cosine.lr_at(6),
            cosine.lr_at(9),
        ],
        &[1e-3, mid, 1e-4, 1e-4],
    );
    assert!(cosine.lr_at(3) < 1e-3 && cosine.lr_at(3) > mid);
}

/// The weight of each trained token, sample by sample.
fn token_weights(norm: LossNorm) -> Vec<Vec<f32>> {
    // Group a: a1 (samples with 2 and 1 trained tokens, T = 3), a2 (4).
    // Group b: b1 (1), b2 (2). N = 4 rollouts, 5 samples, 2 groups,
    // 10 tokens; group a has 7, group b 3.
    let rollouts = vec![
        ok("a1", "a", 1.0, vec![sample(2, 3, 0..2), sample(2, 1, 0..1)]),
        ok("a2", "a", 0.0, vec![sample(2, 4, 0..4)]),
        ok("b1", "b", 1.0, vec![sample(2, 1, 0..1)]),
        ok("b2", "b", 0.0, vec![sample(2, 2, 0..2)]),
    ];
    let cfg = BatchConfig {
        norm,
        ..BatchConfig::default()
    };
    let batch = build_update(rollouts, &cfg).unwrap().batch;
    batch
        .samples
        .iter()
        .map(|s| s.weights.iter().copied().filter(|w| *w > 0.0).collect())
        .collect()
}

#[test]
fn each_loss_normalisation_weighs_what_it_names() {
    let cases: [(LossNorm, [f64; 5]); 4] = [
        // 1 / (N T_i): every rollout weighs 1/4.
        (
            LossNorm::Rollout,
            [1.0 / 12.0, 1.0 / 12.0, 1.0 / 16.0, 1.0 / 4.0, 1.0 / 8.0],
        ),
        // 1 / T: every token 1/10.
        (LossNorm::Token, [0.1; 5]),
        // 1 / (S T_s): every sample weighs 1/5.
        (
            LossNorm::Sequence,
            [1.0 / 10.0, 1.0 / 5.0, 1.0 / 20.0, 1.0 / 5.0, 1.0 / 10.0],
        ),
        // 1 / (G T_g): every group (prompt) weighs 1/2.
        (
            LossNorm::Group,
            [1.0 / 14.0, 1.0 / 14.0, 1.0 / 14.0, 1.0 / 6.0, 1.0 / 6.0],
        ),
    ];
    for (norm, expected) in cases {
        let got = token_weights(norm);
        assert_eq!(got.len(), 5, "{norm:?}");
        for (sample, want) in got.iter().zip(expected) {
            for w in sample {
                assert!((*w as f64 - want).abs() < 1e-7, "{norm:?}: {got:?}");
            }
        }
        // Every normalisation is a weighted mean: the weights sum to 1.
        let total: f64 = got.iter().flatten().map(|w| *w as f64).sum();
        assert!((total - 1.0).abs() < 1e-6, "{norm:?}: {total}");
    }
}

#[test]
fn tokens_sampled_too_many_versions_ago_are_masked() {
    // Four trained tokens of versions 0..=3; the update trains version 3
    // with at most 1 version of staleness: versions 0 and 1 are too old.
    let mut s = sample(2, 4, 0..4);
    s.token_versions = Some(vec![0, 1, 2, 3]);
    let cfg = BatchConfig {
        stale_tokens: Some(StaleTokens { current: 3, max: 1 }),
        ..BatchConfig::default()
    };
    let p = build_update(vec![ok("a", "g", 1.0, vec![s.clone()])], &cfg).unwrap();
    assert_eq!(p.stats.stale_tokens, 2);
    let weights = &p.batch.samples[0].weights;
    assert_eq!(weights.iter().filter(|w| **w > 0.0).count(), 2);
    assert!(weights[0] == 0.0 && weights[1] == 0.0 && weights[2] > 0.0);
    // Without the bound every token trains.
    let p = build_update(
        vec![ok("a", "g", 1.0, vec![s.clone()])],
        &BatchConfig::default(),
    )
    .unwrap();
    assert_eq!(
        (p.stats.stale_tokens, p.batch.samples[0].trainable_tokens()),
        (0, 4)
    );
    // One version per token, or the sample is refused.
    s.token_versions = Some(vec![3]);
    let e = build_update(vec![ok("a", "g", 1.0, vec![s])], &cfg).unwrap_err();
    assert!(e.to_string().contains("token versions"), "{e}");
}
