//! Chat calls the gateway renders (engine `render = "gateway"`): the
//! engine sees token ids on `/v1/completions`, the harness sees Chat
//! Completions with parsed tool calls, and each call that extends the
//! previous one continues its tokens exactly. The policy here is the
//! byte-level fixture tokenizer under the Hermes/Qwen-style tools template.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use agl_conversation::Renderer;
use agl_gateway::GatewayConfig;
use agl_store::EngineApi;
use agl_testengine::{Reply, TestEngineConfig};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::{ADMIN, start_local_with};

fn renderer(dir: &Path) -> Renderer {
    let (tok, eos) = crate::policy::tools_policy(dir);
    Renderer::new(tok, &[eos]).expect("renderer")
}

const CALL: &str =
    "<tool_call>\n{\"name\": \"bash\", \"arguments\": {\"cmd\":\"ls\"}}\n</tool_call>";

fn tools() -> Value {
    json!([{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}])
}

/// Posts `body` to `url` with the admin key (the rendered tests' client).
pub(crate) async fn chat(url: &str, body: Value) -> reqwest::Response {
    reqwest::Client::new()
        .post(url)
        .bearer_auth(ADMIN)
        .json(&body)
        .send()
        .await
        .expect("send")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_rendered_calls_continue_token_exactly() {
    calls_continue_token_exactly(EngineApi::Openai).await;
}

/// The same conversation against the SGLang mock (`/generate`, written from
/// sglang 0.5.x's source; see `agl_testengine`'s `sglang.rs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_rendered_calls_continue_token_exactly_on_sglang_generate() {
    calls_continue_token_exactly(EngineApi::Sglang).await;
}

/// Rollout `r1` running on a gateway that renders, its engine writing a
/// `bash` call first and "There are 3 files." after.
async fn call_then_answer(dir: &Path, api: EngineApi) -> crate::support::Local {
    let turn = Arc::new(AtomicUsize::new(0));
    let engine = TestEngineConfig::default().with_script(move |_| {
        match turn.fetch_add(1, Ordering::SeqCst) {
            0 => Reply::text(CALL),
            _ => Reply::text("There are 3 files."),
        }
    });
    let env = start_local_with(engine, GatewayConfig::default(), Some(renderer(dir)), api).await;
    env.running(&["r1".to_string()]).await;
    env
}

