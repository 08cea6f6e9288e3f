//! The model, engine and RL step on CUDA against the same weights on CPU.
//! Every test is `#[ignore]`d, so a machine without a GPU (CI) reports them
//! skipped, not passed; `deploy/gpu-check.sh` runs them (`--ignored`) on a
//! GPU machine, where a missing device fails them. `--nocapture` shows the
//! measured differences.

use crate::common::{max_abs_diff, random_model, random_tokens, tiny_config};
use agl_engine::SequenceCache;
use agl_engine::{
    EngineConfig, EngineEvent, EngineHandle, Finished, InFlight, Request, SamplingParams,
};
use agl_model::Model;
use agl_rl::autocast::with_bf16_autocast;
use agl_rl::{
    AdamWConfig, BatchConfig, Correction, LossConfig, LrDecay, LrSchedule, OneRank, Outcome,
    RlOptimizer, Sample, ScoredRollout, StepConfig, StepStats, build_update, score_old_logprobs,
    train_step,
};
use serde_json::json;
use tch::{Device, Kind, Tensor};

/// The device the tests run on: asked for (`--ignored`) without one, they fail.
fn cuda() -> Device {
    assert!(
        tch::Cuda::is_available(),
        "no CUDA device (a CPU torch, or libtorch_cuda not linked)"
    );
    Device::Cuda(0)
}

/// A GQA model (4 heads over 2 kv heads) on CPU.
fn cpu_model(seed: i64) -> Model {
    random_model(tiny_config(json!({})), Kind::Float, seed)
}

/// A copy of `src`'s weights on `device` in `kind`.
fn copy_to(src: &Model, kind: Kind, device: Device) -> Model {
    let dst = Model::new(src.config().clone(), kind, device).unwrap();
    let tensors: Vec<(String, Tensor)> = src.var_store().variables().into_iter().collect();
    dst.load_weights_in_place(&tensors).unwrap();
    dst
}

#[test]
#[ignore = "needs a CUDA device: deploy/gpu-check.sh runs it"]
fn forward_on_cuda_matches_cpu_and_the_cache() {
    let gpu = cuda();
    let cpu = cpu_model(1);
    let model = copy_to(&cpu, Kind::Float, gpu);
    let tokens = random_tokens(2, 24, 300);
    let want = cpu.forward(&tokens, None).unwrap();
    let got = model.forward(&tokens.to_device(gpu), None).unwrap();
    assert_eq!(got.device(), gpu);
    let diff = max_abs_diff(&got.to_device(Device::Cpu), &want);
    println!("cuda vs cpu logits: max abs diff {diff:.2e}");
    assert!(diff < 1e-3, "{diff}");

    // Prefill 5 tokens, then decode one at a time, against the full forward.
    let ids: Vec<i64> = Vec::try_from(tokens.get(0)).unwrap();
    let mut cache = SequenceCache::new(&model, 2, 64);
    let slot = cache.allocate().unwrap();
    let full = got.get(0).to_device(Device::Cpu);
    let out = cache.step(&model, &[(slot, &ids[..5])]).unwrap();
    let mut worst = max_abs_diff(&out.get(0).to_device(Device::Cpu), &full.get(4));
    for i in 5..ids.len() {
        let out = cache.step(&model, &[(slot, &ids[i..=i])]).unwrap();
        worst = worst.max(max_abs_diff(
            &out.get(0).to_device(Device::Cpu),
            &full.get(i as i64),
        ));
    }
    println!("cuda cached vs full forward: max abs diff {worst:.2e}");
    assert!(worst < 1e-3, "{worst}");
}

fn greedy_all(engine: &EngineHandle, prompts: &[Vec<u32>]) -> Vec<Finished> {
    let params = SamplingParams {
        temperature: 0.0,
        max_tokens: 16,
        ..SamplingParams::default()
    };
    let rxs: Vec<_> = prompts
        .iter()
        .map(|p| {
            let request = Request {
                prompt_ids: p.clone(),
                params: params.clone(),
                stop_hook: None,
                constraint: None,
            };
            engine.submit(request).unwrap()
        })
        .collect();
    rxs.into_iter()
        .map(|mut rx| {
            loop {
                if let EngineEvent::Finished(f) = rx.blocking_recv().unwrap() {
                    break f;
                }
            }
        })
        .collect()
}

