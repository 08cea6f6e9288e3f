//! The engine against the model's own full forward: greedy decode, logprobs
//! (the `token_logprobs` convention), batching, seeds, stops, weight updates.

use crate::common::{random_model, tiny_config};
use agl_engine::{
    EngineConfig, EngineEvent, EngineHandle, FinishReason, Finished, InFlight, Request,
    SamplingParams,
};
use agl_model::{Model, token_logprobs};
use serde_json::json;
use tch::{Kind, Tensor};

fn model(seed: i64) -> Model {
    random_model(tiny_config(json!({})), Kind::Float, seed)
}

/// An engine on a copy of `reference`'s weights (tests run in parallel and
/// `tch::manual_seed` is global, so a seed alone does not pin a model).
fn engine_on(reference: &Model, max_seqs: usize, max_len: usize) -> EngineHandle {
    let copy = Model::new(reference.config().clone(), Kind::Float, tch::Device::Cpu).unwrap();
    let tensors: Vec<(String, Tensor)> = reference.var_store().variables().into_iter().collect();
    copy.load_weights_in_place(&tensors).unwrap();
    let config = EngineConfig {
        max_seqs,
        max_len,
        weight_version: 3,
    };
    EngineHandle::spawn(copy, config).unwrap()
}

fn engine(max_seqs: usize, max_len: usize) -> EngineHandle {
    engine_on(&model(11), max_seqs, max_len)
}

fn greedy(max_tokens: usize) -> SamplingParams {
    SamplingParams {
        temperature: 0.0,
        max_tokens,
        ..SamplingParams::default()
    }
}

fn request(prompt: &[u32], params: SamplingParams) -> Request {
    Request {
        prompt_ids: prompt.to_vec(),
        params,
        stop_hook: None,
        constraint: None,
    }
}

/// Collects a stream; checks the tokens match the final summary.
fn collect(mut rx: tokio::sync::mpsc::UnboundedReceiver<EngineEvent>) -> Finished {
    let mut tokens = Vec::new();
    loop {
        match rx.blocking_recv().unwrap() {
            EngineEvent::Token { id, logprob, .. } => tokens.push((id, logprob)),
            EngineEvent::Finished(f) => {
                let streamed: Vec<u32> = tokens.iter().map(|t| t.0).collect();
                assert_eq!(streamed, f.response_ids);
                return f;
            }
        }
    }
}

/// Greedy decode with the full (uncached) forward.
fn reference_greedy(model: &Model, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut seq: Vec<i64> = prompt.iter().map(|&t| t as i64).collect();
    for _ in 0..n {
        let logits = model
            .forward(&Tensor::from_slice(&seq).view([1, -1]), None)
            .unwrap();
        let next = logits.get(0).get(seq.len() as i64 - 1).argmax(-1, false);
        seq.push(i64::try_from(next).unwrap());
    }
    seq[prompt.len()..].iter().map(|&t| t as u32).collect()
}

/// `token_logprobs` of the response under the full forward.
fn reference_logprobs(model: &Model, f: &Finished, temperature: f64) -> Vec<f32> {
    let all: Vec<i64> = f
        .prompt_ids
        .iter()
        .chain(&f.response_ids)
        .map(|&t| t as i64)
        .collect();
    let tokens = Tensor::from_slice(&all).view([1, -1]);
    let logits = model.forward(&tokens, None).unwrap();
    let lp = token_logprobs(&logits, &tokens, temperature);
    let p = f.prompt_ids.len() as i64;
    Vec::<f32>::try_from(lp.get(0).narrow(0, p - 1, f.response_ids.len() as i64)).unwrap()
}

fn assert_close(a: &[f32], b: &[f32]) {
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(b) {
        assert!((x - y).abs() < 1e-4, "{a:?} vs {b:?}");
    }
}

const PROMPTS: [&[u32]; 4] = [
    &[1, 2, 3],
    &[9, 40, 7, 250, 33],
    &[5],
    &[100, 101, 102, 103, 104, 105],
];

