//! KV cache for batched inference with sequences of different lengths.
//!
//! Design: a fixed number of *slots*, one per live sequence. Per layer the
//! cache holds keys and values `[slots, kv_heads, capacity, head_dim]`; a
//! slot's first `len` positions are valid. The capacity grows (doubling, up to
//! `max_len`) when a step needs more, so a cache sized for long contexts costs
//! little until used.
//!
//! One [`Model::forward_cached`] call runs one step for any set of slots, each
//! with any number of new tokens (a prefill is many, a decode step one): the
//! new tokens are right padded into `[N, T_new]`, their keys/values written
//! into the slots at positions `len..len + n`, and the queries attend over the
//! slots' first `max(len + n)` positions with a mask that hides other
//! sequences' padding. Sequences join (`allocate`, then a prefill step) and
//! leave (`release`) between steps.
//!
//! Cost: each step gathers the active slots' caches (a copy of `N * L` keys
//! per layer). Mixing one long prefill with many decodes pads every decode to
//! the prefill's length, so an engine should step prefills and decodes apart.

use tch::{Device, Kind, Tensor};

use super::attention::Visibility;
use super::decode_step;
use super::layers::{self, Pass};
use super::{Model, ModelError};

/// A sequence's place in a [`KvCache`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SlotId(usize);

impl SlotId {
    pub fn index(self) -> usize {
        self.0
    }
}

/// Keys and values of up to `num_slots` sequences; see the module docs.
#[derive(Debug)]
pub struct KvCache {
    keys: Vec<Tensor>,
    values: Vec<Tensor>,
    /// Valid positions per slot; `None` when the slot is free.
    lens: Vec<Option<usize>>,
    capacity: usize,
    max_len: usize,
}

/// The first capacity allocated; grown on demand.
const INITIAL_CAPACITY: usize = 64;

impl KvCache {
    /// An empty cache for `model` holding `num_slots` sequences of at most
    /// `max_len` tokens each.
    pub fn new(model: &Model, num_slots: usize, max_len: usize) -> Self {
        let c = model.config();
        let capacity = INITIAL_CAPACITY.min(max_len);
        let shape = [
            num_slots as i64,
            c.num_key_value_heads,
            capacity as i64,
            c.head_dim,
        ];
        let zeros = || Tensor::zeros(shape, (model.kind(), model.device()));
        Self {
            keys: (0..c.num_hidden_layers).map(|_| zeros()).collect(),
            values: (0..c.num_hidden_layers).map(|_| zeros()).collect(),
            lens: vec![None; num_slots],
            capacity,
            max_len,
        }
    }

    pub fn num_slots(&self) -> usize {
        self.lens.len()
    }

    pub fn max_len(&self) -> usize {
        self.max_len
    }

    /// Slots not in use.
    pub fn free_slots(&self) -> usize {
        self.lens.iter().filter(|l| l.is_none()).count()
    }

    /// Takes a free slot (length 0), or `None` if all are in use.
    pub fn allocate(&mut self) -> Option<SlotId> {
        let i = self.lens.iter().position(Option::is_none)?;
        self.lens[i] = Some(0);
        Some(SlotId(i))
    }

    /// Frees a slot; its contents are dropped (overwritten by the next user).
    pub fn release(&mut self, slot: SlotId) {
        if let Some(len) = self.lens.get_mut(slot.0) {
            *len = None;
        }
    }

    /// Tokens cached for `slot`, or `None` if it is not allocated.
    pub fn seq_len(&self, slot: SlotId) -> Option<usize> {
        self.lens.get(slot.0).copied().flatten()
    }

    /// Keeps only the first `len` positions of `slot` (e.g. to re-use a
    /// shared prefix and recompute what follows).
    pub fn truncate(&mut self, slot: SlotId, len: usize) -> Result<(), ModelError> {
        match self.lens.get_mut(slot.0) {
            Some(Some(cur)) if len <= *cur => {
                *cur = len;
                Ok(())
            }
            Some(Some(cur)) => Err(ModelError::Cache(format!(
                "cannot truncate {slot:?} of length {cur} to {len}"
            ))),
            _ => Err(ModelError::Cache(format!("{slot:?} is not allocated"))),
        }
    }

    fn grow(&mut self, needed: usize) {
        if needed <= self.capacity {
            return;
        }
        let capacity = needed.max(2 * self.capacity).min(self.max_len);
        let old = self.capacity as i64;
        for t in self.keys.iter_mut().chain(self.values.iter_mut()) {
            let mut size = t.size();
            size[2] = capacity as i64;
            let bigger = Tensor::zeros(&size, (t.kind(), t.device()));
            bigger.narrow(2, 0, old).copy_(t);
            *t = bigger;
        }
        self.capacity = capacity;
    }
}

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
    /// Keys attended over: `max(len + n)`.
    key_len: i64,
}

