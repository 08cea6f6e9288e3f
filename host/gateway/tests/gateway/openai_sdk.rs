//! The proxy driven by the real OpenAI Python SDK (`python/openai_client.py`)
//! run with `$AGL_VENV/bin/python` (default `<repo>/.venv`, installed by
//! `deploy/setup.sh`). A missing interpreter or `openai` package fails the
//! test rather than skipping it.

use crate::process::python;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use agl_gateway::GatewayConfig;
use agl_testengine::{Endpoint, Reply, TestEngineConfig, tokens};
use agl_wire::rollout::{ApiKind, Rollout};
use serde_json::{Value, json};

struct Env {
    local: crate::support::Local,
    base_url: String,
    token: String,
}

fn tool_reply() -> Reply {
    Reply::default().with_tool_call("get_weather", r#"{"city":"Paris"}"#)
}

/// Text for chat, "world" for completions, a tool call when tools are sent.
fn reply_for(endpoint: Endpoint, body: &Value) -> Reply {
    match endpoint {
        Endpoint::Completions | Endpoint::Generate => Reply::text("world"),
        Endpoint::Chat if body.get("tools").is_some() => tool_reply(),
        Endpoint::Chat => Reply::text("hello there"),
    }
}

async fn start() -> Env {
    let config = TestEngineConfig::default().with_script(|r| reply_for(r.endpoint, r.body()));
    let local = crate::support::start_local(config, GatewayConfig::default()).await;
    local.running(&["r1".into()]).await;
    Env {
        base_url: format!("{}/proxy/r1/1/train/openai/v1", local.base),
        token: local.auth.rollout_token("r1", 1),
        local,
    }
}

/// Runs the client script in a blocking thread; returns its JSON summary.
fn run_client(env: &Env, args: &[&str]) -> tokio::task::JoinHandle<Value> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/python/openai_client.py");
    let mut cmd = Command::new(python());
    cmd.arg(script)
        .args(args)
        .env("OPENAI_BASE_URL", &env.base_url)
        .env("OPENAI_API_KEY", &env.token);
    tokio::task::spawn_blocking(move || {
        let out = cmd.output().expect("run python");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "client failed: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_str(stdout.trim()).expect("client summary JSON")
    })
}

fn chat_prompt(text: &str, tools: Option<&Value>) -> Vec<u32> {
    let messages = [json!({"role": "user", "content": text})];
    tokens::encode(&tokens::render_chat(&messages, tools))
}

fn calls_for<'a>(rollout: &'a Rollout, prompt: &[u32]) -> Vec<&'a agl_wire::rollout::ModelCall> {
    rollout
        .calls
        .iter()
        .filter(|c| c.prompt_ids == prompt)
        .collect()
}

#[tokio::test]
async fn sdk_chat_stream_tools_and_completions() {
    let env = start().await;
    let got = run_client(&env, &["all"]).await.expect("client");
    assert_eq!(got["chat"], "hello there");
    assert_eq!(got["chat_finish"], "stop");
    assert_eq!(got["stream"], "hello there");
    assert!(got["stream_chunks"].as_u64() > Some(1), "{got}");
    assert_eq!(got["tool_finish"], "tool_calls");
    let tool = &got["tool_calls"][0];
    assert_eq!(tool["name"], "get_weather");
    assert_eq!(tool["arguments"], r#"{"city":"Paris"}"#);
    assert_eq!(got["completion"], "world");

    let rollout = env.local.store.export_rollout("r1").await.expect("export");
    assert_eq!(rollout.calls.len(), 4, "{:?}", rollout.calls);
    let tools_sent: Value = {
        let req: Value = rollout.calls[2].request.parse().expect("request");
        req["tools"].clone()
    };
    let expected = [
        (
            ApiKind::ChatCompletions,
            chat_prompt("hi", None),
            "hello there".to_string(),
        ),
        (
            ApiKind::ChatCompletions,
            chat_prompt("stream please", None),
            "hello there".to_string(),
        ),
        (
            ApiKind::ChatCompletions,
            chat_prompt("weather in Paris?", Some(&tools_sent)),
            tool_reply().sampled_text(),
        ),
        (
            ApiKind::Completions,
            tokens::encode("say"),
            "world".to_string(),
        ),
    ];
    for (call, (api, prompt, reply)) in rollout.calls.iter().zip(expected) {
        assert_eq!(call.api, api);
        assert_eq!(call.prompt_ids, prompt);
        assert_eq!(call.response_ids, tokens::encode(&reply));
        assert_eq!(call.response_logprobs.len(), call.response_ids.len());
    }
}

#[tokio::test]
async fn sdk_retries_the_paused_proxy_429_into_one_call() {
    let env = start().await;
    env.local.control.pause();
    let client = run_client(&env, &["retry", "10"]);
    // Python's start-up is slow and varies: wait for the first 429, then
    // resume about a second later so the SDK has to retry it.
    let answered_429 = || {
        env.local
            .metrics
            .render(&env.local.control)
            .contains("status=\"429\"")
    };
    for _ in 0..200 {
        if answered_429() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(answered_429(), "the client never reached the paused proxy");
    tokio::time::sleep(Duration::from_secs(1)).await;
    env.local.control.resume();
    let got = client.await.expect("client");
    assert_eq!(got["chat"], "hello there");
    assert!(got["retry_count"].as_u64() >= Some(1), "{got}");
    let rollout = env.local.store.export_rollout("r1").await.expect("export");
    assert_eq!(rollout.calls.len(), 1, "{:?}", rollout.calls);
    let prompt = chat_prompt("retry me", None);
    assert_eq!(calls_for(&rollout, &prompt).len(), 1);
}
