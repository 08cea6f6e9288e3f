//! The engine's per-sequence cache: its steps agree with the full
//! forward, alone and batched, and bad steps are errors that change nothing.

use crate::common::{max_abs_diff, random_model, tiny_config};
use agl_engine::{SequenceCache, SlotId};
use agl_model::Model;
use serde_json::json;
use tch::{Kind, Tensor};

const TOL: f64 = 1e-5;

fn full_logits(model: &Model, tokens: &[i64]) -> Tensor {
    let t = Tensor::from_slice(tokens).view([1, -1]);
    tch::no_grad(|| model.forward(&t, None).unwrap()).squeeze_dim(0)
}

fn seq(len: usize, salt: i64) -> Vec<i64> {
    (0..len as i64)
        .map(|i| (i * 37 + salt * 101 + 5) % 300)
        .collect()
}

#[test]
fn incremental_decoding_matches_full_forward() {
    // Qwen3-style q/k norms and biases exercise every projection path.
    for extra in [
        json!({}),
        json!({ "model_type": "qwen3", "attention_bias": true, "head_dim": 24 }),
    ] {
        let model = random_model(tiny_config(extra.clone()), Kind::Float, 7);
        let tokens = seq(20, 1);
        let full = full_logits(&model, &tokens);
        let mut cache = SequenceCache::new(&model, 2, 64);
        let slot = cache.allocate().unwrap();
        // Prefill 5 tokens, then decode the rest one at a time.
        let mut worst = 0f64;
        let out = cache.step(&model, &[(slot, &tokens[..5])]).unwrap();
        worst = worst.max(max_abs_diff(&out.get(0), &full.get(4)));
        for i in 5..tokens.len() {
            let out = cache.step(&model, &[(slot, &tokens[i..=i])]).unwrap();
            worst = worst.max(max_abs_diff(&out.get(0), &full.get(i as i64)));
        }
        println!("{extra}: incremental vs full max abs diff {worst:e}");
        assert!(worst < TOL, "{worst}");
        assert_eq!(cache.seq_len(slot), Some(20));
    }
}

#[test]
fn batched_steps_match_each_sequence_alone() {
    let model = random_model(tiny_config(json!({})), Kind::Float, 8);
    let seqs: Vec<Vec<i64>> = [(3, 1), (11, 2), (7, 3)]
        .iter()
        .map(|&(n, s)| seq(n, s))
        .collect();
    let decode: Vec<Vec<i64>> = (0..3).map(|s| seq(4, 10 + s)).collect();

    // Each sequence alone: prefill then 4 decode steps, in its own cache.
    let alone: Vec<Vec<Tensor>> = (0..3)
        .map(|i| {
            let mut cache = SequenceCache::new(&model, 1, 64);
            let slot = cache.allocate().unwrap();
            let mut outs = vec![cache.step(&model, &[(slot, &seqs[i])]).unwrap().get(0)];
            for tok in &decode[i] {
                outs.push(cache.step(&model, &[(slot, &[*tok])]).unwrap().get(0));
            }
            outs
        })
        .collect();

    // All three together: one batched prefill of different lengths, then
    // batched decode steps of one token per sequence.
    let mut cache = SequenceCache::new(&model, 4, 64);
    let slots: Vec<SlotId> = (0..3).map(|_| cache.allocate().unwrap()).collect();
    let batch: Vec<(SlotId, &[i64])> = slots
        .iter()
        .zip(&seqs)
        .map(|(s, t)| (*s, t.as_slice()))
        .collect();
    let prefill = cache.step(&model, &batch).unwrap();
    assert_eq!(prefill.size(), [3, 300]);
    let mut worst = 0f64;
    for (i, outs) in alone.iter().enumerate() {
        worst = worst.max(max_abs_diff(&prefill.get(i as i64), &outs[0]));
    }
    for step in 0..4 {
        let toks: Vec<[i64; 1]> = (0..3).map(|i| [decode[i][step]]).collect();
        let batch: Vec<(SlotId, &[i64])> = slots
            .iter()
            .zip(&toks)
            .map(|(s, t)| (*s, t.as_slice()))
            .collect();
        let out = cache.step(&model, &batch).unwrap();
        for (i, outs) in alone.iter().enumerate() {
            worst = worst.max(max_abs_diff(&out.get(i as i64), &outs[step + 1]));
        }
    }
    println!("batched vs alone max abs diff {worst:e}");
    assert!(worst < TOL, "{worst}");
}

