//! The model shape, read from a Hugging Face `config.json`.
//!
//! Accepts both the transformers 4 layout (`rope_theta` + `rope_scaling`)
//! and the transformers 5 one (`rope_parameters`).

use serde::Deserialize;
use serde_json::Value;

use super::ModelError;

/// Which Hugging Face architecture the config names. They share one decoder;
/// the type decides the biases and the q/k norms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelType {
    Llama,
    Mistral,
    Qwen2,
    Qwen3,
}

/// RoPE frequency scaling (`rope_type` in `rope_parameters`/`rope_scaling`).
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    None,
    /// Positions divided by `factor`.
    Linear {
        factor: f64,
    },
    /// Llama 3.1 frequency-dependent scaling.
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_position_embeddings: f64,
    },
}

/// Everything the decoder needs, resolved (defaults applied).
#[derive(Debug, Clone)]
pub struct ModelConfig {
    pub model_type: ModelType,
    pub vocab_size: i64,
    pub hidden_size: i64,
    pub intermediate_size: i64,
    pub num_hidden_layers: usize,
    pub num_attention_heads: i64,
    pub num_key_value_heads: i64,
    pub head_dim: i64,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub rope_scaling: RopeScaling,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    /// Bias on q/k/v projections.
    pub qkv_bias: bool,
    /// Bias on the output projection.
    pub o_bias: bool,
    /// Qwen3: RMSNorm over each head's q and k before RoPE.
    pub qk_norm: bool,
    /// Mistral: a query attends to at most this many most recent positions.
    pub sliding_window: Option<usize>,
    pub initializer_range: f64,
    pub bos_token_id: Option<i64>,
    pub eos_token_ids: Vec<i64>,
    /// The JSON this was parsed from, written back unchanged on save.
    pub raw: Value,
}

#[derive(Deserialize)]
struct RawConfig {
    model_type: String,
    vocab_size: i64,
    hidden_size: i64,
    intermediate_size: i64,
    num_hidden_layers: usize,
    num_attention_heads: i64,
    num_key_value_heads: Option<i64>,
    head_dim: Option<i64>,
    rms_norm_eps: f64,
    rope_theta: Option<f64>,
    rope_scaling: Option<Value>,
    rope_parameters: Option<Value>,
    max_position_embeddings: usize,
    #[serde(default)]
    tie_word_embeddings: bool,
    #[serde(default)]
    attention_bias: bool,
    #[serde(default)]
    mlp_bias: bool,
    hidden_act: Option<String>,
    sliding_window: Option<usize>,
    #[serde(default)]
    use_sliding_window: bool,
    initializer_range: Option<f64>,
    bos_token_id: Option<i64>,
    eos_token_id: Option<Value>,
}

impl ModelConfig {
    /// Parses the text of a `config.json`.
    pub fn from_json_str(text: &str) -> Result<Self, ModelError> {
        let raw: Value =
            serde_json::from_str(text).map_err(|e| ModelError::Config(e.to_string()))?;
        Self::from_json(raw)
    }

    /// Parses an already decoded `config.json`.
    pub fn from_json(raw: Value) -> Result<Self, ModelError> {
        let c: RawConfig =
            serde_json::from_value(raw.clone()).map_err(|e| ModelError::Config(e.to_string()))?;
        let unsupported = |what: String| Err(ModelError::Unsupported(what));
        let model_type = match c.model_type.as_str() {
            "llama" => ModelType::Llama,
            "mistral" => ModelType::Mistral,
            "qwen2" => ModelType::Qwen2,
            "qwen3" => ModelType::Qwen3,
            other => return unsupported(format!("model_type {other:?}")),
        };
        if let Some(act) = c.hidden_act.as_deref().filter(|a| *a != "silu") {
            return unsupported(format!("hidden_act {act:?} (only silu)"));
        }
        if c.mlp_bias {
            return unsupported("mlp_bias = true".into());
        }
        if c.use_sliding_window {
            return unsupported("use_sliding_window = true (Qwen per-layer windows)".into());
        }
        let (qkv_bias, o_bias) = match model_type {
            // Qwen2 always has q/k/v biases and never an o_proj bias.
            ModelType::Qwen2 => (true, false),
            ModelType::Mistral => (false, false),
            ModelType::Llama | ModelType::Qwen3 => (c.attention_bias, c.attention_bias),
        };
        let num_key_value_heads = c.num_key_value_heads.unwrap_or(c.num_attention_heads);
        if c.num_attention_heads % num_key_value_heads != 0 {
            return Err(ModelError::Config(format!(
                "num_attention_heads {} is not a multiple of num_key_value_heads {num_key_value_heads}",
                c.num_attention_heads
            )));
        }
        let head_dim = c.head_dim.unwrap_or(c.hidden_size / c.num_attention_heads);
        if head_dim % 2 != 0 {
            return Err(ModelError::Config(format!("head_dim {head_dim} is odd")));
        }
        // transformers 5 moved rope_theta and the scaling into rope_parameters.
        let rope = c.rope_parameters.as_ref().or(c.rope_scaling.as_ref());
        let rope_theta = c
            .rope_theta
            .or_else(|| {
                rope.and_then(|r| r.get("rope_theta"))
                    .and_then(Value::as_f64)
            })
            .unwrap_or(10000.0);
        let rope_scaling = parse_rope_scaling(rope)?;
        let eos_token_ids = match c.eos_token_id {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Number(n)) => n.as_i64().into_iter().collect(),
            Some(Value::Array(ids)) => ids.iter().filter_map(Value::as_i64).collect(),
            Some(other) => return Err(ModelError::Config(format!("eos_token_id {other}"))),
        };
        Ok(Self {
            model_type,
            vocab_size: c.vocab_size,
            hidden_size: c.hidden_size,
            intermediate_size: c.intermediate_size,
            num_hidden_layers: c.num_hidden_layers,
            num_attention_heads: c.num_attention_heads,
            num_key_value_heads,
            head_dim,
            rms_norm_eps: c.rms_norm_eps,
            rope_theta,
            rope_scaling,
            max_position_embeddings: c.max_position_embeddings,
            tie_word_embeddings: c.tie_word_embeddings,
            qkv_bias,
            o_bias,
            qk_norm: model_type == ModelType::Qwen3,
            sliding_window: if model_type == ModelType::Mistral {
                c.sliding_window
            } else {
                None
            },
            initializer_range: c.initializer_range.unwrap_or(0.02),
            bos_token_id: c.bos_token_id,
            eos_token_ids,
            raw,
        })
    }
}

