//! A training forward and backward that keeps less alive (`[train]
//! checkpoint_layers`, `logprob_chunk`), with the same gradients as
//! [`Model::forward`] + autograd:
//!
//! - **Chunked log-probabilities**: the head (final norm, LM head,
//!   log-softmax) runs `chunk` positions at a time, without a graph, so the
//!   `[tokens x vocabulary]` logits never exist whole. The loss is taken on
//!   the logprobs as a leaf; its gradient `dL/dlogp` `[B, T-1]` then flows
//!   back chunk by chunk: each chunk's logits are recomputed with a graph,
//!   their gradient (the log-softmax's derivative, written out) is built in
//!   place in one f32 buffer, and autograd takes it through the LM head and
//!   the norm into the head's parameters and `dL/dh` of the final hidden
//!   states. A chunk's peak is the logits and two buffers of their size,
//!   not the five an autograd log-softmax keeps and makes.
//! - **Activation checkpointing per decoder layer**: the forward keeps only
//!   each layer's input; the backward recomputes one layer at a time from
//!   its input and back-propagates `dL/dh` through it, so one layer's
//!   activations are alive at once instead of all of them.
//!
//! What torch.utils.checkpoint does with a saved RNG state is not needed:
//! nothing in a layer is random unless LoRA dropout is on, which the
//! caller refuses with checkpointing.

use tch::{Kind, Tensor};

use super::layers::Pass;
use super::logprobs::Picked;
use super::{BodyInputs, Model, ModelError};

/// Which savings to make.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct Lean {
    /// Recompute each decoder layer in the backward.
    pub checkpoint_layers: bool,
    /// Positions per head chunk (0: the whole sequence at once).
    pub logprob_chunk: usize,
}

/// A lean forward's results and what its backward needs.
pub struct LeanForward {
    /// `[B, T - 1]` f32 logprobs of each next token (no graph), as
    /// [`super::token_logprobs`] gives them.
    pub logprobs: Tensor,
    /// Sum of the policy entropy at the positions asked for.
    pub entropy_sum: f64,
    tokens: Tensor,
    temperature: f64,
    chunk: i64,
    /// The grid cells the head ran on.
    picked: Picked,
    /// Their final hidden states `[N, H]`, detached.
    picked_hidden: Tensor,
    /// Without checkpointing: the final hidden states with their graph.
    graph: Option<Tensor>,
    /// With checkpointing: each layer's input (detached) and the layers'
    /// shared inputs.
    layer_inputs: Vec<Tensor>,
    body: BodyInputs,
}

impl Model {
    /// The training forward of `tokens` (as [`Model::forward`] takes them)
    /// under `lean`, its logprobs where `at` (`[B, T-1]`) is positive (the
    /// head runs there alone, as in [`Model::logprobs_at`]; 0 elsewhere);
    /// the entropy is summed where `entropy_at` (`[B, T-1]`) is nonzero
    /// among those.
    pub fn lean_forward(
        &self,
        tokens: &Tensor,
        attention_mask: Option<&Tensor>,
        temperature: f64,
        lean: Lean,
        at: &Tensor,
        entropy_at: Option<&Tensor>,
    ) -> Result<LeanForward, ModelError> {
        let body = self.body_inputs(tokens, attention_mask)?;
        let tokens = tokens.to_device(self.device());
        let t = tokens.size()[1];
        if t < 2 {
            return Err(ModelError::Input(
                "a training sequence needs at least two tokens".into(),
            ));
        }
        let layers = |x: Tensor, keep: &mut Vec<Tensor>| {
            self.layers.iter().fold(x, |x, layer| {
                if lean.checkpoint_layers {
                    keep.push(x.shallow_clone());
                }
                layer.forward(
                    &x,
                    &body.tables,
                    body.visibility(),
                    Pass::Autograd,
                    |k, v| (k, v),
                )
            })
        };
        let mut layer_inputs = Vec::new();
        let (hidden, graph) = if lean.checkpoint_layers {
            let h = tch::no_grad(|| layers(self.embed(&tokens), &mut layer_inputs));
            (h, None)
        } else {
            let h = layers(self.embed(&tokens), &mut layer_inputs);
            (h.detach(), Some(h))
        };
        let picked = Picked::of(at, &tokens)?;
        let picked_hidden = picked.select(&hidden);
        let entropy_at = entropy_at.map(|e| picked.gather(e));
        let n = picked.len();
        let chunk = match lean.logprob_chunk {
            0 => n.max(1),
            c => (c as i64).min(n.max(1)),
        };
        let (mut parts, mut entropy_sum) = (Vec::new(), 0.0);
        tch::no_grad(|| -> Result<(), ModelError> {
            for start in (0..n).step_by(chunk as usize) {
                let len = chunk.min(n - start);
                let at = entropy_at.as_ref().map(|e| e.narrow(0, start, len));
                let (lp, entropy) = self.head_logprobs(
                    &picked_hidden.narrow(0, start, len),
                    &picked.targets.narrow(0, start, len),
                    temperature,
                    at.as_ref(),
                )?;
                entropy_sum += entropy;
                parts.push(lp);
            }
            Ok(())
        })?;
        let logprobs = if parts.is_empty() {
            Tensor::zeros([0], (Kind::Float, hidden.device()))
        } else {
            Tensor::cat(&parts, 0)
        };
        Ok(LeanForward {
            logprobs: picked.scatter(&logprobs),
            entropy_sum,
            tokens,
            temperature,
            chunk,
            picked,
            picked_hidden,
            graph,
            layer_inputs,
            body,
        })
    }

