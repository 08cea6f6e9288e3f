//! A tool-using harness (the real OpenAI Python SDK, `tests/python/tool_harness.py`)
//! through the gateway-rendered path under a Hermes/Qwen-style template, and
//! the samples the SDK's merge (the `trajectory` plugin, through
//! `agl plugin test`) makes of it: one per linear history, a `summary`
//! break where the harness compacted its history.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use agl_conversation::{Family, Renderer, ToolFormat};
use agl_gateway::{Gateway, GatewayConfig};
use agl_store::{EngineApi, Mode, NewRollout, Render, Store};
use agl_testengine::{Codec, Reply, TestEngine, TestEngineConfig};
use agl_tokenizer::Tokenizer;
use agl_wire::api::StatusPatch;
use agl_wire::rollout::{Rollout, RolloutStatus};
use serde_json::{Value, json};

use crate::process::python;

/// The model's call: compact JSON, keys in its own order (the harness
/// re-serialises it with spaces and sorted keys).
const CALL: &str = "<tool_call>\n{\"name\": \"bash\", \"arguments\": {\"cwd\":\"/repo\",\"cmd\":\"ls -1\"}}\n</tool_call>";

struct Env {
    base: String,
    store: Store,
    tokenizer: Arc<Tokenizer>,
    _engine: TestEngine,
    dir: tempfile::TempDir,
}

/// Gateway + test engine (`render = "gateway"`) over the tools policy; the
/// engine calls the tool `tool_turns` times, then answers in text.
async fn start(tool_turns: usize, api: EngineApi) -> Env {
    let dir = tempfile::tempdir().unwrap();
    let (tokenizer, eos) = crate::policy::tools_policy(dir.path());
    let renderer = Renderer::new(tokenizer.clone(), &[eos]).unwrap();
    start_with(dir, tokenizer, renderer, tool_turns, api).await
}

/// [`start`] with any policy; the engine tokenizes with its tokenizer.
async fn start_with(
    dir: tempfile::TempDir,
    tokenizer: Arc<Tokenizer>,
    renderer: Renderer,
    tool_turns: usize,
    api: EngineApi,
) -> Env {
    let turn = Arc::new(AtomicUsize::new(0));
    let script = TestEngineConfig::default().with_script(move |_| {
        if turn.fetch_add(1, Ordering::SeqCst) < tool_turns {
            Reply::text(CALL)
        } else {
            Reply::text("There are 5 files.")
        }
    });
    let codec = {
        let (e, d) = (tokenizer.clone(), tokenizer.clone());
        Codec::new(
            move |text| e.encode(text, false).unwrap(),
            move |ids| d.decode(ids, false).unwrap(),
        )
    };
    let engine = TestEngine::start(script.with_codec(codec)).await.unwrap();
    let store = Store::open(dir.path().join("agl.db")).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let config = GatewayConfig {
        listen: addr.to_string(),
        admin_key: Some("admin-key".into()),
        ..GatewayConfig::default()
    };
    let gateway = Gateway::new(store.clone(), config).with_policy(renderer);
    store
        .register_engine(
            &agl_store::RegisterEngine::new("e1", &engine.base_url(), "m")
                .with_render(Render::Gateway)
                .with_api(api),
        )
        .await
        .unwrap();
    tokio::spawn(gateway.serve(listener, std::future::pending()));
    store
        .create_rollouts(vec![NewRollout {
            id: Some("r1".into()),
            group_id: "g".into(),
            mode: Mode::Train,
            input: Default::default(),
            config: Default::default(),
        }])
        .await
        .unwrap();
    store
        .set_status("r1", &StatusPatch::to(1, RolloutStatus::Running))
        .await
        .unwrap();
    Env {
        base: format!("http://{addr}"),
        store,
        tokenizer,
        _engine: engine,
        dir,
    }
}

async fn harness(env: &Env, args: &[&str]) -> Value {
    let script = crate::support::repo_root().join("tests/python/tool_harness.py");
    let mut cmd = Command::new(python());
    cmd.arg(script)
        .args(args)
        .env(
            "OPENAI_BASE_URL",
            format!("{}/proxy/r1/1/train/openai/v1", env.base),
        )
        .env("OPENAI_API_KEY", "admin-key");
    crate::support::python_json(cmd).await
}

/// The rollout's samples as the `trajectory` plugin builds them.
fn samples(env: &Env, rollout: &Rollout) -> Vec<Value> {
    let export: PathBuf = env.dir.path().join("r1.jsonl");
    std::fs::write(&export, serde_json::to_string(rollout).unwrap() + "\n").unwrap();
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
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap()["sample"].clone())
        .collect()
}