#[test]
fn greedy_matches_the_full_forward_with_t1_logprobs() {
    let reference = model(11);
    let e = engine_on(&reference, 4, 64);
    for prompt in PROMPTS {
        let f = collect(e.submit(request(prompt, greedy(12))).unwrap());
        assert_eq!(f.response_ids, reference_greedy(&reference, prompt, 12));
        assert_eq!(f.finish_reason, FinishReason::Length);
        assert_eq!(f.weight_version, 3);
        assert_close(&f.logprobs, &reference_logprobs(&reference, &f, 1.0));
    }
}

#[test]
fn sampled_logprobs_follow_the_temperature_and_seeds_reproduce() {
    let reference = model(11);
    let e = engine_on(&reference, 4, 64);
    let params = SamplingParams {
        temperature: 0.7,
        top_p: 0.9,
        top_k: 50,
        max_tokens: 10,
        seed: Some(42),
        ..SamplingParams::default()
    };
    let a = collect(e.submit(request(PROMPTS[1], params.clone())).unwrap());
    assert_close(&a.logprobs, &reference_logprobs(&reference, &a, 0.7));
    // The same seed alone and inside a busy batch draws the same tokens.
    let others: Vec<_> = (0..3)
        .map(|i| {
            e.submit(request(
                PROMPTS[i],
                SamplingParams {
                    seed: None,
                    ..params.clone()
                },
            ))
            .unwrap()
        })
        .collect();
    let b = collect(e.submit(request(PROMPTS[1], params.clone())).unwrap());
    others.into_iter().for_each(|rx| drop(collect(rx)));
    assert_eq!(a.response_ids, b.response_ids);
    let c = collect(
        e.submit(request(
            PROMPTS[1],
            SamplingParams {
                seed: Some(43),
                ..params
            },
        ))
        .unwrap(),
    );
    assert_ne!(a.response_ids, c.response_ids);
}

#[test]
fn concurrent_requests_match_one_at_a_time() {
    // 3 slots for 8 requests: they queue, join and leave between steps.
    let e = engine(3, 64);
    let prompts: Vec<Vec<u32>> = (0..8)
        .map(|i| (0..(2 + i * 3)).map(|t| (t * 17 + i) % 300).collect())
        .collect();
    let alone: Vec<Finished> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| collect(e.submit(request(p, greedy(4 + i))).unwrap()))
        .collect();
    let rxs: Vec<_> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| e.submit(request(p, greedy(4 + i))).unwrap())
        .collect();
    for (rx, one) in rxs.into_iter().zip(alone) {
        let f = collect(rx);
        assert_eq!(f.response_ids, one.response_ids);
        assert_close(&f.logprobs, &one.logprobs);
    }
}

#[test]
fn stops_and_lengths() {
    let e = engine(2, 16);
    let free = collect(e.submit(request(PROMPTS[0], greedy(8))).unwrap());
    // A stop id ends the sequence and is kept.
    let stop = free.response_ids[2];
    let params = SamplingParams {
        stop_ids: vec![stop],
        ..greedy(8)
    };
    let f = collect(e.submit(request(PROMPTS[0], params)).unwrap());
    let first = free.response_ids.iter().position(|&t| t == stop).unwrap();
    assert_eq!(f.response_ids, free.response_ids[..=first]);
    assert_eq!(f.finish_reason, FinishReason::Stop);
    // The hook sees the ids so far.
    let hook = Request {
        stop_hook: Some(Box::new(|ids: &[u32]| ids.len() == 5)),
        ..request(PROMPTS[0], greedy(8))
    };
    let f = collect(e.submit(hook).unwrap());
    assert_eq!(
        (f.response_ids.len(), f.finish_reason),
        (5, FinishReason::Stop)
    );
    // max_len (16) caps prompt + response.
    let f = collect(e.submit(request(PROMPTS[3], greedy(100))).unwrap());
    assert_eq!(
        (f.response_ids.len(), f.finish_reason),
        (10, FinishReason::Length)
    );
    assert!(e.submit(request(&[1; 16], greedy(1))).is_err());
    assert!(e.submit(request(&[300], greedy(1))).is_err());
    assert!(e.submit(request(&[], greedy(1))).is_err());
}

