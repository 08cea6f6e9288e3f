//! Samples per rollout and chain breaks per kind, `render = "engine"` (the
//! engine re-renders the harness's text history each call) vs `render =
//! "gateway"` (the gateway continues what it served token-exactly), in one
//! run, one table. The samples are what the `trajectory` plugin builds
//! through the real plugin host: the host's merge (`agl-samples`, asked for
//! by the plugin) with the policy tokenizer.
//!
//! `cargo bench -p agl --bench samples [-- --rollouts N --mini-rollouts M]`
//!
//! Traces:
//! - `tools/qwen-style`: a tool-calling agent under the Hermes/Qwen-style
//!   tools template (`tests/python/tools_template.jinja`, fixture
//!   tokenizer), replayed: each turn the model writes a `<tool_call>` with
//!   compact JSON arguments and the harness sends the call back re-serialised
//!   (`json.dumps(sort_keys=True)`: spaces, sorted keys), as SDK-based
//!   harnesses do. `engine` prompts are the template's render of the
//!   harness's history (what vLLM/SGLang chat does), `gateway` prompts come
//!   from the gateway's own continuation logic (`agl_conversation::Chains`);
//!   the sampled ids are the same in both.
//! - `smollm2/chat`: live, SmolLM2-135M-Instruct on the embedded engine
//!   behind the real gateway, the real OpenAI Python SDK as a harness that
//!   keeps its history as text (`tests/python/engine_client.py
//!   conversation`, whole and streamed turns); skipped when the model is not
//!   fetched (`agl model fetch smollm2`). Its `engine` row is the same
//!   calls with each prompt re-rendered from the request's text history, as
//!   an engine that renders (vLLM's chat) would have sent (agl's engine
//!   takes token ids only).
//! - `smollm2/mini-swe`: live, the real mini-swe-agent 2.4.6
//!   (`examples/mini-swe/run_rollout.py`, 5 steps, 48 tokens a call) on
//!   generated tasks against the same engine, samples by the `mini-swe`
//!   adapter. SmolLM2 writes no tool calls, so mini answers each reply with
//!   a format error and drops it: not a linear history, a break per call
//!   in both modes (kind `other`, detail `format-error-drop`); the
//!   `engine` row re-rendered as `smollm2/chat`'s.
//!
//! Targets (issue 16), printed with a verdict each: 1.00 samples per
//! rollout on the linear histories and no retokenize/template breaks on
//! the gateway path.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use agl_conversation::{AssistantTurn, Chains, Renderer, Served, openai_chat};
use agl_gateway::{Gateway, GatewayConfig};
use agl_plugin_host::{HostConfig, PluginHost, PluginSpec};
use agl_store::{Mode, NewRollout, Render, Store};
use agl_tokenizer::Tokenizer;
use agl_wire::api::StatusPatch;
use agl_wire::rollout::{BreakKind, ModelCall, Rollout, RolloutStatus};
use serde_json::{Value, json};

#[path = "../../../tests/support/policy.rs"]
mod policy;
#[allow(dead_code)]
#[path = "../../../tests/support/process.rs"]
mod process;

const ADMIN: &str = "bench-admin";

/// One table row.
struct Row {
    trace: &'static str,
    render: Render,
    rollouts: usize,
    calls: usize,
    samples: usize,
    breaks: BTreeMap<BreakKind, usize>,
}

/// Builds every rollout's samples with the adapter plugin and counts.
async fn count(
    host: &PluginHost,
    tokenizer: Arc<Tokenizer>,
    (trace, adapter): (&'static str, &str),
    render: Render,
    rollouts: &[Rollout],
) -> Row {
    let wasm = repo().join(format!("build/plugins/{adapter}.wasm"));
    let mut spec = PluginSpec::new(adapter, wasm);
    spec.tokenizer = Some(tokenizer);
    let plugin = host
        .load(spec)
        .await
        .expect("trajectory.wasm (plugins/build.sh)");
    let mut row = Row {
        trace,
        render,
        rollouts: rollouts.len(),
        calls: 0,
        samples: 0,
        breaks: BTreeMap::new(),
    };
    for r in rollouts {
        row.calls += r.calls.len();
        // Counted, not timed: the copy into an `Arc` costs nothing here.
        let samples = plugin
            .build_samples(&Arc::new(r.clone()))
            .await
            .expect("samples");
        row.samples += samples.len();
        for b in samples.iter().filter_map(|s| s.break_before.as_ref()) {
            *row.breaks.entry(b.kind).or_default() += 1;
        }
    }
    row
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn call(
    index: u32,
    request: Value,
    reply: Value,
    prompt_ids: Vec<u32>,
    response_ids: Vec<u32>,
) -> ModelCall {
    let response = json!({"object": "chat.completion",
                          "choices": [{"index": 0, "message": reply, "finish_reason": "stop"}]});
    let logprobs = vec![-0.5; response_ids.len()];
    ModelCall {
        finish_reason: Some("stop".into()),
        ..ModelCall::chat(
            index,
            (request.into(), response.into()),
            (prompt_ids, response_ids),
            logprobs,
        )
    }
}

fn rollout(id: String, calls: Vec<ModelCall>) -> Rollout {
    Rollout {
        id,
        group_id: "bench".into(),
        attempt: 1,
        input: Default::default(),
        status: RolloutStatus::Succeeded,
        failure: None,
        calls,
        events: Vec::new(),
    }
}

fn tools() -> Value {
    json!([{"type": "function", "function": {"name": "bash", "description": "Run a shell command.",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}, "cwd": {"type": "string"}}}}}])
}

