//! The Responses proxy driven by the real OpenAI Python SDK
//! (`tests/python/responses_client.py`): a function call and its output
//! sent back as input items, continued token-exactly; whole and streamed
//! (the SDK's stream helper rebuilds each response from the events).

use std::path::Path;
use std::process::Command;

use serde_json::Value;

use crate::process::python;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sdk_responses_with_a_function_call_round_trip_whole_and_streamed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let local = crate::anthropic_sdk::start(dir.path()).await;
    let view = local.view("r1").await;
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/python/responses_client.py");
    let mut cmd = Command::new(python());
    cmd.arg(script)
        .env(
            "OPENAI_BASE_URL",
            view["proxy_base_url"].as_str().expect("url"),
        )
        .env("OPENAI_API_KEY", view["token"].as_str().expect("token"));
    let out = tokio::task::spawn_blocking(move || cmd.output().expect("python"))
        .await
        .expect("join");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got: Value = serde_json::from_str(stdout.trim()).expect("json");
    assert_eq!(got["call"]["name"], "bash", "{got}");
    assert_eq!(got["call"]["arguments"]["cmd"], "ls");
    assert_eq!(got["first_status"], "completed");
    assert_eq!(got["text"], "There are 3 files.");
    assert_eq!(got["streamed_call"]["name"], "bash", "{got}");
    assert_eq!(got["streamed_call"]["arguments"]["cmd"], "ls");
    assert_eq!(got["streamed_text"], "There are 3 files.");
    assert_eq!(got["streamed_deltas"], "There are 3 files.");
    assert_eq!(got["streamed_status"], "completed");
    let types: Vec<&str> = got["event_types"]
        .as_array()
        .expect("types")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for t in [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ] {
        assert!(types.contains(&t), "{t}: {types:?}");
    }
    assert_eq!(types.last(), Some(&"response.completed"));
    let rollout = local.store.export_rollout("r1").await.expect("export");
    let links: Vec<Option<u32>> = rollout.calls.iter().map(|c| c.continues).collect();
    assert_eq!(links, [None, Some(0), None, Some(2)]);
    // A streamed call's record is the response it streamed.
    let record: Value = rollout.calls[2].response.parse().expect("record");
    assert_eq!(record["object"], "response", "{record}");
    let item = record["output"]
        .as_array()
        .expect("output")
        .iter()
        .find(|i| i["type"] == "function_call")
        .expect("the call");
    assert_eq!(item["call_id"], got["streamed_call"]["call_id"]);
    for c in &rollout.calls {
        assert_eq!(c.response_logprobs.len(), c.response_ids.len());
        assert!(!c.response_ids.is_empty());
    }
}
