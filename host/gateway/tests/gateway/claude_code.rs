//! The real Claude Code CLI (`claude -p`, pinned by deploy/setup.sh) through
//! the Messages proxy, against a scripted engine that writes Hermes tool
//! calls in the policy's ids: it runs the Bash tool (the side effect
//! happens), starts a sub-agent with its Agent tool, and finishes. Every
//! call is recorded with the ids the engine saw and sampled.

use std::path::Path;
use std::process::{Command, Output};

use agl_testengine::{EngineRequest, Reply};
use agl_wire::rollout::ModelCall;
use serde_json::{Value, json};

use crate::harness::{
    assert_exact, assert_wrote, call, output, recorded, report, start, start_sized,
};
use crate::process::node_cli;
use crate::support::Local;

/// The sub-agent `--agents` defines; its system prompt tells the script
/// which agent is asking.
const WRITER: &str =
    r#"{"writer": {"description": "Writes files", "prompt": "You are the writer sub-agent."}}"#;

/// `claude -p TASK` headless in `work`, with a private home, the rollout's
/// URL and token, and a one-line system prompt. The billing line is left
/// on (no `CLAUDE_CODE_ATTRIBUTION_HEADER=0`): the chains must hold with it.
async fn claude(local: &Local, work: &Path, task: &str, extra: &[&str]) -> Output {
    // `--bare` leaves out the Agent tool; a test that needs it goes without.
    let view = local.view("r1").await;
    let home = work.join(".home");
    std::fs::create_dir_all(&home).expect("home");
    let mut cmd = Command::new(node_cli("claude"));
    cmd.args(["-p", task, "--system-prompt", "You are terse."])
        .args(["--max-turns", "6", "--output-format", "json"])
        .args(extra)
        .current_dir(work)
        .env("HOME", &home)
        .env(
            "ANTHROPIC_BASE_URL",
            view["anthropic_base_url"].as_str().expect("url"),
        )
        .env("ANTHROPIC_API_KEY", view["token"].as_str().expect("token"))
        .env("ANTHROPIC_MODEL", "policy")
        .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
        .env("DISABLE_TELEMETRY", "1");
    output(cmd).await
}

fn main_agent(r: &EngineRequest) -> Reply {
    if r.prompt_text.contains("<tool_response>") {
        Reply::text("Done: wrote out.txt.")
    } else {
        call(
            "Bash",
            json!({"command": "echo hello > out.txt", "description": "Write a file"}),
        )
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_runs_its_bash_tool_and_every_call_continues_token_exactly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let local = start(dir.path(), main_agent).await;
    let out = claude(
        &local,
        dir.path(),
        "Write hello to out.txt",
        &["--bare", "--tools", "Bash", "--allowedTools", "Bash"],
    )
    .await;
    let calls = recorded(&local).await;
    let why = report(&out, &calls);
    assert!(out.status.success(), "{why}");
    let result: Value = serde_json::from_slice(&out.stdout).expect("result JSON");
    assert_eq!(result["result"], "Done: wrote out.txt.", "{why}");
    assert_wrote(dir.path(), "out.txt", "hello\n", &why);
    // The tool call, then the answer continuing it.
    assert_eq!(calls.len(), 2, "{why}");
    assert_eq!(calls[1].continues, Some(0), "{why}");
    assert_exact(&local, &calls);
    let prefix = [calls[0].prompt_ids.clone(), calls[0].response_ids.clone()].concat();
    assert!(calls[1].prompt_ids.starts_with(&prefix));
    // Claude Code's billing line is in the request, never in the prompt.
    assert!(
        calls[0]
            .request
            .as_str()
            .contains("x-anthropic-billing-header")
    );
    let (tok, _) = crate::policy::tools_policy(&dir.path().join(".home"));
    let prompt = tok.decode(&calls[1].prompt_ids, false).expect("decode");
    assert!(!prompt.contains("x-anthropic-billing-header"), "{prompt}");
    // The tool_use id the answer streamed is the one Claude Code sent back.
    let second: Value = calls[1].request.parse().expect("request");
    let first: Value = calls[0].response.parse().expect("response");
    let sent_back = &second["messages"][1]["content"][0]["id"];
    assert_eq!(sent_back, &first["content"][0]["id"], "{why}");
}

/// The writer sub-agent runs Bash and reports; the main agent starts it
/// with the Agent tool and answers once it has heard back.
fn with_sub_agent(r: &EngineRequest) -> Reply {
    let answered = r.prompt_text.contains("<tool_response>");
    if r.prompt_text.contains("You are the writer sub-agent.") {
        if answered {
            Reply::text("Wrote sub.txt.")
        } else {
            call(
                "Bash",
                json!({"command": "echo sub > sub.txt", "description": "Write a file"}),
            )
        }
    } else if answered {
        Reply::text("The writer is on it.")
    } else {
        call(
            "Agent",
            json!({"description": "Write sub.txt", "prompt": "Write sub to sub.txt.",
                   "subagent_type": "writer"}),
        )
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claude_code_sub_agent_is_a_second_chain_of_the_same_rollout() {
    let dir = tempfile::tempdir().expect("tempdir");
    let local = start(dir.path(), with_sub_agent).await;
    let out = claude(
        &local,
        dir.path(),
        "Have the writer write sub.txt",
        &[
            "--tools",
            "Bash,Agent",
            "--allowedTools",
            "Bash,Agent",
            "--agents",
            WRITER,
        ],
    )
    .await;
    let calls = recorded(&local).await;
    let why = report(&out, &calls);
    assert!(out.status.success(), "{why}");
    assert_wrote(dir.path(), "sub.txt", "sub\n", &why);
    assert_exact(&local, &calls);
    // Two agents by their system prompts, each one chain: its first call
    // starts fresh, every later one continues the agent's previous call.
    let sub: Vec<bool> = calls
        .iter()
        .map(|c| c.request.as_str().contains("You are the writer sub-agent."))
        .collect();
    for agent in [false, true] {
        let mine: Vec<&ModelCall> = calls
            .iter()
            .filter(|c| sub[c.index as usize] == agent)
            .collect();
        assert!(mine.len() >= 2, "agent {agent}: {why}");
        assert_eq!(mine[0].continues, None, "{why}");
        for pair in mine.windows(2) {
            assert_eq!(pair[1].continues, Some(pair[0].index), "{why}");
        }
    }
}

/// A prompt the policy's context cannot hold: Claude Code gets Anthropic's
/// "prompt is too long" error and reports it; nothing is recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_reports_the_context_length_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let local = start_sized(dir.path(), main_agent, Some(200)).await;
    let out = claude(
        &local,
        dir.path(),
        "Write hello to out.txt",
        &["--bare", "--tools", "Bash"],
    )
    .await;
    let calls = recorded(&local).await;
    let why = report(&out, &calls);
    let result: Value = serde_json::from_slice(&out.stdout).expect("result JSON");
    assert_eq!(result["terminal_reason"], "prompt_too_long", "{why}");
    assert!(calls.is_empty(), "{why}");
    assert!(local.engine.requests().is_empty());
}
