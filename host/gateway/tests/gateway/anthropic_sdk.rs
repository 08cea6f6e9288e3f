//! The Messages proxy driven by the real anthropic Python SDK
//! (`tests/python/anthropic_client.py`, pinned by deploy/setup.sh) with the
//! rollout token as its API key (sent as `x-api-key`): tools and a tool
//! result round trip, whole and streamed, and the SDK's own retry of the
//! paused proxy's 429 into exactly one recorded call.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use agl_testengine::Reply;
use serde_json::Value;

use crate::process::python;
use crate::support::Local;

const CALL: &str =
    "<tool_call>\n{\"name\": \"bash\", \"arguments\": {\"cmd\":\"ls\"}}\n</tool_call>";

/// A tool call for the first prompt, text for any prompt with a result.
fn script(r: &agl_testengine::EngineRequest) -> Reply {
    if r.prompt_text.contains("<tool_response>") {
        Reply::text("There are 3 files.")
    } else if r.prompt_text.contains("retry me") {
        Reply::text("retried")
    } else {
        Reply::text(CALL)
    }
}

pub(crate) async fn start(dir: &Path) -> Local {
    crate::harness::start(dir, script).await
}

/// Runs the client with the URL and token the rollout's view gives its agent.
async fn run_client(local: &Local, args: &[&str]) -> tokio::task::JoinHandle<Value> {
    let view = local.view("r1").await;
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/python/anthropic_client.py");
    let mut cmd = Command::new(python());
    cmd.arg(script)
        .args(args)
        .env(
            "ANTHROPIC_BASE_URL",
            view["anthropic_base_url"].as_str().expect("url"),
        )
        .env("ANTHROPIC_API_KEY", view["token"].as_str().expect("token"));
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sdk_messages_with_a_tool_round_trip_whole_and_streamed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let local = start(dir.path()).await;
    let got = run_client(&local, &["tools"]).await.await.expect("client");
    assert_eq!(got["first_stop"], "tool_use", "{got}");
    assert_eq!(got["tool"]["name"], "bash");
    assert_eq!(got["tool"]["input"]["cmd"], "ls");
    assert_eq!(got["second_stop"], "end_turn");
    assert_eq!(got["second_text"], "There are 3 files.");
    assert_eq!(got["streamed_text"], "There are 3 files.");
    assert_eq!(got["streamed_stop"], "end_turn");
    // Counted as the gateway renders it: the continued prompt's length.
    assert_eq!(got["counted"], got["second_input_tokens"], "{got}");
    assert_eq!(got["models"], serde_json::json!(["served-model"]));
    let types: Vec<&str> = got["event_types"]
        .as_array()
        .expect("types")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for t in [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ] {
        assert!(types.contains(&t), "{t}: {types:?}");
    }
    // Every call recorded with its tokens; the tool-result turn continued
    // the tool call token-exactly (both times it was sent).
    let rollout = local.store.export_rollout("r1").await.expect("export");
    assert_eq!(rollout.calls.len(), 3);
    let links: Vec<Option<u32>> = rollout.calls.iter().map(|c| c.continues).collect();
    assert_eq!(links, [None, Some(0), Some(0)]);
    for c in &rollout.calls {
        assert!(!c.response_ids.is_empty());
        assert_eq!(c.response_logprobs.len(), c.response_ids.len());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sdk_retries_the_paused_proxy_429_into_one_message() {
    let dir = tempfile::tempdir().expect("tempdir");
    let local = start(dir.path()).await;
    local.control.pause();
    let client = run_client(&local, &["retry", "10"]).await;
    let answered_429 = || {
        local
            .metrics
            .render(&local.control)
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
    local.control.resume();
    let got = client.await.expect("client");
    assert_eq!(got["text"], "retried", "{got}");
    assert!(got["retry_count"].as_u64() >= Some(1), "{got}");
    let rollout = local.store.export_rollout("r1").await.expect("export");
    assert_eq!(rollout.calls.len(), 1, "{:?}", rollout.calls);
}

/// `GET .../openai/v1/models` lists the policy for the rollout's own token;
/// another attempt's token is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_models_route_lists_the_policy_for_the_rollout_token() {
    let dir = tempfile::tempdir().expect("tempdir");
    let local = start(dir.path()).await;
    let url = format!("{}/proxy/r1/1/train/openai/v1/models", local.base);
    let get = |token: String| {
        let url = url.clone();
        async move {
            reqwest::Client::new()
                .get(&url)
                .bearer_auth(token)
                .send()
                .await
                .expect("send")
        }
    };
    let list: Value = get(local.auth.rollout_token("r1", 1))
        .await
        .json()
        .await
        .expect("json");
    assert_eq!(list["object"], "list");
    assert_eq!(list["data"][0]["id"], "served-model", "{list}");
    let stale = get(local.auth.rollout_token("r1", 7)).await;
    assert_eq!(stale.status(), reqwest::StatusCode::FORBIDDEN);
}
