//! A decode step (one new token for each of 1-8 sequences) of an f32 model
//! on the CPU in plain Rust around [`decode_matmul`]'s kernels, with no
//! libtorch op in between. Through libtorch the same step is ~1,500 small
//! ops (norms, RoPE, the cache write and gather, attention, activations),
//! each a dispatch, an allocation and often a thread wake-up: on 2 cores
//! they took ~40% of a batch-1 SmolLM2 step that the weights' read alone
//! bounds. Here they are loops over a few thousand floats per layer.
//!
//! The maths is the libtorch path's, in f32, the sums in another order:
//! `cached.rs`'s tests pin this step's logits and states against the
//! libtorch step, agl-engine's `tests/cache.rs` decoding against the full
//! forward. Anything it does not cover
//! (another dtype or device, biases, q/k norms, a sliding window, an active
//! LoRA adapter, shapes the kernels do not take) returns `None` and the
//! caller takes the libtorch path.

use tch::{Device, Kind, Tensor};

use super::Model;
use super::decode_matmul::{self, f32s, f32s_mut};
use super::layer_state::LayerState;
use super::layers::{Linear, RmsNorm};
use super::team;

/// One sequence's new token: its cache slot and position (the tokens it
/// already holds).
pub struct Row {
    pub slot: usize,
    pub pos: usize,
    pub token: i64,
}

/// The logits `[rows, vocab]` of one decode step, its keys and values
/// written into the attention `states` (per layer `[slots, kv_heads,
/// capacity, head_dim]`, grown by the caller to hold every row's position);
/// `None` (nothing written) where the step or the model is not covered.
pub fn run(model: &Model, states: &mut [LayerState], rows: &[Row]) -> Option<Tensor> {
    let shape = Shape::of(model, rows.len())?;
    let layers = model
        .layers
        .iter()
        .map(|l| LayerWeights::of(l, &shape))
        .collect::<Option<Vec<_>>>()?;
    let embed = f32s(&model.embed_tokens)?;
    let (final_norm, final_eps) = norm_parts(&model.norm)?;
    let lm_head = f32s(&model.lm_head)?;
    let inv_freq = Vec::<f32>::try_from(model.rope.inv_freq()).ok()?;
    let mut kv: Vec<(&mut Tensor, &mut Tensor)> = states
        .iter_mut()
        .map(|s| {
            let LayerState::Attention { keys, values } = s;
            (keys, values)
        })
        .collect();
    let caches_fit = kv.iter().flat_map(|(k, v)| [&**k, &**v]).all(|t| {
        let size = t.size();
        size.len() == 4
            && size[1] as usize == shape.kv_heads
            && size[3] as usize == shape.d
            && rows
                .iter()
                .all(|r| r.slot < size[0] as usize && r.pos < size[2] as usize)
    });
    let vocab = model.config.vocab_size as usize;
    let tokens_fit = rows.iter().all(|r| (0..vocab as i64).contains(&r.token));
    if !caches_fit || !tokens_fit || kv.len() != layers.len() {
        return None;
    }

    let (m, h) = (rows.len(), shape.hidden);
    let mut x = vec![0f32; m * h];
    for (r, row) in rows.iter().enumerate() {
        let t = row.token as usize;
        x[r * h..][..h].copy_from_slice(&embed[t * h..][..h]);
    }
    // Every layer's cache as floats before the first write, so a `None`
    // leaves the cache as it was.
    let caches = kv
        .iter_mut()
        .map(|(k, v)| {
            let capacity = k.size()[2] as usize;
            Some(Cache {
                keys: f32s_mut(k)?,
                values: f32s_mut(v)?,
                capacity,
            })
        })
        .collect::<Option<Vec<_>>>()?;
    let rope = RopeRows::new(&inv_freq, rows);
    let mut buf = Buffers::new(&shape);
    for (layer, cache) in layers.iter().zip(caches) {
        layer.step(&shape, &rope, rows, &mut x, &mut buf, cache);
    }
    rms_norm(&x, final_norm, final_eps, &mut buf.normed, h);
    let mut logits = vec![0f32; m * vocab];
    decode_matmul::rows(&buf.normed, lm_head, &mut logits, m, vocab, h);
    Some(Tensor::from_slice(&logits).view([m as i64, vocab as i64]))
}

/// The model's sizes, for a step of `m` rows it covers.
struct Shape {
    m: usize,
    hidden: usize,
    heads: usize,
    kv_heads: usize,
    d: usize,
    inter: usize,
}

