//! Per-request sampling: temperature, top-k, top-p, with a per-request RNG.

/// How a request picks its tokens.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// 0 = greedy.
    pub temperature: f64,
    /// 1 = no nucleus cut.
    pub top_p: f64,
    /// 0 = no top-k cut.
    pub top_k: usize,
    pub max_tokens: usize,
    /// Sampling one of these ends the sequence (the id is kept).
    pub stop_ids: Vec<u32>,
    /// `None`: a fresh seed.
    pub seed: Option<u64>,
    /// How many most likely tokens to report with each sampled one
    /// (0..=[`MAX_TOP_LOGPROBS`]), under the distribution it was drawn from.
    pub top_logprobs: usize,
}

/// The most alternatives a request may ask for per token (OpenAI's limit).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// `(token, logprob)` pairs, most likely first.
pub type TopLogprobs = Vec<(u32, f32)>;

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            max_tokens: 16,
            stop_ids: Vec::new(),
            seed: None,
            top_logprobs: 0,
        }
    }
}

impl SamplingParams {
    pub fn validate(&self) -> Result<(), String> {
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return Err(format!("temperature {} must be >= 0", self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(format!("top_p {} must be in (0, 1]", self.top_p));
        }
        if self.max_tokens == 0 {
            return Err("max_tokens must be >= 1".into());
        }
        if self.top_logprobs > MAX_TOP_LOGPROBS {
            return Err(format!(
                "top_logprobs {} must be at most {MAX_TOP_LOGPROBS}",
                self.top_logprobs
            ));
        }
        Ok(())
    }
}

/// SplitMix64: tiny, fast, and good enough to draw tokens.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// Uniform in `[0, 1)`.
    pub fn uniform(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Picks a token from one row of f32 logits; returns it with its f32
/// `log_softmax(logits / t)` (t = 1 when greedy) and the `top_logprobs`
/// most likely tokens under that same distribution (ties by id). With
/// `allowed` (a constraint's mask, one bit per token id) every other token
/// is out: the distribution, and so each logprob, is over the allowed ones.
pub fn sample(
    logits: &[f32],
    params: &SamplingParams,
    allowed: Option<&[u32]>,
    rng: &mut Rng,
) -> (u32, f32, TopLogprobs) {
    let greedy = params.temperature == 0.0;
    let t = if greedy {
        1.0
    } else {
        params.temperature as f32
    };
    let mut scaled: Vec<f32> = logits.iter().map(|&x| x / t).collect();
    if let Some(mask) = allowed {
        for (id, x) in scaled.iter_mut().enumerate() {
            if !is_allowed(mask, id) {
                *x = f32::NEG_INFINITY;
            }
        }
    }
    let max = scaled.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    // f32 exponentials (each within an ulp), summed in f64: the step's
    // 49k f64 `exp`s cost ~2% of a decode step.
    let sum: f64 = scaled.iter().map(|&x| f64::from((x - max).exp())).sum();
    let log_z = max + sum.ln() as f32;
    let token = if greedy {
        argmax(&scaled)
    } else {
        draw(&scaled, max, params, rng)
    };
    let top = top_k(&scaled, params.top_logprobs)
        .into_iter()
        .filter(|&i| scaled[i].is_finite())
        .map(|i| (i as u32, scaled[i] - log_z))
        .collect();
    (token as u32, scaled[token] - log_z, top)
}

/// Whether bit `id` of a token mask (32 ids per word) is set.
pub fn is_allowed(mask: &[u32], id: usize) -> bool {
    mask.get(id / 32).is_some_and(|w| w >> (id % 32) & 1 == 1)
}

/// Indices of the `k` largest values, largest first, ties by index.
fn top_k(xs: &[f32], k: usize) -> Vec<usize> {
    if k == 0 {
        return Vec::new();
    }
    let by_value = |a: &usize, b: &usize| xs[*b].total_cmp(&xs[*a]).then(a.cmp(b));
    let mut order: Vec<usize> = (0..xs.len()).collect();
    let k = k.min(order.len());
    if k < order.len() {
        order.select_nth_unstable_by(k - 1, by_value);
        order.truncate(k);
    }
    order.sort_unstable_by(by_value);
    order
}

fn argmax(xs: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in xs.iter().enumerate() {
        if x > xs[best] {
            best = i;
        }
    }
    best
}

/// Draws from softmax(`scaled`) restricted to the top-k / top-p set.
fn draw(scaled: &[f32], max: f32, params: &SamplingParams, rng: &mut Rng) -> usize {
    let weights: Vec<f64> = scaled.iter().map(|&x| ((x - max) as f64).exp()).collect();
    let cut = params.top_k > 0 && params.top_k < weights.len() || params.top_p < 1.0;
    let candidates: Vec<usize> = if cut {
        let mut order: Vec<usize> = (0..weights.len()).collect();
        // Ties broken by id so the kept set does not depend on sort internals.
        order.sort_unstable_by(|&a, &b| weights[b].total_cmp(&weights[a]).then(a.cmp(&b)));
        if params.top_k > 0 {
            order.truncate(params.top_k);
        }
        if params.top_p < 1.0 {
            let total: f64 = order.iter().map(|&i| weights[i]).sum();
            let mut acc = 0.0;
            let mut keep = 0;
            for &i in &order {
                keep += 1;
                acc += weights[i];
                if acc >= params.top_p * total {
                    break;
                }
            }
            order.truncate(keep);
        }
        order
    } else {
        (0..weights.len()).collect()
    };
    let total: f64 = candidates.iter().map(|&i| weights[i]).sum();
    let mut target = rng.uniform() * total;
    for &i in &candidates {
        target -= weights[i];
        if target < 0.0 {
            return i;
        }
    }
    // Rounding left a sliver: the last candidate that may be drawn.
    candidates
        .iter()
        .rev()
        .copied()
        .find(|&i| weights[i] > 0.0)
        .unwrap_or(candidates[candidates.len() - 1])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: f64, top_k: usize, top_p: f64) -> SamplingParams {
        SamplingParams {
            temperature,
            top_k,
            top_p,
            ..SamplingParams::default()
        }
    }

    #[test]
    fn greedy_takes_the_argmax_with_its_t1_logprob() {
        let logits = [0.0f32, 2.0, 1.0];
        let (tok, lp, _) = sample(&logits, &params(0.0, 0, 1.0), None, &mut Rng::new(1));
        assert_eq!(tok, 1);
        let z: f32 = logits.iter().map(|x| x.exp()).sum();
        assert!((lp - (2.0 - z.ln())).abs() < 1e-6);
    }

    #[test]
    fn top_k_one_is_greedy_and_logprob_is_temperature_scaled() {
        let logits = [0.5f32, 3.0, 1.0, -1.0];
        let mut rng = Rng::new(7);
        for _ in 0..20 {
            let (tok, lp, _) = sample(&logits, &params(0.5, 1, 1.0), None, &mut rng);
            assert_eq!(tok, 1);
            let z: f32 = logits.iter().map(|x| (x / 0.5).exp()).sum();
            assert!((lp - (3.0 / 0.5 - z.ln())).abs() < 1e-5);
        }
    }

    #[test]
    fn top_p_keeps_the_nucleus_and_sampling_follows_the_distribution() {
        // Probabilities ~ [0.64, 0.24, 0.09, 0.03]: top_p 0.7 keeps two.
        let logits = [3.0f32, 2.0, 1.0, -0.2];
        let mut rng = Rng::new(3);
        let mut counts = [0usize; 4];
        for _ in 0..4000 {
            counts[sample(&logits, &params(1.0, 0, 0.7), None, &mut rng).0 as usize] += 1;
        }
        assert_eq!(counts[2] + counts[3], 0);
        let share = counts[0] as f64 / 4000.0;
        assert!((share - 0.64 / 0.88).abs() < 0.03, "{counts:?}");
    }

    #[test]
    fn top_logprobs_come_from_the_sampling_distribution_most_likely_first() {
        let logits = [1.0f32, 3.0, 3.0, -2.0, 0.5];
        let mut p = params(0.7, 0, 1.0);
        p.top_logprobs = 3;
        let (_, _, top) = sample(&logits, &p, None, &mut Rng::new(9));
        let z: f32 = logits.iter().map(|x| (x / 0.7).exp()).sum();
        let lp = |i: usize| logits[i] / 0.7 - z.ln();
        let ids: Vec<u32> = top.iter().map(|t| t.0).collect();
        assert_eq!(ids, [1, 2, 0], "ties by id");
        for (id, got) in top {
            assert!((got - lp(id as usize)).abs() < 1e-5);
        }
        // Greedy: the top-1 is the sampled token, with the same logprob.
        p.temperature = 0.0;
        p.top_logprobs = 20;
        let (tok, lp, top) = sample(&logits, &p, None, &mut Rng::new(9));
        assert_eq!(top.len(), logits.len(), "capped at the vocabulary");
        assert_eq!(top[0], (tok, lp));
        p.top_logprobs = 21;
        assert!(p.validate().unwrap_err().contains("top_logprobs"));
    }

    #[test]
    fn a_mask_keeps_only_allowed_tokens_and_renormalises_over_them() {
        let logits = [2.0f32, 0.5, 1.5, -1.0, 0.0];
        // Tokens 1 and 3 only.
        let mask = [0b01010u32];
        let mut p = params(0.8, 0, 1.0);
        p.top_logprobs = 5;
        let z: f32 = [1usize, 3].iter().map(|&i| (logits[i] / 0.8).exp()).sum();
        let mut rng = Rng::new(4);
        let mut seen = [0usize; 5];
        for _ in 0..300 {
            let (tok, lp, top) = sample(&logits, &p, Some(&mask), &mut rng);
            seen[tok as usize] += 1;
            assert!((lp - (logits[tok as usize] / 0.8 - z.ln())).abs() < 1e-5);
            assert_eq!(top.iter().map(|t| t.0).collect::<Vec<_>>(), [1, 3]);
        }
        assert_eq!(seen[0] + seen[2] + seen[4], 0, "{seen:?}");
        assert!(seen[1] > 0 && seen[3] > 0, "{seen:?}");
        let (tok, _, _) = sample(&logits, &params(0.0, 0, 1.0), Some(&mask), &mut rng);
        assert_eq!(tok, 1, "greedy: the best allowed token");
    }

    #[test]
    fn same_seed_same_draws() {
        let logits: Vec<f32> = (0..50).map(|i| (i % 7) as f32 * 0.3).collect();
        let run = |seed| {
            let mut rng = Rng::new(seed);
            (0..30)
                .map(|_| sample(&logits, &params(1.0, 0, 1.0), None, &mut rng).0)
                .collect::<Vec<_>>()
        };
        assert_eq!(run(5), run(5));
        assert_ne!(run(5), run(6));
    }
}
