//! `config.json` and `generation_config.json` for a llama-architecture GGUF,
//! with the fields transformers derives from the same metadata.

use serde_json::{Value, json};

use super::ImportError;
use super::gguf::{GgufFile, MetaValue};
use super::hf_weights::WeightDtype;

/// The model dimensions read from `llama.*` metadata.
#[derive(Debug, Clone, PartialEq)]
pub struct LlamaShape {
    pub hidden_size: u64,
    pub intermediate_size: u64,
    pub num_hidden_layers: u64,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: u64,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub max_position_embeddings: u64,
    pub vocab_size: u64,
    /// No `output.weight`: the LM head reuses the embedding.
    pub tie_word_embeddings: bool,
    /// `attn_q.bias` present (transformers' `attention_bias`).
    pub attention_bias: bool,
}

impl LlamaShape {
    pub fn from_gguf(gguf: &GgufFile) -> Result<Self, ImportError> {
        let arch = gguf
            .get("general.architecture")
            .and_then(MetaValue::as_str)
            .ok_or_else(|| ImportError::Missing("general.architecture".into()))?;
        if arch != "llama" {
            return Err(ImportError::Unsupported(format!(
                "architecture {arch:?} (only llama is imported)"
            )));
        }
        let uint = |key: &str| {
            gguf.get(&format!("llama.{key}"))
                .and_then(MetaValue::as_u64)
                .ok_or_else(|| ImportError::Missing(format!("llama.{key}")))
        };
        let float = |key: &str, default: f64| {
            gguf.get(&format!("llama.{key}"))
                .map(|v| {
                    v.as_f64()
                        .ok_or_else(|| ImportError::Missing(format!("llama.{key}")))
                })
                .unwrap_or(Ok(default))
        };
        let hidden_size = uint("embedding_length")?;
        let heads = uint("attention.head_count")?;
        let kv_heads = uint("attention.head_count_kv").unwrap_or(heads);
        let vocab_size = match uint("vocab_size") {
            Ok(n) => n,
            // Older files: the vocabulary is the token list.
            Err(_) => gguf
                .get("tokenizer.ggml.tokens")
                .and_then(MetaValue::as_array)
                .map(|t| t.len() as u64)
                .ok_or_else(|| ImportError::Missing("llama.vocab_size".into()))?,
        };
        if gguf
            .get("llama.rope.scaling.type")
            .and_then(MetaValue::as_str)
            .is_some_and(|t| t != "none")
        {
            return Err(ImportError::Unsupported("rope scaling".into()));
        }
        Ok(Self {
            hidden_size,
            intermediate_size: uint("feed_forward_length")?,
            num_hidden_layers: uint("block_count")?,
            num_attention_heads: heads as usize,
            num_key_value_heads: kv_heads as usize,
            head_dim: uint("attention.key_length").unwrap_or(hidden_size / heads.max(1)),
            rms_norm_eps: float("attention.layer_norm_rms_epsilon", 1e-6)?,
            rope_theta: float("rope.freq_base", 10_000.0)?,
            max_position_embeddings: uint("context_length")?,
            vocab_size,
            tie_word_embeddings: gguf.tensor("output.weight").is_none(),
            attention_bias: gguf.tensor("blk.0.attn_q.bias").is_some(),
        })
    }
}

/// A token id from `tokenizer.ggml.{key}`, if the file sets one.
pub fn token_id(gguf: &GgufFile, key: &str) -> Option<u64> {
    gguf.get(&format!("tokenizer.ggml.{key}"))
        .and_then(MetaValue::as_u64)
}

/// `config.json` for transformers' `LlamaForCausalLM`.
pub fn config_json(gguf: &GgufFile, shape: &LlamaShape, dtype: WeightDtype) -> Value {
    let mut config = json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": shape.hidden_size,
        "intermediate_size": shape.intermediate_size,
        "num_hidden_layers": shape.num_hidden_layers,
        "num_attention_heads": shape.num_attention_heads,
        "num_key_value_heads": shape.num_key_value_heads,
        "head_dim": shape.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": shape.rms_norm_eps,
        "rope_theta": shape.rope_theta,
        "rope_parameters": {"rope_theta": shape.rope_theta, "rope_type": "default"},
        "max_position_embeddings": shape.max_position_embeddings,
        "vocab_size": shape.vocab_size,
        "tie_word_embeddings": shape.tie_word_embeddings,
        "attention_bias": shape.attention_bias,
        "mlp_bias": false,
        "dtype": dtype.torch_name(),
    });
    for (key, field) in [
        ("bos_token_id", "bos_token_id"),
        ("eos_token_id", "eos_token_id"),
        ("padding_token_id", "pad_token_id"),
        ("unknown_token_id", "unk_token_id"),
    ] {
        if let Some(id) = token_id(gguf, key) {
            config[field] = json!(id);
        }
    }
    config
}

/// `generation_config.json`: generation stops at EOS and, if the file names
/// one, at the end-of-turn token.
pub fn generation_config_json(gguf: &GgufFile) -> Value {
    let mut config = json!({});
    if let Some(bos) = token_id(gguf, "bos_token_id") {
        config["bos_token_id"] = json!(bos);
    }
    let mut eos: Vec<u64> = Vec::new();
    for key in ["eos_token_id", "eot_token_id", "eom_token_id"] {
        if let Some(id) = token_id(gguf, key).filter(|id| !eos.contains(id)) {
            eos.push(id);
        }
    }
    match eos.as_slice() {
        [] => {}
        [one] => config["eos_token_id"] = json!(one),
        many => config["eos_token_id"] = json!(many),
    }
    if let Some(pad) = token_id(gguf, "padding_token_id") {
        config["pad_token_id"] = json!(pad);
    }
    config
}