impl Model {
    /// One batched inference step: `batch` lists (slot, new tokens) pairs,
    /// each slot at most once and already allocated. Writes the new tokens'
    /// keys/values into their slots, advances their lengths, and returns the
    /// logits of each pair's last new token, `[N, V]` in the model dtype, in
    /// batch order. Runs without autograd.
    pub fn forward_cached(
        &self,
        cache: &mut KvCache,
        batch: &[(SlotId, &[i64])],
    ) -> Result<Tensor, ModelError> {
        self.check_step(cache, batch)?;
        let starts: Vec<i64> = batch
            .iter()
            .map(|(s, _)| cache.lens[s.0].unwrap_or(0) as i64)
            .collect();
        if let Some(logits) = self.decode_in_rust(cache, batch, &starts) {
            return Ok(logits);
        }
        self.forward_cached_torch(cache, batch, &starts)
    }

    /// A step of one new token per sequence through [`decode_step`], where
    /// it covers the model and the step.
    fn decode_in_rust(
        &self,
        cache: &mut KvCache,
        batch: &[(SlotId, &[i64])],
        starts: &[i64],
    ) -> Option<Tensor> {
        let rows = batch
            .iter()
            .zip(starts)
            .map(|((slot, tokens), &start)| match tokens {
                [token] => Some(decode_step::Row {
                    slot: slot.0,
                    pos: start as usize,
                    token: *token,
                }),
                _ => None,
            })
            .collect::<Option<Vec<_>>>()?;
        cache.grow(rows.iter().map(|r| r.pos + 1).max()?);
        let logits = decode_step::run(self, &mut cache.keys, &mut cache.values, &rows)?;
        for row in &rows {
            cache.lens[row.slot] = Some(row.pos + 1);
        }
        Some(logits)
    }