/// The tool trace of rollout `r`: per turn, what the model wrote and the
/// assistant message the harness sends back for it.
fn tool_turns(r: usize, turns: usize) -> Vec<(String, Value)> {
    (0..turns)
        .map(|t| {
            if t + 1 == turns {
                let text = format!("Found {} files.", t + r);
                return (text.clone(), json!({"role": "assistant", "content": text}));
            }
            let cmd = format!("ls -la dir{r}/{t}");
            // Compact, `cwd` first: the model's way.
            let raw_args = format!(r#"{{"cwd":"/repo","cmd":"{cmd}"}}"#);
            let lead = if t % 2 == 1 { "Next, list it.\n" } else { "" };
            let raw = format!(
                "{lead}<tool_call>\n{{\"name\": \"bash\", \"arguments\": {raw_args}}}\n</tool_call>"
            );
            // The harness's: spaces, sorted keys.
            let sent_args = format!(r#"{{"cmd": "{cmd}", "cwd": "/repo"}}"#);
            let content = if lead.is_empty() {
                Value::Null
            } else {
                json!(lead.trim())
            };
            let message = json!({"role": "assistant", "content": content, "tool_calls": [{
                "id": format!("call_{t}"), "type": "function",
                "function": {"name": "bash", "arguments": sent_args}}]});
            (raw, message)
        })
        .collect()
}

/// Replays the tool trace for both render modes.
fn tool_trace(renderer: &Renderer, eos: u32, rollouts: usize, turns: usize) -> [Vec<Rollout>; 2] {
    let tok = renderer.tokenizer();
    let mut engine = Vec::new();
    let mut gateway = Vec::new();
    for r in 0..rollouts {
        let mut messages = vec![
            json!({"role": "system", "content": "You are a careful agent."}),
            json!({"role": "user", "content": format!("How many files are in dir{r}?")}),
        ];
        let mut chains = Chains::default();
        let (mut by_engine, mut by_gateway) = (Vec::new(), Vec::new());
        for (k, (raw, message)) in tool_turns(r, turns).into_iter().enumerate() {
            let request = json!({"model": "policy", "messages": messages, "tools": tools()});
            let conv = openai_chat::conversation(&request).expect("conversation");
            let mut response = tok.encode(&raw, false).expect("encode");
            response.push(eos);
            let fresh = renderer.fresh(&conv).expect("render");
            by_engine.push(call(
                k as u32,
                request.clone(),
                message.clone(),
                fresh,
                response.clone(),
            ));
            let prompt = chains.prompt(renderer, &conv).expect("prompt");
            let reply: AssistantTurn = renderer.family().parse(&raw);
            let mut c = call(
                k as u32,
                request,
                message.clone(),
                prompt.ids.clone(),
                response.clone(),
            );
            c.continues = prompt.continues.map(|seq| seq as u32);
            by_gateway.push(c);
            chains.served(
                Served {
                    call: k as u64,
                    messages: conv.messages.clone(),
                    tools: conv.tools.clone(),
                    prompt_ids: prompt.ids,
                    response_ids: response,
                    reply,
                },
                prompt.continues,
            );
            messages.push(message);
            if k + 1 < turns {
                messages.push(json!({"role": "tool", "tool_call_id": format!("call_{k}"),
                                     "content": format!("a.txt\nb{k}.txt")}));
            }
        }
        engine.push(rollout(format!("tools-{r}"), by_engine));
        gateway.push(rollout(format!("tools-{r}"), by_gateway));
    }
    [engine, gateway]
}

/// The SmolLM2 folder if `agl model fetch smollm2` put it in the cache.
fn smollm2() -> Option<PathBuf> {
    let dir = agl_models::fetch::cache_root()
        .join("models")
        .join(agl_models::fetch::SMOLLM2.dir);
    dir.join("model.safetensors").is_file().then_some(dir)
}

/// The real gateway with SmolLM2 embedded (the gateway renders), and
/// running train rollouts `ids` (sampled at temperature 1).
struct Embedded {
    base: String,
    store: Store,
    _server: agl_inference::InferenceServer,
    _work: tempfile::TempDir,
}

async fn embedded(dir: &Path, ids: &[String]) -> Embedded {
    let work = tempfile::tempdir().expect("tempdir");
    let store = Store::open(work.path().join("agl.db")).expect("store");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let config = GatewayConfig {
        listen: addr.to_string(),
        admin_key: Some(ADMIN.into()),
        ..GatewayConfig::default()
    };
    let gateway = Gateway::new(store.clone(), config)
        .with_policy(agl::assembly::renderer(dir).expect("renderer"));
    let engine = agl_engine::EngineConfig {
        max_seqs: 4,
        max_len: 4096,
        weight_version: 0,
    };
    let server = agl_inference::InferenceServer::load(dir, "policy", tch::Kind::Float, engine)
        .expect("load SmolLM2");
    agl::policy::embed(&gateway, &store, "embedded", &server)
        .await
        .expect("embed");
    tokio::spawn(gateway.serve(listener, std::future::pending()));
    let new = ids
        .iter()
        .map(|id| NewRollout {
            id: Some(id.clone()),
            group_id: "bench".into(),
            mode: Mode::Train,
            input: Default::default(),
            config: Default::default(),
        })
        .collect();
    store.create_rollouts(new).await.expect("create");
    for id in ids {
        store
            .set_status(id, &StatusPatch::to(1, RolloutStatus::Running))
            .await
            .expect("running");
    }
    Embedded {
        base: format!("http://{addr}"),
        store,
        _server: server,
        _work: work,
    }
}

/// Runs `cmd` (a harness) to its end off the async workers.
async fn run(mut cmd: Command) {
    let done = tokio::task::spawn_blocking(move || cmd.output().expect("harness"))
        .await
        .expect("join");
    assert!(
        done.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&done.stdout),
        String::from_utf8_lossy(&done.stderr)
    );
}

/// `rollouts` conversations of `prompts` through the gateway, SmolLM2
/// embedded; the exported rollouts.
async fn smollm2_chat(dir: &Path, rollouts: usize, prompts: &[&str]) -> Vec<Rollout> {
    let ids: Vec<String> = (0..rollouts).map(|i| format!("chat-{i}")).collect();
    let env = embedded(dir, &ids).await;
    let mut out = Vec::new();
    for id in &ids {
        let mut cmd = Command::new(process::python());
        cmd.arg(repo().join("tests/python/engine_client.py"))
            .arg("conversation")
            .args(prompts)
            .env(
                "OPENAI_BASE_URL",
                format!("{}/proxy/{id}/1/train/openai/v1", env.base),
            )
            .env("OPENAI_API_KEY", ADMIN);
        run(cmd).await;
        out.push(env.store.export_rollout(id).await.expect("export"));
    }
    out
}

/// The real mini-swe-agent (examples/mini-swe/run_rollout.py) on the first
/// `rollouts` generated tasks, SmolLM2 embedded.
async fn smollm2_mini_swe(dir: &Path, rollouts: usize) -> Vec<Rollout> {
    let tasks = tempfile::tempdir().expect("tempdir");
    let mut make = Command::new(process::python());
    make.arg(repo().join("examples/mini-swe/gen_tasks.py"))
        .arg("--root")
        .arg(tasks.path().join("repos"))
        .arg("--out")
        .arg(tasks.path().join("tasks.jsonl"));
    run(make).await;
    let rows: Vec<String> = std::fs::read_to_string(tasks.path().join("tasks.jsonl"))
        .expect("tasks")
        .lines()
        .take(rollouts)
        .map(str::to_owned)
        .collect();
    let ids: Vec<String> = (0..rows.len()).map(|i| format!("mini-{i}")).collect();
    let env = embedded(dir, &ids).await;
    let mut out = Vec::new();
    for (id, row) in ids.iter().zip(&rows) {
        let mut cmd = Command::new(process::python());
        cmd.arg(repo().join("examples/mini-swe/run_rollout.py"))
            .env("AGL_INPUT", row)
            .env(
                "OPENAI_BASE_URL",
                format!("{}/proxy/{id}/1/train/openai/v1", env.base),
            )
            .env("OPENAI_API_KEY", ADMIN)
            .env(
                "AGL_EVENT_URL",
                format!("{}/v1/rollouts/{id}/events", env.base),
            )
            .env("MSWE_TASKS_ROOT", tasks.path().join("repos"))
            .env("MSWE_STEP_LIMIT", "5")
            .env("MSWE_MAX_TOKENS", "48")
            .env("MSWE_CMD_TIMEOUT", "10");
        run(cmd).await;
        out.push(env.store.export_rollout(id).await.expect("export"));
    }
    out
}

/// `rollouts` as an engine that renders would have served them: each
/// call's prompt the template's render of its request's text history (the
/// sampled ids as they were), no call continuing another.
fn re_rendered(renderer: &Renderer, rollouts: &[Rollout]) -> Vec<Rollout> {
    let mut out = rollouts.to_vec();
    for call in out.iter_mut().flat_map(|r| &mut r.calls) {
        let request: Value = serde_json::from_str(call.request.as_str()).expect("request");
        let conv = openai_chat::conversation(&request).expect("conversation");
        call.prompt_ids = renderer.fresh(&conv).expect("render");
        call.continues = None;
    }
    out
}

fn print(rows: &[Row]) {
    let kinds = [
        BreakKind::Retokenize,
        BreakKind::Template,
        BreakKind::Summary,
        BreakKind::SubAgent,
        BreakKind::Other,
    ];
    print!(
        "{:<20} {:<8} {:>8} {:>6} {:>16}",
        "trace", "render", "rollouts", "calls", "samples/rollout"
    );
    for k in kinds {
        print!(" {:>10}", k.as_str());
    }
    println!();
    for r in rows {
        print!(
            "{:<20} {:<8} {:>8} {:>6} {:>16.2}",
            r.trace,
            r.render.as_str(),
            r.rollouts,
            r.calls,
            r.samples as f64 / r.rollouts.max(1) as f64
        );
        for k in kinds {
            print!(" {:>10}", r.breaks.get(&k).copied().unwrap_or(0));
        }
        println!();
    }
}

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let rollouts = arg("--rollouts", 12);
    let mini_rollouts = arg("--mini-rollouts", 4);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let host = PluginHost::new(HostConfig::default()).expect("plugin host");
        let dir = tempfile::tempdir().expect("tempdir");
        let (tok, eos) = policy::tools_policy(dir.path());
        let renderer = Renderer::new(tok.clone(), &[eos]).expect("renderer");
        let [engine, gateway] = tool_trace(&renderer, eos, rollouts, 6);
        let tools = ("tools/qwen-style", "trajectory");
        let mut rows = vec![
            count(&host, tok.clone(), tools, Render::Engine, &engine).await,
            count(&host, tok.clone(), tools, Render::Gateway, &gateway).await,
        ];
        match smollm2() {
            Some(model) => {
                let tok = Arc::new(
                    Tokenizer::from_file(&model.join("tokenizer.json")).expect("tokenizer"),
                );
                let prompts = [
                    "What is the capital of France?",
                    "And of Italy?",
                    "Write a haiku about rust.",
                    "List three colors.",
                ];
                let smol = agl::assembly::renderer(&model).expect("renderer");
                let chat = ("smollm2/chat", "trajectory");
                let exported = smollm2_chat(&model, rollouts, &prompts).await;
                let engine = re_rendered(&smol, &exported);
                rows.push(count(&host, tok.clone(), chat, Render::Engine, &engine).await);
                rows.push(count(&host, tok.clone(), chat, Render::Gateway, &exported).await);
                let mini = ("smollm2/mini-swe", "mini-swe");
                let exported = smollm2_mini_swe(&model, mini_rollouts).await;
                let engine = re_rendered(&smol, &exported);
                rows.push(count(&host, tok.clone(), mini, Render::Engine, &engine).await);
                rows.push(count(&host, tok.clone(), mini, Render::Gateway, &exported).await);
            }
            None => println!("smollm2 traces not run: `agl model fetch smollm2` first"),
        }
        print(&rows);
        verdicts(&rows);
    });
}

