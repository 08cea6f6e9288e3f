//! The test engine through real HTTP clients (reqwest and curl).

use agl_testengine::tokens::{encode, logprob, top_logprob};
use agl_testengine::{Faults, Reply, TestEngine, TestEngineConfig};
use futures_util::StreamExt;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

async fn engine(replies: Vec<Reply>) -> TestEngine {
    TestEngine::start(TestEngineConfig::default().with_replies(replies))
        .await
        .expect("engine starts")
}

async fn post(engine: &TestEngine, path: &str, body: &Value) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("{}{path}", engine.base_url()))
        .json(body)
        .send()
        .await
        .expect("request sent")
}

async fn post_json(engine: &TestEngine, path: &str, body: &Value) -> Value {
    let resp = post(engine, path, body).await;
    assert_eq!(resp.status(), 200);
    resp.json().await.expect("json body")
}

/// Chunk bodies of an SSE text; asserts it ends with `[DONE]`.
fn sse_chunks(text: &str) -> Vec<Value> {
    let events: Vec<&str> = text
        .split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| e.strip_prefix("data: ").expect("data event"))
        .collect();
    assert_eq!(events.last(), Some(&"[DONE]"));
    events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).expect("chunk json"))
        .collect()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("id array")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

fn chat_body(stream: bool) -> Value {
    json!({
        "model": "policy-7b",
        "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
        "tools": [{"type": "function", "function": {"name": "bash"}}],
        "return_token_ids": true, "logprobs": true, "top_logprobs": 2,
        "stream": stream, "stream_options": {"include_usage": true},
    })
}

fn prompt_text() -> String {
    "system: be brief\nuser: hi\ntools: [{\"type\":\"function\",\"function\":{\"name\":\"bash\"}}]\n"
        .to_owned()
}

#[tokio::test]
async fn chat_returns_exact_ids_and_logprobs() {
    let engine = engine(vec![Reply::text("Hé!")]).await;
    let resp = post_json(&engine, "/chat/completions", &chat_body(false)).await;
    assert_eq!(resp["model"], "policy-7b");
    assert_eq!(ids(&resp["prompt_token_ids"]), encode(&prompt_text()));
    let choice = &resp["choices"][0];
    assert_eq!(choice["message"]["content"], "Hé!");
    assert_eq!(choice["finish_reason"], "stop");
    assert_eq!(ids(&choice["token_ids"]), vec![1072, 1195, 1169, 1033]);
    let content = choice["logprobs"]["content"].as_array().expect("content");
    assert_eq!(content.len(), 4);
    for (i, entry) in content.iter().enumerate() {
        assert_eq!(entry["logprob"].as_f64(), Some(logprob(i)));
        assert_eq!(
            entry["top_logprobs"][1]["logprob"].as_f64(),
            Some(top_logprob(i, 1))
        );
    }
    assert_eq!(content[0]["token"], "H");
    assert_eq!(content[0]["bytes"], json!([72]));
    assert_eq!(content[0]["top_logprobs"][1]["token"], "I");
    assert_eq!(content[6 % 4]["logprob"].as_f64(), Some(-0.03));
    let prompt_len = encode(&prompt_text()).len();
    assert_eq!(resp["usage"]["prompt_tokens"], prompt_len);
    assert_eq!(resp["usage"]["completion_tokens"], 4);
}

#[tokio::test]
async fn completions_put_ids_on_the_choice() {
    let engine = engine(vec![Reply::text("xyz")]).await;
    let body = json!({"model": "m", "prompt": "abc", "logprobs": 1, "return_token_ids": true});
    let resp = post_json(&engine, "/completions", &body).await;
    let choice = &resp["choices"][0];
    assert!(resp.get("prompt_token_ids").is_none());
    assert_eq!(ids(&choice["prompt_token_ids"]), vec![1097, 1098, 1099]);
    assert_eq!(ids(&choice["token_ids"]), encode("xyz"));
    assert_eq!(choice["text"], "xyz");
    assert_eq!(choice["logprobs"]["tokens"], json!(["x", "y", "z"]));
    assert_eq!(
        choice["logprobs"]["token_logprobs"],
        json!([logprob(0), logprob(1), logprob(2)])
    );
    assert_eq!(
        choice["logprobs"]["top_logprobs"][2]["z"].as_f64(),
        Some(logprob(2))
    );

    // A prompt given as ids is taken as is.
    let body = json!({"prompt": [1097, 1098], "return_token_ids": true});
    let resp = post_json(&engine, "/completions", &body).await;
    assert_eq!(
        ids(&resp["choices"][0]["prompt_token_ids"]),
        vec![1097, 1098]
    );
    assert_eq!(resp["model"], "test-model");
}

