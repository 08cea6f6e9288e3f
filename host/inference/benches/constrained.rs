//! Decode throughput with and without a JSON-schema constraint on the
//! embedded engine (SmolLM2-135M-Instruct, f32, CPU), at 1 and 8 concurrent
//! completions requests through the inference server's router. Prints a
//! table.
//!
//! `cargo bench -p agl-inference --bench constrained`; the model folder is
//! `$AGL_SMOLLM2` or `~/.cache/agl/models/smollm2-135m-instruct` (written by
//! `agl model fetch smollm2` or the e2e tests). Target: constrained >= 80%
//! of unconstrained tokens per second.

use std::path::PathBuf;
use std::time::Instant;

use agl_engine::EngineConfig;
use agl_inference::InferenceServer;
use axum::body::Body;
use serde_json::{Value, json};
use tower::ServiceExt;

const MAX_TOKENS: usize = 64;

fn model_dir() -> PathBuf {
    std::env::var_os("AGL_SMOLLM2").map_or_else(
        || {
            let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
            PathBuf::from(home).join(".cache/agl/models/smollm2-135m-instruct")
        },
        PathBuf::from,
    )
}

/// A schema no answer completes within `MAX_TOKENS` (a long story), so
/// every constrained answer runs as long as an unconstrained one and the
/// batches stay as full.
fn schema() -> Value {
    json!({"type": "object", "properties": {
        "title": {"type": "string", "maxLength": 40},
        "story": {"type": "string", "minLength": 400}},
        "required": ["title", "story"]})
}

/// One answer's completion tokens.
async fn complete(server: &InferenceServer, seed: u64, constrained: bool) -> usize {
    let mut body = json!({"model": "smollm2", "max_tokens": MAX_TOKENS, "temperature": 1.0,
        "seed": seed, "ignore_eos": true,
        "prompt": "<|im_start|>user\nWrite some stories as JSON.<|im_end|>\n<|im_start|>assistant\n"});
    if constrained {
        body["response_format"] =
            json!({"type": "json_schema", "json_schema": {"name": "s", "schema": schema()}});
    }
    let req = axum::http::Request::post("/v1/completions")
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .expect("request");
    let resp = server.router().oneshot(req).await.expect("answer");
    let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .expect("body");
    let v: Value = serde_json::from_slice(&bytes).expect("JSON");
    v["usage"]["completion_tokens"]
        .as_u64()
        .unwrap_or_else(|| panic!("no usage: {v}")) as usize
}

/// Tokens per second of `batch` concurrent requests over 3 rounds, and the
/// mean tokens per answer (a constrained answer may end before
/// `max_tokens`, when its JSON is complete).
async fn throughput(server: &InferenceServer, batch: usize, constrained: bool) -> (f64, f64) {
    let (mut tokens, start) = (0, Instant::now());
    for round in 0..3u64 {
        let calls = (0..batch as u64).map(|i| complete(server, round * 100 + i, constrained));
        tokens += futures_util::future::join_all(calls)
            .await
            .into_iter()
            .sum::<usize>();
    }
    let per_answer = tokens as f64 / (3 * batch) as f64;
    (tokens as f64 / start.elapsed().as_secs_f64(), per_answer)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let dir = model_dir();
    assert!(
        dir.join("config.json").exists(),
        "{} missing: run `agl model fetch smollm2` (or the e2e tests) first",
        dir.display()
    );
    let config = EngineConfig {
        max_seqs: 8,
        max_len: 1024,
        weight_version: 0,
    };
    let server = InferenceServer::load(&dir, "smollm2", tch::Kind::Float, config).expect("load");
    // Warm up; the first constrained call builds the token trie.
    complete(&server, 0, true).await;
    complete(&server, 0, false).await;
    println!(
        "| batch | unconstrained tok/s | json_schema tok/s | constrained / unconstrained | json_schema tokens per answer |"
    );
    println!("|---|---|---|---|---|");
    let mut worst = f64::MAX;
    for batch in [1, 8] {
        let (free, _) = throughput(&server, batch, false).await;
        let (guided, per_answer) = throughput(&server, batch, true).await;
        worst = worst.min(guided / free);
        println!(
            "| {batch} | {free:.1} | {guided:.1} | {:.2} | {per_answer:.1} of {MAX_TOKENS} |",
            guided / free
        );
    }
    println!(
        "target: constrained >= 80% of unconstrained: {} (worst {:.0}%)",
        if worst >= 0.8 { "met" } else { "NOT met" },
        worst * 100.0
    );
}
