//! agl-model: the Llama-family decoder (Llama, Mistral, Qwen2, Qwen3) in
//! tch, its weights, LoRA, tiles and CPU kernels. See `trainer/README.md`
//! for the API, the KV-cache design and the logprob convention.
//!
//! One set of weights, two forward paths:
//! - [`Model::forward`]: tokens `[B, T]` (right padded) -> logits `[B, T, V]`,
//!   with autograd, for the trainer's logprobs;
//! - [`Model::forward_cached`]: a batched step over each layer's
//!   [`LayerState`] for the inference engine (see `layer_state.rs` and
//!   `cached.rs`; the engine's per-sequence cache owns the slots).
//!
//! Parameters live in a `tch::nn::VarStore` under the exact Hugging Face
//! names (`model.layers.0.self_attn.q_proj.weight`, ...), so weights load
//! from and save to a Hugging Face folder (`weights.rs`) and an optimizer can
//! take `var_store().trainable_variables()`.

mod adapter;
mod attention;
mod cached;
mod config;
mod decode_matmul;
mod decode_step;
mod fused;
mod layer_state;
mod layers;
mod lean;
mod logprobs;
mod lora;
mod onednn_linear;
mod rope;
mod shim;
mod team;
pub mod tiles;
mod weight_file;
mod weights;

/// How a unit test that cannot run here is reported skipped.
#[cfg(test)]
#[path = "../../../tests/support/skip.rs"]
pub(crate) mod skip;

use std::path::PathBuf;

use tch::nn::{Init, VarStore};
use tch::{Device, Kind, Tensor};

use attention::{DecoderLayer, Visibility};
use layers::{Pass, RmsNorm};
use rope::Rope;

pub use adapter::AdapterLoad;
pub use config::{ModelConfig, ModelType, RopeScaling};
/// The f32 CPU decode step's matmul, for the engine bench to time apart
/// from the rest of the step.
pub use decode_matmul::{rows as decode_rows, rows_many as decode_rows_many};
pub use layer_state::{LayerState, StepRow, grow_states};
pub use lean::{Lean, LeanForward};
pub use logprobs::{PickedLogprobs, at_temperature, token_logprobs};
pub use lora::{LoraConfig, read_adapter};
pub use weights::{DEFAULT_MAX_SHARD_BYTES, create_private_dir_all, read_safetensors_folder};

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("invalid config.json: {0}")]
    Config(String),
    #[error("unsupported model: {0}")]
    Unsupported(String),
    #[error("invalid input: {0}")]
    Input(String),
    #[error("weights: {0}")]
    Weights(String),
    #[error("inference state: {0}")]
    Cache(String),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {source}")]
    SafeTensors {
        path: PathBuf,
        source: safetensors::SafeTensorError,
    },
    #[error(transparent)]
    Torch(#[from] tch::TchError),
}

/// What the decoder layers of a full (uncached) forward share.
struct BodyInputs {
    tables: rope::RopeTables,
    /// A sliding window's `[1, 1, T, T]` visibility; none: causal.
    window: Option<Tensor>,
    /// Rows of packed sequences: each attended alone (`tiles.rs`).
    tiles: Option<tiles::Tiles>,
}

impl BodyInputs {
    fn visibility(&self) -> Visibility<'_> {
        match (&self.tiles, &self.window) {
            (Some(t), _) => Visibility::Tiles(t),
            (None, Some(m)) => Visibility::Mask(m),
            (None, None) => Visibility::Causal,
        }
    }
}

/// A decoder-only language model with its parameters.
#[derive(Debug)]
pub struct Model {
    config: ModelConfig,
    kind: Kind,
    vs: VarStore,
    embed_tokens: Tensor,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    /// The same tensor as `embed_tokens` when the embeddings are tied.
    lm_head: Tensor,
    rope: Rope,
    /// A LoRA adapter, when attached (`adapter.rs`).
    adapter: Option<adapter::Adapter>,
}

