//! The training proxy over real HTTP: reqwest -> gateway -> test engine, and
//! the recorded `model_request` events read back through the store's export.

use std::sync::Arc;
use std::time::Duration;

use agl_gateway::GatewayConfig;
use agl_gateway::{Gateway, ProxyControl};
use agl_store::{Mode, NewRollout, Store};
use agl_testengine::{Faults, Reply, TestEngine, TestEngineConfig, tokens};
use agl_wire::api::StatusPatch;
use agl_wire::rollout::{ApiKind, RolloutStatus};
use reqwest::{Client, StatusCode};
use serde_json::{Value, json};

const ADMIN: &str = "admin-key";

struct Env {
    base: String,
    store: Store,
    control: Arc<ProxyControl>,
    engine: TestEngine,
    http: Client,
    token: String,
    other_token: String,
    _dir: tempfile::TempDir,
}

async fn start(reply: Reply) -> Env {
    let engine = TestEngine::start(TestEngineConfig::default().with_replies([reply]))
        .await
        .expect("engine");
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path().join("agl.db")).expect("open store");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let config = GatewayConfig {
        listen: addr.to_string(),
        admin_key: Some(ADMIN.into()),
        train_temperature: 0.7,
        ..GatewayConfig::default()
    };
    let gateway = Gateway::new(store.clone(), config);
    let token = gateway.state().auth.rollout_token("r1", 1);
    let other_token = gateway.state().auth.rollout_token("r2", 1);
    let control = gateway.control();
    tokio::spawn(gateway.serve(listener, std::future::pending()));
    let new = |id: &str| NewRollout {
        id: Some(id.into()),
        group_id: "g".into(),
        mode: Mode::Train,
        input: Default::default(),
        config: Default::default(),
    };
    store
        .create_rollouts(vec![new("r1"), new("r2")])
        .await
        .expect("create");
    store
        .set_status("r1", &StatusPatch::to(1, RolloutStatus::Running))
        .await
        .expect("run");
    let engine_url = engine.base_url();
    store
        .register_engine(
            &agl_store::RegisterEngine::new("e1", &engine_url, "served-model")
                .with_render(agl_store::Render::Engine),
        )
        .await
        .expect("engine");
    Env {
        base: format!("http://{addr}"),
        store,
        control,
        engine,
        http: Client::new(),
        token,
        other_token,
        _dir: dir,
    }
}

fn chat_body(stream: bool) -> Value {
    json!({"model": "whatever", "temperature": 0.1, "stream": stream,
           "messages": [{"role": "user", "content": "hi"}]})
}

impl Env {
    fn url(&self, rollout: &str, attempt: u32, endpoint: &str) -> String {
        format!(
            "{}/proxy/{rollout}/{attempt}/train/openai/v1/{endpoint}",
            self.base
        )
    }

    async fn post(&self, token: &str, url: &str, body: &Value) -> reqwest::Response {
        self.http
            .post(url)
            .bearer_auth(token)
            .header("x-agl-step", "3")
            .json(body)
            .send()
            .await
            .expect("send")
    }

    async fn chat(&self, stream: bool) -> reqwest::Response {
        let url = self.url("r1", 1, "chat/completions");
        self.post(&self.token, &url, &chat_body(stream)).await
    }
}

fn expected_logprobs(n: usize) -> Vec<f32> {
    (0..n).map(|i| tokens::logprob(i) as f32).collect()
}

fn chat_prompt_ids() -> Vec<u32> {
    tokens::encode(&tokens::render_chat(
        &[json!({"role": "user", "content": "hi"})],
        None,
    ))
}

/// The one exported call matches the engine's exact ids and logprobs.
async fn assert_one_call(env: &Env, api: ApiKind, prompt: Vec<u32>, reply: &str) {
    let rollout = env.store.export_rollout("r1").await.expect("export");
    assert_eq!(rollout.calls.len(), 1, "{:?}", rollout.calls);
    let call = &rollout.calls[0];
    assert_eq!(call.api, api);
    assert_eq!(call.prompt_ids, prompt);
    assert_eq!(call.response_ids, tokens::encode(reply));
    assert_eq!(call.response_logprobs, expected_logprobs(reply.len()));
    assert_eq!(call.finish_reason.as_deref(), Some("stop"));
    assert_eq!(call.tags.get("x-agl-step").map(String::as_str), Some("3"));
    assert!(call.finished_at_ms >= call.started_at_ms);
    // What the trainer scores at: the temperature the gateway set, not the
    // harness's 0.1.
    assert_eq!(call.temperature, Some(0.7));
}