    /// [`Model::forward_cached`] through libtorch, for any step.
    fn forward_cached_torch(
        &self,
        cache: &mut KvCache,
        batch: &[(SlotId, &[i64])],
        starts: &[i64],
    ) -> Result<Tensor, ModelError> {
        let device = self.device();
        let counts: Vec<i64> = batch.iter().map(|(_, t)| t.len() as i64).collect();
        let (n, t_new) = (
            batch.len() as i64,
            counts.iter().copied().max().unwrap_or(0),
        );
        let plan = plan_step(batch, starts, &counts, device);
        cache.grow(plan.key_len as usize);

        let mut padded = vec![0i64; (n * t_new) as usize];
        for (row, (_, tokens)) in batch.iter().enumerate() {
            padded[row * t_new as usize..][..tokens.len()].copy_from_slice(tokens);
        }
        let tokens = Tensor::from_slice(&padded)
            .view([n, t_new])
            .to_device(device);
        let col = Tensor::arange(t_new, (Kind::Int64, device)).view([1, t_new]);
        let start = Tensor::from_slice(starts).to_device(device).view([n, 1]);
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
            for (l, layer) in self.layers.iter().enumerate() {
                let (keys, values) = (&mut cache.keys[l], &mut cache.values[l]);
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
        for ((slot, _), (s, c)) in batch.iter().zip(starts.iter().zip(&counts)) {
            cache.lens[slot.0] = Some((s + c) as usize);
        }
        Ok(logits)
    }

    fn check_step(&self, cache: &KvCache, batch: &[(SlotId, &[i64])]) -> Result<(), ModelError> {
        if batch.is_empty() {
            return Err(ModelError::Input("empty batch".into()));
        }
        let mut seen = vec![false; cache.num_slots()];
        for (slot, tokens) in batch {
            let len = cache
                .seq_len(*slot)
                .ok_or_else(|| ModelError::Cache(format!("{slot:?} is not allocated")))?;
            if std::mem::replace(&mut seen[slot.0], true) {
                return Err(ModelError::Input(format!(
                    "{slot:?} appears twice in one step"
                )));
            }
            if tokens.is_empty() {
                return Err(ModelError::Input(format!("no new tokens for {slot:?}")));
            }
            if len + tokens.len() > cache.max_len {
                return Err(ModelError::Cache(format!(
                    "{slot:?} would hold {} tokens, over max_len {}",
                    len + tokens.len(),
                    cache.max_len
                )));
            }
            if let Some(bad) = tokens
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

fn plan_step(
    batch: &[(SlotId, &[i64])],
    starts: &[i64],
    counts: &[i64],
    device: Device,
) -> StepPlan {
    let (mut src_rows, mut src_cols, mut dst_slots, mut dst_pos) = (vec![], vec![], vec![], vec![]);
    for (row, ((slot, _), (&start, &count))) in
        batch.iter().zip(starts.iter().zip(counts)).enumerate()
    {
        for j in 0..count {
            src_rows.push(row as i64);
            src_cols.push(j);
            dst_slots.push(slot.0 as i64);
            dst_pos.push(start + j);
        }
    }
    let key_len = starts
        .iter()
        .zip(counts)
        .map(|(s, c)| s + c)
        .max()
        .unwrap_or(0);
    let slots: Vec<i64> = batch.iter().map(|(s, _)| s.0 as i64).collect();
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

    fn copy(cache: &KvCache) -> KvCache {
        KvCache {
            keys: cache.keys.iter().map(Tensor::copy).collect(),
            values: cache.values.iter().map(Tensor::copy).collect(),
            lens: cache.lens.clone(),
            capacity: cache.capacity,
            max_len: cache.max_len,
        }
    }

    fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
        f64::try_from((a - b).abs().max()).unwrap()
    }

    /// The Rust decode step against libtorch's on the same cache: logits,
    /// every layer's keys and values, and the lengths, for 1 and 3
    /// sequences at different positions (3 only where the kernels take
    /// them, i.e. with AVX-512).
    #[test]
    fn the_rust_decode_step_matches_libtorch() {
        let model = model(json!({}));
        let mut cache = KvCache::new(&model, 4, 128);
        let slots: Vec<SlotId> = (0..3).map(|_| cache.allocate().unwrap()).collect();
        for (i, slot) in slots.iter().enumerate() {
            let prompt: Vec<i64> = (0..(5 + 30 * i as i64))
                .map(|t| (t * 7 + 1) % 300)
                .collect();
            let _ = model
                .forward_cached(&mut cache, &[(*slot, &prompt)])
                .unwrap();
        }
        for rows in [1, 3] {
            let tokens = [11i64, 222, 33];
            let batch: Vec<(SlotId, &[i64])> = slots[..rows]
                .iter()
                .zip(&tokens)
                .map(|(s, t)| (*s, std::slice::from_ref(t)))
                .collect();
            let starts: Vec<i64> = slots[..rows]
                .iter()
                .map(|s| cache.seq_len(*s).unwrap() as i64)
                .collect();
            let mut torch_cache = copy(&cache);
            let fast = tch::no_grad(|| model.decode_in_rust(&mut cache, &batch, &starts));
            let Some(fast) = fast else {
                assert!(rows > 1, "one row is always covered");
                continue;
            };
            let torch = model
                .forward_cached_torch(&mut torch_cache, &batch, &starts)
                .unwrap();
            assert_eq!(fast.size(), torch.size());
            assert!(max_diff(&fast, &torch) < 1e-5, "{rows} rows: logits");
            for (a, b) in cache
                .keys
                .iter()
                .chain(&cache.values)
                .zip(torch_cache.keys.iter().chain(&torch_cache.values))
            {
                assert!(max_diff(a, b) < 1e-5, "{rows} rows: cache");
            }
            assert_eq!(cache.lens, torch_cache.lens);
        }
    }

    /// Biases, q/k norms and bf16 are left to libtorch.
    #[test]
    fn the_rust_decode_step_declines_what_it_does_not_cover() {
        for (model, why) in [
            (
                model(json!({ "model_type": "qwen3", "head_dim": 16 })),
                "q/k norms",
            ),
            (model(json!({ "attention_bias": true })), "biases"),
        ] {
            let mut cache = KvCache::new(&model, 1, 16);
            let slot = cache.allocate().unwrap();
            let _ = model
                .forward_cached(&mut cache, &[(slot, &[1, 2])])
                .unwrap();
            assert!(
                model
                    .decode_in_rust(&mut cache, &[(slot, &[3])], &[2])
                    .is_none(),
                "{why}"
            );
        }
        let bf16 = model_in(json!({}), Kind::BFloat16);
        let mut cache = KvCache::new(&bf16, 1, 16);
        let slot = cache.allocate().unwrap();
        assert!(
            bf16.decode_in_rust(&mut cache, &[(slot, &[3])], &[0])
                .is_none(),
            "bf16"
        );
    }
}
