//! A training forward and backward that keeps less alive (`[train]
//! checkpoint_layers`, `logprob_chunk`), with the same gradients as
//! [`Model::forward`] + autograd:
//!
//! - **Chunked log-probabilities**: the head (final norm, LM head,
//!   log-softmax) runs `chunk` positions at a time, without a graph, so the
//!   `[tokens x vocabulary]` logits never exist whole. The loss is taken on
//!   the logprobs as a leaf; its gradient `dL/dlogp` `[B, T-1]` then flows
//!   back chunk by chunk, each chunk's head recomputed with a graph and
//!   dropped, adding into the head's parameters and `dL/dh` of the final
//!   hidden states.
//! - **Activation checkpointing per decoder layer**: the forward keeps only
//!   each layer's input; the backward recomputes one layer at a time from
//!   its input and back-propagates `dL/dh` through it, so one layer's
//!   activations are alive at once instead of all of them.
//!
//! What torch.utils.checkpoint does with a saved RNG state is not needed:
//! nothing in a layer is random unless LoRA dropout is on, which the
//! caller refuses with checkpointing.

use tch::{Kind, Tensor};

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
    /// The final hidden states, detached.
    hidden: Tensor,
    /// Without checkpointing: the final hidden states with their graph.
    graph: Option<Tensor>,
    /// With checkpointing: each layer's input (detached) and the layers'
    /// shared inputs.
    layer_inputs: Vec<Tensor>,
    body: BodyInputs,
}

impl Model {
    /// The training forward of `tokens` (as [`Model::forward`] takes them)
    /// under `lean`; the entropy is summed where `entropy_at` (`[B, T-1]`)
    /// is nonzero.
    pub fn lean_forward(
        &self,
        tokens: &Tensor,
        attention_mask: Option<&Tensor>,
        temperature: f64,
        lean: Lean,
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
                layer.forward(&x, &body.tables, body.visibility(), |k, v| (k, v))
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
        let cols = t - 1;
        let chunk = match lean.logprob_chunk {
            0 => cols,
            n => (n as i64).min(cols),
        };
        let (mut parts, mut entropy_sum) = (Vec::new(), 0.0);
        tch::no_grad(|| -> Result<(), ModelError> {
            for start in (0..cols).step_by(chunk as usize) {
                let n = chunk.min(cols - start);
                let (lp, logp) = self.head_chunk(&hidden, &tokens, start, n, temperature);
                if let Some(at) = entropy_at {
                    let at = at.narrow(1, start, n).to_kind(Kind::Float).unsqueeze(-1);
                    let ent = -(logp.exp() * &logp * at).sum(Kind::Double);
                    entropy_sum += f64::try_from(ent)?;
                }
                parts.push(lp);
            }
            Ok(())
        })?;
        Ok(LeanForward {
            logprobs: Tensor::cat(&parts, 1),
            entropy_sum,
            tokens,
            temperature,
            chunk,
            hidden,
            graph,
            layer_inputs,
            body,
        })
    }

    /// Back-propagates `grad` = dL/dlogprobs (`[B, T-1]`) of a
    /// [`Model::lean_forward`] into every trainable parameter's `.grad`.
    pub fn lean_backward(&self, fwd: LeanForward, grad: &Tensor) -> Result<(), ModelError> {
        let hidden = fwd.hidden.detach().set_requires_grad(true);
        let cols = fwd.tokens.size()[1] - 1;
        let grad = grad.to_device(self.device()).to_kind(Kind::Float);
        for start in (0..cols).step_by(fwd.chunk as usize) {
            let n = fwd.chunk.min(cols - start);
            let (lp, _) = self.head_chunk(&hidden, &fwd.tokens, start, n, fwd.temperature);
            if lp.requires_grad() {
                (lp * grad.narrow(1, start, n)).sum(Kind::Float).backward();
            }
        }
        let mut g = hidden.grad();
        if !g.defined() {
            return Ok(()); // nothing below the head is trainable
        }
        if let Some(graph) = fwd.graph {
            if graph.requires_grad() {
                (graph * g).sum(Kind::Float).backward();
            }
            return Ok(());
        }
        for (layer, input) in self.layers.iter().zip(&fwd.layer_inputs).rev() {
            let x = input.detach().set_requires_grad(true);
            let y = layer.forward(&x, &fwd.body.tables, fwd.body.visibility(), |k, v| (k, v));
            (y * &g).sum(Kind::Float).backward();
            g = x.grad();
        }
        let embedded = self.embed(&fwd.tokens);
        if embedded.requires_grad() {
            (embedded * g).sum(Kind::Float).backward();
        }
        Ok(())
    }

    /// Logprobs of positions `start..start + n` (`[B, n]`, f32) and their
    /// log-softmax (`[B, n, V]`), with a graph when grad mode is on.
    fn head_chunk(
        &self,
        hidden: &Tensor,
        tokens: &Tensor,
        start: i64,
        n: i64,
        temperature: f64,
    ) -> (Tensor, Tensor) {
        let logits = self.head(&hidden.narrow(1, start, n));
        let logp = (logits.to_kind(Kind::Float) / temperature).log_softmax(-1, None);
        let targets = tokens.narrow(1, start + 1, n).unsqueeze(-1);
        let lp = logp.gather(2, &targets, false).squeeze_dim(-1);
        (lp, logp)
    }
}