#[test]
#[ignore = "needs a CUDA device: deploy/gpu-check.sh runs it"]
fn engine_on_cuda_matches_the_cpu_engine() {
    let gpu = cuda();
    let cpu = cpu_model(2);
    let config = EngineConfig {
        max_seqs: 4,
        max_len: 128,
        weight_version: 1,
    };
    let on_cpu =
        EngineHandle::spawn(copy_to(&cpu, Kind::Float, Device::Cpu), config.clone()).unwrap();
    let on_gpu = EngineHandle::spawn(copy_to(&cpu, Kind::Float, gpu), config).unwrap();
    let prompts: Vec<Vec<u32>> = (0..6u32)
        .map(|i| (0..3 + 2 * i).map(|t| (t * 37 + i * 11) % 300).collect())
        .collect();
    let want = greedy_all(&on_cpu, &prompts);
    let got = greedy_all(&on_gpu, &prompts);
    let mut worst = 0f32;
    for (g, w) in got.iter().zip(&want) {
        assert_eq!(g.response_ids, w.response_ids);
        for (a, b) in g.logprobs.iter().zip(&w.logprobs) {
            worst = worst.max((a - b).abs());
        }
    }
    println!("cuda vs cpu engine: same greedy tokens, logprob max abs diff {worst:.2e}");
    assert!(worst < 1e-3, "{worst}");

    let new: Vec<(String, Tensor)> = cpu_model(3).var_store().variables().into_iter().collect();
    on_gpu
        .update_weights_blocking(new, 2, InFlight::Abort)
        .unwrap();
    assert_eq!(on_gpu.weight_version(), 2);
    let after = greedy_all(&on_gpu, &prompts[..1]);
    assert_eq!(after[0].weight_version, 2);
    assert_ne!(after[0].response_ids, got[0].response_ids);
}

/// Two groups of rollouts with deterministic ids, masks and logprobs.
fn rollouts() -> Vec<ScoredRollout> {
    let sample = |k: usize, prompt: usize, response: usize| Sample {
        prompt_ids: (0..prompt)
            .map(|t| ((t * 31 + k * 7) % 300) as i64)
            .collect(),
        response_ids: (0..response)
            .map(|t| ((t * 53 + k * 13) % 300) as i64)
            .collect(),
        mask: Sample::mask_from_spans(response, &[0..response / 2, response / 2 + 1..response]),
        engine_logprobs: (0..response).map(|t| -5.0 - (t % 5) as f32 * 0.3).collect(),
        weight_version: 0,
        token_versions: None,
        ref_logprobs: None,
    };
    (0..6)
        .map(|k| ScoredRollout {
            id: format!("r{k}"),
            group_id: format!("g{}", k % 2),
            reward: Some(k as f64 * 0.5),
            outcome: Outcome::Succeeded,
            samples: vec![sample(k, 3 + k, 6 + 2 * k)],
        })
        .collect()
}

fn step_config(bf16_autocast: bool) -> StepConfig {
    StepConfig {
        loss: LossConfig {
            eps_low: 0.2,
            eps_high: 0.28,
            correction: Correction::TokenTis { high: 2.0 },
            kl_coef: 0.0,
        },
        temperature: 1.0,
        token_budget: 64,
        micro_batch_overhead: 0,
        max_grad_norm: Some(1.0),
        bf16_autocast,
        entropy: true,
        lean: Default::default(),
    }
}

/// One AdamW step on `model`; the stats and the updated weights.
fn one_step(model: &Model, bf16_autocast: bool) -> (StepStats, Vec<(String, Tensor)>) {
    let c = step_config(bf16_autocast);
    let mut batch = build_update(rollouts(), &BatchConfig::default())
        .unwrap()
        .batch;
    score_old_logprobs(model, &mut batch, &c).unwrap();
    let schedule = LrSchedule {
        peak_lr: 1e-3,
        warmup_steps: 0,
        decay: LrDecay::Constant,
    };
    let mut opt = RlOptimizer::new(model, AdamWConfig::default(), schedule).unwrap();
    let stats = train_step(model, &mut opt, &batch, &c, &mut OneRank).unwrap();
    let mut weights: Vec<(String, Tensor)> = model.var_store().variables().into_iter().collect();
    weights.sort_by(|a, b| a.0.cmp(&b.0));
    (stats, weights)
}

