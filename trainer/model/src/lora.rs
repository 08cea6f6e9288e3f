//! LoRA (Hu et al. 2021) as PEFT implements it: a target linear `W` gets
//! `y = x W^T + scale * (dropout(x) A^T) B^T` with `A` `[r, in]`
//! (Kaiming-uniform, `a = sqrt(5)`: uniform within `1 / sqrt(in)`), `B`
//! `[out, r]` (zeros) and `scale = alpha / r`. Only `A` and `B` train; the
//! base weights are frozen. Served merged (`W + scale * B A`), saved and
//! loaded in PEFT's format: `adapter_config.json` and
//! `adapter_model.safetensors` with names
//! `base_model.model.<module>.lora_A.weight` / `.lora_B.weight`.

use std::collections::HashMap;
use std::fs;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use serde::{Deserialize, Serialize};
use serde_json::json;
use tch::Tensor;

use super::ModelError;

/// The linears LoRA can target (PEFT's module names for Llama-family
/// models).
pub const TARGETS: [&str; 7] = [
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
];

/// `[train.lora]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LoraConfig {
    pub rank: i64,
    pub alpha: f64,
    /// Dropout on the adapter's input, in the training forward only.
    pub dropout: f64,
    pub target_modules: Vec<String>,
}

impl Default for LoraConfig {
    fn default() -> Self {
        LoraConfig {
            rank: 8,
            alpha: 16.0,
            dropout: 0.0,
            target_modules: TARGETS.iter().map(|t| t.to_string()).collect(),
        }
    }
}

impl LoraConfig {
    pub fn check(&self) -> Result<(), String> {
        if self.rank < 1 {
            return Err(format!(
                "train.lora.rank must be at least 1, not {}",
                self.rank
            ));
        }
        if !(self.alpha.is_finite() && self.alpha > 0.0) {
            return Err(format!(
                "train.lora.alpha must be positive, not {}",
                self.alpha
            ));
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return Err(format!(
                "train.lora.dropout must be in [0, 1), not {}",
                self.dropout
            ));
        }
        if self.target_modules.is_empty() {
            return Err("train.lora.target_modules is empty".into());
        }
        if let Some(bad) = self
            .target_modules
            .iter()
            .find(|t| !TARGETS.contains(&t.as_str()))
        {
            return Err(format!(
                "train.lora.target_modules: `{bad}` is not one of {}",
                TARGETS.join(", ")
            ));
        }
        Ok(())
    }

    pub fn scale(&self) -> f64 {
        self.alpha / self.rank as f64
    }

    /// PEFT's `adapter_config.json` for this config.
    fn peft_json(&self, base: &str) -> serde_json::Value {
        json!({
            "peft_type": "LORA",
            "task_type": "CAUSAL_LM",
            "base_model_name_or_path": base,
            "r": self.rank,
            "lora_alpha": self.alpha,
            "lora_dropout": self.dropout,
            "target_modules": self.target_modules,
            "bias": "none",
            "fan_in_fan_out": false,
            "use_rslora": false,
            "use_dora": false,
            "inference_mode": false,
        })
    }

