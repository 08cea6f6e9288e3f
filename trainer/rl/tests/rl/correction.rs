//! The off-policy corrections and the mismatch figures of `token_loss`, on
//! hand-computed values (no model: the inputs are the logprobs).

use agl_rl::Correction;
use agl_rl::LossConfig;
use agl_rl::loss::{LossOutput, TokenInputs, token_loss};
use tch::{Kind, Tensor};

/// Two sequences (rows) of two trained tokens whose importance ratios
/// `exp(old - eng)` are 3, 0.8 and 1.5, 0.4 (sequence ratios 2.4 and 0.6).
/// The trainer's `new` equals `old` (ratio 1), advantage and weight 1, so
/// each token's loss is `-c` and its gradient `-c`, `c` the correction.
const RATIOS: [f64; 4] = [3.0, 0.8, 1.5, 0.4];

fn run(correction: Correction) -> (LossOutput, Vec<f32>) {
    let new = Tensor::zeros([2, 2], (Kind::Float, tch::Device::Cpu)).set_requires_grad(true);
    let old = new.detach();
    let engine: Vec<f32> = RATIOS.iter().map(|r| -r.ln() as f32).collect();
    let engine = Tensor::from_slice(&engine).view([2, 2]);
    let ones = Tensor::ones([2, 2], (Kind::Float, tch::Device::Cpu));
    let out = token_loss(
        &TokenInputs {
            new: &new,
            old: &old,
            engine: &engine,
            advantage: &ones,
            weight: &ones,
            trainable: &ones,
            reference: None,
        },
        &LossConfig {
            correction,
            ..LossConfig::default()
        },
    );
    out.loss.backward();
    let grad = Vec::<f32>::try_from(new.grad().view([4])).unwrap();
    (out, grad)
}

fn near(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-5
}

#[test]
fn each_correction_weighs_the_policy_gradient_as_its_formula_says() {
    let cases: [(Correction, [f64; 4], f64); 5] = [
        (Correction::None, [1.0, 1.0, 1.0, 1.0], 0.0),
        // min(rho_t, 2): the 3 is truncated.
        (
            Correction::TokenTis { high: 2.0 },
            [2.0, 0.8, 1.5, 0.4],
            1.0,
        ),
        // min(rho_s, 2): 2.4 -> 2 on both tokens of row 0; 0.6 kept.
        (
            Correction::SequenceTis { high: 2.0 },
            [2.0, 2.0, 0.6, 0.6],
            2.0,
        ),
        // 3 and 0.4 leave [0.5, 2]: masked.
        (
            Correction::TokenMask {
                low: 0.5,
                high: 2.0,
            },
            [0.0, 1.0, 1.0, 0.0],
            2.0,
        ),
        // Row 0's 2.4 leaves [0.5, 2]: the whole row is masked.
        (
            Correction::SequenceMask {
                low: 0.5,
                high: 2.0,
            },
            [0.0, 0.0, 1.0, 1.0],
            2.0,
        ),
    ];
    for (correction, weights, corrected) in cases {
        let (out, grad) = run(correction);
        let loss = f64::try_from(&out.loss).unwrap();
        let expected: f64 = -weights.iter().sum::<f64>();
        assert!(near(loss, expected), "{correction:?}: {loss} vs {expected}");
        for (g, w) in grad.iter().zip(weights) {
            assert!(near(*g as f64, -w), "{correction:?}: grad {grad:?}");
        }
        assert_eq!(out.corrected_tokens, corrected, "{correction:?}");
    }
}

#[test]
fn the_mismatch_is_measured_against_the_corrections_bounds() {
    let gaps: Vec<f64> = RATIOS.iter().map(|r| r.ln().abs()).collect();
    let (tis, _) = run(Correction::TokenTis { high: 2.0 });
    let m = tis.mismatch;
    assert!(near(m.abs_gap_sum, gaps.iter().sum()), "{m:?}");
    assert!(near(m.abs_gap_max, 3f64.ln()), "{m:?}");
    // Truncated IS bounds only from above: the 3 and the row of 2.4.
    assert_eq!(
        (m.tokens_outside, m.sequences, m.sequences_outside),
        (1.0, 2.0, 1.0)
    );
    let (mask, _) = run(Correction::TokenMask {
        low: 0.5,
        high: 2.0,
    });
    // [0.5, 2]: the 3 and the 0.4; row 1's 0.6 is inside.
    let m = mask.mismatch;
    assert_eq!((m.tokens_outside, m.sequences_outside), (2.0, 1.0));
    // The k3 estimate of KL(engine || trainer): sum of e^g - g - 1 over g = old - eng.
    let k3: f64 = RATIOS.iter().map(|r| r - r.ln() - 1.0).sum();
    assert!(near(tis.engine_kl_sum, k3), "{} vs {k3}", tis.engine_kl_sum);
}

#[test]
fn a_long_sequences_ratio_is_bounded_in_log_space() {
    // 2,000 tokens each a nat above the engine: a product of e^2000, which
    // overflows f64; in log space it is truncated to `high` (or masked).
    let n = 2000;
    let new = Tensor::zeros([1, n], (Kind::Float, tch::Device::Cpu)).set_requires_grad(true);
    let old = new.detach();
    let engine = Tensor::full([1, n], -1.0, (Kind::Float, tch::Device::Cpu));
    let ones = Tensor::ones([1, n], (Kind::Float, tch::Device::Cpu));
    let weight = &ones / n as f64;
    for (correction, want) in [
        (Correction::SequenceTis { high: 2.0 }, -2.0),
        (
            Correction::SequenceMask {
                low: 0.5,
                high: 2.0,
            },
            0.0,
        ),
    ] {
        let out = token_loss(
            &TokenInputs {
                new: &new,
                old: &old,
                engine: &engine,
                advantage: &ones,
                weight: &weight,
                trainable: &ones,
                reference: None,
            },
            &LossConfig {
                correction,
                ..LossConfig::default()
            },
        );
        let loss = f64::try_from(&out.loss).unwrap();
        assert!(near(loss, want), "{correction:?}: {loss}");
    }
}
