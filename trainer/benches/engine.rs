//! Decode throughput of agl's engine vs transformers `generate` on
//! SmolLM2-135M-Instruct (f32, CPU, same thread count), at 1 and 8
//! concurrent requests, plus peak RSS. Prints a table.
//!
//! `cargo bench -p agl-trainer --bench engine` with `AGL_VENV` set; the
//! model folder is `$AGL_SMOLLM2` or `~/.cache/agl/models/smollm2-135m-instruct`
//! (built by `host/tests/engine_server.rs`'s `smollm2_dir`).

use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use agl_trainer::engine::{EngineConfig, EngineHandle, Event, Request, SamplingParams};
use agl_trainer::model::Model;
use serde_json::Value;
use tch::{Device, Kind};

const NEW_TOKENS: usize = 64;

fn model_dir() -> PathBuf {
    std::env::var_os("AGL_SMOLLM2").map_or_else(
        || {
            let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
            PathBuf::from(home).join(".cache/agl/models/smollm2-135m-instruct")
        },
        PathBuf::from,
    )
}

/// `n` concurrent greedy requests of `NEW_TOKENS` each; aggregate tokens/s.
fn run(engine: &EngineHandle, prompt: &[u32], n: usize) -> f64 {
    let params = SamplingParams {
        temperature: 0.0,
        max_tokens: NEW_TOKENS,
        ..SamplingParams::default()
    };
    let start = Instant::now();
    let rxs: Vec<_> = (0..n)
        .map(|_| {
            let request = Request {
                prompt_ids: prompt.to_vec(),
                params: params.clone(),
                stop_hook: None,
            };
            engine.submit(request).unwrap()
        })
        .collect();
    let mut tokens = 0;
    for mut rx in rxs {
        while let Some(event) = rx.blocking_recv() {
            if let Event::Finished(f) = event {
                tokens += f.response_ids.len();
                break;
            }
        }
    }
    tokens as f64 / start.elapsed().as_secs_f64()
}

fn peak_rss_mb() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

fn main() {
    let dir = model_dir();
    let threads = tch::get_num_threads();
    let venv = std::env::var_os("AGL_VENV").map_or_else(|| PathBuf::from(".venv"), PathBuf::from);
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("benches/hf_generate.py");
    let out = Command::new(venv.join("bin/python"))
        .arg(script)
        .arg(&dir)
        .arg(NEW_TOKENS.to_string())
        .arg(threads.to_string())
        .output()
        .expect("run python");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let hf: Value = serde_json::from_slice(&out.stdout).expect("hf JSON");
    let prompt: Vec<u32> = hf["prompt_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();

    let model = Model::load(&dir, Kind::Float, Device::Cpu).expect("load model");
    let config = EngineConfig {
        max_seqs: 8,
        max_len: 1024,
        weight_version: 0,
    };
    let engine = EngineHandle::spawn(model, config).unwrap();
    run(&engine, &prompt, 1); // warm-up
    let single = run(&engine, &prompt, 1);
    let batch8 = run(&engine, &prompt, 8);
    let f = |k: &str| hf[k].as_f64().unwrap_or(0.0);
    println!(
        "SmolLM2-135M-Instruct f32, CPU, {threads} threads, {NEW_TOKENS} new tokens, prompt {} tokens",
        prompt.len()
    );
    println!(
        "{:<24} {:>12} {:>16} {:>14}",
        "", "1 req tok/s", "8 conc. tok/s", "peak RSS MB"
    );
    println!(
        "{:<24} {:>12.1} {:>16.1} {:>14.0}",
        "agl engine",
        single,
        batch8,
        peak_rss_mb()
    );
    println!(
        "{:<24} {:>12.1} {:>16.1} {:>14.0}",
        "transformers generate",
        f("single_tok_s"),
        f("batch8_tok_s"),
        f("peak_rss_mb")
    );
    println!(
        "ratio agl/transformers: 1 req {:.2}x, 8 conc. {:.2}x",
        single / f("single_tok_s"),
        batch8 / f("single_tok_s")
    );
}
