//! The real OpenCode CLI (`opencode run`, pinned by deploy/setup.sh) with an
//! `@ai-sdk/openai-compatible` provider at the rollout's proxy (Chat
//! Completions, rendered by the gateway), against a scripted engine that
//! writes Hermes tool calls in the policy's ids: it runs its `bash` tool
//! (the side effect happens) and finishes; the agent's calls are one chain.

use std::path::Path;
use std::process::{Command, Output};

use agl_testengine::{EngineRequest, Reply};
use agl_wire::rollout::ModelCall;
use serde_json::json;

use crate::harness::{assert_exact, assert_wrote, call, output, recorded, report, start};
use crate::process::node_cli;
use crate::support::Local;

/// OpenCode's title call (its own small agent) gets a title; the agent
/// runs bash, then answers.
fn policy(r: &EngineRequest) -> Reply {
    if !r.prompt_text.contains("\"name\": \"bash\"") {
        Reply::text("Writing a file")
    } else if r.prompt_text.contains("<tool_response>") {
        Reply::text("Wrote out.txt.")
    } else {
        call(
            "bash",
            json!({"command": "echo hello > out.txt", "description": "Write a file"}),
        )
    }
}

/// `opencode run TASK` in `work`: the provider in the project's
/// `opencode.json`, found through `$PWD` (OpenCode reads it, not the
/// process's directory), a private home.
async fn opencode(local: &Local, work: &Path, task: &str) -> Output {
    let view = local.view("r1").await;
    let config = json!({
        "$schema": "https://opencode.ai/config.json",
        "model": "agl/policy",
        "share": "disabled",
        "autoupdate": false,
        "provider": {"agl": {
            "npm": "@ai-sdk/openai-compatible",
            "name": "agl",
            "options": {"baseURL": view["proxy_base_url"], "apiKey": "{env:AGL_ROLLOUT_TOKEN}"},
            "models": {"policy": {"name": "policy"}},
        }},
    });
    std::fs::write(work.join("opencode.json"), config.to_string()).expect("config");
    let home = work.join(".home");
    std::fs::create_dir_all(&home).expect("home");
    let mut cmd = Command::new(node_cli("opencode"));
    cmd.args(["run", "-m", "agl/policy", task])
        .current_dir(work)
        .env("PWD", work)
        .env("HOME", &home)
        .env("XDG_CONFIG_HOME", home.join(".config"))
        .env("XDG_DATA_HOME", home.join(".local/share"))
        .env("XDG_CACHE_HOME", home.join(".cache"))
        .env("XDG_STATE_HOME", home.join(".local/state"))
        .env("OPENCODE_DISABLE_AUTOUPDATE", "1")
        .env("AGL_ROLLOUT_TOKEN", view["token"].as_str().expect("token"));
    output(cmd).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opencode_runs_its_bash_tool_through_chat_completions_in_one_chain() {
    let dir = tempfile::tempdir().expect("tempdir");
    let local = start(dir.path(), policy).await;
    let out = opencode(&local, dir.path(), "Write hello to out.txt").await;
    let calls = recorded(&local).await;
    let why = report(&out, &calls);
    assert!(out.status.success(), "{why}");
    assert_wrote(dir.path(), "out.txt", "hello\n", &why);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("Wrote out.txt."),
        "{why}"
    );
    assert_exact(&local, &calls);
    // The agent's calls (those offered the bash tool): a chain.
    let agent: Vec<&ModelCall> = calls
        .iter()
        .filter(|c| c.request.as_str().contains("\"bash\""))
        .collect();
    assert_eq!(agent.len(), 2, "{why}");
    assert_eq!(agent[1].continues, Some(agent[0].index), "{why}");
}