async fn calls_continue_token_exactly(api: EngineApi) {
    let dir = tempfile::tempdir().expect("tempdir");
    let env = call_then_answer(dir.path(), api).await;
    let url = env.chat_url("r1");
    let user = json!({"role": "user", "content": "How many files?"});

    // 1: not streamed; the reply's call comes back parsed.
    let resp = chat(&url, json!({"messages": [user], "tools": tools()})).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let first: Value = resp.json().await.expect("json");
    let message = &first["choices"][0]["message"];
    assert_eq!(
        first["choices"][0]["finish_reason"], "tool_calls",
        "{first}"
    );
    assert_eq!(message["tool_calls"][0]["function"]["name"], "bash");
    let sent = env.engine.requests();
    let body = sent[0].body.as_ref().expect("body");
    let is_ids = |v: &Value| {
        v.as_array()
            .is_some_and(|p| !p.is_empty() && p.iter().all(Value::is_u64))
    };
    match api {
        EngineApi::Openai => {
            // vLLM's token-in request (>= 0.10.2): token ids as the prompt,
            // the sampled ids and one logprob each back, markers kept.
            assert_eq!(sent[0].path, "/v1/completions");
            assert!(is_ids(&body["prompt"]), "{body}");
            assert_eq!(body["return_token_ids"], true);
            assert_eq!(body["logprobs"], 1);
            assert_eq!(body["skip_special_tokens"], false);
            for chat_only in ["messages", "tools", "top_logprobs", "max_completion_tokens"] {
                assert!(body.get(chat_only).is_none(), "{chat_only}: {body}");
            }
        }
        EngineApi::Sglang => {
            // SGLang's native request: `input_ids`, sampling options under
            // `sampling_params` (the mock refuses keys SamplingParams lacks).
            assert_eq!(sent[0].path, "/generate");
            assert!(is_ids(&body["input_ids"]), "{body}");
            assert_eq!(body["return_logprob"], true);
            assert_eq!(body["logprob_start_len"], -1);
            assert_eq!(body["stream"], false);
            assert_eq!(body["sampling_params"]["skip_special_tokens"], false);
            let keys: Vec<&str> = body
                .as_object()
                .expect("object")
                .keys()
                .map(String::as_str)
                .collect();
            assert_eq!(keys.len(), 5, "{body}");
        }
    }

    // 2: streamed, the harness re-serialising the call's arguments.
    let assistant = json!({"role": "assistant", "content": null, "tool_calls": [{
        "id": "c1", "type": "function",
        "function": {"name": "bash", "arguments": "{\"cmd\": \"ls\"}"}}]});
    let tool = json!({"role": "tool", "tool_call_id": "c1", "content": "a b c"});
    let resp = chat(
        &url,
        json!({"messages": [user, assistant, tool], "tools": tools(), "stream": true}),
    )
    .await;
    let text = resp.text().await.expect("stream");
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    let content: String = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|c| {
            c["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_string)
        })
        .collect();
    assert_eq!(content, "There are 3 files.");

    // 3: a history whose middle was replaced by a summary starts anew.
    let summary = json!({"role": "assistant", "content": "Summary: listed files."});
    let resp = chat(
        &url,
        json!({"messages": [user, summary, {"role": "user", "content": "go on"}],
                                  "tools": tools()}),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::OK);

    let events = env.store.list_events("r1", 0, 10).await.expect("events");
    let calls: Vec<Value> = events
        .iter()
        .map(|e| e.payload.parse().expect("payload"))
        .collect();
    assert_eq!(calls.len(), 3);
    let ids = |v: &Value| -> Vec<u64> {
        v.as_array()
            .expect("ids")
            .iter()
            .filter_map(Value::as_u64)
            .collect()
    };
    // Call 2 continues call 1: its prompt starts with call 1's prompt and
    // sampled response, token for token.
    assert_eq!(calls[1]["continues"], json!(events[0].seq));
    let prefix = [ids(&calls[0]["prompt_ids"]), ids(&calls[0]["response_ids"])].concat();
    let second = ids(&calls[1]["prompt_ids"]);
    assert!(second.len() > prefix.len());
    assert_eq!(&second[..prefix.len()], &prefix[..]);
    assert!(calls[2].get("continues").is_none(), "{}", calls[2]);
    // The records keep what the harness was answered.
    assert_eq!(
        calls[0]["response"]["choices"][0]["message"]["tool_calls"][0]["function"]["name"],
        "bash"
    );
    assert_eq!(
        calls[1]["response"]["choices"][0]["message"]["content"],
        "There are 3 files."
    );
    assert!(!ids(&calls[1]["response_ids"]).is_empty());
    // One logprob per sampled id, whatever the engine's shape.
    for call in &calls {
        let logprobs = call["response_logprobs"].as_array().expect("logprobs");
        assert_eq!(logprobs.len(), ids(&call["response_ids"]).len(), "{call}");
    }
    if api == EngineApi::Sglang {
        assert_eq!(sent_path(&env, 1), "/generate");
        assert_eq!(
            env.engine.requests()[1].body.as_ref().expect("body")["stream"],
            true
        );
        // SGLang reports its weight version with every answer, whole or
        // streamed; the record keeps it.
        for call in &calls {
            assert_eq!(call["engine_weight_version"], "default", "{call}");
        }
    } else {
        assert!(calls[0].get("engine_weight_version").is_none());
    }
    // The export names the continued call by its index.
    let exported = env.store.export_rollout("r1").await.expect("export");
    let links: Vec<Option<u32>> = exported.calls.iter().map(|c| c.continues).collect();
    assert_eq!(links, [None, Some(0), None]);
}

/// A new gateway process on `env`'s store (no chains in memory); its
/// address.
async fn restart(env: &crate::support::Local, dir: &Path) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let restarted = agl_gateway::Gateway::new(
        env.store.clone(),
        GatewayConfig {
            listen: addr.to_string(),
            admin_key: Some(ADMIN.into()),
            ..GatewayConfig::default()
        },
    )
    .with_policy(renderer(dir));
    tokio::spawn(restarted.serve(listener, std::future::pending()));
    addr
}

