//! The trainer/engine mismatch on a real model: SmolLM2-135M-Instruct sampled
//! by agl's engine in f32 and in bf16, each token's sampling logprob against
//! the f32 trainer's logprob of the same token (what the loss's correction
//! sees), in the figures a step reports (`agl_rl::loss::Mismatch`).
//!
//! `cargo bench -p agl --bench mismatch [-- --prompts N --tokens T]`
//! (needs `agl model fetch smollm2`; the prompts are chat-templated
//! questions, sampled at temperature 1 with fixed seeds).
//!
//! `-- --trace FILE [--model DIR]` scores a recorded trace instead: rollout
//! JSONL (`agl rollouts export`) of any engine, e.g. a run on vLLM, each
//! call's sampled tokens and logprobs against the f32 trainer on the model
//! at `DIR` (default SmolLM2). `examples/calc/mismatch_trace.sh` records
//! one through vLLM's token-id contract.

use std::path::PathBuf;

use agl_engine::{EngineConfig, EngineEvent, EngineHandle, Request, SamplingParams};
use agl_model::{Model, token_logprobs};
use agl_rl::loss::{Mismatch, TokenInputs, token_loss};
use agl_rl::{Correction, LossConfig};
use agl_tokenizer::Tokenizer;
use tch::{Device, Kind, Tensor};

const QUESTIONS: [&str; 8] = [
    "What is 17 times 23?",
    "Name three rivers in Europe.",
    "Write a haiku about rain.",
    "Explain what a hash map is.",
    "How do I reverse a list in Python?",
    "What causes the seasons?",
    "Give me a recipe for pancakes.",
    "What is the capital of Australia?",
];

fn arg_str(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    let at = args.iter().position(|a| a == name)?;
    args.get(at + 1).cloned()
}