#[tokio::test]
async fn tool_calls_and_their_ids() {
    let reply = Reply::text("").with_tool_call("bash", r#"{"command": "ls"}"#);
    let engine = engine(vec![reply.clone()]).await;
    let resp = post_json(&engine, "/chat/completions", &chat_body(false)).await;
    let choice = &resp["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls");
    assert_eq!(choice["message"]["content"], Value::Null);
    let call = &choice["message"]["tool_calls"][0];
    assert_eq!(call["id"], "call_0");
    assert_eq!(call["type"], "function");
    assert_eq!(call["function"]["name"], "bash");
    assert_eq!(call["function"]["arguments"], r#"{"command": "ls"}"#);
    assert_eq!(ids(&choice["token_ids"]), encode(&reply.sampled_text()));
    assert_eq!(
        reply.sampled_text(),
        r#"<tool_call>bash {"command": "ls"}</tool_call>"#
    );
}

#[tokio::test]
async fn streamed_chat_assembles_to_the_plain_response() {
    let reply = Reply::text("Let me look.").with_tool_call("bash", r#"{"command": "ls -la /tmp"}"#);
    let engine = engine(vec![reply]).await;
    let plain = post_json(&engine, "/chat/completions", &chat_body(false)).await;
    let resp = post(&engine, "/chat/completions", &chat_body(true)).await;
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let chunks = sse_chunks(&resp.text().await.expect("body"));

    assert_eq!(
        ids(&chunks[0]["prompt_token_ids"]),
        ids(&plain["prompt_token_ids"])
    );
    assert!(
        chunks[1..]
            .iter()
            .all(|c| c.get("prompt_token_ids").is_none())
    );
    let (mut content, mut token_ids, mut lps) = (String::new(), Vec::new(), Vec::new());
    let mut calls: Vec<Value> = Vec::new();
    let mut finish = Value::Null;
    for chunk in &chunks {
        assert_eq!(chunk["object"], "chat.completion.chunk");
        assert_eq!(chunk["model"], "policy-7b");
        let Some(choice) = chunk["choices"].get(0) else {
            continue;
        };
        let delta = &choice["delta"];
        content.push_str(delta["content"].as_str().unwrap_or(""));
        if let Some(ids_here) = choice.get("token_ids") {
            token_ids.extend(ids(ids_here));
        }
        if let Some(entries) = choice["logprobs"]["content"].as_array() {
            lps.extend(entries.iter().cloned());
        }
        for tc in delta["tool_calls"].as_array().into_iter().flatten() {
            let index = tc["index"].as_u64().expect("index") as usize;
            if tc.get("id").is_some() {
                assert_eq!(calls.len(), index, "first delta of a call carries its id");
                calls.push(json!({"id": tc["id"], "type": "function",
                    "function": {"name": tc["function"]["name"], "arguments": ""}}));
            } else {
                let args = format!(
                    "{}{}",
                    calls[index]["function"]["arguments"]
                        .as_str()
                        .expect("args"),
                    tc["function"]["arguments"].as_str().expect("fragment")
                );
                calls[index]["function"]["arguments"] = json!(args);
            }
        }
        if !choice["finish_reason"].is_null() {
            finish = choice["finish_reason"].clone();
        }
    }
    let choice = &plain["choices"][0];
    assert_eq!(
        content,
        choice["message"]["content"].as_str().expect("text")
    );
    assert_eq!(json!(calls), choice["message"]["tool_calls"]);
    assert!(calls[0]["function"]["arguments"].as_str().expect("a").len() > 8);
    assert_eq!(token_ids, ids(&choice["token_ids"]));
    assert_eq!(json!(lps), choice["logprobs"]["content"]);
    assert_eq!(finish, "tool_calls");
    let usage = chunks.last().expect("usage chunk");
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"], plain["usage"]);
}

#[tokio::test]
async fn max_tokens_truncates_ids() {
    let engine = engine(vec![Reply::text("abcdef").with_tool_call("f", "{}")]).await;
    let mut body = chat_body(false);
    body["max_tokens"] = json!(3);
    let resp = post_json(&engine, "/chat/completions", &body).await;
    let choice = &resp["choices"][0];
    assert_eq!(choice["finish_reason"], "length");
    assert_eq!(ids(&choice["token_ids"]), encode("abc"));
    assert_eq!(choice["message"]["content"], "abc");
    assert_eq!(choice["message"]["tool_calls"], json!([]));
    assert_eq!(resp["usage"]["completion_tokens"], 3);

    body["max_completion_tokens"] = json!(8);
    let resp = post_json(&engine, "/chat/completions", &body).await;
    assert_eq!(resp["choices"][0]["message"]["content"], "abcdef<t");

    let body = json!({"prompt": "p", "max_tokens": 2, "return_token_ids": true});
    let resp = post_json(&engine, "/completions", &body).await;
    assert_eq!(ids(&resp["choices"][0]["token_ids"]), encode("ab"));
    assert_eq!(resp["choices"][0]["finish_reason"], "length");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_streams_completions() {
    let engine = engine(vec![Reply::text("streamed text")]).await;
    let url = format!("{}/completions", engine.base_url());
    let body = json!({"prompt": "go", "stream": true, "return_token_ids": true, "logprobs": 0});
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("curl")
            .args(["-sN", "-H", "content-type: application/json", "-d"])
            .arg(body.to_string())
            .arg(url)
            .output()
    })
    .await
    .expect("join")
    .expect("curl runs");
    assert!(out.status.success());
    let chunks = sse_chunks(&String::from_utf8(out.stdout).expect("utf8"));
    let text: String = chunks
        .iter()
        .map(|c| c["choices"][0]["text"].as_str().expect("text"))
        .collect();
    assert_eq!(text, "streamed text");
    assert_eq!(
        ids(&chunks[0]["choices"][0]["prompt_token_ids"]),
        encode("go")
    );
    let streamed: Vec<u32> = chunks
        .iter()
        .filter_map(|c| c["choices"][0].get("token_ids"))
        .flat_map(ids)
        .collect();
    assert_eq!(streamed, encode("streamed text"));
    let last_lp = &chunks[chunks.len() - 2]["choices"][0]["logprobs"]["token_logprobs"];
    assert_eq!(last_lp, &json!([logprob(12)]));
    assert_eq!(
        chunks.last().expect("last")["choices"][0]["finish_reason"],
        "stop"
    );
}

#[tokio::test]
async fn failures_then_success() {
    let engine = engine(vec![Reply::text("ok")]).await;
    engine.set_faults(Faults {
        fail_next: 2,
        fail_status: 503,
        ..Faults::default()
    });
    for _ in 0..2 {
        let resp = post(&engine, "/chat/completions", &chat_body(false)).await;
        assert_eq!(resp.status(), 503);
        let err: Value = resp.json().await.expect("error json");
        assert_eq!(err["error"]["type"], "server_error");
        assert!(err["error"]["message"].is_string());
    }
    post_json(&engine, "/chat/completions", &chat_body(false)).await;
    assert_eq!(engine.faults().fail_next, 0);

    engine.set_faults(Faults {
        fail_next: 1,
        fail_status: 429,
        retry_after: Some(2),
        ..Faults::default()
    });
    let resp = post(&engine, "/chat/completions", &chat_body(false)).await;
    assert_eq!(resp.status(), 429);
    assert_eq!(resp.headers()["retry-after"], "2");
    assert_eq!(engine.requests().len(), 4);
}

#[tokio::test]
async fn reset_drops_the_connection() {
    let engine = TestEngine::start(TestEngineConfig::default().with_faults(Faults {
        reset_next: 1,
        ..Faults::default()
    }))
    .await
    .expect("start");
    let client = reqwest::Client::new();
    let url = format!("{}/chat/completions", engine.base_url());
    let err = client
        .post(&url)
        .json(&chat_body(false))
        .send()
        .await
        .expect_err("connection dropped");
    assert!(err.status().is_none());
    let ok = client
        .post(&url)
        .json(&chat_body(false))
        .send()
        .await
        .expect("sent");
    assert_eq!(ok.status(), 200);
    assert_eq!(engine.requests().len(), 2);
}

#[tokio::test]
async fn stream_cut_midway_is_a_client_error() {
    let engine = engine(vec![Reply::text("a long enough reply")]).await;
    engine.set_faults(Faults {
        close_stream_next: 1,
        close_stream_after: 3,
        ..Faults::default()
    });
    // Plain requests do not consume a stream cut.
    post_json(&engine, "/chat/completions", &chat_body(false)).await;
    let resp = post(&engine, "/chat/completions", &chat_body(true)).await;
    assert_eq!(resp.status(), 200);
    let mut stream = resp.bytes_stream();
    let mut received = Vec::new();
    let mut failed = false;
    while let Some(item) = stream.next().await {
        match item {
            Ok(bytes) => received.extend_from_slice(&bytes),
            Err(_) => {
                failed = true;
                break;
            }
        }
    }
    assert!(failed, "a cut stream must not end cleanly");
    let text = String::from_utf8(received).expect("utf8");
    assert_eq!(text.matches("data: ").count(), 3);
    assert!(!text.contains("[DONE]"));
    let resp = post(&engine, "/chat/completions", &chat_body(true)).await;
    sse_chunks(&resp.text().await.expect("full stream"));
}

#[tokio::test]
async fn latency_delays_the_head_and_spaces_chunks() {
    let engine = engine(vec![Reply::text("abc")]).await;
    engine.set_faults(Faults {
        first_byte_latency: Duration::from_millis(150),
        chunk_latency: Duration::from_millis(50),
        ..Faults::default()
    });
    let start = Instant::now();
    let resp = post(&engine, "/chat/completions", &chat_body(true)).await;
    // Lower bounds only: a sleep never ends early.
    assert!(start.elapsed() >= Duration::from_millis(150));
    let mut stream = resp.bytes_stream();
    let first = stream.next().await.expect("a frame").expect("bytes");
    // Spaced chunks arrive one at a time, not as one buffered body.
    assert_eq!(String::from_utf8_lossy(&first).matches("data: ").count(), 1);
    let mut frames = 1;
    while let Some(frame) = stream.next().await {
        frame.expect("frame");
        frames += 1;
    }
    assert!(frames >= 5, "got {frames} frames");
    assert!(start.elapsed() >= Duration::from_millis(150 + 4 * 50));
}

#[tokio::test]
async fn invalid_json_is_an_openai_error_and_requests_are_recorded() {
    let engine = engine(vec![Reply::text("ok")]).await;
    let resp = reqwest::Client::new()
        .post(format!("{}/chat/completions", engine.base_url()))
        .header("content-type", "application/json")
        .header("x-agl-rollout", "r-1")
        .body("{not json")
        .send()
        .await
        .expect("sent");
    assert_eq!(resp.status(), 400);
    let err: Value = resp.json().await.expect("json");
    assert_eq!(err["error"]["type"], "invalid_request_error");
    assert!(
        err["error"]["message"]
            .as_str()
            .expect("msg")
            .contains("invalid JSON")
    );

    let missing = post(&engine, "/chat/completions", &json!({"model": "m"})).await;
    assert_eq!(missing.status(), 400);

    let mut body = chat_body(false);
    body["temperature"] = json!(0.7);
    post_json(&engine, "/chat/completions", &body).await;
    let recorded = engine.requests();
    assert_eq!(recorded.len(), 3);
    assert_eq!(recorded[0].body, None);
    assert_eq!(recorded[0].raw, "{not json");
    assert_eq!(recorded[0].header("X-AGL-Rollout"), Some("r-1"));
    assert_eq!(recorded[2].path, "/v1/chat/completions");
    assert_eq!(recorded[2].body.as_ref().expect("body")["temperature"], 0.7);
    engine.clear_requests();
    assert!(engine.requests().is_empty());
}

#[tokio::test]
async fn models_scripts_and_shutdown() {
    let config =
        TestEngineConfig::default().with_script(|req| Reply::text(req.prompt_text.to_uppercase()));
    let engine = TestEngine::start(config).await.expect("start");
    let models: Value = reqwest::get(format!("{}/models", engine.base_url()))
        .await
        .expect("models")
        .json()
        .await
        .expect("json");
    assert_eq!(models["data"][0]["id"], "test-model");
    let resp = post_json(&engine, "/completions", &json!({"prompt": "echo me"})).await;
    assert_eq!(resp["choices"][0]["text"], "ECHO ME");
    let missing = reqwest::get(format!("{}/nope", engine.base_url()))
        .await
        .expect("sent");
    assert_eq!(missing.status(), 404);

    let url = engine.base_url();
    engine.shutdown().await;
    assert!(reqwest::get(format!("{url}/models")).await.is_err());
}

#[tokio::test]
async fn cycled_replies_in_order() {
    let engine = engine(vec![Reply::text("one"), Reply::text("two")]).await;
    let mut texts = Vec::new();
    for _ in 0..3 {
        let resp = post_json(&engine, "/completions", &json!({"prompt": "x"})).await;
        texts.push(
            resp["choices"][0]["text"]
                .as_str()
                .expect("text")
                .to_owned(),
        );
    }
    assert_eq!(texts, ["one", "two", "one"]);
}