fn sent_path(env: &crate::support::Local, n: usize) -> String {
    env.engine.requests()[n].path.clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_gateway_rebuilds_its_chains_from_the_store() {
    let dir = tempfile::tempdir().expect("tempdir");
    let engine = TestEngineConfig::default().with_replies([Reply::text(CALL)]);
    let env = start_local_with(
        engine,
        GatewayConfig::default(),
        Some(renderer(dir.path())),
        Default::default(),
    )
    .await;
    env.running(&["r1".to_string()]).await;
    let user = json!({"role": "user", "content": "How many files?"});
    // Streamed, so the record's response is the assembled one.
    let resp = chat(
        &env.chat_url("r1"),
        json!({"messages": [user], "tools": tools(), "stream": true}),
    )
    .await;
    assert!(
        resp.text()
            .await
            .expect("stream")
            .ends_with("data: [DONE]\n\n")
    );
    let first = env.store.list_events("r1", 0, 10).await.expect("events")[0].seq;

    // A new gateway process on the same store: no chains in memory.
    let addr = restart(&env, dir.path()).await;
    let assistant = json!({"role": "assistant", "tool_calls": [{"id": "x", "type": "function",
        "function": {"name": "bash", "arguments": {"cmd": "ls"}}}]});
    let tool = json!({"role": "tool", "tool_call_id": "x", "content": "a b c"});
    let url = format!("http://{addr}/proxy/r1/1/train/openai/v1/chat/completions");
    let resp = chat(
        &url,
        json!({"messages": [user, assistant, tool], "tools": tools()}),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::OK);
    let events = env.store.list_events("r1", 0, 10).await.expect("events");
    let second = events[1].payload.parse().expect("payload");
    assert_eq!(second["continues"], json!(first), "{second}");
}

/// Anthropic Messages on the same core: a tool_use answer, a tool_result
/// turn that continues it token-exactly, the rollout token as `x-api-key`,
/// and errors in Anthropic's shape.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_messages_continue_token_exactly_with_errors_in_their_shape() {
    let dir = tempfile::tempdir().expect("tempdir");
    let env = call_then_answer(dir.path(), EngineApi::Openai).await;
    let url = format!(
        "{}/proxy/r1/1/train/anthropic/v1/messages?beta=true",
        env.base
    );
    let send = |body: Value| {
        let url = url.clone();
        async move {
            reqwest::Client::new()
                .post(&url)
                .header("x-api-key", ADMIN)
                .header("anthropic-version", "2023-06-01")
                .json(&body)
                .send()
                .await
                .expect("send")
        }
    };
    let tools = json!([{"name": "bash", "input_schema": {"type": "object"}}]);
    let user = json!({"role": "user", "content": "How many files?"});
    let resp = send(
        json!({"model": "policy", "max_tokens": 256, "system": "Be brief.",
                           "messages": [user], "tools": tools}),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::OK);
    let first: Value = resp.json().await.expect("json");
    assert_eq!(first["type"], "message", "{first}");
    assert_eq!(first["stop_reason"], "tool_use", "{first}");
    let block = &first["content"][0];
    assert_eq!(
        (block["type"].as_str(), block["name"].as_str()),
        (Some("tool_use"), Some("bash"))
    );
    assert_eq!(block["input"], json!({"cmd": "ls"}));
    assert!(first["usage"]["input_tokens"].as_u64().unwrap() > 0);

    // The harness sends the blocks back with the tool's result.
    let id = block["id"].clone();
    let resp = send(json!({"model": "policy", "max_tokens": 256, "system": "Be brief.", "tools": tools,
        "messages": [user, {"role": "assistant", "content": first["content"]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": id, "content": "a b c"}]}]}))
    .await;
    let second: Value = resp.json().await.expect("json");
    assert_eq!(second["stop_reason"], "end_turn", "{second}");
    assert_eq!(second["content"][0]["text"], "There are 3 files.");
    let events = env.store.list_events("r1", 0, 10).await.expect("events");
    let calls: Vec<Value> = events
        .iter()
        .map(|e| e.payload.parse().expect("payload"))
        .collect();
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[0]["api"], "anthropic_messages");
    assert_eq!(calls[1]["continues"], json!(events[0].seq), "{}", calls[1]);
    // Only sampling options reach the engine, no Messages keys.
    let sent = env.engine.requests();
    let body = sent[1].body.as_ref().expect("body");
    for key in ["system", "messages", "tools", "stop_sequences"] {
        assert!(body.get(key).is_none(), "{key}: {body}");
    }
    assert_eq!(body["max_tokens"], 256);

    // Bad input: Anthropic's error shape, nothing recorded.
    for (bad, want) in [
        (
            json!({"model": "p", "max_tokens": 8, "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": ""}}]}]}),
            "`image` blocks are not supported",
        ),
        (
            json!({"model": "p", "max_tokens": 8, "messages": [{"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_x", "content": "?"}]}]}),
            "tool_use id `toolu_x`",
        ),
    ] {
        let resp = send(bad).await;
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
        let err: Value = resp.json().await.expect("json");
        assert_eq!(err["type"], "error", "{err}");
        assert_eq!(err["error"]["type"], "invalid_request_error");
        assert!(
            err["error"]["message"].as_str().unwrap().contains(want),
            "{err}"
        );
    }
    let wrong = reqwest::Client::new()
        .post(&url)
        .header("x-api-key", "not-a-key")
        .json(&json!({"model": "p", "max_tokens": 8, "messages": [user]}))
        .send()
        .await
        .expect("send");
    assert_eq!(wrong.status(), StatusCode::UNAUTHORIZED);
    let err: Value = wrong.json().await.expect("json");
    assert_eq!(err["error"]["type"], "authentication_error", "{err}");
    assert_eq!(
        env.store
            .list_events("r1", 0, 10)
            .await
            .expect("events")
            .len(),
        2
    );
}

