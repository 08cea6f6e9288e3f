//! The training/scoring path: autograd, padding, and the logprob convention.

use crate::common::{max_abs_diff, random_model, random_tokens, tiny_config};
use agl_model::{Model, token_logprobs};
use serde_json::json;
use tch::{Kind, Tensor};

/// The trainable parameters' gradients of `loss` alone (zeroed first).
fn gradients(model: &Model, loss: Tensor) -> Vec<Tensor> {
    let params: Vec<Tensor> = model
        .trainable_parameters()
        .into_iter()
        .map(|(_, p)| p)
        .collect();
    for p in &params {
        let mut g = p.grad();
        if g.defined() {
            let _ = g.zero_();
        }
    }
    loss.backward();
    params.iter().map(|p| p.grad().copy()).collect()
}

#[test]
fn logprobs_follow_the_documented_convention() {
    let model = random_model(tiny_config(json!({})), Kind::Float, 12);
    let tokens = random_tokens(2, 7, 300);
    let logits = model.forward(&tokens, None).unwrap();
    let lp = token_logprobs(&logits, &tokens, 0.7);
    assert_eq!(lp.size(), [2, 6]);
    let logits = logits.to_kind(Kind::Double).detach();
    for b in 0..2 {
        for t in 0..6 {
            let row = logits.get(b).get(t) / 0.7;
            let target = i64::try_from(tokens.get(b).get(t + 1)).unwrap();
            let expected = f64::try_from(row.get(target) - row.logsumexp([0], false)).unwrap();
            let got = f64::try_from(lp.get(b).get(t)).unwrap();
            assert!(
                (got - expected).abs() < 1e-5,
                "[{b},{t}] {got} vs {expected}"
            );
        }
    }
}

/// The head on chosen positions only: there the full forward's logprobs
/// and gradient, elsewhere 0 with no gradient; nothing chosen, a zero
/// gradient.
#[test]
fn logprobs_at_chosen_positions_match_the_full_forward() {
    let model = random_model(tiny_config(json!({})), Kind::Float, 13);
    let tokens = random_tokens(3, 9, 300);
    let mask = Tensor::ones([3, 9], (Kind::Int64, tch::Device::Cpu));
    let _ = mask.get(2).narrow(0, 6, 3).fill_(0);
    let at = Tensor::zeros([3, 8], (Kind::Float, tch::Device::Cpu));
    for (b, t) in [(0, 0), (0, 5), (1, 3), (1, 7), (2, 2), (2, 4)] {
        let _ = at.get(b).get(t).fill_(1.0);
    }
    let grads = |loss: Tensor| gradients(&model, loss);
    let full = token_logprobs(&model.forward(&tokens, Some(&mask)).unwrap(), &tokens, 0.8);
    let full_grads = grads((&full * &at).sum(Kind::Float));
    let picked = model.logprobs_at(&tokens, Some(&mask), 0.8, &at).unwrap();
    assert_eq!(picked.logits.size(), [6, 300]);
    assert!(max_abs_diff(&picked.logprobs, &(full.detach() * &at)) < 1e-5);
    let picked_grads = grads((&picked.logprobs * &at).sum(Kind::Float));
    for (a, b) in picked_grads.iter().zip(&full_grads) {
        assert!(max_abs_diff(a, b) < 1e-5);
    }
    assert!(
        full_grads
            .iter()
            .any(|g| g.abs().max().double_value(&[]) > 1e-4)
    );

    let none = Tensor::zeros([3, 8], (Kind::Float, tch::Device::Cpu));
    let nothing = model.logprobs_at(&tokens, Some(&mask), 0.8, &none).unwrap();
    assert_eq!(nothing.logits.size(), [0, 300]);
    assert_eq!(
        f64::try_from(nothing.logprobs.abs().sum(Kind::Float)).unwrap(),
        0.0
    );
    let no_grads = grads(nothing.logprobs.sum(Kind::Float));
    assert!(
        no_grads
            .iter()
            .all(|g| g.abs().max().double_value(&[]) == 0.0)
    );
}

#[test]
fn forward_backpropagates_into_every_parameter() {
    let model = random_model(
        tiny_config(json!({ "tie_word_embeddings": true })),
        Kind::Float,
        13,
    );
    let tokens = random_tokens(2, 6, 300);
    let lp = token_logprobs(&model.forward(&tokens, None).unwrap(), &tokens, 1.0);
    lp.sum(Kind::Float).backward();
    for (name, p) in model.var_store().variables() {
        let g = p.grad();
        assert!(
            g.defined() && f64::try_from(g.abs().sum(Kind::Float)).unwrap() > 0.0,
            "{name}"
        );
    }
}

