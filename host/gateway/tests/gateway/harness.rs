//! What the real-CLI tests share: a gateway rendering with the tools
//! policy over a scripted engine that reads prompts in the policy's ids, a
//! Hermes tool call as the engine writes it, the check that every record
//! holds the ids the engine saw and sampled, and a failure report.

use std::path::Path;
use std::process::{Command, Output};

use agl_conversation::Renderer;
use agl_gateway::GatewayConfig;
use agl_testengine::{Codec, EngineRequest, Reply, TestEngineConfig};
use agl_wire::rollout::ModelCall;
use serde_json::{Value, json};

use crate::support::{Local, start_local_sized};

/// The engine's text for a Hermes call of `name`.
pub fn call(name: &str, arguments: Value) -> Reply {
    Reply::text(format!(
        "<tool_call>\n{}\n</tool_call>",
        json!({"name": name, "arguments": arguments})
    ))
}

pub async fn start(dir: &Path, script: fn(&EngineRequest) -> Reply) -> Local {
    start_sized(dir, script, None).await
}

/// [`start`] on a policy whose context is `context_len` tokens.
pub async fn start_sized(
    dir: &Path,
    script: fn(&EngineRequest) -> Reply,
    context_len: Option<usize>,
) -> Local {
    let (tok, eos) = crate::policy::tools_policy(dir);
    let codec = {
        let (e, d) = (tok.clone(), tok.clone());
        Codec::new(
            move |text| e.encode(text, false).unwrap_or_default(),
            move |ids| d.decode(ids, false).unwrap_or_default(),
        )
    };
    let engine = TestEngineConfig::default()
        .with_codec(codec)
        .with_script(script);
    let renderer = Renderer::new(tok, &[eos]).expect("renderer");
    let local = start_local_sized(
        engine,
        GatewayConfig::default(),
        Some(renderer),
        Default::default(),
        context_len,
    )
    .await;
    local.running(&["r1".into()]).await;
    local
}

/// What the CLI printed and each recorded call (its last message, its
/// tools and its answer), for failure messages.
pub fn report(out: &Output, calls: &[ModelCall]) -> String {
    let mut s = format!(
        "stdout: {}\nstderr: {}\n",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    for c in calls {
        let request: Value = c.request.parse().unwrap_or_default();
        let last = request["messages"]
            .as_array()
            .and_then(|m| m.last())
            .cloned();
        let tools: Vec<Value> = request["tools"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|t| t["name"].clone())
            .collect();
        s.push_str(&format!(
            "call {} (continues {:?}, tools {tools:?}): last message {} -> {}\n",
            c.index,
            c.continues,
            last.unwrap_or_default(),
            c.response
        ));
    }
    s
}

/// Each recorded call holds the prompt ids the engine was sent and the ids
/// and logprobs it sampled.
pub fn assert_exact(local: &Local, calls: &[ModelCall]) {
    let sent: Vec<Vec<u32>> = local
        .engine
        .requests()
        .iter()
        .filter(|r| r.path == "/v1/completions")
        .filter_map(|r| serde_json::from_value(r.body.as_ref()?["prompt"].clone()).ok())
        .collect();
    // Agents may call at once: the same prompts, in whatever order.
    let mut recorded: Vec<&Vec<u32>> = calls.iter().map(|c| &c.prompt_ids).collect();
    let mut sent: Vec<&Vec<u32>> = sent.iter().collect();
    recorded.sort();
    sent.sort();
    assert_eq!(recorded, sent);
    for c in calls {
        assert!(!c.response_ids.is_empty());
        assert_eq!(c.response_logprobs.len(), c.response_ids.len());
    }
}

/// Runs a CLI to its end off the async workers.
pub async fn output(mut cmd: Command) -> Output {
    tokio::task::spawn_blocking(move || cmd.output().expect("run the CLI"))
        .await
        .expect("join")
}

/// Rollout `r1`'s recorded calls.
pub async fn recorded(local: &Local) -> Vec<ModelCall> {
    local
        .store
        .export_rollout("r1")
        .await
        .expect("export")
        .calls
}

/// The CLI's side effect: `file` in `dir` holds `text`.
pub fn assert_wrote(dir: &Path, file: &str, text: &str, why: &str) {
    let got = std::fs::read_to_string(dir.join(file)).unwrap_or_default();
    assert_eq!(got, text, "{why}");
}