fn arg(name: &str, default: usize) -> usize {
    arg_str(name)
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn smollm2() -> Option<PathBuf> {
    let dir = agl_models::fetch::cache_root()
        .join("models")
        .join(agl_models::fetch::SMOLLM2.dir);
    dir.join("model.safetensors").is_file().then_some(dir)
}

/// A prompt, the response ids sampled for it, the engine's logprobs, the
/// sampling temperature.
type Sampled = (Vec<u32>, Vec<u32>, Vec<f32>, f64);

/// Every unconstrained call of a recorded trace, scored at `temperature`
/// (the gateway's `train_temperature` the calls were sampled at).
fn read_trace(path: &std::path::Path, temperature: f64) -> anyhow::Result<Vec<Sampled>> {
    let mut out = Vec::new();
    for rollout in agl_wire::rollout::read_jsonl(path)? {
        for call in rollout.calls {
            if call.constrained || call.response_ids.len() != call.response_logprobs.len() {
                continue;
            }
            out.push((
                call.prompt_ids,
                call.response_ids,
                call.response_logprobs,
                temperature,
            ));
        }
    }
    Ok(out)
}

/// One [`Sampled`] per prompt.
fn sample(
    dir: &std::path::Path,
    kind: Kind,
    prompts: &[Vec<u32>],
    tokens: usize,
) -> anyhow::Result<Vec<Sampled>> {
    let model = Model::load(dir, kind, Device::Cpu)?;
    let engine = EngineHandle::spawn(
        model,
        EngineConfig {
            max_seqs: prompts.len(),
            max_len: 1024,
            weight_version: 0,
        },
    )?;
    let mut streams = Vec::new();
    for (i, p) in prompts.iter().enumerate() {
        let params = SamplingParams {
            temperature: 1.0,
            max_tokens: tokens,
            seed: Some(i as u64),
            ..SamplingParams::default()
        };
        streams.push(engine.submit(Request {
            prompt_ids: p.clone(),
            params,
            stop_hook: None,
            constraint: None,
        })?);
    }
    let mut out = Vec::new();
    for (p, mut rx) in prompts.iter().zip(streams) {
        while let Some(event) = rx.blocking_recv() {
            if let EngineEvent::Finished(f) = event {
                out.push((p.clone(), f.response_ids, f.logprobs, 1.0));
                break;
            }
        }
    }
    Ok(out)
}

/// The mismatch of `samples` against `trainer`, under `correction`'s bounds.
fn mismatch(
    trainer: &Model,
    samples: &[Sampled],
    correction: Correction,
) -> (Mismatch, f64, usize) {
    let (mut total, mut kl, mut n) = (Mismatch::default(), 0.0, 0);
    for (prompt, response, engine, temperature) in samples {
        if response.is_empty() || prompt.is_empty() || *temperature <= 0.0 {
            continue;
        }
        let all: Vec<i64> = prompt.iter().chain(response).map(|&t| t as i64).collect();
        let tokens = Tensor::from_slice(&all).view([1, -1]);
        let lp = tch::no_grad(|| {
            let logits = trainer.forward(&tokens, None).expect("forward");
            token_logprobs(&logits, &tokens, *temperature)
        });
        let old = lp
            .get(0)
            .narrow(0, prompt.len() as i64 - 1, response.len() as i64)
            .view([1, -1]);
        let engine = Tensor::from_slice(engine).view([1, -1]);
        let ones = old.ones_like();
        let out = token_loss(
            &TokenInputs {
                new: &old,
                old: &old,
                engine: &engine,
                advantage: &ones,
                weight: &ones,
                trainable: &ones,
                reference: None,
            },
            &LossConfig {
                correction,
                ..LossConfig::default()
            },
        );
        total.add(&out.mismatch);
        kl += out.engine_kl_sum;
        n += response.len();
    }
    (total, kl, n)
}

const HEADER: &str = "| engine | tokens | mean abs gap | max abs gap | KL(engine, trainer) | tokens outside | sequences outside |\n\
|--------|--------|--------------|-------------|---------------------|----------------|-------------------|";

/// One table row: `samples`' mismatch against `trainer`, ratio bounds [0.5, 2].
fn row(name: &str, trainer: &Model, samples: &[Sampled]) {
    let bounds = Correction::TokenMask {
        low: 0.5,
        high: 2.0,
    };
    let (m, kl, n) = mismatch(trainer, samples, bounds);
    let per = |x: f64| x / n.max(1) as f64;
    println!(
        "| {name:>6} | {n:>6} | {:12.2e} | {:11.2e} | {:19.2e} | {:13.2}% | {:16.1}% |",
        per(m.abs_gap_sum),
        m.abs_gap_max,
        per(kl),
        100.0 * per(m.tokens_outside),
        100.0 * m.sequences_outside / m.sequences.max(1.0),
    );
}

fn main() -> anyhow::Result<()> {
    let dir = match arg_str("--model") {
        Some(dir) => PathBuf::from(dir),
        None => match smollm2() {
            Some(dir) => dir,
            None => {
                eprintln!("mismatch bench skipped: run `agl model fetch smollm2`");
                return Ok(());
            }
        },
    };
    let trainer = Model::load(&dir, Kind::Float, Device::Cpu)?;
    if let Some(trace) = arg_str("--trace") {
        let temperature = arg_str("--temperature")
            .and_then(|t| t.parse().ok())
            .unwrap_or(1.0);
        let samples = read_trace(std::path::Path::new(&trace), temperature)?;
        println!(
            "trainer (f32, {}) vs the recorded trace {trace}: {} calls scored at temperature \
             {temperature}; ratio bounds [0.5, 2]",
            dir.display(),
            samples.len()
        );
        println!("{HEADER}");
        row("trace", &trainer, &samples);
        return Ok(());
    }
    let (count, tokens) = (arg("--prompts", 8), arg("--tokens", 96));
    let tokenizer = Tokenizer::from_file(&dir.join("tokenizer.json"))?;
    let prompts: Vec<Vec<u32>> = QUESTIONS
        .iter()
        .cycle()
        .take(count)
        .map(|q| {
            let messages = serde_json::json!([{"role": "user", "content": q}]).to_string();
            let text = tokenizer.apply_chat_template(&messages, None, true)?;
            Ok(tokenizer.encode(&text, false)?)
        })
        .collect::<anyhow::Result<_>>()?;
    println!(
        "trainer (f32) vs engine, SmolLM2-135M-Instruct on CPU: {count} prompts x up to {tokens} \
         tokens sampled at temperature 1; ratio bounds [0.5, 2]"
    );
    println!("{HEADER}");
    for (name, kind) in [("f32", Kind::Float), ("bf16", Kind::BFloat16)] {
        row(name, &trainer, &sample(&dir, kind, &prompts, tokens)?);
    }
    Ok(())
}
