//! The real Codex CLI (`codex exec`, pinned by deploy/setup.sh) through the
//! Responses proxy, streamed as Codex asks, against a scripted engine that
//! writes Hermes tool calls in the policy's ids: it runs `exec_command`
//! (the side effect happens) and finishes; both calls are one chain.

use std::path::Path;
use std::process::{Command, Output};

use agl_testengine::{EngineRequest, Reply};
use serde_json::{Value, json};

use crate::harness::{assert_exact, assert_wrote, call, output, recorded, report, start};
use crate::process::node_cli;
use crate::support::Local;

fn policy(r: &EngineRequest) -> Reply {
    if r.prompt_text.contains("<tool_response>") {
        Reply::text("Wrote out.txt.")
    } else {
        call("exec_command", json!({"cmd": "echo hello > out.txt"}))
    }
}

/// `codex exec TASK` in `work` with a private `CODEX_HOME` whose provider
/// is the rollout's proxy, the token in the variable it names.
async fn codex(local: &Local, work: &Path, task: &str) -> Output {
    let view = local.view("r1").await;
    let home = work.join(".codex");
    std::fs::create_dir_all(&home).expect("home");
    let config = format!(
        r#"model = "policy"
model_provider = "agl"
[model_providers.agl]
name = "agl"
base_url = "{}"
env_key = "AGL_ROLLOUT_TOKEN"
wire_api = "responses"
request_max_retries = 0
stream_max_retries = 0
"#,
        view["proxy_base_url"].as_str().expect("url")
    );
    std::fs::write(home.join("config.toml"), config).expect("config");
    let mut cmd = Command::new(node_cli("codex"));
    cmd.args([
        "exec",
        "--skip-git-repo-check",
        "--sandbox",
        "danger-full-access",
    ])
    .args(["--json", task])
    .current_dir(work)
    .env("HOME", work)
    .env("CODEX_HOME", &home)
    .env("AGL_ROLLOUT_TOKEN", view["token"].as_str().expect("token"));
    output(cmd).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_runs_a_command_through_streamed_responses_in_one_chain() {
    let dir = tempfile::tempdir().expect("tempdir");
    let local = start(dir.path(), policy).await;
    let out = codex(&local, dir.path(), "Write hello to out.txt").await;
    let calls = recorded(&local).await;
    let why = report(&out, &calls);
    assert!(out.status.success(), "{why}");
    assert_wrote(dir.path(), "out.txt", "hello\n", &why);
    // Codex's JSON events end with the agent's answer.
    let answered = String::from_utf8_lossy(&out.stdout).contains("Wrote out.txt.");
    assert!(answered, "{why}");
    assert_eq!(calls.len(), 2, "{why}");
    assert_eq!(calls[1].continues, Some(0), "{why}");
    assert_exact(&local, &calls);
    // Each record is the response Codex was streamed.
    for c in &calls {
        let record: Value = c.response.parse().expect("record");
        assert_eq!(record["object"], "response", "{why}");
        assert_eq!(record["status"], "completed", "{why}");
    }
}

/// A prompt the policy's context cannot hold: Codex gets `response.failed`
/// with `context_length_exceeded` and reports it; nothing is recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_reports_the_context_length_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let local = crate::harness::start_sized(dir.path(), policy, Some(200)).await;
    let out = codex(&local, dir.path(), "Write hello to out.txt").await;
    let calls = recorded(&local).await;
    let why = report(&out, &calls);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("ran out of room in the model's context window"),
        "{why}"
    );
    assert!(calls.is_empty(), "{why}");
    assert!(local.engine.requests().is_empty());
}