#[test]
#[ignore = "needs a CUDA device: deploy/gpu-check.sh runs it"]
fn rl_step_on_cuda_matches_cpu() {
    let gpu = cuda();
    let cpu = cpu_model(4);
    let gpu_model = copy_to(&cpu, Kind::Float, gpu);
    let bf16_model = copy_to(&cpu, Kind::Float, gpu);
    let (want, want_w) = one_step(&cpu, false);
    let (got, got_w) = one_step(&gpu_model, false);
    // AdamW's first step moves each weight by about lr * sign(grad), so a
    // gradient that is ~0 on both devices may move a weight differently:
    // count the weights that differ rather than bound the worst one.
    let (mut worst, mut off, mut total) = (0f64, 0i64, 0i64);
    for (g, w) in got_w.iter().zip(&want_w) {
        let d = (g.1.to_device(Device::Cpu) - &w.1).abs();
        worst = worst.max(f64::try_from(d.max()).unwrap());
        off += i64::try_from(d.gt(1e-5).sum(Kind::Int64)).unwrap();
        total += w.1.numel() as i64;
    }
    println!(
        "rl step f32: loss cpu {:.6} cuda {:.6}; grad norm cpu {:.6} cuda {:.6}; weights max abs diff {worst:.2e}, {off}/{total} differ > 1e-5",
        want.loss, got.loss, want.grad_norm, got.grad_norm
    );
    assert!((got.loss - want.loss).abs() < 1e-4 * (1.0 + want.loss.abs()));
    assert!((got.grad_norm - want.grad_norm).abs() < 1e-3 * want.grad_norm);
    assert!(off * 1000 < total, "{off}/{total}");

    let (bf16, _) = one_step(&bf16_model, true);
    println!(
        "rl step bf16 autocast on cuda: loss {:.6} grad norm {:.6}",
        bf16.loss, bf16.grad_norm
    );
    assert!(bf16.loss.is_finite() && bf16.grad_norm.is_finite());
    assert!((bf16.loss - want.loss).abs() < 0.05 * (1.0 + want.loss.abs()));
    assert!((bf16.grad_norm - want.grad_norm).abs() < 0.1 * want.grad_norm);
}

/// `StepConfig::bf16_autocast` runs the forward under `with_bf16_autocast`;
/// plain `tch::autocast` would compute in CUDA autocast's default, f16.
#[test]
#[ignore = "needs a CUDA device: deploy/gpu-check.sh runs it"]
fn bf16_autocast_computes_in_bf16() {
    let gpu = cuda();
    let model = copy_to(&cpu_model(6), Kind::Float, gpu);
    let tokens = random_tokens(1, 8, 300).to_device(gpu);
    let logits = with_bf16_autocast(true, || model.forward(&tokens, None).unwrap());
    println!("logits dtype under autocast: {:?}", logits.kind());
    assert_eq!(logits.kind(), Kind::BFloat16);
}

#[test]
#[ignore = "needs a CUDA device: deploy/gpu-check.sh runs it"]
fn weights_saved_on_cuda_reload_on_cpu() {
    let gpu = cuda();
    let cpu = cpu_model(5);
    let model = copy_to(&cpu, Kind::Float, gpu);
    let dir = tempfile::tempdir().unwrap();
    model.save(dir.path()).unwrap();
    let back = Model::load(dir.path(), Kind::Float, Device::Cpu).unwrap();
    let tokens = random_tokens(1, 12, 300);
    let want = cpu.forward(&tokens, None).unwrap();
    let got = back.forward(&tokens, None).unwrap();
    assert_eq!(max_abs_diff(&got, &want), 0.0);
}