impl Shape {
    fn of(model: &Model, m: usize) -> Option<Self> {
        let c = &model.config;
        let plain = model.kind == Kind::Float
            && model.device() == Device::Cpu
            && c.sliding_window.is_none()
            && !c.qk_norm;
        let (heads, kv_heads, d) = model.layers.first()?.parts().1.heads();
        let shape = Shape {
            m,
            hidden: c.hidden_size as usize,
            heads: heads as usize,
            kv_heads: kv_heads as usize,
            d: d as usize,
            inter: c.intermediate_size as usize,
        };
        let covered = [shape.hidden, shape.heads * shape.d, shape.inter]
            .into_iter()
            .all(|k| decode_matmul::covers(m, k));
        (plain
            && covered
            && shape.d.is_multiple_of(2)
            && shape.kv_heads > 0
            && shape.heads.is_multiple_of(shape.kv_heads))
        .then_some(shape)
    }
}

fn norm_parts(norm: &RmsNorm) -> Option<(&[f32], f32)> {
    let (w, eps) = norm.parts();
    Some((f32s(w)?, eps as f32))
}

fn weight(linear: &Linear) -> Option<&[f32]> {
    f32s(linear.plain_weight()?)
}

/// One decoder layer's parameters.
struct LayerWeights<'a> {
    in_norm: (&'a [f32], f32),
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    o: &'a [f32],
    post_norm: (&'a [f32], f32),
    gate: &'a [f32],
    up: &'a [f32],
    down: &'a [f32],
}

impl<'a> LayerWeights<'a> {
    /// `None` where a projection is not a plain `x W^T` of the shape's
    /// sizes.
    fn of(layer: &'a super::attention::DecoderLayer, s: &Shape) -> Option<Self> {
        let (in_norm, attn, post_norm, mlp) = layer.parts();
        let [(_, q), (_, k), (_, v), (_, o)] = attn.linears();
        let [(_, gate), (_, up), (_, down)] = mlp.linears();
        let (h, qd, kvd) = (s.hidden, s.heads * s.d, s.kv_heads * s.d);
        let dims = [
            (q, qd, h),
            (k, kvd, h),
            (v, kvd, h),
            (o, h, qd),
            (gate, s.inter, h),
            (up, s.inter, h),
            (down, h, s.inter),
        ];
        if !dims
            .iter()
            .all(|(l, out, inp)| l.dims() == (*out as i64, *inp as i64))
        {
            return None;
        }
        Some(Self {
            in_norm: norm_parts(in_norm)?,
            q: weight(q)?,
            k: weight(k)?,
            v: weight(v)?,
            o: weight(o)?,
            post_norm: norm_parts(post_norm)?,
            gate: weight(gate)?,
            up: weight(up)?,
            down: weight(down)?,
        })
    }

    /// `x` (`[m, hidden]`) through the layer, in place.
    fn step(
        &self,
        s: &Shape,
        rope: &RopeRows,
        rows: &[Row],
        x: &mut [f32],
        b: &mut Buffers,
        cache: Cache,
    ) {
        let (m, h, d) = (s.m, s.hidden, s.d);
        let (qd, kvd) = (s.heads * d, s.kv_heads * d);
        rms_norm(x, self.in_norm.0, self.in_norm.1, &mut b.normed, h);
        decode_matmul::rows_many(
            &b.normed,
            &mut [
                (self.q, &mut b.q, qd),
                (self.k, &mut b.k, kvd),
                (self.v, &mut b.v, kvd),
            ],
            m,
            h,
        );
        for (r, row) in rows.iter().enumerate() {
            rope.apply(r, &mut b.q[r * qd..][..qd], d);
            rope.apply(r, &mut b.k[r * kvd..][..kvd], d);
            for g in 0..s.kv_heads {
                let at = cache.at(s, row.slot, g, row.pos);
                cache.keys[at..][..d].copy_from_slice(&b.k[r * kvd + g * d..][..d]);
                cache.values[at..][..d].copy_from_slice(&b.v[r * kvd + g * d..][..d]);
            }
        }
        // Every (row, query head) apart: over the team's threads.
        let (cache, q) = (&cache, &b.q);
        team::for_each_chunk_mut(&mut b.attn, d, |i, out| {
            let (r, hq) = (i / s.heads, i % s.heads);
            let q = &q[r * qd + hq * d..][..d];
            attend(s, cache, &rows[r], hq, q, out);
        });
        decode_matmul::rows(&b.attn, self.o, &mut b.out, m, h, qd);
        add(x, &b.out);
        rms_norm(x, self.post_norm.0, self.post_norm.1, &mut b.normed, h);
        decode_matmul::rows_many(
            &b.normed,
            &mut [
                (self.gate, &mut b.gate, s.inter),
                (self.up, &mut b.up, s.inter),
            ],
            m,
            h,
        );
        for (g, u) in b.gate.iter_mut().zip(&b.up) {
            *g = *g / (1.0 + (-*g).exp()) * u;
        }
        decode_matmul::rows(&b.gate, self.down, &mut b.out, m, h, s.inter);
        add(x, &b.out);
    }
}

/// One layer's cache as floats, `[slots, kv_heads, capacity, d]`.
struct Cache<'a> {
    keys: &'a mut [f32],
    values: &'a mut [f32],
    capacity: usize,
}