/// A streamed Messages call: the events a Messages client reads, ending
/// with `message_stop` once the record (with its logprobs) is committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_anthropic_message_is_events_and_its_record_is_the_message() {
    let dir = tempfile::tempdir().expect("tempdir");
    let engine =
        TestEngineConfig::default().with_replies([Reply::text(format!("Looking.\n{CALL}"))]);
    let env = start_local_with(
        engine,
        GatewayConfig::default(),
        Some(renderer(dir.path())),
        Default::default(),
    )
    .await;
    env.running(&["r1".to_string()]).await;
    let url = format!("{}/proxy/r1/1/train/anthropic/v1/messages", env.base);
    let body = json!({"model": "policy", "max_tokens": 256, "stream": true,
        "tools": [{"name": "bash", "input_schema": {"type": "object"}}],
        "messages": [{"role": "user", "content": "How many files?"}]});
    let text = reqwest::Client::new()
        .post(&url)
        .header("x-api-key", ADMIN)
        .json(&body)
        .send()
        .await
        .expect("send")
        .text()
        .await
        .expect("stream");
    let mut names = Vec::new();
    let (mut text_out, mut json_out) = (String::new(), String::new());
    let mut stop_reason = Value::Null;
    for frame in text.split("\n\n").filter(|f| !f.is_empty()) {
        let mut lines = frame.lines();
        let event = lines
            .next()
            .and_then(|l| l.strip_prefix("event: "))
            .expect("event line");
        let data: Value = serde_json::from_str(
            lines
                .next()
                .and_then(|l| l.strip_prefix("data: "))
                .expect("data"),
        )
        .expect("json");
        assert_eq!(data["type"], event, "{frame}");
        match event {
            "content_block_delta" => {
                text_out.push_str(data["delta"]["text"].as_str().unwrap_or(""));
                json_out.push_str(data["delta"]["partial_json"].as_str().unwrap_or(""));
            }
            "message_delta" => stop_reason = data["delta"]["stop_reason"].clone(),
            _ => {}
        }
        if names.last() != Some(&event.to_string()) {
            names.push(event.to_string());
        }
    }
    assert_eq!(names.first().map(String::as_str), Some("message_start"));
    assert_eq!(
        names.last().map(String::as_str),
        Some("message_stop"),
        "{names:?}"
    );
    assert!(names.contains(&"content_block_start".to_string()));
    // Streamed before the call was known; the record trims it.
    assert_eq!(text_out.trim_end(), "Looking.");
    assert_eq!(
        serde_json::from_str::<Value>(&json_out).expect("input"),
        json!({"cmd": "ls"})
    );
    assert_eq!(stop_reason, "tool_use");
    let events = env.store.list_events("r1", 0, 10).await.expect("events");
    let call: Value = events[0].payload.parse().expect("payload");
    assert_eq!(call["response"]["type"], "message", "{call}");
    assert_eq!(call["response"]["content"][1]["type"], "tool_use");
    let ids = call["response_ids"].as_array().expect("ids").len();
    assert!(ids > 0);
    assert_eq!(
        call["response_logprobs"]
            .as_array()
            .expect("logprobs")
            .len(),
        ids
    );
}