/// A `--json` sample line's trainable spans as (start, end).
pub(crate) fn spans(sample: &Value) -> Vec<(usize, usize)> {
    sample["trainable"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["start"].as_u64().unwrap() as usize,
                s["end"].as_u64().unwrap() as usize,
            )
        })
        .collect()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// Every position outside the trainable spans, decoded: what was masked.
fn masked_text(tokenizer: &Tokenizer, sample: &Value) -> String {
    let response = ids(&sample["response_ids"]);
    let mut masked = Vec::new();
    let mut at = 0;
    for (start, end) in spans(sample) {
        masked.extend_from_slice(&response[at..start]);
        at = end;
    }
    masked.extend_from_slice(&response[at..]);
    tokenizer.decode(&masked, false).unwrap()
}

/// The checks of a 6-turn tool conversation: one sample, every sampled
/// token trained in its own span, every tool result masked.
async fn six_tool_turns_are_one_sample(env: Env, what: &str) {
    let got = harness(&env, &["tools", "6"]).await;
    assert_eq!(got["calls"], 5, "{what}: {got}");
    let rollout = env.store.export_rollout("r1").await.unwrap();
    assert_eq!(rollout.calls.len(), 6);
    let links: Vec<Option<u32>> = rollout.calls.iter().map(|c| c.continues).collect();
    assert_eq!(
        links,
        [None, Some(0), Some(1), Some(2), Some(3), Some(4)],
        "{what}"
    );
    let samples = samples(&env, &rollout);
    assert_eq!(samples.len(), 1, "{what}: one linear history, one sample");
    let sample = &samples[0];
    assert_eq!(sample["source_calls"], json!([0, 1, 2, 3, 4, 5]));
    assert!(sample["break_before"].is_null());
    let trained: Vec<usize> = spans(sample).iter().map(|(s, e)| e - s).collect();
    let sampled: Vec<usize> = rollout.calls.iter().map(|c| c.response_ids.len()).collect();
    assert_eq!(trained, sampled, "{what}");
    let masked = masked_text(&env.tokenizer, sample);
    for k in 1..=5 {
        assert!(
            masked.contains(&format!("file{k}.txt")),
            "{what}: tool result {k} masked: {masked:?}"
        );
    }
    assert!(
        !masked.contains("ls -1"),
        "{what}: no sampled call is masked: {masked:?}"
    );
}

/// SmolLM2's own template (it has no tool syntax; the policy writes Hermes
/// calls, `[engine] tool_parser = "hermes"`): the tool turns still continue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_six_turn_tool_conversation_under_smollm2s_template_is_one_sample() {
    let model = crate::engine_server::smollm2_dir();
    let tokenizer = Arc::new(Tokenizer::from_file(&model.join("tokenizer.json")).unwrap());
    let renderer = agl::assembly::renderer(&model)
        .unwrap()
        .with_family(Family {
            tools: ToolFormat::Hermes,
            reasoning: false,
        });
    let env = start_with(
        tempfile::tempdir().unwrap(),
        tokenizer,
        renderer,
        5,
        EngineApi::Openai,
    )
    .await;
    six_tool_turns_are_one_sample(env, "smollm2").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_six_turn_tool_conversation_is_one_sample_with_every_tool_result_masked() {
    for api in [EngineApi::Openai, EngineApi::Sglang] {
        six_tool_turns_are_one_sample(start(5, api).await, &format!("{api:?}")).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compacted_history_is_two_chains_and_one_summary_break() {
    let env = start(4, EngineApi::Openai).await;
    // Calls 0-2 extend each other; call 3 sends a summary instead of the
    // middle; calls 3-5 extend each other again.
    let got = harness(&env, &["summary", "6", "3"]).await;
    assert_eq!(got["calls"], 4, "{got}");
    let rollout = env.store.export_rollout("r1").await.unwrap();
    let links: Vec<Option<u32>> = rollout.calls.iter().map(|c| c.continues).collect();
    assert_eq!(links, [None, Some(0), Some(1), None, Some(3)]);
    let samples = samples(&env, &rollout);
    let chains: Vec<&Value> = samples.iter().map(|s| &s["source_calls"]).collect();
    assert_eq!(chains, [&json!([0, 1, 2]), &json!([3, 4])]);
    let kinds: Vec<&Value> = samples.iter().map(|s| &s["break_before"]["kind"]).collect();
    assert_eq!(kinds, [&Value::Null, &json!("summary")], "{samples:?}");
}
