//! GGUF tensors to a Hugging Face `LlamaForCausalLM` checkpoint: names,
//! shapes, the attention Q/K row order, and `model.safetensors`.

use std::path::Path;

use safetensors::Dtype;
use safetensors::tensor::TensorView;

use super::ImportError;
use super::gguf::{GgufFile, TensorInfo};
use super::hf_config::LlamaShape;

/// The element type written to `model.safetensors`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum WeightDtype {
    /// Exact: every GGUF encoding agl decodes is exactly representable.
    #[default]
    F32,
    Bf16,
    F16,
}

impl WeightDtype {
    /// The name transformers uses in `config.json` (`dtype`).
    pub fn torch_name(self) -> &'static str {
        match self {
            Self::F32 => "float32",
            Self::Bf16 => "bfloat16",
            Self::F16 => "float16",
        }
    }

    fn safetensors(self) -> Dtype {
        match self {
            Self::F32 => Dtype::F32,
            Self::Bf16 => Dtype::BF16,
            Self::F16 => Dtype::F16,
        }
    }

    fn encode(self, values: &[f32]) -> Vec<u8> {
        match self {
            Self::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
            Self::Bf16 => values
                .iter()
                .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
                .collect(),
            Self::F16 => values
                .iter()
                .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
                .collect(),
        }
    }
}

/// The Hugging Face name of a llama-architecture GGUF tensor; `None` for
/// tensors with no HF counterpart.
pub fn hf_name(gguf_name: &str) -> Option<String> {
    let fixed = match gguf_name {
        "token_embd.weight" => Some("model.embed_tokens.weight"),
        "output_norm.weight" => Some("model.norm.weight"),
        "output.weight" => Some("lm_head.weight"),
        _ => None,
    };
    if let Some(name) = fixed {
        return Some(name.to_string());
    }
    let rest = gguf_name.strip_prefix("blk.")?;
    let (layer, rest) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let (part, suffix) = rest.rsplit_once('.')?;
    let module = match part {
        "attn_norm" => "input_layernorm",
        "ffn_norm" => "post_attention_layernorm",
        "attn_q" => "self_attn.q_proj",
        "attn_k" => "self_attn.k_proj",
        "attn_v" => "self_attn.v_proj",
        "attn_output" => "self_attn.o_proj",
        "ffn_gate" => "mlp.gate_proj",
        "ffn_up" => "mlp.up_proj",
        "ffn_down" => "mlp.down_proj",
        _ => return None,
    };
    matches!(suffix, "weight" | "bias").then(|| format!("model.layers.{layer}.{module}.{suffix}"))
}

/// llama.cpp's converter interleaves the two rotary halves of every head's
/// Q and K rows (`permute` in convert_hf_to_gguf.py); HF expects them
/// split. Row `h*2*d + 2*i + a` of the GGUF tensor is row `h*2*d + a*d + i`
/// of the HF tensor (transformers' `_reverse_permute_weights`).
pub fn unpermute_rows(data: &[f32], rows: usize, n_head: usize) -> Result<Vec<f32>, String> {
    if n_head == 0 || !rows.is_multiple_of(2 * n_head) || !data.len().is_multiple_of(rows.max(1)) {
        return Err(format!(
            "{rows} rows cannot be split into {n_head} rotary heads"
        ));
    }
    let cols = data.len() / rows;
    let half = rows / n_head / 2;
    let mut out = vec![0f32; data.len()];
    for h in 0..n_head {
        for i in 0..half {
            for a in 0..2 {
                let src = h * 2 * half + 2 * i + a;
                let dst = h * 2 * half + a * half + i;
                out[dst * cols..(dst + 1) * cols]
                    .copy_from_slice(&data[src * cols..(src + 1) * cols]);
            }
        }
    }
    Ok(out)
}

