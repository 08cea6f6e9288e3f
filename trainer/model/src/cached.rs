//! The forward of new tokens over each layer's per-sequence state
//! ([`Model::forward_cached`], see `layer_state.rs` for the state). One
//! call runs one step for any set of slots, each with any number of new
//! tokens (a prefill is many, a decode step one): the new tokens are right
//! padded into `[N, T_new]`, their keys/values written into the slots at
//! positions `start..start + n`, and the queries attend over the slots'
//! first `max(start + n)` positions with a mask that hides other sequences'
//! padding. A decode step the Rust kernels cover goes through
//! `decode_step.rs` instead of libtorch.
//!
//! Cost: each step gathers the active slots' caches (a copy of `N * L` keys
//! per layer). Mixing one long prefill with many decodes pads every decode to
//! the prefill's length, so an engine should step prefills and decodes apart.

use tch::{Device, Kind, Tensor};

use super::attention::Visibility;
use super::decode_step;
use super::layer_state::{LayerState, StepRow};
use super::layers::{self, Pass};
use super::{Model, ModelError};

/// Index tensors of one step, built from the batch before the forward.
struct StepPlan {
    /// Slot of each batch row, `[N]`.
    slots: Tensor,
    /// (row, column) in the padded new tokens and (slot, position) in the
    /// cache of every real new token, `[M]` each.
    src_rows: Tensor,
    src_cols: Tensor,
    dst_slots: Tensor,
    dst_pos: Tensor,
    /// Keys attended over: `max(start + n)`.
    key_len: i64,
}

impl Model {
    /// Every layer's state for `num_slots` sequences of up to `capacity`
    /// positions, zeroed.
    pub fn layer_states(&self, num_slots: usize, capacity: usize) -> Vec<LayerState> {
        let c = self.config();
        let shape = [
            num_slots as i64,
            c.num_key_value_heads,
            capacity as i64,
            c.head_dim,
        ];
        let zeros = || Tensor::zeros(shape, (self.kind(), self.device()));
        (0..c.num_hidden_layers)
            .map(|_| LayerState::Attention {
                keys: zeros(),
                values: zeros(),
            })
            .collect()
    }

    /// One batched inference step: each row's new tokens (each slot at most
    /// once) after the `start` positions its slot's state holds. Writes
    /// their keys/values into `states` (grown by the caller to hold
    /// `start + tokens`) and returns the logits of each row's last new token,
    /// `[N, V]` in the model dtype, in row order. Runs without autograd.
    pub fn forward_cached(
        &self,
        states: &mut [LayerState],
        rows: &[StepRow],
    ) -> Result<Tensor, ModelError> {
        self.check_step(states, rows)?;
        if let Some(logits) = self.decode_in_rust(states, rows) {
            return Ok(logits);
        }
        self.forward_cached_torch(states, rows)
    }

    /// A step of one new token per sequence through [`decode_step`], where
    /// it covers the model and the step.
    fn decode_in_rust(&self, states: &mut [LayerState], rows: &[StepRow]) -> Option<Tensor> {
        let rows = rows
            .iter()
            .map(|r| match r.tokens {
                [token] => Some(decode_step::Row {
                    slot: r.slot,
                    pos: r.start,
                    token: *token,
                }),
                _ => None,
            })
            .collect::<Option<Vec<_>>>()?;
        decode_step::run(self, states, &rows)
    }

    /// [`Model::forward_cached`] through libtorch, for any step.
    fn forward_cached_torch(
        &self,
        states: &mut [LayerState],
        rows: &[StepRow],
    ) -> Result<Tensor, ModelError> {
        let device = self.device();
        let starts: Vec<i64> = rows.iter().map(|r| r.start as i64).collect();
        let counts: Vec<i64> = rows.iter().map(|r| r.tokens.len() as i64).collect();
        let (n, t_new) = (rows.len() as i64, counts.iter().copied().max().unwrap_or(0));
        let plan = plan_step(rows, device);

        let mut padded = vec![0i64; (n * t_new) as usize];
        for (i, r) in rows.iter().enumerate() {
            padded[i * t_new as usize..][..r.tokens.len()].copy_from_slice(r.tokens);
        }
        let tokens = Tensor::from_slice(&padded)
            .view([n, t_new])
            .to_device(device);
        let col = Tensor::arange(t_new, (Kind::Int64, device)).view([1, t_new]);
        let start = Tensor::from_slice(&starts).to_device(device).view([n, 1]);
        let count = Tensor::from_slice(&counts).to_device(device).view([n, 1]);
        let positions = &start + &col;
        // Padding queries reuse their row's last real position, so every
        // query row sees at least one key (their outputs are discarded).
        let query_pos = &start + col.minimum(&(&count - 1));
        let key_pos =
            Tensor::arange(plan.key_len, (Kind::Int64, device)).view([1, 1, plan.key_len]);
        // Without a sliding window, two common steps need no mask (and so
        // let SDPA pick its fused kernels): one sequence decoding one token
        // sees every key; one sequence prefilled from position 0 is plainly
        // causal.
        let window = self.config.sliding_window.is_some();
        let explicit = (window || n > 1 || (t_new > 1 && starts[0] > 0)).then(|| {
            self.visible(&query_pos.unsqueeze(-1), &key_pos)
                .unsqueeze(1)
        });
        let mask = match &explicit {
            Some(m) => Visibility::Mask(m),
            None if t_new > 1 => Visibility::Causal,
            None => Visibility::All,
        };
        let logits = tch::no_grad(|| {
            let tables = self.rope.tables(&positions, self.kind);
            let mut x = Tensor::embedding(&self.embed_tokens, &tokens, -1, false, false);
            for (layer, state) in self.layers.iter().zip(states.iter_mut()) {
                let LayerState::Attention { keys, values } = state;
                x = layer.forward(&x, &tables, mask, Pass::Inference, |k, v| {
                    (
                        plan.write_and_read(keys, &k),
                        plan.write_and_read(values, &v),
                    )
                });
            }
            let rows = Tensor::arange(n, (Kind::Int64, device));
            let last = (count.view([n]) - 1).to_device(device);
            let x = x.index(&[Some(&rows), Some(&last)]);
            let h = self.norm.forward(&x);
            layers::project(&h, &self.lm_head, Pass::Inference)
        });
        Ok(logits)
    }

