//! agl's own AdamW, so that its state (the moments and step counts) can be
//! checkpointed: tch's C++ optimizer keeps that state out of reach.
//!
//! The update is `torch.optim.AdamW`'s single-tensor path (amsgrad off,
//! what PyTorch runs for CPU parameters), op for op, so on the same libtorch
//! it gives the same bits:
//! ```text
//! step += 1
//! p *= 1 - lr * wd                                  (decoupled weight decay)
//! m  = lerp(m, g, 1 - beta1)
//! v  = v * beta2 + (1 - beta2) * g * g
//! denom = sqrt(v) / sqrt(1 - beta2^step) + eps
//! p += -(lr / (1 - beta1^step)) * m / denom
//! ```
//! The moments are f32 whatever the parameter dtype; a non-f32 parameter is
//! updated in f32 and rounded back (no master copy: tiny updates to bf16
//! weights can round away, so train in f32).

use std::collections::HashMap;

use tch::{Kind, Tensor};

#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct AdamWConfig {
    pub beta1: f64,
    pub beta2: f64,
    pub weight_decay: f64,
    pub eps: f64,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        AdamWConfig {
            beta1: 0.9,
            beta2: 0.999,
            weight_decay: 0.0,
            eps: 1e-8,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AdamWError {
    #[error("optimizer state: {0}")]
    State(String),
    #[error(transparent)]
    Torch(#[from] tch::TchError),
}

/// One parameter and its state (`exp_avg`/`exp_avg_sq` as PyTorch names them).
#[derive(Debug)]
struct ParamState {
    name: String,
    param: Tensor,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    /// Steps this parameter took (PyTorch skips parameters without a
    /// gradient, so this is per parameter).
    step: u64,
}

/// AdamW over named parameters (shallow clones: the updates land in the
/// caller's tensors).
#[derive(Debug)]
pub struct AdamW {
    config: AdamWConfig,
    params: Vec<ParamState>,
}

/// Key prefixes of [`AdamW::state_tensors`].
const EXP_AVG: &str = "exp_avg.";
const EXP_AVG_SQ: &str = "exp_avg_sq.";
const STEP: &str = "step.";

impl AdamW {
    /// Zero moments for every parameter; the order of `params` is the
    /// update order (it does not change the result).
    pub fn new(params: Vec<(String, Tensor)>, config: AdamWConfig) -> Result<Self, AdamWError> {
        let params = params
            .into_iter()
            .map(|(name, param)| {
                let zeros = || param.f_zeros_like()?.f_to_kind(Kind::Float);
                Ok(ParamState {
                    exp_avg: zeros()?,
                    exp_avg_sq: zeros()?,
                    param: param.shallow_clone(),
                    name,
                    step: 0,
                })
            })
            .collect::<Result<_, AdamWError>>()?;
        Ok(AdamW { config, params })
    }

    pub fn config(&self) -> &AdamWConfig {
        &self.config
    }

    /// The parameters, in update order.
    pub fn params(&self) -> impl Iterator<Item = (&str, &Tensor)> {
        self.params.iter().map(|s| (s.name.as_str(), &s.param))
    }

    /// Zeroes (and detaches) every defined gradient, as tch's optimizer does.
    pub fn zero_grad(&self) {
        for s in &self.params {
            let mut g = s.param.grad();
            if g.defined() {
                let _ = g.detach_();
                let _ = g.zero_();
            }
        }
    }

    /// One update with learning rate `lr` from the parameters' `.grad`;
    /// parameters without a gradient are left alone (state included).
    pub fn step(&mut self, lr: f64) -> Result<(), AdamWError> {
        let AdamWConfig {
            beta1,
            beta2,
            weight_decay,
            eps,
        } = self.config;
        tch::no_grad(|| {
            for s in &mut self.params {
                let grad = s.param.grad();
                if !grad.defined() {
                    continue;
                }
                let grad = grad.f_to_kind(Kind::Float)?;
                let f32_param = s.param.kind() == Kind::Float;
                let mut p = if f32_param {
                    s.param.shallow_clone()
                } else {
                    s.param.f_to_kind(Kind::Float)?
                };
                s.step += 1;
                // In-place ops return a handle to the same tensor: dropped.
                if weight_decay != 0.0 {
                    let _ = p.f_mul_scalar_(1.0 - lr * weight_decay)?;
                }
                let _ = s.exp_avg.f_lerp_(&grad, 1.0 - beta1)?;
                // addcmul_ without `value`: PyTorch's kernel computes
                // `v + (value * g) * g`, so scaling g first is the same op.
                let _ = s
                    .exp_avg_sq
                    .f_mul_scalar_(beta2)?
                    .f_addcmul_(&grad.f_mul_scalar(1.0 - beta2)?, &grad)?;
                let step = s.step as f64;
                let bias_correction1 = 1.0 - beta1.powf(step);
                let bias_correction2 = 1.0 - beta2.powf(step);
                let step_size = lr / bias_correction1;
                let mut denom = s
                    .exp_avg_sq
                    .f_sqrt()?
                    .f_div_scalar_(bias_correction2.powf(0.5))?;
                let _ = denom.f_add_scalar_(eps)?;
                // Likewise `p + (value * m) / denom` for addcdiv_.
                let _ = p.f_addcdiv_(&s.exp_avg.f_mul_scalar(-step_size)?, &denom)?;
                if !f32_param {
                    s.param.f_copy_(&p)?;
                }
            }
            Ok(())
        })
    }

    /// The state as named tensors (on the parameters' device):
    /// `exp_avg.<name>`, `exp_avg_sq.<name>` (f32) and `step.<name>` (i64
    /// scalar).
    pub fn state_tensors(&self) -> Vec<(String, Tensor)> {
        let mut out = Vec::with_capacity(3 * self.params.len());
        for s in &self.params {
            out.push((format!("{EXP_AVG}{}", s.name), s.exp_avg.shallow_clone()));
            out.push((
                format!("{EXP_AVG_SQ}{}", s.name),
                s.exp_avg_sq.shallow_clone(),
            ));
            out.push((format!("{STEP}{}", s.name), Tensor::from(s.step as i64)));
        }
        out
    }

    /// The names [`AdamW::state_tensors`] writes for the parameter `name`:
    /// its two moments and its step count.
    pub fn state_names(name: &str) -> [String; 3] {
        [
            format!("{EXP_AVG}{name}"),
            format!("{EXP_AVG_SQ}{name}"),
            format!("{STEP}{name}"),
        ]
    }

    /// Restores [`AdamW::state_tensors`] output. Every parameter must be
    /// present with its shape; an error changes nothing.
    pub fn load_state_tensors(&mut self, tensors: &[(String, Tensor)]) -> Result<(), AdamWError> {
        let by_name: HashMap<&str, &Tensor> =
            tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
        let find = |key: String| {
            by_name
                .get(key.as_str())
                .copied()
                .ok_or_else(|| AdamWError::State(format!("missing {key}")))
        };
        let mut loaded = Vec::with_capacity(self.params.len());
        for s in &self.params {
            let exp_avg = find(format!("{EXP_AVG}{}", s.name))?;
            let exp_avg_sq = find(format!("{EXP_AVG_SQ}{}", s.name))?;
            for (key, t) in [(EXP_AVG, exp_avg), (EXP_AVG_SQ, exp_avg_sq)] {
                if t.size() != s.exp_avg.size() {
                    return Err(AdamWError::State(format!(
                        "{key}{}: shape {:?}, expected {:?}",
                        s.name,
                        t.size(),
                        s.exp_avg.size()
                    )));
                }
            }
            let step = i64::try_from(find(format!("{STEP}{}", s.name))?)?;
            let step = u64::try_from(step)
                .map_err(|_| AdamWError::State(format!("{STEP}{}: {step}", s.name)))?;
            loaded.push((exp_avg, exp_avg_sq, step));
        }
        if by_name.len() != 3 * self.params.len() {
            return Err(AdamWError::State(format!(
                "{} tensors for {} parameters (expected {}): state of another model?",
                by_name.len(),
                self.params.len(),
                3 * self.params.len()
            )));
        }
        tch::no_grad(|| {
            for (s, (exp_avg, exp_avg_sq, step)) in self.params.iter_mut().zip(loaded) {
                s.exp_avg.f_copy_(exp_avg)?;
                s.exp_avg_sq.f_copy_(exp_avg_sq)?;
                s.step = step;
            }
            Ok(())
        })
    }
}
