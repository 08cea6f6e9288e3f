//! Load: 1,000 concurrent streaming clients through the proxy on loopback,
//! each on its own rollout; every call must be recorded exactly once with
//! its exact token ids (0 lost events).

use std::sync::Arc;

use agl_gateway::GatewayConfig;
use agl_testengine::{Faults, Reply, TestEngineConfig, tokens};
use serde_json::json;
use tokio::sync::Barrier;

const CLIENTS: usize = 1000;

/// The content deltas of an SSE body, joined.
fn streamed_text(body: &str) -> String {
    body.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .filter_map(|d| serde_json::from_str::<serde_json::Value>(d).ok())
        .filter_map(|v| {
            v["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_string)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_thousand_concurrent_streams_lose_no_event() {
    let env = crate::support::start_local(
        // 16 chunks, 10 ms apart: every stream stays open while the others
        // start.
        TestEngineConfig::default()
            .with_replies([Reply::text("the answer is 42")])
            .with_faults(Faults {
                chunk_latency: std::time::Duration::from_millis(10),
                ..Faults::default()
            }),
        GatewayConfig::default(),
    )
    .await;
    let ids: Vec<String> = (0..CLIENTS).map(|i| format!("load-{i}")).collect();
    env.running(&ids).await;

    // One connection per client (no pooling across clients): 1,000 streams
    // are open at once when the barrier lets them go.
    let barrier = Arc::new(Barrier::new(CLIENTS));
    let clients: Vec<_> = ids
        .iter()
        .map(|id| {
            let url = env.chat_url(id);
            let token = env.auth.rollout_token(id, 1);
            let barrier = barrier.clone();
            let marker = format!("question from {id}");
            tokio::spawn(async move {
                let http = reqwest::Client::new();
                barrier.wait().await;
                let resp = http
                    .post(url)
                    .bearer_auth(token)
                    .json(&json!({
                        "model": "m",
                        "stream": true,
                        "messages": [{"role": "user", "content": marker}]
                    }))
                    .send()
                    .await
                    .expect("send");
                assert_eq!(resp.status(), 200);
                let body = resp.text().await.expect("stream body");
                assert!(body.ends_with("data: [DONE]\n\n"), "cut stream: {body}");
                body
            })
        })
        .collect();
    for c in clients {
        let body = c.await.expect("client task");
        assert_eq!(streamed_text(&body), "the answer is 42");
    }

    let mut recorded = 0;
    for id in &ids {
        let rollout = env.store.export_rollout(id).await.expect("export");
        assert_eq!(rollout.calls.len(), 1, "{id}: calls recorded");
        let call = &rollout.calls[0];
        let marker = format!("question from {id}");
        assert!(
            call.request.as_str().contains(&marker),
            "{id}: wrong request"
        );
        assert_eq!(call.response_ids, tokens::encode("the answer is 42"));
        assert_eq!(call.response_logprobs.len(), call.response_ids.len());
        assert!(!call.prompt_ids.is_empty());
        recorded += 1;
    }
    assert_eq!(recorded, CLIENTS);
    assert_eq!(env.engine.requests().len(), CLIENTS, "engine calls");
}
