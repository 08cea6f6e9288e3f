//! The RL loss and update on a tiny random model: the batched loss and
//! gradient against a naive per-token implementation of the ARCHITECTURE.md
//! formula, packing invariance, TIS truncation, and a real AdamW step.

use crate::common::tiny_config;
use agl_model::{Model, token_logprobs};
use agl_rl::loss::{TokenInputs, token_loss};
use agl_rl::step::pass_cost;
use agl_rl::{
    AdamWConfig, BatchConfig, Correction, Estimator, LossConfig, LrDecay, LrSchedule, MicroBatch,
    OneRank, Outcome, Packing, PassCost, RlOptimizer, Sample, ScoredRollout, StepConfig,
    UpdateBatch, accumulate_gradients, build_update, evaluate, pack, pack_ffd, score_old_logprobs,
    train_step,
};
use serde_json::json;
use tch::{Kind, Tensor};

const VOCAB: i64 = 300;

/// Test data from a local generator: tch's global RNG is shared by the
/// tests running in parallel, so it cannot make reproducible inputs.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
    }

    fn ids(&mut self, n: usize) -> Vec<i64> {
        (0..n)
            .map(|_| (self.next() * VOCAB as f64) as i64)
            .collect()
    }

    fn uniform(&mut self, n: usize, lo: f64, hi: f64) -> Vec<f32> {
        (0..n)
            .map(|_| (lo + (hi - lo) * self.next()) as f32)
            .collect()
    }
}

/// A sample with a context gap in the mask and random engine logprobs spread
/// around the model's (about -5.7 for a random 300-token vocabulary), so some
/// tokens hit the TIS threshold.
fn sample(rng: &mut Rng, prompt: usize, response: usize, with_ref: bool) -> Sample {
    Sample {
        prompt_ids: rng.ids(prompt),
        response_ids: rng.ids(response),
        mask: Sample::mask_from_spans(response, &[0..response / 2, response / 2 + 2..response]),
        engine_logprobs: rng.uniform(response, -8.0, -4.5),
        weight_version: 0,
        token_versions: None,
        ref_logprobs: with_ref.then(|| rng.uniform(response, -7.0, -5.0)),
    }
}

/// Two groups; rollouts with 1 to 3 samples of different lengths; one agent
/// failure (trained) and one system failure (excluded).
pub(crate) fn rollouts() -> Vec<ScoredRollout> {
    let rng = &mut Rng(7);
    let r =
        |id: &str, g: &str, reward: f64, outcome: Outcome, samples: Vec<Sample>| ScoredRollout {
            id: id.into(),
            group_id: g.into(),
            reward: Some(reward),
            outcome,
            samples,
        };
    vec![
        r(
            "a",
            "g1",
            1.0,
            Outcome::Succeeded,
            vec![
                sample(rng, 5, 9, true),
                sample(rng, 12, 6, false),
                sample(rng, 3, 14, false),
            ],
        ),
        r(
            "b",
            "g1",
            0.0,
            Outcome::AgentFailure,
            vec![sample(rng, 7, 5, false)],
        ),
        r(
            "c",
            "g1",
            0.5,
            Outcome::Succeeded,
            vec![sample(rng, 4, 11, false), sample(rng, 9, 7, true)],
        ),
        r(
            "x",
            "g1",
            1.0,
            Outcome::SystemFailure,
            vec![sample(rng, 4, 4, false)],
        ),
        r(
            "d",
            "g2",
            2.0,
            Outcome::Succeeded,
            vec![sample(rng, 6, 8, false)],
        ),
        r(
            "e",
            "g2",
            -1.0,
            Outcome::Succeeded,
            vec![sample(rng, 2, 13, false), sample(rng, 8, 4, false)],
        ),
    ]
}

fn estimator() -> Estimator {
    Estimator::Grpo {
        normalize_std: true,
        eps: 1e-6,
    }
}

pub(crate) fn cfg() -> StepConfig {
    StepConfig {
        loss: LossConfig {
            eps_low: 0.2,
            eps_high: 0.28,
            correction: Correction::TokenTis { high: 2.0 },
            kl_coef: 0.05,
        },
        temperature: 0.8,
        token_budget: 64,
        micro_batch_overhead: 0,
        max_grad_norm: Some(1.0),
        bf16_autocast: true,
        entropy: true,
        lean: Default::default(),
    }
}

