//! What the trainer benches share: the fetched SmolLM2, its shape and a
//! random batch.
// Each bench compiles this module for itself and uses part of it.
#![allow(dead_code)]

use std::path::PathBuf;

use agl_model::ModelConfig;
use agl_rl::{BatchConfig, Outcome, Sample, ScoredRollout, UpdateBatch, build_update};
use serde_json::json;

/// SmolLM2-135M's shape.
pub fn smollm2_shape() -> ModelConfig {
    ModelConfig::from_json(json!({
        "model_type": "llama", "vocab_size": 49152, "hidden_size": 576,
        "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
        "num_key_value_heads": 3, "rms_norm_eps": 1e-5, "rope_theta": 100000.0,
        "max_position_embeddings": 8192, "tie_word_embeddings": true,
    }))
    .expect("SmolLM2 config")
}

/// SmolLM2-135M-Instruct when fetched (`agl model fetch smollm2`).
pub fn smollm2() -> Option<PathBuf> {
    let home = std::env::var_os("HOME")?;
    let dir = PathBuf::from(home).join(".cache/agl/models/smollm2-135m-instruct");
    dir.join("model.safetensors").is_file().then_some(dir)
}

/// `samples` one-sample rollouts of random tokens below `vocab` (the same
/// every run), `len` tokens of which `len / 4` prompt; groups of four with
/// rewards 0, 1, 2, 0, ... so every sample trains. `vary`: lengths vary as
/// rollouts' do (len, 7/8, 6/8, 5/8 of it).
pub fn random_batch(samples: usize, len: usize, vocab: i64, vary: bool) -> UpdateBatch {
    let mut x: u64 = 11;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let prompt = len / 4;
    let rollouts = (0..samples)
        .map(|i| {
            let len = if vary { len - (i % 4) * len / 8 } else { len };
            let mut ids =
                |n: usize| -> Vec<i64> { (0..n).map(|_| (next() % vocab as u64) as i64).collect() };
            let response = len - prompt;
            ScoredRollout {
                id: format!("r{i}"),
                group_id: format!("g{}", i / 4),
                reward: Some((i % 3) as f64),
                outcome: Outcome::Succeeded,
                samples: vec![Sample {
                    prompt_ids: ids(prompt),
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
