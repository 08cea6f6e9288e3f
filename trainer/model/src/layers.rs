//! The small building blocks: linear, RMSNorm and the SwiGLU MLP. Their
//! tensors live in the model's `VarStore` under Hugging Face names.

use tch::nn::{Init, Path};
use tch::{Kind, Tensor};

use super::config::ModelConfig;
use super::lora::LoraPair;
use super::{decode_matmul, fused, onednn_linear};

/// How a forward runs: with autograd (training, scoring), or as an engine
/// step under `no_grad`, which may take kernels that build no graph.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pass {
    Autograd,
    Inference,
}

/// `x W^T` (weight `[out, in]`) by the fastest path that takes the
/// operands: under [`Pass::Inference`] a decode step's few rows on the CPU
/// go through [`decode_matmul`]; other f32 on the CPU through
/// [`onednn_linear`] (with its backward); the rest is libtorch's.
pub fn project(x: &Tensor, weight: &Tensor, pass: Pass) -> Tensor {
    let decode = match pass {
        Pass::Inference => decode_matmul::linear(x, weight),
        Pass::Autograd => None,
    };
    decode
        .or_else(|| onednn_linear::linear(x, weight))
        .unwrap_or_else(|| x.linear(weight, None::<Tensor>))
}

/// `y = x W^T (+ b)`, weights `[out, in]` as in PyTorch, plus a LoRA
/// adapter's `scale * B A x` when one is attached.
#[derive(Debug)]
pub struct Linear {
    weight: Tensor,
    bias: Option<Tensor>,
    lora: Option<LoraPair>,
}

impl Linear {
    pub fn new(path: Path, in_dim: i64, out_dim: i64, bias: bool, std: f64) -> Self {
        let weight = path.var(
            "weight",
            &[out_dim, in_dim],
            Init::Randn {
                mean: 0.0,
                stdev: std,
            },
        );
        let bias = bias.then(|| path.var("bias", &[out_dim], Init::Const(0.0)));
        Self {
            weight,
            bias,
            lora: None,
        }
    }

    /// `y = x W^T (+ b)` plus the adapter's delta, the product by
    /// [`project`] for `pass`.
    pub fn run(&self, x: &Tensor, pass: Pass) -> Tensor {
        let y = project(x, &self.weight, pass);
        let y = match &self.bias {
            Some(bias) => y + bias,
            None => y,
        };
        self.with_adapter(x, y)
    }

    fn with_adapter(&self, x: &Tensor, y: Tensor) -> Tensor {
        match &self.lora {
            Some(lora) if lora.active() => y + lora.delta(x),
            _ => y,
        }
    }

    /// The weight, when `y = x W^T` is the whole layer (no bias, no active
    /// adapter).
    pub fn plain_weight(&self) -> Option<&Tensor> {
        let adapter = self.lora.as_ref().is_some_and(LoraPair::active);
        (self.bias.is_none() && !adapter).then_some(&self.weight)
    }

    /// `(out, in)`.
    pub fn dims(&self) -> (i64, i64) {
        let size = self.weight.size();
        (size[0], size[1])
    }

    pub fn attach(&mut self, lora: LoraPair) {
        self.lora = Some(lora);
    }

    /// The weight as served: merged with the adapter, if any.
    pub fn serving_weight(&self) -> Option<Tensor> {
        self.lora.as_ref().map(|l| l.merged(&self.weight))
    }
}

/// RMSNorm computed in f32 and cast back before the weight, like
/// transformers' `LlamaRMSNorm`; f32 on the CPU as one fused op.
#[derive(Debug)]
pub struct RmsNorm {
    weight: Tensor,
    eps: f64,
}

impl RmsNorm {
    pub fn new(path: Path, dim: i64, eps: f64) -> Self {
        Self {
            weight: path.var("weight", &[dim], Init::Const(1.0)),
            eps,
        }
    }

    /// `(weight, eps)`.
    pub fn parts(&self) -> (&Tensor, f64) {
        (&self.weight, self.eps)
    }

    pub fn forward(&self, x: &Tensor) -> Tensor {
        if let Some(y) = fused::rms_norm(x, &self.weight, self.eps) {
            return y;
        }
        let kind = x.kind();
        let x32 = x.to_kind(Kind::Float);
        let variance = x32.square().mean_dim(-1, true, Kind::Float);
        let normed = x32 * (variance + self.eps).rsqrt();
        &self.weight * normed.to_kind(kind)
    }
}

/// `down(silu(gate(x)) * up(x))`, the product fused for f32 on the CPU.
#[derive(Debug)]
pub struct Mlp {
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
}

impl Mlp {
    pub fn new(path: Path, config: &ModelConfig) -> Self {
        let (h, i, std) = (
            config.hidden_size,
            config.intermediate_size,
            config.initializer_range,
        );
        Self {
            gate_proj: Linear::new(&path / "gate_proj", h, i, false, std),
            up_proj: Linear::new(&path / "up_proj", h, i, false, std),
            down_proj: Linear::new(&path / "down_proj", i, h, false, std),
        }
    }

    pub fn forward(&self, x: &Tensor, pass: Pass) -> Tensor {
        let (gate, up) = (self.gate_proj.run(x, pass), self.up_proj.run(x, pass));
        let hidden = fused::swiglu(&gate, &up).unwrap_or_else(|| gate.silu() * up);
        self.down_proj.run(&hidden, pass)
    }

    /// The projections by Hugging Face module name.
    pub fn linears_mut(&mut self) -> [(&'static str, &mut Linear); 3] {
        [
            ("gate_proj", &mut self.gate_proj),
            ("up_proj", &mut self.up_proj),
            ("down_proj", &mut self.down_proj),
        ]
    }

    pub fn linears(&self) -> [(&'static str, &Linear); 3] {
        [
            ("gate_proj", &self.gate_proj),
            ("up_proj", &self.up_proj),
            ("down_proj", &self.down_proj),
        ]
    }
}
