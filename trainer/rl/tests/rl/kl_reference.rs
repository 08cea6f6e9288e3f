//! `kl_coef` under LoRA: the KL term's reference is the base with the
//! adapter switched off (`Model::without_adapter`, what the trainer thread
//! scores the reference with), not the adapted policy: its logprobs are the
//! base model's, the adapter is back on after, and once a step has moved the
//! adapter the step reports `ref_kl > 0`.

use agl_model::{LoraConfig, Model};
use agl_rl::{
    AdamWConfig, LrDecay, LrSchedule, OneRank, RlOptimizer, UpdateBatch, evaluate,
    score_ref_logprobs, train_step,
};

use crate::rl_step::{cfg, prepared, test_model};

/// Each sample's reference logprobs, end to end.
fn refs(batch: &UpdateBatch) -> Vec<f32> {
    batch
        .samples
        .iter()
        .flat_map(|s| s.ref_logprobs.clone().expect("scored"))
        .collect()
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// `batch` scored by `reference` (its reference logprobs replaced).
fn scored(reference: &Model, batch: &UpdateBatch) -> Vec<f32> {
    let mut batch = batch.clone();
    score_ref_logprobs(reference, &mut batch, &cfg()).unwrap();
    refs(&batch)
}

#[test]
fn under_lora_the_kl_reference_is_the_base_without_the_adapter() {
    let base = test_model(31);
    let mut policy = test_model(31);
    policy.add_lora(&LoraConfig::default()).unwrap();
    let c = cfg();
    assert!(c.loss.kl_coef > 0.0);
    let mut batch = prepared(&policy);

    // LoRA's B starts at zero: the adapted policy is the base, KL 0.
    policy
        .without_adapter(|b| score_ref_logprobs(b, &mut batch, &c))
        .unwrap();
    let at_start = evaluate(&policy, &batch, &c).unwrap();
    assert!(
        at_start.ref_kl.is_some_and(|k| k.abs() < 1e-9),
        "{at_start:?}"
    );

    // One step moves the adapter away from the base.
    let schedule = LrSchedule {
        peak_lr: 1e-2,
        warmup_steps: 0,
        decay: LrDecay::Constant,
    };
    let mut opt = RlOptimizer::new(&policy, AdamWConfig::default(), schedule).unwrap();
    train_step(&policy, &mut opt, &batch, &c, &mut OneRank).unwrap();

    let reference = policy.without_adapter(|b| scored(b, &batch));
    let (to_base, to_policy) = (
        max_diff(&reference, &scored(&base, &batch)),
        max_diff(&reference, &scored(&policy, &batch)),
    );
    println!("reference vs the base {to_base:.2e}, vs the adapted policy {to_policy:.2e}");
    assert!(to_base < 1e-5, "the reference is the base: {to_base}");
    assert!(to_policy > 1e-3, "not the adapted policy: {to_policy}");
    // The adapter is back on after scoring without it.
    assert!(max_diff(&scored(&policy, &batch), &reference) > 1e-3);

    let after = evaluate(&policy, &batch, &c).unwrap();
    assert!(after.ref_kl.is_some_and(|k| k > 0.0), "{after:?}");
}