    /// Reads PEFT's `adapter_config.json` (a LoRA adapter PEFT can load
    /// into agl: no rsLoRA, DoRA, bias or per-module ranks).
    pub fn from_peft_json(text: &str) -> Result<LoraConfig, ModelError> {
        let v: serde_json::Value = serde_json::from_str(text)
            .map_err(|e| ModelError::Weights(format!("adapter_config.json: {e}")))?;
        let bad = |why: &str| ModelError::Unsupported(format!("adapter_config.json: {why}"));
        if v["peft_type"] != "LORA" {
            return Err(bad("peft_type is not LORA"));
        }
        for (key, off) in [
            ("use_rslora", false),
            ("use_dora", false),
            ("fan_in_fan_out", false),
        ] {
            if v.get(key)
                .and_then(serde_json::Value::as_bool)
                .unwrap_or(off)
                != off
            {
                return Err(bad(&format!("{key} is not supported")));
            }
        }
        if v.get("bias").and_then(|b| b.as_str()).unwrap_or("none") != "none"
            || v.get("lora_bias").and_then(serde_json::Value::as_bool) == Some(true)
        {
            return Err(bad("bias is not supported"));
        }
        for key in ["rank_pattern", "alpha_pattern"] {
            if v.get(key)
                .and_then(serde_json::Value::as_object)
                .is_some_and(|m| !m.is_empty())
            {
                return Err(bad(&format!("{key} (per-module ranks) is not supported")));
            }
        }
        let targets = match &v["target_modules"] {
            serde_json::Value::Array(list) => list
                .iter()
                .filter_map(|t| t.as_str().map(str::to_string))
                .collect(),
            serde_json::Value::String(s) => vec![s.clone()],
            _ => return Err(bad("target_modules must be a list")),
        };
        let config = LoraConfig {
            rank: v["r"].as_i64().ok_or_else(|| bad("r missing"))?,
            alpha: v["lora_alpha"]
                .as_f64()
                .ok_or_else(|| bad("lora_alpha missing"))?,
            dropout: v["lora_dropout"].as_f64().unwrap_or(0.0),
            target_modules: targets,
        };
        config.check().map_err(|e| bad(&e))?;
        Ok(config)
    }
}

/// One target linear's adapter.
#[derive(Debug)]
pub struct LoraPair {
    /// `[r, in]`.
    a: Tensor,
    /// `[out, r]`.
    b: Tensor,
    scale: f64,
    dropout: f64,
    /// Set while the trainer's forward runs with gradients (dropout on).
    training: Arc<AtomicBool>,
    /// Set while the base alone answers (the KL reference).
    off: Arc<AtomicBool>,
}

impl LoraPair {
    pub(crate) fn new(
        a: Tensor,
        b: Tensor,
        config: &LoraConfig,
        (training, off): (Arc<AtomicBool>, Arc<AtomicBool>),
    ) -> LoraPair {
        LoraPair {
            a,
            b,
            scale: config.scale(),
            dropout: config.dropout,
            training,
            off,
        }
    }

    /// Whether the adapter adds its delta (not while the base alone answers).
    pub(crate) fn active(&self) -> bool {
        !self.off.load(Ordering::Relaxed)
    }

    /// `scale * B A x`.
    pub(crate) fn delta(&self, x: &Tensor) -> Tensor {
        let x = if self.dropout > 0.0 && self.training.load(Ordering::Relaxed) {
            x.dropout(self.dropout, true)
        } else {
            x.shallow_clone()
        };
        x.linear(&self.a, None::<Tensor>)
            .linear(&self.b, None::<Tensor>)
            * self.scale
    }

    /// `W + scale * B A`, for serving.
    pub(crate) fn merged(&self, weight: &Tensor) -> Tensor {
        let delta = self.b.matmul(&self.a) * self.scale;
        weight + delta.to_kind(weight.kind())
    }
}

/// Writes PEFT's adapter folder.
pub(crate) fn save_adapter(
    dir: &Path,
    config: &LoraConfig,
    base: &str,
    tensors: &[(String, Tensor)],
) -> Result<(), ModelError> {
    crate::weights::create_private_dir_all(dir).map_err(|source| ModelError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    let path = dir.join("adapter_config.json");
    let text = format!("{:#}\n", config.peft_json(base));
    fs::write(&path, text).map_err(|source| ModelError::Io { path, source })?;
    let file = dir.join("adapter_model.safetensors");
    super::weight_file::write_tensors(&file, tensors)
}

/// Reads PEFT's adapter folder: its config and tensors by name.
pub fn read_adapter(dir: &Path) -> Result<(LoraConfig, HashMap<String, Tensor>), ModelError> {
    let path = dir.join("adapter_config.json");
    let text = fs::read_to_string(&path).map_err(|source| ModelError::Io { path, source })?;
    let config = LoraConfig::from_peft_json(&text)?;
    let file = dir.join("adapter_model.safetensors");
    let tensors = Tensor::read_safetensors(&file)?.into_iter().collect();
    Ok((config, tensors))
}