/// While the engine is silent a Messages stream sends `ping` events (after
/// `message_start`, which goes out at once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_engine_gets_a_messages_stream_pinged() {
    let dir = tempfile::tempdir().expect("tempdir");
    let engine = TestEngineConfig::default()
        .with_replies([Reply::text("ok")])
        .with_faults(agl_testengine::Faults {
            chunk_latency: std::time::Duration::from_millis(700),
            ..Default::default()
        });
    let config = GatewayConfig {
        stream_ping_secs: 0.2,
        ..GatewayConfig::default()
    };
    let env = start_local_with(
        engine,
        config,
        Some(renderer(dir.path())),
        Default::default(),
    )
    .await;
    env.running(&["r1".to_string()]).await;
    let text = reqwest::Client::new()
        .post(format!(
            "{}/proxy/r1/1/train/anthropic/v1/messages",
            env.base
        ))
        .header("x-api-key", ADMIN)
        .json(&json!({"model": "p", "max_tokens": 16, "stream": true,
                      "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .expect("send")
        .text()
        .await
        .expect("stream");
    let events: Vec<&str> = text
        .split("\n\n")
        .filter_map(|f| f.lines().next()?.strip_prefix("event: "))
        .collect();
    assert_eq!(events.first(), Some(&"message_start"), "{events:?}");
    // The engine waits 700 ms before each chunk after its first.
    let deltas: Vec<usize> = (0..events.len())
        .filter(|&i| events[i] == "content_block_delta")
        .collect();
    assert_eq!(deltas.len(), 2, "{events:?}");
    assert!(
        events[deltas[0]..deltas[1]].contains(&"ping"),
        "pinged while the engine was silent: {events:?}"
    );
    assert_eq!(events.last(), Some(&"message_stop"));
}

/// OpenAI Responses on the same core: a function_call
/// item, the call's output sent back as items continuing token-exactly,
/// and what it cannot hold refused by name before anything is recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_continue_token_exactly_and_refuse_what_they_cannot_hold() {
    let dir = tempfile::tempdir().expect("tempdir");
    let env = call_then_answer(dir.path(), EngineApi::Openai).await;
    let url = format!("{}/proxy/r1/1/train/openai/v1/responses", env.base);
    let tools = json!([{"type": "function", "name": "bash", "parameters": {"type": "object"}}]);
    let first = chat(
        &url,
        json!({"model": "policy", "instructions": "Be brief.", "tools": tools,
                                  "input": "How many files?", "max_output_tokens": 256}),
    )
    .await;
    assert_eq!(first.status(), StatusCode::OK);
    let first: Value = first.json().await.expect("json");
    assert_eq!(first["object"], "response", "{first}");
    assert_eq!(first["status"], "completed");
    let call = first["output"]
        .as_array()
        .expect("output")
        .iter()
        .find(|i| i["type"] == "function_call")
        .expect("a function_call item")
        .clone();
    assert_eq!(call["name"], "bash");
    let mut input = vec![json!({"role": "user", "content": "How many files?"})];
    input.extend(first["output"].as_array().expect("output").iter().cloned());
    input.push(
        json!({"type": "function_call_output", "call_id": call["call_id"], "output": "a b c"}),
    );
    let second: Value = chat(
        &url,
        json!({"model": "policy", "instructions": "Be brief.", "tools": tools,
                                          "input": input, "max_output_tokens": 256}),
    )
    .await
    .json()
    .await
    .expect("json");
    assert_eq!(
        second["output"][0]["content"][0]["text"], "There are 3 files.",
        "{second}"
    );
    let events = env.store.list_events("r1", 0, 10).await.expect("events");
    let calls: Vec<Value> = events
        .iter()
        .map(|e| e.payload.parse().expect("payload"))
        .collect();
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[0]["api"], "responses");
    assert_eq!(calls[1]["continues"], json!(events[0].seq), "{}", calls[1]);
    let sent = env.engine.requests();
    let body = sent[1].body.as_ref().expect("body");
    assert_eq!(body["max_tokens"], 256);
    for key in ["input", "instructions", "tools", "max_output_tokens"] {
        assert!(body.get(key).is_none(), "{key}: {body}");
    }
    for (bad, want) in [(
        json!({"model": "p", "input": [{"type": "local_shell_call", "call_id": "c"}]}),
        "local_shell_call",
    )] {
        let resp = chat(&url, bad).await;
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
        let err: Value = resp.json().await.expect("json");
        assert!(
            err["error"]["message"].as_str().unwrap().contains(want),
            "{err}"
        );
    }
    assert_eq!(
        env.store
            .list_events("r1", 0, 10)
            .await
            .expect("events")
            .len(),
        2
    );
}

