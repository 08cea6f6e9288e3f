//! A rendered answer is held to the limits of a record's JSON as an
//! engine's own answer is: a tool input the model nested deeper than they
//! allow makes a Messages answer (whose `input` is that object) a 502 with
//! nothing stored as served, where a Chat answer (whose `arguments` is a
//! string) is within them.

use agl_testengine::{Reply, TestEngineConfig};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::{ADMIN, rendering_r1};

fn nested(depth: usize) -> String {
    format!("{}1{}", "{\"a\": ".repeat(depth), "}".repeat(depth))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_input_beyond_the_json_limits_is_refused_in_messages_only() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (tok, eos) = crate::policy::tools_policy(dir.path());
    let renderer = agl_conversation::Renderer::new(tok, &[eos]).expect("renderer");
    // Within serde_json's own recursion limit (128), beyond agl's (100).
    let call = format!(
        "<tool_call>\n{{\"name\": \"bash\", \"arguments\": {}}}\n</tool_call>",
        nested(110)
    );
    let engine = TestEngineConfig::default().with_script(move |_| Reply::text(call.clone()));
    let env = rendering_r1(engine, renderer).await;
    let client = reqwest::Client::new();

    let chat = client
        .post(env.chat_url("r1"))
        .bearer_auth(ADMIN)
        .json(&json!({"messages": [{"role": "user", "content": "go"}],
                      "tools": [{"type": "function", "function": {"name": "bash"}}]}))
        .send()
        .await
        .expect("send");
    assert_eq!(chat.status(), StatusCode::OK);
    let answer: Value = chat.json().await.expect("json");
    let arguments = &answer["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"];
    assert!(arguments.is_string(), "{answer}");
    assert!(
        answer["prompt_token_ids"]
            .as_array()
            .is_some_and(|ids| !ids.is_empty())
    );

    let messages = client
        .post(format!(
            "{}/proxy/r1/1/train/anthropic/v1/messages",
            env.base
        ))
        .header("x-api-key", ADMIN)
        .header("anthropic-version", "2023-06-01")
        .json(&json!({"model": "policy", "max_tokens": 4096,
                      "messages": [{"role": "user", "content": "go"}],
                      "tools": [{"name": "bash", "input_schema": {"type": "object"}}]}))
        .send()
        .await
        .expect("send");
    let status = messages.status();
    let error: Value = messages.json().await.expect("json");
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{error}");
    assert_eq!(error["type"], "error", "{error}");
    assert!(
        error["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("invalid JSON")),
        "{error}"
    );
    // Both calls are recorded: the chat one ok, the Messages one failed.
    let events = env.store.list_events("r1", 0, 10).await.expect("events");
    let statuses: Vec<String> = events
        .iter()
        .map(|e| e.payload.parse().expect("payload")["status"].to_string())
        .collect();
    assert_eq!(statuses, ["\"ok\"", "\"error\""], "{statuses:?}");
}