#[test]
fn right_padding_does_not_change_real_positions() {
    let model = random_model(tiny_config(json!({})), Kind::Float, 14);
    let short = random_tokens(1, 5, 300);
    let padded = Tensor::cat(
        &[
            &short,
            &Tensor::zeros([1, 3], (Kind::Int64, tch::Device::Cpu)),
        ],
        1,
    );
    let batch = Tensor::cat(&[&padded, &random_tokens(1, 8, 300)], 0);
    let mask =
        Tensor::from_slice(&[1i64, 1, 1, 1, 1, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1]).view([2, 8]);
    let alone = tch::no_grad(|| model.forward(&short, None).unwrap());
    let batched = tch::no_grad(|| model.forward(&batch, Some(&mask)).unwrap());
    let diff = max_abs_diff(&batched.get(0).narrow(0, 0, 5), &alone.get(0));
    assert!(diff < 1e-5, "{diff}");
}

/// Sequences packed end to end in rows (attention-mask ids 1, 2, ...) get
/// the logits and the gradient they get alone: positions restart and no
/// query sees another sequence's keys, with or without a sliding window.
#[test]
fn packed_rows_score_each_sequence_as_alone() {
    for extra in [
        json!({}),
        json!({ "model_type": "mistral", "sliding_window": 3 }),
    ] {
        let model = random_model(tiny_config(extra.clone()), Kind::Float, 15);
        let seqs: Vec<Tensor> = [5, 4, 6, 2]
            .iter()
            .map(|&n| random_tokens(1, n, 300))
            .collect();
        // Row 0: sequences 0 and 1 (9 tokens); row 1: 2 and 3 (8) + 1 pad.
        let pad = Tensor::zeros([1, 1], (Kind::Int64, tch::Device::Cpu));
        let tokens = Tensor::cat(
            &[
                Tensor::cat(&[&seqs[0], &seqs[1]], 1),
                Tensor::cat(&[&seqs[2], &seqs[3], &pad], 1),
            ],
            0,
        );
        let ids: Vec<i64> = [[1, 1, 1, 1, 1, 2, 2, 2, 2], [1, 1, 1, 1, 1, 1, 2, 2, 0]]
            .concat()
            .to_vec();
        let mask = Tensor::from_slice(&ids).view([2, 9]);
        let at = [(0usize, 0i64), (0, 5), (1, 0), (1, 6)];
        let grads = |loss: Tensor| gradients(&model, loss);
        let packed = model.forward(&tokens, Some(&mask)).unwrap();
        // A row's padding: meaningless, but finite.
        assert!(bool::try_from(packed.isfinite().all()).unwrap());
        let mut loss = Tensor::zeros([], (Kind::Float, tch::Device::Cpu));
        for (s, &(row, start)) in at.iter().enumerate() {
            let n = seqs[s].size()[1];
            let lp = token_logprobs(
                &packed.get(row as i64).narrow(0, start, n).unsqueeze(0),
                &seqs[s],
                0.9,
            );
            loss += lp.sum(Kind::Float);
        }
        let packed_grads = grads(loss);
        let mut loss = Tensor::zeros([], (Kind::Float, tch::Device::Cpu));
        for (s, &(row, start)) in at.iter().enumerate() {
            let n = seqs[s].size()[1];
            let alone = model.forward(&seqs[s], None).unwrap();
            let diff = max_abs_diff(&packed.get(row as i64).narrow(0, start, n), &alone.get(0));
            assert!(diff < 1e-5, "{extra} sequence {s}: {diff}");
            loss += token_logprobs(&alone, &seqs[s], 0.9).sum(Kind::Float);
        }
        let alone_grads = grads(loss);
        for (a, b) in packed_grads.iter().zip(&alone_grads) {
            assert!(max_abs_diff(a, b) < 1e-5, "{extra}");
        }
        assert!(
            alone_grads
                .iter()
                .any(|g| g.abs().max().double_value(&[]) > 1e-4)
        );
    }
}

#[test]
fn a_packed_mask_out_of_order_is_refused() {
    let model = random_model(tiny_config(json!({})), Kind::Float, 16);
    let tokens = random_tokens(1, 4, 300);
    for ids in [[1i64, 2, 1, 1], [1, 0, 2, 2], [0, 1, 1, 1], [1, 2, -1, 0]] {
        let mask = Tensor::from_slice(&ids).view([1, 4]);
        let err = model.forward(&tokens, Some(&mask)).unwrap_err();
        assert!(err.to_string().contains("attention_mask"), "{ids:?}: {err}");
    }
    let ok = Tensor::from_slice(&[1i64, 1, 3, 0]).view([1, 4]);
    assert!(model.forward(&tokens, Some(&ok)).is_ok());
}