/// On a policy with a known context: `max_tokens` beyond what the prompt
/// leaves is clamped (and set when absent), and a prompt that leaves no
/// room is each API's own context-length error, never an engine call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_context_limit_clamps_max_tokens_and_refuses_a_prompt_that_fills_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let engine = TestEngineConfig::default().with_replies([Reply::text("ok")]);
    let env = crate::support::start_local_sized(
        engine,
        GatewayConfig::default(),
        Some(renderer(dir.path())),
        EngineApi::Openai,
        Some(400),
    )
    .await;
    env.running(&["r1".to_string()]).await;
    let short = json!({"role": "user", "content": "hi"});
    let resp = chat(
        &env.chat_url("r1"),
        json!({"messages": [short], "max_tokens": 100_000}),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::OK);
    let resp = chat(&env.chat_url("r1"), json!({"messages": [short]})).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let sent = env.engine.requests();
    for r in &sent {
        let body = r.body.as_ref().expect("body");
        let prompt = body["prompt"].as_array().expect("ids").len() as u64;
        assert_eq!(body["max_tokens"].as_u64(), Some(400 - prompt), "{body}");
    }
    // A prompt of 500 bytes (one id each) cannot fit.
    let long = "x".repeat(500);
    let base = format!("{}/proxy/r1/1/train", env.base);
    let resp = chat(
        &env.chat_url("r1"),
        json!({"messages": [{"role": "user", "content": long}]}),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    let err: Value = resp.json().await.expect("json");
    assert_eq!(err["error"]["code"], "context_length_exceeded", "{err}");
    let resp = chat(
        &format!("{base}/anthropic/v1/messages"),
        json!({"model": "p", "max_tokens": 10, "messages": [{"role": "user", "content": long}]}),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    let err: Value = resp.json().await.expect("json");
    assert_eq!(err["type"], "error");
    assert_eq!(err["error"]["type"], "invalid_request_error");
    let message = err["error"]["message"].as_str().expect("message");
    assert!(message.starts_with("prompt is too long: "), "{message}");
    // Streamed Responses: a stream whose response.failed says why.
    let resp = chat(
        &format!("{base}/openai/v1/responses"),
        json!({"model": "p", "input": long, "stream": true}),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::OK);
    let text = resp.text().await.expect("text");
    let failed: Value = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .find(|v| v["type"] == "response.failed")
        .expect("response.failed");
    assert_eq!(
        failed["response"]["error"]["code"], "context_length_exceeded",
        "{failed}"
    );
    // Nothing reached the engine, nothing was recorded.
    assert_eq!(env.engine.requests().len(), sent.len());
    let calls = env.store.list_events("r1", 0, 10).await.expect("events");
    assert_eq!(calls.len(), 2);
}

/// `gateway.max_tokens` caps every rendered answer, asked for or not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_configured_max_tokens_caps_every_rendered_answer() {
    let dir = tempfile::tempdir().expect("tempdir");
    let engine = TestEngineConfig::default().with_replies([Reply::text("ok")]);
    let config = GatewayConfig {
        max_tokens: Some(7),
        ..GatewayConfig::default()
    };
    let env = start_local_with(
        engine,
        config,
        Some(renderer(dir.path())),
        EngineApi::Openai,
    )
    .await;
    env.running(&["r1".to_string()]).await;
    let base = format!("{}/proxy/r1/1/train", env.base);
    let user = json!({"role": "user", "content": "hi"});
    for (url, body) in [
        (
            env.chat_url("r1"),
            json!({"messages": [user], "max_tokens": 100}),
        ),
        (
            env.chat_url("r1"),
            json!({"messages": [user], "max_tokens": 3}),
        ),
        (
            format!("{base}/openai/v1/responses"),
            json!({"model": "p", "input": "hi"}),
        ),
    ] {
        assert_eq!(chat(&url, body).await.status(), StatusCode::OK);
    }
    let asked: Vec<Value> = env
        .engine
        .requests()
        .iter()
        .map(|r| r.body.as_ref().expect("body")["max_tokens"].clone())
        .collect();
    assert_eq!(asked, [json!(7), json!(3), json!(7)]);
}

