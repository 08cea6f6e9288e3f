//! Trainer peak memory and step time, full fine-tuning vs LoRA (rank 16 on
//! every projection), on SmolLM2-135M (`agl model fetch smollm2`; skipped
//! when absent) and on a random ~1.5B-parameter Qwen2-shaped model, in bf16
//! on CPU (f32 AdamW moments, as the trainer keeps them).
//!
//! `cargo bench -p agl-trainer --bench lora` (`-- --small` skips the 1.5B
//! model). Each case runs in a process of its own (this binary with
//! `--case`) so its peak RSS is its own. Prints one table; asserts
//! nothing. "training MB" is the peak RSS over the RSS of the loaded model
//! (gradients, moments, activations). Target: LoRA's <= 15% of the base
//! weights.

use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use agl_trainer::model::{LoraConfig, Model, ModelConfig};
use agl_trainer::rl::{
    AdamWConfig, BatchConfig, LrDecay, LrSchedule, Outcome, RlOptimizer, Sample, ScoredRollout,
    StepConfig, build_update, train_step,
};
use serde_json::json;
use tch::{Device, Kind};

const SAMPLES: usize = 2;
const LEN: usize = 128;
const PROMPT: usize = 32;

fn smollm2() -> Option<PathBuf> {
    let home = std::env::var_os("HOME")?;
    let dir = PathBuf::from(home).join(".cache/agl/models/smollm2-135m-instruct");
    dir.join("config.json").is_file().then_some(dir)
}

/// Qwen2.5-1.5B's shape (1.54B parameters), random weights.
fn qwen_1_5b() -> ModelConfig {
    ModelConfig::from_json(json!({
        "model_type": "qwen2",
        "vocab_size": 151936,
        "hidden_size": 1536,
        "intermediate_size": 8960,
        "num_hidden_layers": 28,
        "num_attention_heads": 12,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": true,
    }))
    .expect("1.5B config")
}

fn peak_rss_mb() -> f64 {
    status_mb("VmHWM:")
}

fn rss_mb() -> f64 {
    status_mb("VmRSS:")
}

fn status_mb(key: &str) -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

fn batch(vocab: i64) -> agl_trainer::rl::UpdateBatch {
    let mut x: u64 = 7;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let rollouts = (0..SAMPLES)
        .map(|i| {
            let mut ids =
                |n: usize| -> Vec<i64> { (0..n).map(|_| (next() % vocab as u64) as i64).collect() };
            let response = LEN - PROMPT;
            ScoredRollout {
                id: format!("r{i}"),
                group_id: "g".into(),
                reward: Some(i as f64),
                outcome: Outcome::Succeeded,
                samples: vec![Sample {
                    prompt_ids: ids(PROMPT),
                    response_ids: ids(response),
                    mask: vec![true; response],
                    engine_logprobs: vec![-5.0; response],
                    weight_version: 0,
                    token_versions: None,
                    ref_logprobs: None,
                }],
            }
        })
        .collect();
    build_update(rollouts, &BatchConfig::default())
        .expect("batch")
        .batch
}

/// One case in this process: prints `base_mb trained_params step_s peak_mb
/// loaded_mb` (`loaded_mb`: the RSS once the model is loaded, before any
/// training state exists).
fn run_case(model: &str, lora: bool) -> anyhow::Result<()> {
    let mut m = match model {
        "smollm2" => Model::load(&smollm2().expect("smollm2"), Kind::BFloat16, Device::Cpu)?,
        _ => {
            tch::manual_seed(0);
            Model::new(qwen_1_5b(), Kind::BFloat16, Device::Cpu)?
        }
    };
    let base_mb: f64 = m
        .var_store()
        .variables()
        .values()
        .map(|t| (t.numel() * t.kind().elt_size_in_bytes()) as f64)
        .sum::<f64>()
        / (1 << 20) as f64;
    let loaded_mb = rss_mb();
    if lora {
        m.add_lora(&LoraConfig {
            rank: 16,
            alpha: 32.0,
            ..LoraConfig::default()
        })?;
    }
    let schedule = LrSchedule {
        peak_lr: 1e-5,
        warmup_steps: 0,
        decay: LrDecay::Constant,
    };
    let mut opt = RlOptimizer::new(&m, AdamWConfig::default(), schedule)?;
    let trained: usize = m
        .trainable_parameters()
        .iter()
        .map(|(_, t)| t.numel())
        .sum();
    let batch = batch(m.config().vocab_size);
    let cfg = StepConfig {
        token_budget: SAMPLES * LEN,
        entropy: false,
        bf16_autocast: false,
        ..StepConfig::default()
    };
    // The first step allocates gradients and moments; the second is timed.
    train_step(&m, &mut opt, &batch, &cfg)?;
    let t = Instant::now();
    train_step(&m, &mut opt, &batch, &cfg)?;
    let step_s = t.elapsed().as_secs_f64();
    println!("{base_mb} {trained} {step_s} {} {loaded_mb}", peak_rss_mb());
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if let Some(at) = args.iter().position(|a| a == "--case") {
        return run_case(&args[at + 1], args[at + 2] == "lora");
    }
    let mut models = Vec::new();
    if smollm2().is_some() {
        models.push("smollm2");
    } else {
        eprintln!("SmolLM2 not fetched (agl model fetch smollm2): skipped");
    }
    if !args.iter().any(|a| a == "--small") {
        models.push("random-1.5b");
    }
    println!(
        "trainer step, bf16 on CPU, {SAMPLES} x {LEN} tokens (peak RSS of a process that loads the model and takes two steps)"
    );
    println!(
        "{:<13} {:<5} {:>14} {:>9} {:>9} {:>11} {:>8} {:>16}",
        "model",
        "mode",
        "trained params",
        "base MB",
        "peak MB",
        "training MB",
        "step s",
        "training / base"
    );
    let exe = std::env::current_exe()?;
    for model in models {
        for mode in ["full", "lora"] {
            let out = Command::new(&exe).args(["--case", model, mode]).output()?;
            let text = String::from_utf8_lossy(&out.stdout);
            let cols: Vec<f64> = text
                .split_whitespace()
                .filter_map(|c| c.parse().ok())
                .collect();
            if !out.status.success() || cols.len() != 5 {
                println!(
                    "{model:<13} {mode:<5} failed: {}",
                    String::from_utf8_lossy(&out.stderr)
                        .lines()
                        .last()
                        .unwrap_or("killed (out of memory?)")
                );
                continue;
            }
            let (base, trained, step, peak, loaded) = (cols[0], cols[1], cols[2], cols[3], cols[4]);
            // What training adds over the loaded model: gradients, moments,
            // activations.
            let training = peak - loaded;
            println!(
                "{model:<13} {mode:<5} {:>14} {base:>9.0} {peak:>9.0} {training:>11.0} {step:>8.2} {:>15.2}x",
                trained as u64,
                training / base
            );
        }
    }
    Ok(())
}