impl Model {
    /// A model with freshly initialised parameters (normal with the config's
    /// `initializer_range`, zero biases, unit norms) of `kind` (`Float`,
    /// `BFloat16` or `Half`) on `device`.
    pub fn new(config: ModelConfig, kind: Kind, device: Device) -> Result<Self, ModelError> {
        if !matches!(kind, Kind::Float | Kind::BFloat16 | Kind::Half) {
            return Err(ModelError::Unsupported(format!(
                "dtype {kind:?} (use Float, BFloat16 or Half)"
            )));
        }
        let mut vs = VarStore::new(device);
        vs.set_kind(kind);
        let root = vs.root();
        let model = &root / "model";
        let std = config.initializer_range;
        let embed_tokens = (&model / "embed_tokens").var(
            "weight",
            &[config.vocab_size, config.hidden_size],
            Init::Randn {
                mean: 0.0,
                stdev: std,
            },
        );
        let layers = (0..config.num_hidden_layers)
            .map(|i| DecoderLayer::new(&model / "layers" / i, &config))
            .collect();
        let norm = RmsNorm::new(&model / "norm", config.hidden_size, config.rms_norm_eps);
        let lm_head = if config.tie_word_embeddings {
            embed_tokens.shallow_clone()
        } else {
            (&root / "lm_head").var(
                "weight",
                &[config.vocab_size, config.hidden_size],
                Init::Randn {
                    mean: 0.0,
                    stdev: std,
                },
            )
        };
        let rope = Rope::new(&config, device);
        Ok(Self {
            config,
            kind,
            vs,
            embed_tokens,
            layers,
            norm,
            lm_head,
            rope,
            adapter: None,
        })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The parameter dtype.
    pub fn kind(&self) -> Kind {
        self.kind
    }

    pub fn device(&self) -> Device {
        self.vs.device()
    }

    /// The parameters, named as in Hugging Face checkpoints. With tied
    /// embeddings there is no `lm_head.weight` (it is `model.embed_tokens.weight`).
    pub fn var_store(&self) -> &VarStore {
        &self.vs
    }

    /// Training/scoring forward with autograd. `tokens` `[B, T]` i64;
    /// `attention_mask` `[B, T]` i64: 0 = padding, on the right only (every
    /// row starts with a real token); 1 = a real token, positions `0..T`.
    /// A row may hold several sequences end to end (packing): numbered 1,
    /// 2, ... in order, each starts at position 0 and is attended alone
    /// (`tiles.rs`). Returns logits `[B, T, V]` in the model dtype; `logits[b, t]`
    /// predicts `tokens[b, t + 1]` (across a sequence's end, meaningless).
    /// Logits at padded positions are finite but meaningless.
    pub fn forward(
        &self,
        tokens: &Tensor,
        attention_mask: Option<&Tensor>,
    ) -> Result<Tensor, ModelError> {
        Ok(self.head(&self.hidden_states(tokens, attention_mask)?))
    }

    /// [`Model::forward`] up to the final norm: hidden states `[B, T, H]`.
    fn hidden_states(
        &self,
        tokens: &Tensor,
        attention_mask: Option<&Tensor>,
    ) -> Result<Tensor, ModelError> {
        let body = self.body_inputs(tokens, attention_mask)?;
        let mut x = self.embed(tokens);
        for layer in &self.layers {
            x = layer.forward(
                &x,
                &body.tables,
                body.visibility(),
                Pass::Autograd,
                |k, v| (k, v),
            );
        }
        Ok(x)
    }

    /// The input embeddings of `tokens` `[B, T]`.
    fn embed(&self, tokens: &Tensor) -> Tensor {
        Tensor::embedding(
            &self.embed_tokens,
            &tokens.to_device(self.device()),
            -1,
            false,
            false,
        )
    }

    /// The final norm and the LM head: hidden states -> logits.
    fn head(&self, hidden: &Tensor) -> Tensor {
        layers::project(&self.norm.forward(hidden), &self.lm_head, Pass::Autograd)
    }

    /// Checks `tokens` / `attention_mask` and builds what every decoder
    /// layer of a full forward takes: rope tables and key visibility.
    fn body_inputs(
        &self,
        tokens: &Tensor,
        attention_mask: Option<&Tensor>,
    ) -> Result<BodyInputs, ModelError> {
        let (b, t) = match tokens.size()[..] {
            [b, t] if t > 0 => (b, t),
            _ => {
                return Err(ModelError::Input(format!(
                    "tokens must be [B, T>0], got {:?}",
                    tokens.size()
                )));
            }
        };
        self.check_token_ids(tokens)?;
        let device = self.device();
        let pos = Tensor::arange(t, (Kind::Int64, device));
        let segments = match attention_mask {
            Some(am) => check_segments(am, [b, t])?,
            None => None,
        };
        if let Some(seg) = segments {
            let ids = Vec::<i64>::try_from(seg.to_device(Device::Cpu).reshape([-1]))?;
            let packed = tiles::Packed::new(&ids, b as usize, t as usize, |pos| self.window(pos))
                .into_device(device);
            return Ok(BodyInputs {
                tables: self.rope.tables(&packed.positions, self.kind),
                window: None,
                tiles: Some(packed.tiles),
            });
        }
        // Padding is on the right, so causality alone keeps every real
        // query away from padded keys; padded queries' outputs are
        // meaningless either way. A sliding window needs the explicit mask.
        let window = self.window(&pos);
        Ok(BodyInputs {
            tables: self.rope.tables(&pos.unsqueeze(0), self.kind),
            window,
            tiles: None,
        })
    }

    /// A sliding window's `[1, 1, n, n]` visibility over positions `pos`
    /// (`[n]` i64); none without a window (causality alone).
    fn window(&self, pos: &Tensor) -> Option<Tensor> {
        let n = pos.size()[0];
        self.config.sliding_window.map(|_| {
            self.visible(&pos.unsqueeze(1), &pos.unsqueeze(0))
                .view([1, 1, n, n])
        })
    }

    /// Whether a query at position `q` may see a key at position `k`
    /// (broadcasting i64 tensors): causal, and within the sliding window.
    fn visible(&self, q: &Tensor, k: &Tensor) -> Tensor {
        let causal = k.le_tensor(q);
        match self.config.sliding_window {
            Some(w) => causal.logical_and(&(q - k).lt(w as i64)),
            None => causal,
        }
    }

    fn check_token_ids(&self, tokens: &Tensor) -> Result<(), ModelError> {
        if tokens.kind() != Kind::Int64 {
            return Err(ModelError::Input(format!(
                "tokens must be i64, got {:?}",
                tokens.kind()
            )));
        }
        let (lo, hi) = (i64::try_from(tokens.min())?, i64::try_from(tokens.max())?);
        if lo < 0 || hi >= self.config.vocab_size {
            return Err(ModelError::Input(format!(
                "token ids must be in 0..{}, got {lo}..={hi}",
                self.config.vocab_size
            )));
        }
        Ok(())
    }
}

/// Checks an attention mask of shape `shape` ([`Model::forward`]'s rules)
/// and returns it as i64 segment ids when some row holds more than one
/// sequence; `None` when plain 1/0 (causality alone then suffices).
fn check_segments(am: &Tensor, shape: [i64; 2]) -> Result<Option<Tensor>, ModelError> {
    if am.size() != shape {
        return Err(ModelError::Input(format!(
            "attention_mask {:?} != tokens {:?}",
            am.size(),
            shape
        )));
    }
    let seg = am.to_kind(Kind::Int64);
    if !bool::try_from(seg.select(1, 0).gt(0).all())? {
        return Err(ModelError::Input(
            "attention_mask: padding must be on the right".into(),
        ));
    }
    if i64::try_from(seg.min())? < 0 {
        return Err(ModelError::Input(
            "attention_mask: sequence ids must be >= 0".into(),
        ));
    }
    let t = shape[1];
    if t > 1 {
        // Each next token: padding, or the same sequence, or a later one.
        let (prev, next) = (seg.narrow(1, 0, t - 1), seg.narrow(1, 1, t - 1));
        let ordered = next
            .eq(0)
            .logical_or(&prev.gt(0).logical_and(&next.ge_tensor(&prev)));
        if !bool::try_from(ordered.all())? {
            return Err(ModelError::Input(
                "attention_mask: padding must be on the right, sequences numbered in order".into(),
            ));
        }
    }
    Ok((i64::try_from(seg.max())? > 1).then_some(seg))
}