/// A new gateway on the same store: a Messages tool-result turn and a
/// Responses call that names its `previous_response_id` (sending only the
/// call's output) both continue the calls the first gateway served; an
/// unknown previous id is OpenAI's 404.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_and_previous_response_ids_continue_across_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let engine = TestEngineConfig::default().with_replies([Reply::text(CALL)]);
    let env = start_local_with(
        engine,
        GatewayConfig::default(),
        Some(renderer(dir.path())),
        Default::default(),
    )
    .await;
    env.running(&["r1".to_string()]).await;
    let base = format!("{}/proxy/r1/1/train", env.base);
    let claude_tools = json!([{"name": "bash", "input_schema": {"type": "object"}}]);
    let question = json!({"role": "user", "content": "How many files?"});
    let first_message: Value = chat(
        &format!("{base}/anthropic/v1/messages"),
        json!({"model": "p", "max_tokens": 512, "tools": claude_tools, "messages": [question]}),
    )
    .await
    .json()
    .await
    .expect("json");
    let fn_tools = json!([{"type": "function", "name": "bash", "parameters": {"type": "object"}}]);
    let first_response: Value = chat(
        &format!("{base}/openai/v1/responses"),
        json!({"model": "p", "tools": fn_tools, "input": "How many files, again?"}),
    )
    .await
    .json()
    .await
    .expect("json");
    let seqs: Vec<u64> = env
        .store
        .list_events("r1", 0, 10)
        .await
        .expect("events")
        .iter()
        .map(|e| e.seq)
        .collect();

    let addr = restart(&env, dir.path()).await;
    let base = format!("http://{addr}/proxy/r1/1/train");

    let tool_use = first_message["content"]
        .as_array()
        .and_then(|c| c.iter().find(|b| b["type"] == "tool_use"))
        .unwrap_or_else(|| panic!("a tool_use: {first_message}"));
    let result = json!({"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": tool_use["id"], "content": "a b c"}]});
    let resp = chat(
        &format!("{base}/anthropic/v1/messages"),
        json!({"model": "p", "max_tokens": 512, "tools": claude_tools,
               "messages": [question, {"role": "assistant", "content": first_message["content"]}, result]}),
    )
    .await;
    let status = resp.status();
    assert_eq!(
        status,
        StatusCode::OK,
        "{}",
        resp.text().await.unwrap_or_default()
    );
    let call = first_response["output"]
        .as_array()
        .expect("output")
        .iter()
        .find(|i| i["type"] == "function_call")
        .expect("a call")
        .clone();
    let output =
        json!({"type": "function_call_output", "call_id": call["call_id"], "output": "a b c"});
    let resp = chat(
        &format!("{base}/openai/v1/responses"),
        json!({"model": "p", "tools": fn_tools, "previous_response_id": first_response["id"],
               "input": [output]}),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::OK);
    let events = env.store.list_events("r1", 0, 10).await.expect("events");
    let links: Vec<Value> = events[2..]
        .iter()
        .map(|e| e.payload.parse().expect("payload")["continues"].clone())
        .collect();
    assert_eq!(links, [json!(seqs[0]), json!(seqs[1])]);
    // The record keeps the request as sent.
    let sent: Value = events[3].payload.parse().expect("payload");
    assert_eq!(
        sent["request"]["previous_response_id"],
        first_response["id"]
    );

    let resp = chat(
        &format!("{base}/openai/v1/responses"),
        json!({"model": "p", "previous_response_id": "resp_nope", "input": "x"}),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    let err: Value = resp.json().await.expect("json");
    assert_eq!(err["error"]["code"], "previous_response_not_found", "{err}");
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("resp_nope")
    );
}

/// `tool_choice` in each API's words: a named tool is forced by writing its
/// call's start after the generation prompt (prompt ids, not sampled), and
/// the answer is that call; `none` reads the answer as text; a tool the
/// request does not hold is a 400.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_choice_forces_a_named_call_or_none_in_every_api() {
    let dir = tempfile::tempdir().expect("tempdir");
    // The engine reads the prompt in the policy's ids.
    let env = crate::harness::start(dir.path(), |r| {
        if r.prompt_text
            .ends_with("{\"name\": \"bash\", \"arguments\": ")
        {
            Reply::text("{\"cmd\": \"ls\"}}\n</tool_call>")
        } else {
            Reply::text(CALL)
        }
    })
    .await;
    let base = format!("{}/proxy/r1/1/train", env.base);
    let user = json!({"role": "user", "content": "List the files."});
    let fn_tools = json!([{"type": "function", "name": "bash", "parameters": {"type": "object"}}]);
    let claude_tools = json!([{"name": "bash", "input_schema": {"type": "object"}}]);

    let chat_answer: Value = chat(
        &env.chat_url("r1"),
        json!({"messages": [user], "tools": tools(),
               "tool_choice": {"type": "function", "function": {"name": "bash"}}}),
    )
    .await
    .json()
    .await
    .expect("json");
    let call = &chat_answer["choices"][0]["message"]["tool_calls"][0]["function"];
    assert_eq!(call["name"], "bash", "{chat_answer}");
    assert_eq!(
        serde_json::from_str::<Value>(call["arguments"].as_str().unwrap()).unwrap(),
        json!({"cmd": "ls"})
    );

    let messages = chat(
        &format!("{base}/anthropic/v1/messages"),
        json!({"model": "p", "max_tokens": 512, "tools": claude_tools, "stream": true,
               "tool_choice": {"type": "tool", "name": "bash"},
               "messages": [{"role": "user", "content": "List them again."}]}),
    )
    .await
    .text()
    .await
    .expect("stream");
    let start = messages
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .find(|v| v["type"] == "content_block_start" && v["content_block"]["type"] == "tool_use")
        .unwrap_or_else(|| panic!("a tool_use block: {messages}"));
    assert_eq!(start["content_block"]["name"], "bash");

    let response: Value = chat(
        &format!("{base}/openai/v1/responses"),
        json!({"model": "p", "tools": fn_tools, "input": "And once more.",
               "tool_choice": {"type": "function", "name": "bash"}}),
    )
    .await
    .json()
    .await
    .expect("json");
    assert_eq!(response["output"][0]["type"], "function_call", "{response}");
    assert_eq!(response["output"][0]["arguments"], "{\"cmd\": \"ls\"}");

    // Each forced call's start is in the prompt ids, the rest was sampled.
    let (tok, _) = crate::policy::tools_policy(dir.path());
    let events = env.store.list_events("r1", 0, 10).await.expect("events");
    for e in &events {
        let call: Value = e.payload.parse().expect("payload");
        let ids = |k: &str| -> Vec<u32> { serde_json::from_value(call[k].clone()).expect("ids") };
        let prompt = tok.decode(&ids("prompt_ids"), false).expect("decode");
        assert!(
            prompt.ends_with("<tool_call>\n{\"name\": \"bash\", \"arguments\": "),
            "{prompt}"
        );
        let sampled = tok.decode(&ids("response_ids"), false).expect("decode");
        assert!(sampled.starts_with("{\"cmd\": \"ls\"}}"), "{sampled}");
    }

    // none: the same call text is the answer's content, not a call.
    let none: Value = chat(
        &env.chat_url("r1"),
        json!({"messages": [{"role": "user", "content": "Do not."}], "tools": tools(),
               "tool_choice": "none"}),
    )
    .await
    .json()
    .await
    .expect("json");
    let message = &none["choices"][0]["message"];
    assert!(
        message["tool_calls"].is_null() || message["tool_calls"] == json!([]),
        "{none}"
    );
    assert!(message["content"].as_str().unwrap().contains("<tool_call>"));

    let resp = chat(
        &env.chat_url("r1"),
        json!({"messages": [user], "tools": tools(),
               "tool_choice": {"type": "function", "function": {"name": "rm"}}}),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    let err: Value = resp.json().await.expect("json");
    assert!(
        err["error"]["message"].as_str().unwrap().contains("`rm`"),
        "{err}"
    );
}