/// The batch, with `old` logprobs = the model's own, perturbed so that some
/// ratios leave the clip range.
pub(crate) fn prepared(model: &Model) -> UpdateBatch {
    let p = build_update(
        rollouts(),
        &BatchConfig {
            estimator: estimator(),
            ..BatchConfig::default()
        },
    )
    .unwrap();
    assert_eq!(p.stats.excluded_system_failure, 1);
    let mut batch = p.batch;
    score_old_logprobs(model, &mut batch, &cfg()).unwrap();
    let rng = &mut Rng(8);
    for s in &mut batch.samples {
        let old = s.old_logprobs.as_mut().unwrap();
        let noise = rng.uniform(old.len(), -0.4, 0.4);
        old.iter_mut().zip(noise).for_each(|(o, n)| *o += n);
    }
    batch
}

/// A reproducible random model. `crate::common::random_model` draws in the
/// var store's hash-map order, which changes from run to run, and tch's RNG
/// is global while tests run in parallel: so draw in name order, one model
/// at a time.
pub(crate) fn test_model(seed: i64) -> Model {
    let model = Model::new(tiny_config(json!({})), Kind::Float, tch::Device::Cpu).unwrap();
    let _guard = crate::common::RNG
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    tch::manual_seed(seed);
    let mut vars = model
        .var_store()
        .variables()
        .into_iter()
        .collect::<Vec<_>>();
    vars.sort_by(|a, b| a.0.cmp(&b.0));
    let fresh: Vec<(String, Tensor)> = vars
        .into_iter()
        .map(|(name, t)| {
            let noise = Tensor::randn(t.size(), (Kind::Float, tch::Device::Cpu));
            let value = if name.contains("norm") {
                noise * 0.2 + 1.0
            } else {
                noise * 0.1
            };
            (name, value)
        })
        .collect();
    model.load_weights_in_place(&fresh).unwrap();
    model
}

fn zero_grads(model: &Model) {
    for p in model.var_store().trainable_variables() {
        let mut g = p.grad();
        if g.defined() {
            let _ = g.zero_();
        }
    }
}

