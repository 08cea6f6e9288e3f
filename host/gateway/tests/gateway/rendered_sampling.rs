//! What a rendered chat call asks of the engine beyond sampling, on both
//! token-in APIs (the mocks follow vLLM 0.33's completions and SGLang
//! 0.5's `/generate`): `top_logprobs` alternatives (vLLM `logprobs: k`,
//! SGLang `top_logprobs_num` with their text) answered as chat entries, and
//! a JSON `response_format` (and the Responses API's `text.format`) sent
//! as the engine's own constraint (vLLM
//! `structured_outputs.json`, SGLang `sampling_params.json_schema`), the
//! call recorded `constrained`.

use agl_gateway::GatewayConfig;
use agl_store::EngineApi;
use agl_testengine::{Reply, TestEngineConfig};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::{ADMIN, start_local_with};

async fn chat(url: &str, body: Value) -> Value {
    let resp = reqwest::Client::new()
        .post(url)
        .bearer_auth(ADMIN)
        .json(&body)
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), StatusCode::OK);
    resp.json().await.expect("json")
}

async fn alternatives_and_constraints_reach_the_engine(api: EngineApi) {
    let dir = tempfile::tempdir().expect("tempdir");
    let (tok, eos) = crate::policy::tools_policy(dir.path());
    let renderer = agl_conversation::Renderer::new(tok, &[eos]).expect("renderer");
    let engine = TestEngineConfig::default().with_script(|_| Reply::text("{\"a\": 1}"));
    let env = start_local_with(engine, GatewayConfig::default(), Some(renderer), api).await;
    env.running(&["r1".to_string()]).await;
    let url = env.chat_url("r1");
    let user = json!([{"role": "user", "content": "hi"}]);

    let answer = chat(
        &url,
        json!({"messages": user, "logprobs": true, "top_logprobs": 3}),
    )
    .await;
    let content = answer["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap();
    assert!(!content.is_empty(), "{answer}");
    for entry in content {
        let top = entry["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3, "{entry}");
        assert!(
            top[0]["token"].is_string() && top[0]["logprob"].is_f64(),
            "{entry}"
        );
        let lps: Vec<f64> = top.iter().map(|t| t["logprob"].as_f64().unwrap()).collect();
        assert!(lps.windows(2).all(|w| w[0] >= w[1]), "{entry}");
    }

    let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
    chat(
        &url,
        json!({"messages": user,
               "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}),
    )
    .await;
    // The Responses API's `text.format`: constrained the same way; plain
    // text is not.
    let responses = url.replace("/chat/completions", "/responses");
    let format = json!({"type": "json_schema", "name": "x", "schema": schema, "strict": true});
    chat(
        &responses,
        json!({"input": "hi", "text": {"format": format}}),
    )
    .await;
    chat(
        &responses,
        json!({"input": "hi", "text": {"format": {"type": "text"}}}),
    )
    .await;
    let sent = env.engine.requests();
    let (first, second) = (sent[0].body.clone().unwrap(), sent[1].body.clone().unwrap());
    assert_eq!(
        [&sent[2].body, &sent[3].body].map(|b| constraint_of(b.as_ref().unwrap(), api)),
        [Some(schema.clone()), None]
    );
    match api {
        EngineApi::Openai => {
            assert_eq!(first["logprobs"], 3, "{first}");
            assert_eq!(
                second["structured_outputs"],
                json!({"json": schema}),
                "{second}"
            );
        }
        EngineApi::Sglang => {
            assert_eq!(first["top_logprobs_num"], 3, "{first}");
            assert_eq!(first["return_text_in_logprobs"], true, "{first}");
            let text = second["sampling_params"]["json_schema"].as_str().unwrap();
            assert_eq!(serde_json::from_str::<Value>(text).unwrap(), schema);
        }
    }
    let rollout = env.store.export_rollout("r1").await.expect("export");
    let constrained: Vec<bool> = rollout.calls.iter().map(|c| c.constrained).collect();
    assert_eq!(constrained, [false, true, true, false]);
}

/// The JSON schema `body` asks the engine of `api` to sample under.
fn constraint_of(body: &Value, api: EngineApi) -> Option<Value> {
    match api {
        EngineApi::Openai => body["structured_outputs"].get("json").cloned(),
        EngineApi::Sglang => body["sampling_params"]["json_schema"]
            .as_str()
            .map(|s| serde_json::from_str(s).unwrap()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_gets_logprobs_k_and_structured_outputs() {
    alternatives_and_constraints_reach_the_engine(EngineApi::Openai).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sglang_gets_top_logprobs_num_and_a_json_schema() {
    alternatives_and_constraints_reach_the_engine(EngineApi::Sglang).await;
}