    /// Back-propagates `grad` = dL/dlogprobs (`[B, T-1]`) of a
    /// [`Model::lean_forward`] into every trainable parameter's `.grad`.
    pub fn lean_backward(&self, fwd: LeanForward, grad: &Tensor) -> Result<(), ModelError> {
        let picked = fwd.picked_hidden.detach().set_requires_grad(true);
        let grad = fwd.picked.gather(&grad.to_kind(Kind::Float));
        let n = fwd.picked.len();
        for start in (0..n).step_by(fwd.chunk as usize) {
            let len = fwd.chunk.min(n - start);
            let logits = self.head(&picked.narrow(0, start, len));
            if !logits.requires_grad() {
                continue;
            }
            let targets = fwd.picked.targets.narrow(0, start, len).unsqueeze(-1);
            let dlogits = tch::no_grad(|| {
                logit_grad(
                    &logits,
                    &targets,
                    &grad.narrow(0, start, len),
                    fwd.temperature,
                )
            });
            // d(sum(logits * dlogits))/dlogits = dlogits: the head's own
            // backward (linear and norm) runs from here, and the product
            // saves only `dlogits`, so the logits are freed at once.
            let surrogate = (&logits * &dlogits).sum(Kind::Float);
            drop(logits);
            surrogate.backward();
        }
        let picked_grad = picked.grad();
        if !picked_grad.defined() {
            return Ok(()); // no cell, or nothing below the head is trainable
        }
        // dL/dh of every final hidden state: 0 off the picked rows.
        let mut g = fwd.picked.spread(&picked_grad);
        if let Some(graph) = fwd.graph {
            if graph.requires_grad() {
                (graph * g).sum(Kind::Float).backward();
            }
            return Ok(());
        }
        for (layer, input) in self.layers.iter().zip(&fwd.layer_inputs).rev() {
            let x = input.detach().set_requires_grad(true);
            let y = layer.forward(
                &x,
                &fwd.body.tables,
                fwd.body.visibility(),
                Pass::Autograd,
                |k, v| (k, v),
            );
            (y * &g).sum(Kind::Float).backward();
            g = x.grad();
        }
        let embedded = self.embed(&fwd.tokens);
        if embedded.requires_grad() {
            (embedded * g).sum(Kind::Float).backward();
        }
        Ok(())
    }

    /// Logprobs (`[N]`, f32) of `targets` (`[N]`) after final hidden
    /// states `hidden` (`[N, H]`), and the sum of their entropy where
    /// `entropy_at` (`[N]`) is nonzero. Run without a graph; the f32
    /// `[N, V]` logits are worked on in place (one more buffer for the
    /// entropy) instead of a log-softmax and its temporaries.
    fn head_logprobs(
        &self,
        hidden: &Tensor,
        targets: &Tensor,
        temperature: f64,
        entropy_at: Option<&Tensor>,
    ) -> Result<(Tensor, f64), ModelError> {
        let mut z = shifted_logits(&self.head(hidden), temperature);
        let target = z.gather(-1, &targets.unsqueeze(-1), false);
        let mut entropy = 0.0;
        let log_sum = match entropy_at {
            // H = log S - sum(e z) / S with e = exp(z), S = sum(e).
            Some(at) => {
                let mut e = z.exp();
                let sum = e.sum_dim_intlist(-1, true, Kind::Float);
                let mean_z = e.g_mul_(&z).sum_dim_intlist(-1, true, Kind::Float) / &sum;
                let log_sum = sum.log();
                let h = (&log_sum - mean_z).squeeze_dim(-1);
                entropy = f64::try_from((h * at.to_kind(Kind::Float)).sum(Kind::Double))?;
                log_sum
            }
            None => z.exp_().sum_dim_intlist(-1, true, Kind::Float).log(),
        };
        Ok(((target - log_sum).squeeze_dim(-1), entropy))
    }
}

/// `logits / temperature` in f32, less each row's maximum (so `exp` cannot
/// overflow): a buffer of its own, even when the logits are f32 already.
fn shifted_logits(logits: &Tensor, temperature: f64) -> Tensor {
    let mut z = logits.detach().to_dtype(Kind::Float, false, true);
    if temperature != 1.0 {
        let _ = z.g_div_scalar_(temperature);
    }
    let max = z.amax(-1, true);
    let _ = z.g_sub_(&max);
    z
}

/// dL/dlogits (`[N, V]`, the logits' dtype) from `grad` = dL/dlogprob of
/// each target (`[N]`, the targets `[N, 1]`): the log-softmax's derivative at temperature `T`,
/// `grad / T * (onehot(target) - softmax(logits / T))`, built in one f32
/// buffer in place.
fn logit_grad(logits: &Tensor, targets: &Tensor, grad: &Tensor, temperature: f64) -> Tensor {
    let mut p = shifted_logits(logits, temperature);
    let _ = p.exp_();
    let sum = p.sum_dim_intlist(-1, true, Kind::Float);
    let _ = p.g_div_(&sum);
    let g = (grad / temperature).unsqueeze(-1);
    let _ = p.g_mul_(&(-&g));
    let _ = p.scatter_add_(-1, targets, &g);
    p.to_kind(logits.kind())
}