#[tokio::test]
async fn non_streaming_chat_is_forwarded_and_recorded() {
    let env = start(Reply::text("hello")).await;
    let resp = env.chat(false).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let body: Value = resp.json().await.expect("json");
    assert_eq!(body["choices"][0]["message"]["content"], "hello");
    assert_one_call(&env, ApiKind::ChatCompletions, chat_prompt_ids(), "hello").await;
    let sent = env.engine.requests();
    assert_eq!(sent.len(), 1);
    let fwd = sent[0].body.clone().expect("json body");
    assert_eq!(fwd["model"], "served-model");
    assert_eq!(fwd["temperature"], 0.7);
    assert_eq!(fwd["return_token_ids"], true);
    assert_eq!(fwd["logprobs"], true);
    assert!(sent[0].header("authorization").is_none());
    // The request is stored as the harness sent it.
    let rollout = env.store.export_rollout("r1").await.expect("export");
    let req = rollout.calls[0].request.parse().expect("request json");
    assert_eq!(req, chat_body(false));
}

#[tokio::test]
async fn streaming_chat_passes_chunks_and_assembles_the_record() {
    let env = start(Reply::text("hello")).await;
    let resp = env.chat(true).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let text = resp.text().await.expect("body");
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    let content: String = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|v| {
            v["choices"][0]["delta"]["content"]
                .as_str()
                .map(String::from)
        })
        .collect();
    assert_eq!(content, "hello");
    assert_one_call(&env, ApiKind::ChatCompletions, chat_prompt_ids(), "hello").await;
    let rollout = env.store.export_rollout("r1").await.expect("export");
    let response = rollout.calls[0].response.parse().expect("response");
    assert_eq!(response["choices"][0]["message"]["content"], "hello");
}

#[tokio::test]
async fn streaming_tool_calls_are_assembled() {
    let env = start(Reply::default().with_tool_call("search", "{\"q\":1}")).await;
    let resp = env.chat(true).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let _ = resp.text().await.expect("body");
    let rollout = env.store.export_rollout("r1").await.expect("export");
    let response = rollout.calls[0].response.parse().expect("response");
    let call = &response["choices"][0]["message"]["tool_calls"][0];
    assert_eq!(call["function"]["name"], "search");
    assert_eq!(call["function"]["arguments"], "{\"q\":1}");
    assert!(!rollout.calls[0].response_ids.is_empty());
}

#[tokio::test]
async fn completions_are_recorded() {
    let env = start(Reply::text("world")).await;
    let url = env.url("r1", 1, "completions");
    // Different prompts: the same one twice would count as a client retry.
    for (prompt, stream) in [("say", false), ("sag", true)] {
        let body = json!({"prompt": prompt, "stream": stream});
        let resp = env.post(&env.token, &url, &body).await;
        assert_eq!(resp.status(), StatusCode::OK);
        let _ = resp.text().await.expect("body");
    }
    let fwd = env.engine.requests()[0].body.clone().expect("json");
    assert_eq!(fwd["logprobs"], 1);
    let rollout = env.store.export_rollout("r1").await.expect("export");
    assert_eq!(rollout.calls.len(), 2);
    for (call, prompt) in rollout.calls.iter().zip(["say", "sag"]) {
        assert_eq!(call.api, ApiKind::Completions);
        assert_eq!(call.prompt_ids, tokens::encode(prompt));
        assert_eq!(call.response_ids, tokens::encode("world"));
        assert_eq!(call.response_logprobs, expected_logprobs(5));
    }
}

#[tokio::test]
async fn paused_proxy_answers_429_until_resumed() {
    let env = start(Reply::text("ok")).await;
    env.control.pause();
    let resp = env.chat(false).await;
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        resp.headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok()),
        Some("1")
    );
    let body: Value = resp.json().await.expect("json");
    assert!(body["error"]["message"].is_string());
    assert_eq!(env.control.in_flight_count(), 0);
    env.control.resume();
    assert_eq!(env.chat(false).await.status(), StatusCode::OK);
}