    fn check_step(&self, states: &[LayerState], rows: &[StepRow]) -> Result<(), ModelError> {
        if rows.is_empty() {
            return Err(ModelError::Input("empty batch".into()));
        }
        if states.len() != self.layers.len() {
            return Err(ModelError::Cache(format!(
                "{} layer states for {} layers",
                states.len(),
                self.layers.len()
            )));
        }
        let slots = states.first().map_or(0, LayerState::slots);
        let capacity = states.iter().filter_map(LayerState::capacity).min();
        let mut seen = vec![false; slots];
        for r in rows {
            if r.slot >= slots || std::mem::replace(&mut seen[r.slot], true) {
                return Err(ModelError::Input(format!(
                    "slot {} is out of range or appears twice in one step",
                    r.slot
                )));
            }
            if r.tokens.is_empty() {
                return Err(ModelError::Input(format!(
                    "no new tokens for slot {}",
                    r.slot
                )));
            }
            if capacity.is_some_and(|c| r.start + r.tokens.len() > c) {
                return Err(ModelError::Cache(format!(
                    "slot {} would hold {} positions, over the state's {capacity:?}",
                    r.slot,
                    r.start + r.tokens.len()
                )));
            }
            if let Some(bad) = r
                .tokens
                .iter()
                .find(|&&t| t < 0 || t >= self.config.vocab_size)
            {
                return Err(ModelError::Input(format!(
                    "token id {bad} outside 0..{}",
                    self.config.vocab_size
                )));
            }
        }
        Ok(())
    }
}

fn plan_step(rows: &[StepRow], device: Device) -> StepPlan {
    let (mut src_rows, mut src_cols, mut dst_slots, mut dst_pos) = (vec![], vec![], vec![], vec![]);
    for (i, r) in rows.iter().enumerate() {
        for j in 0..r.tokens.len() {
            src_rows.push(i as i64);
            src_cols.push(j as i64);
            dst_slots.push(r.slot as i64);
            dst_pos.push((r.start + j) as i64);
        }
    }
    let key_len = rows
        .iter()
        .map(|r| (r.start + r.tokens.len()) as i64)
        .max()
        .unwrap_or(0);
    let slots: Vec<i64> = rows.iter().map(|r| r.slot as i64).collect();
    let t = |v: &[i64]| Tensor::from_slice(v).to_device(device);
    StepPlan {
        slots: t(&slots),
        src_rows: t(&src_rows),
        src_cols: t(&src_cols),
        dst_slots: t(&dst_slots),
        dst_pos: t(&dst_pos),
        key_len,
    }
}

impl StepPlan {
    /// Writes the real entries of `new` (`[N, kv_heads, T_new, d]`) into
    /// `cache` (`[slots, kv_heads, capacity, d]`) and returns the batch's
    /// cached keys/values `[N, kv_heads, key_len, d]`.
    fn write_and_read(&self, cache: &mut Tensor, new: &Tensor) -> Tensor {
        let entries = new
            .permute([0, 2, 1, 3])
            .index(&[Some(&self.src_rows), Some(&self.src_cols)]);
        let _ = cache.index_put_(
            &[Some(&self.dst_slots), None, Some(&self.dst_pos)],
            &entries,
            false,
        );
        cache
            .narrow(2, 0, self.key_len)
            .index_select(0, &self.slots)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::ModelConfig;
    use crate::layer_state::grow_states;

    fn model(extra: serde_json::Value) -> Model {
        model_in(extra, Kind::Float)
    }

    fn model_in(extra: serde_json::Value, kind: Kind) -> Model {
        let mut config = json!({
            "model_type": "llama", "vocab_size": 300, "hidden_size": 64,
            "intermediate_size": 128, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2,
            "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
            "max_position_embeddings": 256, "tie_word_embeddings": false,
        });
        if let (Some(base), Some(extra)) = (config.as_object_mut(), extra.as_object()) {
            base.extend(extra.clone());
        }
        tch::manual_seed(3);
        Model::new(ModelConfig::from_json(config).unwrap(), kind, Device::Cpu).unwrap()
    }

    fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
        f64::try_from((a - b).abs().max()).unwrap()
    }

