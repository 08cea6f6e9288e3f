//! Shared test helpers: tiny random models and the Python venv.

use std::path::PathBuf;

use agl_model::{Model, ModelConfig};
use serde_json::{Value, json};
use tch::{Device, Kind, Tensor};

/// A tiny Llama-shaped config: 2 layers, hidden 64, 4 heads over 2 kv heads.
pub fn tiny_config(extra: Value) -> ModelConfig {
    let mut config = json!({
        "model_type": "llama",
        "vocab_size": 300,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "max_position_embeddings": 256,
        "tie_word_embeddings": false,
    });
    if let (Some(base), Some(extra)) = (config.as_object_mut(), extra.as_object()) {
        base.extend(extra.clone());
    }
    ModelConfig::from_json(config).unwrap()
}

/// tch's random generator is global and the tests share one process: every
/// seed-then-draw holds this, so a seeded draw is not interleaved with
/// another test's.
pub static RNG: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A model whose every parameter (norms and biases included) is random, so
/// each one matters to the logits.
pub fn random_model(config: ModelConfig, kind: Kind, seed: i64) -> Model {
    let _rng = RNG
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    tch::manual_seed(seed);
    let model = Model::new(config, kind, Device::Cpu).unwrap();
    let fresh: Vec<(String, Tensor)> = model
        .var_store()
        .variables()
        .into_iter()
        .map(|(name, t)| {
            let noise = Tensor::randn(t.size(), (Kind::Float, Device::Cpu));
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

/// Random token ids `[b, t]`.
pub fn random_tokens(b: i64, t: i64, vocab: i64) -> Tensor {
    Tensor::randint(vocab, [b, t], (Kind::Int64, Device::Cpu))
}

pub fn max_abs_diff(a: &Tensor, b: &Tensor) -> f64 {
    let d = (a.to_kind(Kind::Float) - b.to_kind(Kind::Float))
        .abs()
        .max();
    f64::try_from(d).unwrap()
}

/// The venv python that has transformers (AGL_VENV, else the repo's .venv).
pub fn venv_python() -> PathBuf {
    let venv = std::env::var_os("AGL_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.venv"));
    let python = venv.join("bin/python");
    assert!(
        python.exists(),
        "no Python venv at {} (set AGL_VENV or run deploy/setup.sh, which installs torch and transformers)",
        venv.display()
    );
    python
}