/// One tensor ready for safetensors.
pub struct HfTensor {
    pub name: String,
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

/// Decodes every tensor, renames it and restores HF's Q/K row order.
pub fn convert_tensors(gguf: &GgufFile, shape: &LlamaShape) -> Result<Vec<HfTensor>, ImportError> {
    let mut out = Vec::with_capacity(gguf.tensors.len());
    for t in &gguf.tensors {
        let name = hf_name(&t.name).ok_or_else(|| {
            ImportError::Unsupported(format!(
                "tensor {} has no Hugging Face llama counterpart",
                t.name
            ))
        })?;
        let data = gguf.dequantize(t)?;
        let data = restore_rotary_order(t, data, shape)?;
        out.push(HfTensor {
            name,
            shape: t.shape(),
            data,
        });
    }
    Ok(out)
}

fn restore_rotary_order(
    t: &TensorInfo,
    data: Vec<f32>,
    shape: &LlamaShape,
) -> Result<Vec<f32>, ImportError> {
    let heads = if t.name.contains(".attn_q.") {
        shape.num_attention_heads
    } else if t.name.contains(".attn_k.") {
        shape.num_key_value_heads
    } else {
        return Ok(data);
    };
    let rows = t.shape().first().copied().unwrap_or(0);
    unpermute_rows(&data, rows, heads)
        .map_err(|message| ImportError::Unsupported(format!("tensor {}: {message}", t.name)))
}

/// Writes `tensors` to `path` as safetensors in `dtype`.
pub fn write_safetensors(
    tensors: &[HfTensor],
    dtype: WeightDtype,
    path: &Path,
) -> Result<(), ImportError> {
    let encoded: Vec<(&HfTensor, Vec<u8>)> =
        tensors.iter().map(|t| (t, dtype.encode(&t.data))).collect();
    let views = encoded
        .iter()
        .map(|(t, bytes)| {
            TensorView::new(dtype.safetensors(), t.shape.clone(), bytes)
                .map(|view| (t.name.clone(), view))
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| ImportError::Write(e.to_string()))?;
    let metadata = std::collections::HashMap::from([("format".to_string(), "pt".to_string())]);
    let write_err =
        |e: &dyn std::fmt::Display| ImportError::Write(format!("{}: {e}", path.display()));
    safetensors::tensor::serialize_to_file(views, Some(metadata), path)
        .map_err(|e| write_err(&e))?;
    // safetensors writes through a private (0600) temporary file; the folder
    // is shared with engines and pods that may run as other users.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644))
            .map_err(|e| write_err(&e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_to_llama_modules() {
        assert_eq!(
            hf_name("blk.12.attn_q.weight").as_deref(),
            Some("model.layers.12.self_attn.q_proj.weight")
        );
        assert_eq!(
            hf_name("blk.0.ffn_norm.weight").as_deref(),
            Some("model.layers.0.post_attention_layernorm.weight")
        );
        assert_eq!(hf_name("rope_freqs.weight"), None);
    }

    #[test]
    fn unpermute_inverts_llama_cpp_permute() {
        // llama.cpp: w.reshape(n_head, 2, d, cols).swapaxes(1, 2): HF row
        // h*2d + a*d + i lands on GGUF row h*2d + 2i + a.
        let (n_head, d, cols) = (2, 3, 2);
        let rows = n_head * 2 * d;
        let hf: Vec<f32> = (0..rows * cols).map(|v| v as f32).collect();
        let mut gguf = vec![0f32; hf.len()];
        for h in 0..n_head {
            for a in 0..2 {
                for i in 0..d {
                    let (src, dst) = (h * 2 * d + a * d + i, h * 2 * d + 2 * i + a);
                    gguf[dst * cols..(dst + 1) * cols]
                        .copy_from_slice(&hf[src * cols..(src + 1) * cols]);
                }
            }
        }
        assert_ne!(gguf, hf);
        assert_eq!(unpermute_rows(&gguf, rows, n_head).unwrap(), hf);
        assert!(unpermute_rows(&gguf, rows, 5).is_err());
    }
}