/// Malformed and unservable bodies: a 400 in the called API's own error
/// shape, naming what is wrong; nothing recorded, nothing sent on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_messages_and_responses_bodies_are_400s_in_their_own_shape() {
    let dir = tempfile::tempdir().expect("tempdir");
    let env = call_then_answer(dir.path(), EngineApi::Openai).await;
    let base = format!("{}/proxy/r1/1/train", env.base);
    let raw = |url: String, body: &'static str| async move {
        reqwest::Client::new()
            .post(url)
            .bearer_auth(ADMIN)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .expect("send")
    };
    let messages = format!("{base}/anthropic/v1/messages");
    let responses = format!("{base}/openai/v1/responses");
    let cases: [(&String, &'static str, &str); 10] = [
        (&messages, "{not json", "JSON"),
        (
            &messages,
            r#"{"model": "p", "max_tokens": 8, "messages": 5}"#,
            "`messages` must be a list",
        ),
        (
            &messages,
            r#"{"model": "p", "max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "foo"}]}]}"#,
            "`foo`",
        ),
        (
            &messages,
            r#"{"model": "p", "max_tokens": 8, "tool_choice": {"type": "maybe"}, "messages": [{"role": "user", "content": "x"}]}"#,
            "`maybe`",
        ),
        (
            &messages,
            r#"{"model": "p", "max_tokens": 8, "tools": [{"type": "web_search_20250305", "name": "web_search"}], "messages": [{"role": "user", "content": "x"}]}"#,
            "web_search_20250305",
        ),
        (&responses, "[1, 2", "JSON"),
        (
            &responses,
            r#"{"model": "p", "input": 3}"#,
            "`input` must be a string",
        ),
        (
            &responses,
            r#"{"model": "p", "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:x"}]}]}"#,
            "`input_image`",
        ),
        (
            &responses,
            r#"{"model": "p", "input": [{"type": "custom_tool_call", "call_id": "c", "name": "apply_patch", "input": "x"}]}"#,
            "`custom_tool_call`",
        ),
        (
            &responses,
            r#"{"model": "p", "input": "x", "tools": [{"type": "custom", "name": "apply_patch"}]}"#,
            "`custom`",
        ),
    ];
    for (url, body, want) in cases {
        let resp = raw(url.clone(), body).await;
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST, "{body}");
        let err: Value = resp.json().await.expect("json");
        let message = if url == &messages {
            assert_eq!(err["type"], "error", "{err}");
            assert_eq!(err["error"]["type"], "invalid_request_error", "{err}");
            err["error"]["message"]
                .as_str()
                .expect("message")
                .to_string()
        } else {
            assert_eq!(err["error"]["type"], "invalid_request_error", "{err}");
            err["error"]["message"]
                .as_str()
                .expect("message")
                .to_string()
        };
        assert!(message.contains(want), "{body}: {message}");
    }
    assert!(env.engine.requests().is_empty());
    let events = env.store.list_events("r1", 0, 10).await.expect("events");
    assert!(events.is_empty());
}