fn grads(model: &Model) -> Vec<(String, Tensor)> {
    let mut v: Vec<(String, Tensor)> = model
        .var_store()
        .variables()
        .into_iter()
        .map(|(n, p)| (n, p.grad().copy()))
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

fn max_grad_diff(a: &[(String, Tensor)], b: &[(String, Tensor)]) -> (f64, f64) {
    let mut diff: f64 = 0.0;
    let mut scale: f64 = 0.0;
    for ((na, ga), (nb, gb)) in a.iter().zip(b) {
        assert_eq!(na, nb);
        diff = diff.max(f64::try_from((ga - gb).abs().max()).unwrap());
        scale = scale.max(f64::try_from(ga.abs().max()).unwrap());
    }
    (diff, scale)
}

/// ARCHITECTURE.md, Training, written out literally: advantages from the rewards,
/// then `(1/N) sum_i (1/T_i) sum_s sum_t m * l`, one token at a time, with
/// every sample run through the model on its own.
fn naive_loss(model: &Model, batch: &UpdateBatch, c: &StepConfig) -> Tensor {
    let kept: Vec<ScoredRollout> = rollouts()
        .into_iter()
        .filter(|r| r.outcome != Outcome::SystemFailure)
        .collect();
    let mut advantages = Vec::new();
    for g in ["g1", "g2"] {
        let rewards: Vec<f64> = kept
            .iter()
            .filter(|r| r.group_id == g)
            .map(|r| r.reward.unwrap())
            .collect();
        let n = rewards.len() as f64;
        let mean = rewards.iter().sum::<f64>() / n;
        let std = (rewards.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt();
        advantages.extend(rewards.iter().map(|r| (r - mean) / (std + 1e-6)));
    }
    let n = kept.len() as f64;
    let mut total = Tensor::zeros([], (Kind::Float, tch::Device::Cpu));
    let mut k = 0; // index into batch.samples, for the `old` logprobs
    for (rollout, adv) in kept.iter().zip(advantages) {
        let t_i: usize = rollout
            .samples
            .iter()
            .map(|s| s.mask.iter().filter(|m| **m).count())
            .sum();
        let mut rollout_sum = Tensor::zeros([], (Kind::Float, tch::Device::Cpu));
        for s in &rollout.samples {
            let old = batch.samples[k].old_logprobs.clone().unwrap();
            k += 1;
            let tokens: Vec<i64> = s
                .prompt_ids
                .iter()
                .chain(&s.response_ids)
                .copied()
                .collect();
            let tokens = Tensor::from_slice(&tokens).view([1, -1]);
            let lp = token_logprobs(
                &model.forward(&tokens, None).unwrap(),
                &tokens,
                c.temperature,
            );
            let p = s.prompt_ids.len() as i64;
            for t in 0..s.response_ids.len() {
                if !s.mask[t] {
                    continue;
                }
                let new = lp.get(0).get(p + t as i64 - 1);
                let ratio = (&new - old[t] as f64).exp();
                let surrogate = (&ratio * adv)
                    .minimum(&(ratio.clamp(1.0 - c.loss.eps_low, 1.0 + c.loss.eps_high) * adv));
                let tis = ((old[t] - s.engine_logprobs[t]) as f64).exp().min(2.0);
                let mut l = -surrogate * tis;
                if let Some(r) = &s.ref_logprobs {
                    let log_ratio = -(&new) + r[t] as f64;
                    l += (log_ratio.exp() - log_ratio - 1.0) * c.loss.kl_coef;
                }
                rollout_sum += l;
            }
        }
        total += rollout_sum / t_i as f64;
    }
    assert_eq!(k, batch.samples.len());
    total / n
}

#[test]
fn loss_and_gradient_match_the_naive_formula() {
    let model = test_model(21);
    let batch = prepared(&model);
    let c = cfg();
    zero_grads(&model);
    let naive = naive_loss(&model, &batch, &c);
    naive.backward();
    let naive_grads = grads(&model);

    zero_grads(&model);
    let packing = pack_ffd(&agl_rl::step::lengths(&batch), c.token_budget);
    assert!(packing.micro_batches.len() > 1);
    let stats = accumulate_gradients(&model, &batch, &packing, &c).unwrap();
    let naive = f64::try_from(&naive).unwrap();
    assert!(
        (stats.loss - naive).abs() < 1e-6,
        "{} vs {naive}",
        stats.loss
    );
    let (diff, scale) = max_grad_diff(&grads(&model), &naive_grads);
    println!("loss {naive:.6}, grad max |diff| {diff:.2e} (max |grad| {scale:.2e}), {stats:?}");
    assert!(diff < 1e-6, "{diff}");
    // The batch exercises every branch of the loss.
    assert!(
        stats.clip_fraction > 0.0 && stats.clip_fraction < 1.0,
        "{stats:?}"
    );
    assert!(
        stats.corrected_fraction > 0.0 && stats.corrected_fraction < 1.0,
        "{stats:?}"
    );
    assert!(stats.ref_kl.is_some_and(|k| k > 0.0) && stats.approx_kl > 0.0);
    assert!(stats.entropy > 0.0 && stats.entropy < (VOCAB as f64).ln());
}

#[test]
fn the_gradient_does_not_depend_on_the_packing() {
    let model = test_model(22);
    let batch = prepared(&model);
    // Sequence-level corrections too: a sequence is one row, whatever the packing.
    for correction in [
        Correction::TokenTis { high: 2.0 },
        Correction::SequenceTis { high: 1.5 },
        Correction::TokenMask {
            low: 0.8,
            high: 1.25,
        },
        Correction::SequenceMask {
            low: 0.5,
            high: 2.0,
        },
    ] {
        let c = StepConfig {
            loss: LossConfig {
                correction,
                ..cfg().loss
            },
            ..cfg()
        };
        same_gradient_for_every_packing(&model, &batch, &c);
    }
}

fn same_gradient_for_every_packing(model: &Model, batch: &UpdateBatch, c: &StepConfig) {
    let lengths = agl_rl::step::lengths(batch);
    let n = lengths.len();
    let dear_attention = PassCost {
        overhead: 2,
        attention_span: 1,
    };
    let packings = [
        Packing::from_groups(&lengths, vec![(0..n).collect()]),
        Packing::from_groups(&lengths, (0..n).map(|i| vec![i]).collect()),
        pack_ffd(&lengths, 48),
        // The trainer's own: a pass worth 2 slots cuts this batch's runs.
        pack(&lengths, 1 << 20, dear_attention),
        // Samples end to end in shared rows: pairs in one micro-batch, and
        // three in a row beside one alone, then the rest.
        Packing::from_rows(
            &lengths,
            vec![
                (0..n)
                    .collect::<Vec<_>>()
                    .chunks(2)
                    .map(<[usize]>::to_vec)
                    .collect(),
            ],
        ),
        Packing::from_rows(
            &lengths,
            vec![
                vec![vec![2, 0, 1], vec![3]],
                (4..n)
                    .collect::<Vec<_>>()
                    .chunks(3)
                    .map(<[usize]>::to_vec)
                    .collect(),
            ],
        ),
    ];
    let mut results = Vec::new();
    for packing in &packings {
        zero_grads(model);
        let stats = accumulate_gradients(model, batch, packing, c).unwrap();
        results.push((stats, grads(model)));
    }
    for cut in &packings[2..4] {
        assert!(
            cut.micro_batches.len() > 1 && cut.micro_batches.len() < n,
            "{cut:?}"
        );
    }
    assert!(
        packings[4..]
            .iter()
            .all(|p| p.micro_batches.iter().all(MicroBatch::is_packed))
    );
    // The correction is at work (some tokens truncated or masked), not all.
    let corrected = results[0].0.corrected_fraction;
    assert!(corrected > 0.0 && corrected < 1.0, "{corrected}");
    for (stats, g) in &results[1..] {
        let (diff, scale) = max_grad_diff(g, &results[0].1);
        println!(
            "{:?}, packing: {} micro-batches, grad diff {diff:.2e} of {scale:.2e}",
            c.loss.correction, stats.micro_batches
        );
        // A row's values do not depend on its micro-batch, but the weight
        // gradients sum rows in f32 in an order that does (MKL blocks a
        // product by its rows; micro-batches add into `.grad`): they agree
        // to a few ulps of the largest, where a packing bug (a sample
        // weighed twice, a micro-batch's normaliser) moves them by percents.
        assert!(diff < 2e-6 * scale, "{diff} of {scale}");
        assert!((stats.loss - results[0].0.loss).abs() < 1e-6);
        assert_eq!(stats.trainable_tokens, results[0].0.trainable_tokens);
        assert_eq!(stats.corrected_fraction, results[0].0.corrected_fraction);
        assert_eq!(
            stats.outside_sequence_fraction,
            results[0].0.outside_sequence_fraction
        );
    }
}

#[test]
fn tis_truncates_at_the_threshold() {
    // Direct: ratio 1, advantage 1, weight 1; engine 5 nats below -> weight
    // min(e^5, 2) = 2; 0.1 below -> e^0.1.
    let new = Tensor::from_slice(&[-1.0f32, -2.0]).set_requires_grad(true);
    let old = new.detach();
    let engine = Tensor::from_slice(&[-6.0f32, -2.1]);
    let ones = Tensor::ones([2], (Kind::Float, tch::Device::Cpu));
    let x = TokenInputs {
        new: &new,
        old: &old,
        engine: &engine,
        advantage: &ones,
        weight: &ones,
        trainable: &ones,
        reference: None,
    };
    let out = token_loss(&x, &LossConfig::default());
    let expected = -(2.0 + 0.1f64.exp());
    assert!((f64::try_from(&out.loss).unwrap() - expected).abs() < 1e-5);
    assert_eq!(out.corrected_tokens, 1.0);
    out.loss.backward();
    let g = Vec::<f32>::try_from(new.grad()).unwrap();
    assert!(
        (g[0] + 2.0).abs() < 1e-5 && (g[1] as f64 + 0.1f64.exp()).abs() < 1e-5,
        "{g:?}"
    );

    // Through the model: engine logprobs far below the trainer's everywhere.
    let model = test_model(23);
    let mut batch = build_update(rollouts(), &BatchConfig::default())
        .unwrap()
        .batch;
    let c = StepConfig {
        loss: LossConfig {
            kl_coef: 0.0,
            ..cfg().loss
        },
        ..cfg()
    };
    score_old_logprobs(&model, &mut batch, &c).unwrap();
    for s in &mut batch.samples {
        s.engine_logprobs = s
            .old_logprobs
            .clone()
            .unwrap()
            .iter()
            .map(|o| o - 10.0)
            .collect();
    }
    let stats = evaluate(&model, &batch, &c).unwrap();
    assert_eq!(stats.corrected_fraction, 1.0);
    // ratio 1 everywhere, so L = -2 * sum w A = -2 * mean advantage.
    assert!(
        (stats.loss + 2.0 * stats.mean_advantage).abs() < 1e-6,
        "{stats:?}"
    );
}

/// Scoring (the head on response tokens alone, packed with padding, whole
/// or in chunks) gives each response token the logprob of the sample's own
/// full forward.
#[test]
fn scored_logprobs_match_a_forward_of_each_sample_alone() {
    use agl_model::Lean;
    let model = test_model(26);
    // A pass dear enough (10k slots) that one pass holds all, the samples
    // sharing rows.
    for (logprob_chunk, micro_batch_overhead) in [(0, 0), (3, 0), (0, 10_000), (3, 10_000)] {
        let mut batch = build_update(rollouts(), &BatchConfig::default())
            .unwrap()
            .batch;
        let c = StepConfig {
            lean: Lean {
                checkpoint_layers: false,
                logprob_chunk,
            },
            micro_batch_overhead,
            token_budget: 1 << 20,
            ..cfg()
        };
        let lengths = agl_rl::step::lengths(&batch);
        let packing = pack(&lengths, c.token_budget, pass_cost(&model, &c));
        let packed = packing.micro_batches.iter().any(MicroBatch::is_packed);
        assert_eq!(packed, micro_batch_overhead > 0, "{packing:?}");
        score_old_logprobs(&model, &mut batch, &c).unwrap();
        for s in &batch.samples {
            let tokens = Tensor::from_slice(&s.tokens).view([1, -1]);
            let full = token_logprobs(
                &model.forward(&tokens, None).unwrap(),
                &tokens,
                c.temperature,
            );
            let n = (s.len() - s.prompt_len) as i64;
            let want =
                Vec::<f32>::try_from(full.get(0).narrow(0, s.prompt_len as i64 - 1, n)).unwrap();
            let got = s.old_logprobs.as_ref().unwrap();
            assert_eq!(got.len(), want.len());
            for (g, w) in got.iter().zip(&want) {
                assert!((g - w).abs() < 1e-5, "chunk {logprob_chunk}: {g} vs {w}");
            }
        }
    }
}

#[test]
fn an_adamw_step_lowers_the_loss() {
    let model = test_model(24);
    let mut batch = build_update(rollouts(), &BatchConfig::default())
        .unwrap()
        .batch;
    let c = cfg();
    score_old_logprobs(&model, &mut batch, &c).unwrap();
    let before = evaluate(&model, &batch, &c).unwrap();
    let schedule = LrSchedule {
        peak_lr: 1e-3,
        warmup_steps: 2,
        decay: LrDecay::Constant,
    };
    let mut opt = RlOptimizer::new(&model, AdamWConfig::default(), schedule).unwrap();
    let stats = train_step(&model, &mut opt, &batch, &c, &mut OneRank).unwrap();
    let after = evaluate(&model, &batch, &c).unwrap();
    println!(
        "loss {:.5} -> {:.5}; step {stats:?}",
        before.loss, after.loss
    );
    assert!((stats.loss - before.loss).abs() < 1e-6);
    assert_eq!(stats.lr, 5e-4);
    assert_eq!(opt.steps(), 1);
    assert!(stats.grad_norm > 0.0);
    assert!(
        after.loss < before.loss,
        "{} -> {}",
        before.loss,
        after.loss
    );
    assert!(after.approx_kl > 0.0);
}

#[test]
fn zero_advantage_samples_are_skipped_and_the_gradient_is_the_same() {
    let c = StepConfig {
        max_grad_norm: None,
        ..cfg()
    };
    let model = test_model(26);
    let mut batch = prepared(&model);
    // Half the samples get advantage 0: those without reference logprobs
    // add nothing (no KL term); one with a reference still counts.
    let mut skippable = 0;
    for (i, s) in batch.samples.iter_mut().enumerate() {
        if i % 2 == 0 {
            s.advantage = 0.0;
            if i > 0 {
                s.ref_logprobs = None;
                skippable += 1;
            }
        }
    }
    assert!(
        batch.samples[0].ref_logprobs.is_some(),
        "sample 0 keeps its KL term"
    );
    assert!(skippable > 0);

    // Every sample through forward and backward.
    let full = pack_ffd(&agl_rl::step::lengths(&batch), c.token_budget);
    zero_grads(&model);
    let all = accumulate_gradients(&model, &batch, &full, &c).unwrap();
    let expected = grads(&model);

    // The update as train_step runs it (its gradients stay in `.grad`).
    zero_grads(&model);
    let schedule = LrSchedule {
        peak_lr: 1e-3,
        warmup_steps: 0,
        decay: LrDecay::Constant,
    };
    let mut opt = RlOptimizer::new(&model, AdamWConfig::default(), schedule).unwrap();
    let stats = train_step(&model, &mut opt, &batch, &c, &mut OneRank).unwrap();
    let (diff, scale) = max_grad_diff(&grads(&model), &expected);
    println!(
        "skipped {} of {}: grad diff {diff:.2e} (max {scale:.2e})",
        stats.skipped_samples, stats.samples
    );
    assert_eq!(stats.skipped_samples, skippable);
    assert_eq!(stats.samples, batch.samples.len());
    assert_eq!(
        stats.trainable_tokens, all.trainable_tokens,
        "counts every sample"
    );
    assert!(scale > 0.0 && diff < 1e-6, "{diff}");
    assert!(
        (stats.loss - all.loss).abs() < 1e-6,
        "{} vs {}",
        stats.loss,
        all.loss
    );
    assert!(stats.engine_kl.is_finite() && stats.engine_kl >= 0.0);
}

/// Activation checkpointing and chunked logprobs (`StepConfig::lean`)
/// give the same loss, statistics and gradient as the plain forward, full
/// fine-tuning and LoRA.
#[test]
fn lean_training_gives_the_same_gradient() {
    use agl_model::{Lean, LoraConfig};
    for lora in [false, true] {
        let mut model = test_model(5);
        if lora {
            model.add_lora(&LoraConfig::default()).unwrap();
            // B starts at zero: give the adapter a gradient path of its own.
            tch::no_grad(|| {
                for (_, mut p) in model.trainable_parameters() {
                    let _ = p.uniform_(-0.05, 0.05);
                }
            });
        }
        let batch = prepared(&model);
        let c = cfg();
        let lengths = agl_rl::step::lengths(&batch);
        let packing = pack_ffd(&lengths, c.token_budget);
        // Samples end to end in shared rows, for the lean path too.
        let pairs: Vec<Vec<usize>> = (0..lengths.len())
            .collect::<Vec<_>>()
            .chunks(2)
            .map(<[usize]>::to_vec)
            .collect();
        let packed = Packing::from_rows(&lengths, vec![pairs]);
        let trainable = || -> Vec<(String, Tensor)> {
            model
                .trainable_parameters()
                .into_iter()
                .map(|(n, p)| (n, p.grad().copy()))
                .collect()
        };
        let zero = || {
            for (_, p) in model.trainable_parameters() {
                let mut g = p.grad();
                if g.defined() {
                    let _ = g.zero_();
                }
            }
        };
        zero();
        let plain = accumulate_gradients(&model, &batch, &packing, &c).unwrap();
        let expected = trainable();
        for (checkpoint_layers, logprob_chunk, rows) in [
            (true, 0, &packing),
            (false, 3, &packing),
            (true, 5, &packing),
            (true, 1000, &packing),
            (true, 0, &packed),
            (false, 3, &packed),
        ] {
            zero();
            let lean = StepConfig {
                lean: Lean {
                    checkpoint_layers,
                    logprob_chunk,
                },
                ..c
            };
            let stats = accumulate_gradients(&model, &batch, rows, &lean).unwrap();
            let (diff, scale) = max_grad_diff(&expected, &trainable());
            let case = format!(
                "lora {lora}, checkpoint {checkpoint_layers}, chunk {logprob_chunk}, packed {}",
                rows.micro_batches[0].is_packed()
            );
            assert!(scale > 1e-4, "{case}: a gradient to compare ({scale})");
            assert!(diff <= 1e-5 * scale, "{case}: grad diff {diff} of {scale}");
            assert!((stats.loss - plain.loss).abs() < 1e-6, "{case}: loss");
            assert!(
                (stats.entropy - plain.entropy).abs() < 1e-5,
                "{case}: entropy"
            );
            assert!(
                (stats.clip_fraction - plain.clip_fraction).abs() < 1e-9,
                "{case}"
            );
            assert!(
                (stats.ref_kl.unwrap() - plain.ref_kl.unwrap()).abs() < 1e-6,
                "{case}"
            );
        }
    }
}