#[tokio::test]
async fn upstream_5xx_is_retried_transparently() {
    let env = start(Reply::text("hello")).await;
    env.engine.set_faults(Faults {
        fail_next: 2,
        fail_status: 503,
        ..Faults::default()
    });
    for stream in [false, true] {
        let resp = env.chat(stream).await;
        assert_eq!(resp.status(), StatusCode::OK);
        let _ = resp.text().await.expect("body");
        env.engine.set_faults(Faults {
            fail_next: 2,
            fail_status: 503,
            ..Faults::default()
        });
    }
    assert_eq!(env.engine.requests().len(), 6);
    // The proxy's own retries are not recorded; the second (identical) call
    // got its answer too, so it is a repeat, not a retry: both are exported.
    let rollout = env.store.export_rollout("r1").await.expect("export");
    assert_eq!(rollout.calls.len(), 2);
}

#[tokio::test]
async fn a_delivered_call_repeated_is_kept_and_a_retry_supersedes() {
    let env = start(Reply::text("hello")).await;
    let url = env.url("r1", 1, "chat/completions");
    // The same request twice, both answers received: a deliberate repeat.
    for step in ["1", "2"] {
        let resp = env
            .http
            .post(&url)
            .bearer_auth(&env.token)
            .header("x-agl-step", step)
            .json(&chat_body(false))
            .send()
            .await
            .expect("send");
        assert_eq!(resp.status(), StatusCode::OK);
        let _ = resp.text().await.expect("body");
    }
    let rollout = env.store.export_rollout("r1").await.expect("export");
    assert_eq!(rollout.calls.len(), 2, "{:?}", rollout.calls);

    // A streamed call whose client leaves before `[DONE]`, then the same
    // request again: the first never reached its client, so the export
    // keeps only the retry (the first is superseded, or cancelled if the
    // client left before it was recorded).
    env.engine.set_faults(Faults {
        chunk_latency: Duration::from_millis(30),
        ..Faults::default()
    });
    let other = json!({"stream": true, "messages": [{"role": "user", "content": "bye"}]});
    let mut resp = env
        .http
        .post(&url)
        .bearer_auth(&env.token)
        .header("x-agl-step", "3")
        .json(&other)
        .send()
        .await
        .expect("send");
    let first = resp.chunk().await.expect("chunk").expect("a first chunk");
    assert!(first.starts_with(b"data: "));
    drop(resp);
    env.engine.set_faults(Faults::default());
    let resp = env
        .http
        .post(&url)
        .bearer_auth(&env.token)
        .header("x-agl-step", "4")
        .json(&other)
        .send()
        .await
        .expect("send");
    assert!(
        resp.text()
            .await
            .expect("body")
            .ends_with("data: [DONE]\n\n")
    );
    let rollout = env.store.export_rollout("r1").await.expect("export");
    let steps: Vec<_> = rollout
        .calls
        .iter()
        .map(|c| c.tags.get("x-agl-step").cloned().unwrap_or_default())
        .collect();
    assert_eq!(steps, ["1", "2", "4"]);
}

#[tokio::test]
async fn upstream_failure_is_recorded_and_answers_502() {
    let env = start(Reply::text("hello")).await;
    env.engine.set_faults(Faults {
        fail_next: 10,
        fail_status: 500,
        ..Faults::default()
    });
    let resp = env.chat(false).await;
    assert_eq!(resp.status(), StatusCode::BAD_GATEWAY);
    let body: Value = resp.json().await.expect("json");
    assert_eq!(body["error"]["type"], "server_error");
    let events = env.store.list_events("r1", 0, 10).await.expect("events");
    assert_eq!(events.len(), 1);
    let payload = events[0].payload.parse().expect("payload");
    assert_eq!(payload["status"], "error");
}

/// An engine on a raw socket that answers every request with whatever
/// `body` holds at the time; its base URL.
async fn fixed_engine(body: Arc<std::sync::Mutex<String>>) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}/v1", listener.local_addr().expect("addr"));
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let body = body.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 1 << 16];
                // One read holds a whole small request on loopback.
                while let Ok(n) = stream.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    let text = body.lock().expect("body").clone();
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                         content-length: {}\r\n\r\n{text}",
                        text.len()
                    );
                    if stream.write_all(answer.as_bytes()).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    url
}