#[test]
fn sequences_join_and_leave_between_steps() {
    let model = random_model(
        tiny_config(json!({ "tie_word_embeddings": true })),
        Kind::Float,
        9,
    );
    let (a, b, c) = (seq(70, 1), seq(9, 2), seq(5, 3));
    // Capacity starts at 64 and must grow while a and b are in flight.
    let mut cache = SequenceCache::new(&model, 2, 128);
    let sa = cache.allocate().unwrap();
    let sb = cache.allocate().unwrap();
    assert!(cache.allocate().is_none());
    let _ = cache
        .step(&model, &[(sa, &a[..60]), (sb, &b[..8])])
        .unwrap();
    // a gets its remaining tokens in one chunk while b decodes one.
    let out = cache
        .step(&model, &[(sb, &b[8..]), (sa, &a[60..])])
        .unwrap();
    let worst_b = max_abs_diff(&out.get(0), &full_logits(&model, &b).get(8));
    let worst_a = max_abs_diff(&out.get(1), &full_logits(&model, &a).get(69));

    // b leaves; c takes over its slot (stale contents must not leak in).
    cache.release(sb);
    assert_eq!(cache.free_slots(), 1);
    let sc = cache.allocate().unwrap();
    assert_eq!(sc, sb);
    let out = cache.step(&model, &[(sc, &c), (sa, &[7])]).unwrap();
    let mut a_next = a.clone();
    a_next.push(7);
    let worst_c = max_abs_diff(&out.get(0), &full_logits(&model, &c).get(4));
    let worst_a2 = max_abs_diff(&out.get(1), &full_logits(&model, &a_next).get(70));

    // Truncating rolls a slot back to a prefix.
    cache.truncate(sc, 3).unwrap();
    let out = cache.step(&model, &[(sc, &[42])]).unwrap();
    let worst_t = max_abs_diff(
        &out.get(0),
        &full_logits(&model, &[c[0], c[1], c[2], 42]).get(3),
    );
    let worst = [worst_a, worst_b, worst_c, worst_a2, worst_t]
        .into_iter()
        .fold(0f64, f64::max);
    println!("join/leave max abs diff {worst:e}");
    assert!(worst < TOL, "{worst}");
}

#[test]
fn sliding_window_cached_matches_full() {
    let model = random_model(
        tiny_config(json!({ "model_type": "mistral", "sliding_window": 4 })),
        Kind::Float,
        10,
    );
    let tokens = seq(12, 4);
    let full = full_logits(&model, &tokens);
    let mut cache = SequenceCache::new(&model, 1, 32);
    let slot = cache.allocate().unwrap();
    let _ = cache.step(&model, &[(slot, &tokens[..6])]).unwrap();
    let mut worst = 0f64;
    for i in 6..12 {
        let out = cache.step(&model, &[(slot, &tokens[i..=i])]).unwrap();
        worst = worst.max(max_abs_diff(&out.get(0), &full.get(i as i64)));
    }
    assert!(worst < TOL, "{worst}");
}

#[test]
fn bad_steps_are_errors() {
    let model = random_model(tiny_config(json!({})), Kind::Float, 11);
    let mut cache = SequenceCache::new(&model, 2, 8);
    let slot = cache.allocate().unwrap();
    let free = cache.allocate().unwrap();
    cache.release(free);
    let err = |cache: &mut SequenceCache, batch: &[(SlotId, &[i64])]| {
        cache.step(&model, batch).unwrap_err().to_string()
    };
    assert!(err(&mut cache, &[]).contains("empty"));
    assert!(err(&mut cache, &[(free, &[1])]).contains("not allocated"));
    assert!(err(&mut cache, &[(slot, &[1]), (slot, &[2])]).contains("twice"));
    assert!(err(&mut cache, &[(slot, &[300])]).contains("outside"));
    assert!(err(&mut cache, &[(slot, &[1; 9])]).contains("max_len"));
    // A failed step leaves the slot untouched.
    assert_eq!(cache.seq_len(slot), Some(0));
}