#[test]
fn weight_update_changes_outputs_and_version() {
    let e = engine(2, 64);
    let before = collect(e.submit(request(PROMPTS[1], greedy(8))).unwrap());
    let new = model(99);
    let tensors: Vec<(String, Tensor)> = new.var_store().variables().into_iter().collect();
    e.update_weights_blocking(tensors, 4, InFlight::Abort)
        .unwrap();
    assert_eq!(e.weight_version(), 4);
    let after = collect(e.submit(request(PROMPTS[1], greedy(8))).unwrap());
    assert_eq!(after.weight_version, 4);
    assert_eq!(after.response_ids, reference_greedy(&new, PROMPTS[1], 8));
    assert_ne!(after.response_ids, before.response_ids);
    assert!(
        e.update_weights_blocking(
            vec![(
                "nope".into(),
                Tensor::zeros([1], (Kind::Float, tch::Device::Cpu))
            )],
            5,
            InFlight::Abort,
        )
        .is_err()
    );
    assert_eq!(e.weight_version(), 4);
}

#[test]
fn an_update_that_keeps_running_sequences_stamps_each_token_with_its_version() {
    let e = engine(2, 64);
    // A slowed sequence (5 ms per token) so the update lands mid-way.
    let slow = Request {
        stop_hook: Some(Box::new(|_: &[u32]| {
            std::thread::sleep(std::time::Duration::from_millis(5));
            false
        })),
        ..request(PROMPTS[1], greedy(40))
    };
    let mut rx = e.submit(slow).unwrap();
    let mut versions = Vec::new();
    while versions.len() < 3 {
        if let EngineEvent::Token { version, .. } = rx.blocking_recv().unwrap() {
            versions.push(version);
        }
    }
    let tensors: Vec<(String, Tensor)> = model(99).var_store().variables().into_iter().collect();
    e.update_weights_blocking(tensors, 4, InFlight::Continue)
        .unwrap();
    let finished = loop {
        match rx.blocking_recv().unwrap() {
            EngineEvent::Token { version, .. } => versions.push(version),
            EngineEvent::Finished(f) => break f,
        }
    };
    // Neither cut nor waited for: it ran to its length on both versions.
    assert_eq!(finished.finish_reason, FinishReason::Length);
    assert_eq!(finished.response_ids.len(), 40);
    assert_eq!(finished.token_versions, versions);
    let switch = versions.iter().position(|&v| v == 4).expect("tokens of v4");
    assert!(switch >= 3, "{versions:?}");
    assert_ne!(versions[0], 4);
    assert!(versions[..switch].iter().all(|&v| v == versions[0]));
    assert!(versions[switch..].iter().all(|&v| v == 4));
    assert_eq!(finished.weight_version, 4);

    // The default still ends running sequences, each from one version.
    let mut rx = e
        .submit(Request {
            stop_hook: Some(Box::new(|_: &[u32]| {
                std::thread::sleep(std::time::Duration::from_millis(5));
                false
            })),
            ..request(PROMPTS[1], greedy(40))
        })
        .unwrap();
    let _ = rx.blocking_recv();
    let tensors: Vec<(String, Tensor)> = model(11).var_store().variables().into_iter().collect();
    e.update_weights_blocking(tensors, 5, InFlight::Abort)
        .unwrap();
    let aborted = loop {
        if let EngineEvent::Finished(f) = rx.blocking_recv().unwrap() {
            break f;
        }
    };
    assert_eq!(aborted.finish_reason, FinishReason::Abort);
    assert!(aborted.token_versions.iter().all(|&v| v == 4));
}
