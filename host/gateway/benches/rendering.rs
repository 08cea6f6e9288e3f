//! What rendering on the gateway costs: per-call latency of a growing
//! multi-turn tool conversation through the gateway, passthrough (`render =
//! "engine"`: the engine renders) vs gateway-rendered (`render =
//! "gateway"`: the gateway renders with the policy template and continues
//! the chain token-exactly), in one run, on loopback.
//!
//! `cargo bench -p agl-gateway --bench rendering [-- --turns N --runs R (20)
//! --only engine|gateway --per-turn]`
//!
//! `--per-turn` also prints each turn's p50 (engine, then gateway).
//! `--only` runs one mode and prints no ratio: for counting one mode's
//! instructions under `valgrind --tool=callgrind`, where wall-clock noise
//! does not reach.
//!
//! The policy is the fixture tokenizer under the Hermes/Qwen-style tools
//! template (`tests/python/tools_template.jinja`); the engine is the test
//! engine answering at once, so the figures are the gateway's own work
//! (render, tokenize, record) plus loopback. Each run is one rollout whose
//! history grows by an assistant tool call and a tool result per turn. The
//! limit (issue 35): gateway-rendered p50 within 1.2x of passthrough.

use std::path::Path;
use std::time::Instant;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use agl_conversation::Renderer;
use agl_gateway::{Gateway, GatewayConfig};
use agl_store::{Mode, NewRollout, Render, Store};
use agl_testengine::{Reply, TestEngine, TestEngineConfig};
use agl_wire::api::StatusPatch;
use agl_wire::rollout::RolloutStatus;
use serde_json::{Value, json};

const ADMIN: &str = "bench-admin";
const REPLY: &str =
    "<tool_call>\n{\"name\": \"bash\", \"arguments\": {\"cmd\": \"ls -la\"}}\n</tool_call>";

#[path = "../../../tests/support/policy.rs"]
mod policy;

fn renderer(dir: &Path) -> Renderer {
    let (tok, eos) = policy::tools_policy(dir);
    Renderer::new(tok, &[eos]).expect("renderer")
}

/// A gateway over its own store with the test engine as `e1`.
async fn gateway(engine: &TestEngine, render: Render, dir: &Path) -> (String, Store) {
    let store = Store::open(dir.join(format!("{}.db", render.as_str()))).expect("store");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let config = GatewayConfig {
        listen: addr.to_string(),
        admin_key: Some(ADMIN.into()),
        ..GatewayConfig::default()
    };
    let mut gw = Gateway::new(store.clone(), config);
    if render == Render::Gateway {
        gw = gw.with_policy(renderer(dir));
    }
    tokio::spawn(gw.serve(listener, std::future::pending()));
    store
        .register_engine(
            &agl_store::RegisterEngine::new("e1", &engine.base_url(), "m").with_render(render),
        )
        .await
        .expect("engine");
    (format!("http://{addr}"), store)
}

fn tools() -> Value {
    json!([{"type": "function", "function": {"name": "bash", "description": "Run a shell command.",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}}])
}

/// One rollout of `turns` calls; the latency of each call, in ms.
async fn rollout(base: &str, store: &Store, id: &str, turns: usize) -> Vec<f64> {
    let new = NewRollout {
        id: Some(id.into()),
        group_id: "bench".into(),
        mode: Mode::Train,
        input: Default::default(),
        config: Default::default(),
    };
    store.create_rollouts(vec![new]).await.expect("create");
    store
        .set_status(id, &StatusPatch::to(1, RolloutStatus::Running))
        .await
        .expect("running");
    let http = reqwest::Client::new();
    let url = format!("{base}/proxy/{id}/1/train/openai/v1/chat/completions");
    let mut messages = vec![
        json!({"role": "system", "content": "You fix bugs in a repository with the bash tool."}),
        json!({"role": "user", "content": "The test test_parse fails; find and fix the bug."}),
    ];
    let mut out = Vec::with_capacity(turns);
    for turn in 0..turns {
        let body = json!({"messages": messages, "tools": tools(), "max_tokens": 256});
        let t = Instant::now();
        let resp: Value = http
            .post(&url)
            .bearer_auth(ADMIN)
            .json(&body)
            .send()
            .await
            .expect("send")
            .json()
            .await
            .expect("json");
        out.push(t.elapsed().as_secs_f64() * 1e3);
        let message = resp["choices"][0]["message"].clone();
        let call_id = format!("c{turn}");
        messages.push(json!({"role": "assistant", "content": message["content"],
            "tool_calls": [{"id": call_id, "type": "function",
                            "function": {"name": "bash", "arguments": "{\"cmd\": \"ls -la\"}"}}]}));
        let listing = format!(
            "total {turn}\n{}",
            "-rw-r--r-- 1 user user 1024 src/parse.py\n".repeat(8)
        );
        messages.push(json!({"role": "tool", "tool_call_id": call_id, "content": listing}));
    }
    out
}

