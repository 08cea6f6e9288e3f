//! One RL training step in agl vs the same step in PyTorch eager
//! (`step_torch.py`, transformers, identical weights and batch), and the
//! padding waste of FFD packing on a heavy-tailed length distribution.
//!
//! `cargo bench -p agl-trainer --bench step` (needs `$AGL_VENV` with torch
//! and transformers). Prints a table; asserts nothing about speed.

use std::process::Command;
use std::time::Instant;

use agl_trainer::model::{Model, ModelConfig};
use agl_trainer::rl::{
    BatchConfig, Outcome, Packing, Rollout, Sample, StepConfig, UpdateBatch, accumulate_gradients,
    build_update, pack_ffd, pack_in_order,
};
use serde_json::json;
use tch::{Device, Kind};

const SAMPLES: usize = 8;
const LEN: usize = 256;
const PROMPT: usize = 64;
const REPEATS: usize = 3;

/// xorshift64*: reproducible data without a rand dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
    }

    fn normal(&mut self) -> f64 {
        let (u, v) = (self.next().max(1e-12), self.next());
        (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
    }
}

fn config() -> ModelConfig {
    ModelConfig::from_json(json!({
        "model_type": "llama",
        "vocab_size": 4096,
        "hidden_size": 256,
        "intermediate_size": 688,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "max_position_embeddings": 512,
        "tie_word_embeddings": false,
    }))
    .expect("bench config")
}

/// Two groups of four rollouts, one sample each, all response tokens trained.
fn batch(rng: &mut Rng, vocab: i64) -> UpdateBatch {
    let rollouts = (0..SAMPLES)
        .map(|i| {
            let ids = |rng: &mut Rng, n: usize| -> Vec<i64> {
                (0..n).map(|_| (rng.next() * vocab as f64) as i64).collect()
            };
            let response = LEN - PROMPT;
            Rollout {
                id: format!("r{i}"),
                group_id: format!("g{}", i / 4),
                reward: Some(rng.next()),
                outcome: Outcome::Succeeded,
                samples: vec![Sample {
                    prompt_ids: ids(rng, PROMPT),
                    response_ids: ids(rng, response),
                    mask: vec![true; response],
                    engine_logprobs: (0..response).map(|_| -9.0 - rng.next() as f32).collect(),
                    weight_version: 0,
                    ref_logprobs: None,
                }],
            }
        })
        .collect();
    build_update(rollouts, &BatchConfig::default())
        .expect("bench batch")
        .batch
}

/// The batch on the `[B, T-1]` logprob grid for the Python side.
fn batch_json(batch: &UpdateBatch, cfg: &StepConfig) -> serde_json::Value {
    let cols = LEN - 1;
    let grid = |f: &dyn Fn(&agl_trainer::rl::TrainSample, usize) -> f32| {
        let mut v = vec![0f32; SAMPLES * cols];
        for (r, s) in batch.samples.iter().enumerate() {
            for k in 0..s.weights.len() {
                v[r * cols + s.prompt_len - 1 + k] = f(s, k);
            }
        }
        v
    };
    json!({
        "tokens": batch.samples.iter().map(|s| s.tokens.clone()).collect::<Vec<_>>(),
        "weight": grid(&|s, k| s.weights[k]),
        "advantage": grid(&|s, _| s.advantage),
        "engine": grid(&|s, k| s.engine_logprobs[k]),
        "temperature": cfg.temperature,
        "eps_low": cfg.loss.eps_low,
        "eps_high": cfg.loss.eps_high,
        "tis_threshold": cfg.loss.tis_threshold,
    })
}

fn zero_grads(model: &Model) {
    for p in model.var_store().trainable_variables() {
        let mut g = p.grad();
        if g.defined() {
            let _ = g.zero_();
        }
    }
}

fn main() -> anyhow::Result<()> {
    let rng = &mut Rng(42);
    tch::manual_seed(0);
    let model = Model::new(config(), Kind::Float, Device::Cpu)?;
    let batch = batch(rng, model.config().vocab_size);
    let cfg = StepConfig {
        token_budget: SAMPLES * LEN,
        entropy: false,
        ..StepConfig::default()
    };
    let dir = tempfile::tempdir()?;
    model.save(dir.path())?;
    std::fs::write(
        dir.path().join("batch.json"),
        batch_json(&batch, &cfg).to_string(),
    )?;

    // agl: forward + backward of the whole batch as one micro-batch.
    let lengths: Vec<usize> = batch.samples.iter().map(|s| s.len()).collect();
    let packing = Packing::from_groups(&lengths, vec![(0..SAMPLES).collect()]);
    let mut times = Vec::new();
    let mut loss = 0.0;
    for i in 0..=REPEATS {
        zero_grads(&model);
        let start = Instant::now();
        loss = accumulate_gradients(&model, &batch, &packing, &cfg)?.loss;
        if i > 0 {
            times.push(start.elapsed().as_secs_f64() * 1000.0);
        }
    }
    times.sort_by(f64::total_cmp);
    let agl_ms = times[times.len() / 2];

    let venv = std::env::var("AGL_VENV").unwrap_or_else(|_| ".venv".into());
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/step_torch.py");
    let out = Command::new(format!("{venv}/bin/python"))
        .args([script, &dir.path().to_string_lossy()])
        .arg(tch::get_num_threads().to_string())
        .arg(REPEATS.to_string())
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "step_torch.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let torch: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let torch_ms = torch["ms"].as_f64().unwrap_or(f64::NAN);
    let torch_loss = torch["loss"].as_f64().unwrap_or(f64::NAN);

    println!(
        "training step: {SAMPLES} x {LEN} tokens, llama hidden 256 x 4 layers, vocab 4096, f32 CPU, {} threads, median of {REPEATS}",
        tch::get_num_threads()
    );
    println!("| impl          | ms/step | loss        |");
    println!("|---------------|---------|-------------|");
    println!("| agl (tch)     | {agl_ms:7.1} | {loss:11.8} |");
    println!("| PyTorch eager | {torch_ms:7.1} | {torch_loss:11.8} |");
    println!("agl / PyTorch time ratio: {:.2}", agl_ms / torch_ms);

    // Packing on heavy-tailed lengths: log-normal, median 1500, clamped.
    let lengths: Vec<usize> = (0..512)
        .map(|_| (1500.0 * (0.8 * rng.normal()).exp()).clamp(64.0, 8192.0) as usize)
        .collect();
    println!("\npadding waste, 512 samples, log-normal lengths (median 1500, sigma 0.8):");
    println!("| budget | FFD waste | micro-batches | in-order waste | micro-batches |");
    println!("|--------|-----------|---------------|----------------|---------------|");
    for budget in [8192, 16384, 32768] {
        let ffd = pack_ffd(&lengths, budget);
        let naive = pack_in_order(&lengths, budget);
        println!(
            "| {budget:6} | {:8.1}% | {:13} | {:13.1}% | {:13} |",
            100.0 * ffd.padding_waste(),
            ffd.micro_batches.len(),
            100.0 * naive.padding_waste(),
            naive.micro_batches.len()
        );
    }
    Ok(())
}
