//! Rotary position embeddings in the Hugging Face `rotate_half` convention:
//! the head dim is split in two halves `[x1, x2]`, and the pair (x1[i], x2[i])
//! rotates by `position * inv_freq[i]`.

use std::f64::consts::PI;

use tch::{Device, Kind, Tensor};

use super::config::{ModelConfig, RopeScaling};

/// Inverse frequencies of one model; cos/sin tables are built per forward from
/// the actual positions, so any mix of sequence offsets works in one batch.
#[derive(Debug)]
pub struct Rope {
    inv_freq: Tensor,
}

/// cos and sin for a batch of positions, shaped `[B, 1, T, head_dim]` so they
/// broadcast over heads.
pub struct RopeTables {
    cos: Tensor,
    sin: Tensor,
}

impl Rope {
    pub fn new(config: &ModelConfig, device: Device) -> Self {
        let dim = config.head_dim as f64;
        let inv_freq: Vec<f32> = (0..config.head_dim / 2)
            .map(|i| {
                let base = 1.0 / config.rope_theta.powf((2 * i) as f64 / dim);
                scale_frequency(base, &config.rope_scaling) as f32
            })
            .collect();
        Self {
            inv_freq: Tensor::from_slice(&inv_freq).to_device(device),
        }
    }

    /// The inverse frequencies, `[head_dim / 2]` f32.
    pub fn inv_freq(&self) -> &Tensor {
        &self.inv_freq
    }

    /// Tables for `positions` (`[B, T]` i64), in `kind`. Angles are computed
    /// in f32 whatever the model dtype, as transformers does.
    pub fn tables(&self, positions: &Tensor, kind: Kind) -> RopeTables {
        let freqs = positions.to_kind(Kind::Float).unsqueeze(-1) * &self.inv_freq;
        let emb = Tensor::cat(&[&freqs, &freqs], -1).unsqueeze(1);
        RopeTables {
            cos: emb.cos().to_kind(kind),
            sin: emb.sin().to_kind(kind),
        }
    }
}

impl RopeTables {
    /// Rotates `x` (`[B, heads, T, head_dim]`).
    pub fn apply(&self, x: &Tensor) -> Tensor {
        let half = x.size().last().copied().unwrap_or(0) / 2;
        let x1 = x.narrow(-1, 0, half);
        let x2 = x.narrow(-1, half, half);
        let rotated = Tensor::cat(&[&x2.neg(), &x1], -1);
        x * &self.cos + rotated * &self.sin
    }
}

fn scale_frequency(inv_freq: f64, scaling: &RopeScaling) -> f64 {
    match *scaling {
        RopeScaling::None => inv_freq,
        RopeScaling::Linear { factor } => inv_freq / factor,
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings: old_len,
        } => {
            // Long wavelengths are slowed by `factor`, short ones kept, and the
            // band between interpolated (transformers' _compute_llama3_parameters).
            let wavelen = 2.0 * PI / inv_freq;
            let low_freq_wavelen = old_len / low_freq_factor;
            let high_freq_wavelen = old_len / high_freq_factor;
            if wavelen > low_freq_wavelen {
                inv_freq / factor
            } else if wavelen < high_freq_wavelen {
                inv_freq
            } else {
                let smooth =
                    (old_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
                (1.0 - smooth) * inv_freq / factor + smooth * inv_freq
            }
        }
    }
}