impl Cache<'_> {
    /// Offset of (slot, kv head, position).
    fn at(&self, s: &Shape, slot: usize, g: usize, pos: usize) -> usize {
        ((slot * s.kv_heads + g) * self.capacity + pos) * s.d
    }
}

/// Scratch space of one step.
struct Buffers {
    normed: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    attn: Vec<f32>,
    out: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
}

impl Buffers {
    fn new(s: &Shape) -> Self {
        let (qd, kvd) = (s.heads * s.d, s.kv_heads * s.d);
        Self {
            normed: vec![0.0; s.m * s.hidden],
            q: vec![0.0; s.m * qd],
            k: vec![0.0; s.m * kvd],
            v: vec![0.0; s.m * kvd],
            attn: vec![0.0; s.m * qd],
            out: vec![0.0; s.m * s.hidden],
            gate: vec![0.0; s.m * s.inter],
            up: vec![0.0; s.m * s.inter],
        }
    }
}

/// transformers' `LlamaRMSNorm` in f32, row by row of `h`.
fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32], h: usize) {
    for (xr, or) in x.chunks_exact(h).zip(out.chunks_exact_mut(h)) {
        let inv = 1.0 / (dot(xr, xr) / h as f32 + eps).sqrt();
        for ((o, &v), &w) in or.iter_mut().zip(xr).zip(weight) {
            *o = w * (v * inv);
        }
    }
}

fn add(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// A dot product in 16 independent lanes (so it vectorises).
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    let (ca, cb) = (a.chunks_exact(16), b.chunks_exact(16));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for i in 0..16 {
            acc[i] += x[i] * y[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// Query head `hq` (`q`, `d` floats) over its kv head's keys `0..=row.pos`
/// of the row's slot: softmax(q k / sqrt(d)) v into `out`.
fn attend(s: &Shape, cache: &Cache, row: &Row, hq: usize, q: &[f32], out: &mut [f32]) {
    let d = s.d;
    let scale = 1.0 / (d as f32).sqrt();
    let g = hq / (s.heads / s.kv_heads);
    let len = row.pos + 1;
    let base = cache.at(s, row.slot, g, 0);
    let keys = &cache.keys[base..][..len * d];
    let values = &cache.values[base..][..len * d];
    let mut scores: Vec<f32> = keys.chunks_exact(d).map(|k| dot(q, k) * scale).collect();
    let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0;
    for p in scores.iter_mut() {
        *p = (*p - max).exp();
        sum += *p;
    }
    out.fill(0.0);
    for (p, v) in scores.iter().zip(values.chunks_exact(d)) {
        let w = p / sum;
        for (o, &vv) in out.iter_mut().zip(v) {
            *o += w * vv;
        }
    }
}

/// cos and sin of each row's position, `[rows][d / 2]`, as
/// [`super::rope::Rope::tables`] makes them (angles in f32).
struct RopeRows {
    cos: Vec<Vec<f32>>,
    sin: Vec<Vec<f32>>,
}

impl RopeRows {
    fn new(inv_freq: &[f32], rows: &[Row]) -> Self {
        let angles =
            |row: &Row| -> Vec<f32> { inv_freq.iter().map(|&f| row.pos as f32 * f).collect() };
        Self {
            cos: rows
                .iter()
                .map(|r| angles(r).into_iter().map(f32::cos).collect())
                .collect(),
            sin: rows
                .iter()
                .map(|r| angles(r).into_iter().map(f32::sin).collect())
                .collect(),
        }
    }

    /// Rotates every head (`d` each) of row `r`'s `x`: `rotate_half`.
    fn apply(&self, r: usize, x: &mut [f32], d: usize) {
        let (cos, sin, half) = (&self.cos[r], &self.sin[r], d / 2);
        for head in x.chunks_exact_mut(d) {
            let (x1, x2) = head.split_at_mut(half);
            for i in 0..half {
                let (a, b) = (x1[i], x2[i]);
                x1[i] = a * cos[i] - b * sin[i];
                x2[i] = b * cos[i] + a * sin[i];
            }
        }
    }
}