/// An engine's answer is kept verbatim only within the limits every stored
/// JSON document is held to, wherever in the answer the excess is; within
/// them, numbers with exponents and escaped text are kept as sent.
#[tokio::test]
async fn an_engine_answer_outside_the_json_limits_is_refused_and_recorded_an_error() {
    let env = start(Reply::text("hello")).await;
    let body = Arc::new(std::sync::Mutex::new(String::new()));
    let url = fixed_engine(body.clone()).await;
    env.store.remove_engine("e1").await.expect("remove");
    env.store
        .register_engine(
            &agl_store::RegisterEngine::new("e2", &url, "served-model")
                .with_render(agl_store::Render::Engine),
        )
        .await
        .expect("engine");
    let answer = |extra: &str| {
        format!(
            r#"{{"id":"c","object":"chat.completion","prompt_token_ids":[1,2],"choices":[{{"index":0,"message":{{"role":"assistant","content":"hi"}},"logprobs":{{"content":[{{"token":"h","logprob":-0.5,"top_logprobs":[]}}]}},"finish_reason":"stop","token_ids":[3]{extra}}}]}}"#
        )
    };
    let deep = format!("{}{}", "[".repeat(120), "]".repeat(120));
    for extra in [
        r#","x":1e999"#.to_string(),
        format!(r#","x":{deep}"#),
        r#","x":"\ud800""#.to_string(),
    ] {
        *body.lock().expect("body") = answer(&extra);
        let resp = env.chat(false).await;
        assert_eq!(resp.status(), StatusCode::BAD_GATEWAY, "{extra}");
        let text = resp.text().await.expect("text");
        assert!(text.contains("invalid JSON"), "{extra}: {text}");
    }
    let events = env.store.list_events("r1", 0, 10).await.expect("events");
    assert_eq!(events.len(), 3);
    for event in &events {
        let payload = event.payload.parse().expect("payload");
        assert_eq!(payload["status"], "error", "{payload}");
    }
    let kept = answer(r#","x":[1.5e-05,-2E+3],"y":"\u00e9""#);
    *body.lock().expect("body") = kept.clone();
    let resp = env.chat(false).await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.text().await.expect("text"), kept);
    let rollout = env.store.export_rollout("r1").await.expect("export");
    let call = rollout.calls.last().expect("a call");
    assert_eq!(call.response.as_str(), kept);
    assert_eq!(
        (call.prompt_ids.clone(), call.response_ids.clone()),
        (vec![1, 2], vec![3])
    );
    assert_eq!(call.response_logprobs, vec![-0.5]);
}

#[tokio::test]
async fn wrong_rollout_token_finished_and_unknown_rollouts_are_refused() {
    let env = start(Reply::text("x")).await;
    let url = env.url("r1", 1, "chat/completions");
    let resp = env.post(&env.other_token, &url, &chat_body(false)).await;
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    let resp = env.post("garbage", &url, &chat_body(false)).await;
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    let resp = env
        .post(
            ADMIN,
            &env.url("nope", 1, "chat/completions"),
            &chat_body(false),
        )
        .await;
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    // Attempt 2 does not exist yet: the admin is told so, and attempt 1's
    // token is not valid there at all.
    let attempt2 = env.url("r1", 2, "chat/completions");
    let resp = env.post(ADMIN, &attempt2, &chat_body(false)).await;
    assert_eq!(resp.status(), StatusCode::CONFLICT);
    let resp = env.post(&env.token, &attempt2, &chat_body(false)).await;
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    let bad = env
        .http
        .post(&url)
        .bearer_auth(&env.token)
        .body("{not json")
        .send()
        .await
        .expect("send");
    assert_eq!(bad.status(), StatusCode::BAD_REQUEST);
    env.store
        .set_status("r1", &StatusPatch::to(1, RolloutStatus::Succeeded))
        .await
        .expect("finish");
    let resp = env.post(&env.token, &url, &chat_body(false)).await;
    assert_eq!(resp.status(), StatusCode::CONFLICT);
    let body: Value = resp.json().await.expect("json");
    assert_eq!(body["error"]["type"], "conflict_error");
    assert!(env.engine.requests().is_empty());
}