/// The targets against the gateway-rendered rows: one sample per rollout
/// on the linear histories (every trace but mini-swe's, which drops
/// replies), no retokenize or template break on any.
fn verdicts(rows: &[Row]) {
    let gateway = || rows.iter().filter(|r| r.render == Render::Gateway);
    let linear: Vec<String> = gateway()
        .filter(|r| !r.trace.contains("mini-swe"))
        .map(|r| {
            let per = r.samples as f64 / r.rollouts.max(1) as f64;
            format!("{} {per:.2}", r.trace)
        })
        .collect();
    let one = gateway()
        .filter(|r| !r.trace.contains("mini-swe"))
        .all(|r| r.samples == r.rollouts);
    let verdict = |ok: bool| if ok { "met" } else { "NOT met" };
    println!(
        "gateway-rendered linear histories: 1.00 samples per rollout: {} ({})",
        verdict(one),
        linear.join(", ")
    );
    let broken: usize = gateway()
        .map(|r| {
            [BreakKind::Retokenize, BreakKind::Template]
                .iter()
                .map(|k| r.breaks.get(k).copied().unwrap_or(0))
                .sum::<usize>()
        })
        .sum();
    println!(
        "gateway-rendered: no retokenize or template break on any trace: {} ({broken} in {} traces)",
        verdict(broken == 0),
        gateway().count()
    );
}
