//! curl as the client: plain and streamed chat completions with a tool call,
//! and a completions call, through the proxy to the test engine; the
//! recorded events hold exact ids and logprobs.

use std::process::Command;

use agl_gateway::GatewayConfig;
use agl_testengine::{Reply, TestEngineConfig, tokens};
use serde_json::{Value, json};

fn curl(args: &[&str]) -> String {
    let out = Command::new("curl")
        .args(["-sS", "--fail-with-body"])
        .args(args)
        .output()
        .expect("run curl (is it installed?)");
    let body = String::from_utf8(out.stdout).expect("utf8");
    assert!(
        out.status.success(),
        "curl {args:?}: {body} {:?}",
        out.status
    );
    body
}

/// Distinct questions: the same prompt twice would count as a client retry
/// (the earlier call superseded).
fn tool_body(stream: bool) -> String {
    json!({
        "model": "whatever",
        "stream": stream,
        "messages": [{"role": "user", "content": format!("What is 6*7? Use the calculator (stream: {stream}).")}],
        "tools": [{"type": "function", "function": {
            "name": "calculator",
            "parameters": {"type": "object", "properties": {"expr": {"type": "string"}}}
        }}]
    })
    .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_plain_streamed_and_completions_are_recorded_exactly() {
    let reply = Reply::text("Let me compute.").with_tool_call("calculator", r#"{"expr":"6*7"}"#);
    let sampled = reply.sampled_text();
    let env = crate::support::start_local(
        TestEngineConfig::default().with_replies([reply]),
        GatewayConfig::default(),
    )
    .await;
    env.running(&["c1".into()]).await;
    let token = env.auth.rollout_token("c1", 1);
    let auth = format!("Authorization: Bearer {token}");
    let base = format!("{}/proxy/c1/1/train/openai/v1", env.base);
    let chat = format!("{base}/chat/completions");
    let json_header = "Content-Type: application/json";

    let plain: Value = serde_json::from_str(&curl(&[
        "-H",
        &auth,
        "-H",
        json_header,
        "-d",
        &tool_body(false),
        &chat,
    ]))
    .expect("json answer");
    let msg = &plain["choices"][0]["message"];
    assert_eq!(msg["tool_calls"][0]["function"]["name"], "calculator");
    assert_eq!(
        msg["tool_calls"][0]["function"]["arguments"],
        r#"{"expr":"6*7"}"#
    );

    // -N: no buffering, SSE as it arrives.
    let streamed = curl(&[
        "-N",
        "-H",
        &auth,
        "-H",
        json_header,
        "-d",
        &tool_body(true),
        &chat,
    ]);
    assert!(streamed.starts_with("data: "), "{streamed}");
    assert!(streamed.ends_with("data: [DONE]\n\n"), "{streamed}");
    assert!(streamed.contains("calculator"), "{streamed}");

    let completion: Value = serde_json::from_str(&curl(&[
        "-H",
        &auth,
        "-H",
        json_header,
        "-d",
        r#"{"model": "m", "prompt": "2+2=", "max_tokens": 8}"#,
        &format!("{base}/completions"),
    ]))
    .expect("json answer");
    assert!(completion["choices"][0]["text"].is_string(), "{completion}");

    // A wrong token is a JSON 401/403 to curl as well.
    let denied = Command::new("curl")
        .args(["-sS", "-o", "-", "-w", "%{http_code}", "-H"])
        .arg("Authorization: Bearer agl-rt-bogus.00")
        .args(["-H", json_header, "-d", &tool_body(false), &chat])
        .output()
        .expect("curl");
    let text = String::from_utf8(denied.stdout).expect("utf8");
    assert!(text.ends_with("401") || text.ends_with("403"), "{text}");
    assert!(text.contains(r#""error""#), "{text}");

    let rollout = env.store.export_rollout("c1").await.expect("export");
    assert_eq!(rollout.calls.len(), 3);
    for call in &rollout.calls[..2] {
        assert_eq!(call.response_ids, tokens::encode(&sampled));
        let want: Vec<f32> = (0..call.response_ids.len())
            .map(|i| tokens::logprob(i) as f32)
            .collect();
        assert_eq!(call.response_logprobs, want);
        assert_eq!(call.finish_reason.as_deref(), Some("tool_calls"));
        let response = call.response.parse().expect("response json");
        assert_eq!(
            response["choices"][0]["message"]["tool_calls"][0]["function"]["name"], "calculator",
            "assembled response of {:?}",
            call.index
        );
    }
    assert!(!rollout.calls[2].prompt_ids.is_empty());
    assert!(!rollout.calls[2].response_ids.is_empty());
}