fn parse_rope_scaling(rope: Option<&Value>) -> Result<RopeScaling, ModelError> {
    let Some(rope) = rope.filter(|r| !r.is_null()) else {
        return Ok(RopeScaling::None);
    };
    // Older configs name the kind `type`, newer ones `rope_type`.
    let kind = rope
        .get("rope_type")
        .or_else(|| rope.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("default");
    let num = |key: &str| {
        rope.get(key)
            .and_then(Value::as_f64)
            .ok_or_else(|| ModelError::Config(format!("rope scaling {kind:?} lacks {key}")))
    };
    match kind {
        "default" => Ok(RopeScaling::None),
        "linear" => Ok(RopeScaling::Linear {
            factor: num("factor")?,
        }),
        "llama3" => Ok(RopeScaling::Llama3 {
            factor: num("factor")?,
            low_freq_factor: num("low_freq_factor")?,
            high_freq_factor: num("high_freq_factor")?,
            original_max_position_embeddings: num("original_max_position_embeddings")?,
        }),
        other => Err(ModelError::Unsupported(format!(
            "rope scaling {other:?} (supported: default, linear, llama3)"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn parse(extra: Value) -> Result<ModelConfig, ModelError> {
        let mut config = json!({
            "model_type": "llama", "vocab_size": 10, "hidden_size": 8, "intermediate_size": 16,
            "num_hidden_layers": 1, "num_attention_heads": 2, "rms_norm_eps": 1e-5,
            "max_position_embeddings": 32,
        });
        if let (Some(base), Some(extra)) = (config.as_object_mut(), extra.as_object()) {
            base.extend(extra.clone());
        }
        ModelConfig::from_json(config)
    }

    #[test]
    fn transformers_4_layout() {
        // SmolLM2-style: rope_theta at the top, rope_scaling null, no kv heads.
        let c = parse(json!({ "rope_theta": 100000.0, "rope_scaling": null, "eos_token_id": 2 }))
            .unwrap();
        assert_eq!(
            (c.rope_theta, c.rope_scaling.clone()),
            (100000.0, RopeScaling::None)
        );
        assert_eq!((c.num_key_value_heads, c.head_dim), (2, 4));
        assert_eq!(c.eos_token_ids, vec![2]);
        let c = parse(json!({ "rope_scaling": { "type": "linear", "factor": 2.0 } })).unwrap();
        assert_eq!(c.rope_scaling, RopeScaling::Linear { factor: 2.0 });
        assert_eq!(c.rope_theta, 10000.0);
    }

    #[test]
    fn transformers_5_layout() {
        let rope = json!({ "rope_type": "default", "rope_theta": 1e6 });
        let c = parse(
            json!({ "model_type": "qwen2", "rope_parameters": rope, "eos_token_id": [3, 4] }),
        )
        .unwrap();
        assert_eq!((c.rope_theta, c.qkv_bias, c.o_bias), (1e6, true, false));
        assert_eq!(c.eos_token_ids, vec![3, 4]);
    }

    #[test]
    fn unsupported_features_are_named() {
        let err = |extra| parse(extra).unwrap_err().to_string();
        assert!(err(json!({ "model_type": "gpt2" })).contains("gpt2"));
        assert!(
            err(json!({ "rope_scaling": { "rope_type": "yarn", "factor": 4.0 } })).contains("yarn")
        );
        assert!(
            err(json!({ "rope_scaling": { "rope_type": "llama3", "factor": 8.0 } }))
                .contains("low_freq_factor")
        );
        assert!(err(json!({ "hidden_act": "gelu" })).contains("gelu"));
        assert!(err(json!({ "num_key_value_heads": 3 })).contains("multiple"));
    }
}
