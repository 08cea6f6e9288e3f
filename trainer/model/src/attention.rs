//! Grouped-query self-attention and the decoder layer around it.
//!
//! Split in two steps so the full forward and the KV-cache forward share the
//! maths: `project` makes q/k/v for the new tokens (RoPE applied), the caller
//! decides which keys/values to attend over (just the new ones, or the cache
//! with the new ones written in), and `attend` finishes.

use tch::Tensor;
use tch::nn::Path;

use super::config::ModelConfig;
use super::layers::{Linear, Mlp, Pass, RmsNorm};
use super::rope::RopeTables;
use super::tiles::Tiles;

/// Which keys a query may see.
#[derive(Clone, Copy)]
pub enum Visibility<'a> {
    /// Every key (one new token per sequence, nothing to hide).
    All,
    /// Query `i` sees keys `0..=i` (queries and keys start at position 0).
    /// Lets SDPA take its flash kernel, which never materialises the
    /// `T x T` weights: long training sequences fit in memory.
    Causal,
    /// `[B, 1, T, L]`, true where a query may see a key.
    Mask(&'a Tensor),
    /// Rows of packed sequences, each attended alone, causally.
    Tiles(&'a Tiles),
}

#[derive(Debug)]
pub struct Attention {
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    q_norm: Option<RmsNorm>,
    k_norm: Option<RmsNorm>,
    num_heads: i64,
    num_kv_heads: i64,
    head_dim: i64,
}

impl Attention {
    pub fn new(path: Path, config: &ModelConfig) -> Self {
        let (h, d, std) = (
            config.hidden_size,
            config.head_dim,
            config.initializer_range,
        );
        let (nh, nkv) = (config.num_attention_heads, config.num_key_value_heads);
        let norm = |name: &str| {
            config
                .qk_norm
                .then(|| RmsNorm::new(&path / name, d, config.rms_norm_eps))
        };
        Self {
            q_proj: Linear::new(&path / "q_proj", h, nh * d, config.qkv_bias, std),
            k_proj: Linear::new(&path / "k_proj", h, nkv * d, config.qkv_bias, std),
            v_proj: Linear::new(&path / "v_proj", h, nkv * d, config.qkv_bias, std),
            o_proj: Linear::new(&path / "o_proj", nh * d, h, config.o_bias, std),
            q_norm: norm("q_norm"),
            k_norm: norm("k_norm"),
            num_heads: nh,
            num_kv_heads: nkv,
            head_dim: d,
        }
    }

    /// The projections by Hugging Face module name.
    pub fn linears_mut(&mut self) -> [(&'static str, &mut Linear); 4] {
        [
            ("q_proj", &mut self.q_proj),
            ("k_proj", &mut self.k_proj),
            ("v_proj", &mut self.v_proj),
            ("o_proj", &mut self.o_proj),
        ]
    }

    pub fn linears(&self) -> [(&'static str, &Linear); 4] {
        [
            ("q_proj", &self.q_proj),
            ("k_proj", &self.k_proj),
            ("v_proj", &self.v_proj),
            ("o_proj", &self.o_proj),
        ]
    }

    /// `(heads, kv_heads, head_dim)`.
    pub fn heads(&self) -> (i64, i64, i64) {
        (self.num_heads, self.num_kv_heads, self.head_dim)
    }

    /// `x` `[B, T, hidden]` -> q `[B, heads, T, d]`, k and v `[B, kv_heads, T, d]`.
    pub fn project(&self, x: &Tensor, rope: &RopeTables, pass: Pass) -> (Tensor, Tensor, Tensor) {
        let (b, t) = (x.size()[0], x.size()[1]);
        let split = |y: Tensor, heads: i64, norm: &Option<RmsNorm>| {
            let y = y.view([b, t, heads, self.head_dim]);
            let y = match norm {
                Some(norm) => norm.forward(&y),
                None => y,
            };
            y.transpose(1, 2)
        };
        let q = split(self.q_proj.run(x, pass), self.num_heads, &self.q_norm);
        let k = split(self.k_proj.run(x, pass), self.num_kv_heads, &self.k_norm);
        let v = split(self.v_proj.run(x, pass), self.num_kv_heads, &None);
        (rope.apply(&q), rope.apply(&k), v)
    }

    /// Attends `q` `[B, heads, T, d]` over `k`/`v` `[B, kv_heads, L, d]`;
    /// `mask` says which keys each query sees. Every query row must see at
    /// least one key. Returns `[B, T, hidden]`.
    pub fn attend(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        mask: Visibility,
        pass: Pass,
    ) -> Tensor {
        // enable_gqa: kv head j serves query heads j*groups .. (j+1)*groups,
        // as transformers' repeat_kv, without materialising the repeat.
        let gqa = self.num_heads != self.num_kv_heads;
        let (explicit, causal) = match mask {
            Visibility::All => (None, false),
            Visibility::Causal => (None, true),
            Visibility::Mask(m) => (Some(m), false),
            Visibility::Tiles(tiles) => return self.o_proj.run(&tiles.attend(q, k, v, gqa), pass),
        };
        let out = Tensor::scaled_dot_product_attention(q, k, v, explicit, 0.0, causal, None, gqa);
        let (b, t) = (q.size()[0], q.size()[2]);
        let out = out
            .transpose(1, 2)
            .reshape([b, t, self.num_heads * self.head_dim]);
        self.o_proj.run(&out, pass)
    }
}

/// Pre-norm decoder block: `x + attn(norm(x))`, then `x + mlp(norm(x))`.
#[derive(Debug)]
pub struct DecoderLayer {
    input_layernorm: RmsNorm,
    self_attn: Attention,
    post_attention_layernorm: RmsNorm,
    mlp: Mlp,
}

impl DecoderLayer {
    pub fn new(path: Path, config: &ModelConfig) -> Self {
        let eps = config.rms_norm_eps;
        Self {
            input_layernorm: RmsNorm::new(&path / "input_layernorm", config.hidden_size, eps),
            self_attn: Attention::new(&path / "self_attn", config),
            post_attention_layernorm: RmsNorm::new(
                &path / "post_attention_layernorm",
                config.hidden_size,
                eps,
            ),
            mlp: Mlp::new(&path / "mlp", config),
        }
    }

    /// Every projection with its module path below the layer
    /// (`self_attn.q_proj`, ..., `mlp.down_proj`).
    pub fn linears_mut(&mut self) -> Vec<(String, &mut Linear)> {
        let attn = self.self_attn.linears_mut().into_iter();
        let attn = attn.map(|(n, l)| (format!("self_attn.{n}"), l));
        let mlp = self.mlp.linears_mut().into_iter();
        attn.chain(mlp.map(|(n, l)| (format!("mlp.{n}"), l)))
            .collect()
    }

    pub fn linears(&self) -> Vec<(String, &Linear)> {
        let attn = self.self_attn.linears().into_iter();
        let attn = attn.map(|(n, l)| (format!("self_attn.{n}"), l));
        let mlp = self.mlp.linears().into_iter();
        attn.chain(mlp.map(|(n, l)| (format!("mlp.{n}"), l)))
            .collect()
    }

    /// The input norm, the attention, the post-attention norm, the MLP.
    pub fn parts(&self) -> (&RmsNorm, &Attention, &RmsNorm, &Mlp) {
        (
            &self.input_layernorm,
            &self.self_attn,
            &self.post_attention_layernorm,
            &self.mlp,
        )
    }

    /// `kv` maps this step's new k/v to the k/v to attend over (identity for
    /// the full forward; cache write + read for the cached one).
    pub fn forward(
        &self,
        x: &Tensor,
        rope: &RopeTables,
        mask: Visibility,
        pass: Pass,
        kv: impl FnOnce(Tensor, Tensor) -> (Tensor, Tensor),
    ) -> Tensor {
        let attn = &self.self_attn;
        let (q, k, v) = attn.project(&self.input_layernorm.forward(x), rope, pass);
        let (k, v) = kv(k, v);
        let x = x + attn.attend(&q, &k, &v, mask, pass);
        let mlp_out = self
            .mlp
            .forward(&self.post_attention_layernorm.forward(&x), pass);
        x + mlp_out
    }
}