/// Calls that continued the one before, of all calls, over the runs.
async fn continued(store: &Store, runs: usize) -> String {
    let (mut linked, mut calls) = (0, 0);
    for r in 0..runs {
        let events = store
            .list_events(&format!("r{r}"), 0, 1000)
            .await
            .expect("events");
        calls += events.len();
        linked += events
            .iter()
            .filter(|e| e.payload.parse().is_ok_and(|p| !p["continues"].is_null()))
            .count();
    }
    format!("{linked}/{calls}")
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str, default: usize| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let (turns, runs) = (arg("--turns", 30), arg("--runs", 20));
    let per_turn = args.iter().any(|a| a == "--per-turn");
    let only = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1))
        .map(|m| match m.as_str() {
            "engine" => Render::Engine,
            "gateway" => Render::Gateway,
            other => panic!("--only {other}: engine or gateway"),
        });
    let rt = agl_gateway::runtime::build().expect("runtime");
    rt.block_on(async {
        let engine = TestEngine::start(TestEngineConfig {
            log_requests: false,
            ..TestEngineConfig::default().with_replies([Reply::text(REPLY)])
        })
        .await
        .expect("engine");
        let dir = tempfile::tempdir().expect("tempdir");
        println!(
            "{turns} turns x {runs} rollouts per mode, one at a time, modes interleaved; \
             latency per call (ms)"
        );
        println!(
            "{:<10} {:>8} {:>8} {:>8} {:>10}",
            "render", "p50", "p90", "max", "last turn"
        );
        // Both gateways up at once and their rollouts interleaved, so drift
        // in the machine's load falls on both modes alike.
        let modes: Vec<Render> = [Render::Engine, Render::Gateway]
            .into_iter()
            .filter(|m| only.is_none_or(|o| o == *m))
            .collect();
        let mut gateways = Vec::new();
        for &render in &modes {
            let (base, store) = gateway(&engine, render, dir.path()).await;
            // A warm-up rollout, not counted.
            rollout(&base, &store, "warm", 3).await;
            gateways.push((base, store));
        }
        let mut all = [Vec::new(), Vec::new()];
        let mut last = [Vec::new(), Vec::new()];
        for r in 0..runs {
            for (m, (base, store)) in gateways.iter().enumerate() {
                let lat = rollout(base, store, &format!("r{r}"), turns).await;
                last[m].push(*lat.last().expect("a call"));
                all[m].extend(lat);
            }
        }
        if per_turn {
            // Which turns the difference is at: a fixed cost per call shows
            // on the short early prompts, a cost per token on the late ones.
            let names: Vec<&str> = modes.iter().map(|m| m.as_str()).collect();
            println!("p50 per turn (ms): {}", names.join(", "));
            for t in 0..turns {
                let mut line = format!("turn {t:<5}");
                for lat in all.iter().filter(|l| !l.is_empty()) {
                    let mut at: Vec<f64> = (0..runs).map(|r| lat[r * turns + t]).collect();
                    at.sort_by(f64::total_cmp);
                    line += &format!(" {:>8.2}", percentile(&at, 0.5));
                }
                println!("{line}");
            }
        }
        let mut p50s = Vec::new();
        for (m, render) in modes.into_iter().enumerate() {
            let (all, last) = (&mut all[m], &mut last[m]);
            all.sort_by(f64::total_cmp);
            last.sort_by(f64::total_cmp);
            let p50 = percentile(all, 0.5);
            p50s.push(p50);
            println!(
                "{:<10} {:>8.2} {:>8.2} {:>8.2} {:>10.2} {:>10}",
                render.as_str(),
                p50,
                percentile(all, 0.9),
                all[all.len() - 1],
                percentile(last, 0.5),
                continued(&gateways[m].1, runs).await
            );
        }
        if p50s.len() < 2 {
            return;
        }
        println!(
            "gateway / engine p50: {:.2}x (limit <= 1.2x): {}",
            p50s[1] / p50s[0],
            if p50s[1] / p50s[0] <= 1.2 {
                "met"
            } else {
                "NOT met"
            }
        );
    });
}