    fn tensors(states: &[LayerState]) -> Vec<&Tensor> {
        states
            .iter()
            .flat_map(|s| {
                let LayerState::Attention { keys, values } = s;
                [keys, values]
            })
            .collect()
    }

    /// The Rust decode step against libtorch's on the same states: logits
    /// and every layer's keys and values, for 1 and 3 sequences at
    /// different positions (3 only where the kernels take them, i.e. with
    /// AVX-512).
    #[test]
    fn the_rust_decode_step_matches_libtorch() {
        let model = model(json!({}));
        let mut states = model.layer_states(4, 128);
        let mut lens = Vec::new();
        for slot in 0..3 {
            let prompt: Vec<i64> = (0..(5 + 30 * slot as i64))
                .map(|t| (t * 7 + 1) % 300)
                .collect();
            let row = StepRow {
                slot,
                start: 0,
                tokens: &prompt,
            };
            let _ = model.forward_cached(&mut states, &[row]).unwrap();
            lens.push(prompt.len());
        }
        for n in [1, 3] {
            let tokens = [11i64, 222, 33];
            let rows: Vec<StepRow> = (0..n)
                .map(|slot| StepRow {
                    slot,
                    start: lens[slot],
                    tokens: std::slice::from_ref(&tokens[slot]),
                })
                .collect();
            let mut torch_states: Vec<LayerState> = states.iter().map(LayerState::copy).collect();
            let fast = tch::no_grad(|| model.decode_in_rust(&mut states, &rows));
            let Some(fast) = fast else {
                assert!(n > 1, "one row is always covered");
                continue;
            };
            let torch = model
                .forward_cached_torch(&mut torch_states, &rows)
                .unwrap();
            assert_eq!(fast.size(), torch.size());
            assert!(max_diff(&fast, &torch) < 1e-5, "{n} rows: logits");
            for (a, b) in tensors(&states).into_iter().zip(tensors(&torch_states)) {
                assert!(max_diff(a, b) < 1e-5, "{n} rows: states");
            }
            for l in lens.iter_mut().take(n) {
                *l += 1;
            }
        }
    }

    /// Biases, q/k norms and bf16 are left to libtorch.
    #[test]
    fn the_rust_decode_step_declines_what_it_does_not_cover() {
        let step = |model: &Model, states: &mut [LayerState]| {
            let row = StepRow {
                slot: 0,
                start: 2,
                tokens: &[3],
            };
            model.decode_in_rust(states, &[row])
        };
        for (model, why) in [
            (
                model(json!({ "model_type": "qwen3", "head_dim": 16 })),
                "q/k norms",
            ),
            (model(json!({ "attention_bias": true })), "biases"),
        ] {
            let mut states = model.layer_states(1, 16);
            let prefill = StepRow {
                slot: 0,
                start: 0,
                tokens: &[1, 2],
            };
            let _ = model.forward_cached(&mut states, &[prefill]).unwrap();
            assert!(step(&model, &mut states).is_none(), "{why}");
        }
        let bf16 = model_in(json!({}), Kind::BFloat16);
        let mut states = bf16.layer_states(1, 16);
        assert!(step(&bf16, &mut states).is_none(), "bf16");
    }

    /// Growing keeps what a state holds and the step refuses rows the
    /// states cannot hold.
    #[test]
    fn states_grow_and_a_step_past_their_capacity_is_refused() {
        let model = model(json!({}));
        let mut states = model.layer_states(1, 4);
        let tokens = [5i64, 6, 7, 8, 9, 10];
        let row = |start, tokens| StepRow {
            slot: 0,
            start,
            tokens,
        };
        let _ = model
            .forward_cached(&mut states, &[row(0, &tokens[..4])])
            .unwrap();
        let err = model.forward_cached(&mut states, &[row(4, &tokens[4..])]);
        assert!(err.unwrap_err().to_string().contains("would hold 6"));
        let before: Vec<Tensor> = tensors(&states).into_iter().map(Tensor::copy).collect();
        grow_states(&mut states, 8);
        assert_eq!(states[0].capacity(), Some(8));
        for (old, new) in before.iter().zip(tensors(&states)) {
            assert_eq!(max_diff(old, &new.narrow(2, 0, 4)), 0.0);
        }
        let _ = model
            .forward_cached(&mut states, &[row(4, &tokens[4..])])
            .unwrap();
    }
}
