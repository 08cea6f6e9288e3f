//! What a hostile agent, a careless user or a web page can send, and what
//! the gateway must do about it (issue 15's red-team findings): bounded
//! JSON, rollout ids that stay one URL segment, timeouts and a connection
//! cap, cancellation of abandoned calls, per-attempt tokens, the mode from
//! the record, and a browser kept out of a local gateway.

use std::time::Duration;

use agl_gateway::GatewayConfig;
use agl_store::{Mode, NewRollout};
use agl_testengine::{Faults, Reply, TestEngineConfig};
use agl_wire::api::StatusPatch;
use agl_wire::rollout::{FailureKind, RolloutStatus};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::{ADMIN, Local, start_local};

fn engine(reply: &str) -> TestEngineConfig {
    TestEngineConfig::default().with_replies([Reply::text(reply)])
}

async fn gateway(config: GatewayConfig) -> Local {
    start_local(engine("hello there"), config).await
}

fn nested(depth: usize) -> String {
    format!("{}{}", "[".repeat(depth), "]".repeat(depth))
}

impl Local {
    async fn admin_post(&self, path: &str, body: String) -> (StatusCode, Value) {
        let resp = reqwest::Client::new()
            .post(format!("{}{path}", self.base))
            .bearer_auth(ADMIN)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .expect("send");
        let status = resp.status();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    async fn admin_get(&self, path: &str) -> (StatusCode, Value) {
        let resp = reqwest::Client::new()
            .get(format!("{}{path}", self.base))
            .bearer_auth(ADMIN)
            .send()
            .await
            .expect("send");
        let status = resp.status();
        (status, resp.json().await.unwrap_or(Value::Null))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unbounded_json_is_refused_before_it_is_stored() {
    let env = gateway(GatewayConfig::default()).await;
    env.running(&["r1".to_string()]).await;
    let deep = nested(100_000);
    let bad_bodies = [
        (
            "/v1/rollouts/r1/events",
            r#"{"kind":"log","payload":{"x":1e999}}"#.to_string(),
        ),
        (
            "/v1/rollouts/r1/events",
            format!(r#"{{"kind":"log","payload":{deep}}}"#),
        ),
        (
            "/v1/rollouts/r1/events",
            format!(r#"{{"kind":"log","payload":{}}}"#, nested(101)),
        ),
        (
            "/v1/rollouts",
            r#"{"rollouts":[{"rollout_id":"r2","input":[1e999]}]}"#.to_string(),
        ),
        (
            "/v1/rollouts",
            format!(r#"{{"rollouts":[{{"rollout_id":"r3","config":{deep}}}]}}"#),
        ),
    ];
    for (path, body) in bad_bodies {
        let (status, answer) = env.admin_post(path, body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}: {answer}");
        let message = answer["error"]["message"].as_str().expect("message");
        assert!(message.contains("at most 100 levels"), "{message}");
    }
    // The proxy checks the harness's body the same way.
    let call = format!(
        r#"{{"messages":[{{"role":"user","content":"x"}}],"n":{}}}"#,
        nested(120)
    );
    let resp = reqwest::Client::new()
        .post(env.chat_url("r1"))
        .bearer_auth(ADMIN)
        .body(call)
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    assert!(
        env.engine.requests().is_empty(),
        "nothing reached the engine"
    );
    // Nothing was stored, and every read still answers.
    let (status, page) = env.admin_get("/v1/rollouts/r1/events").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(page["events"], json!([]));
    for path in [
        "/v1/rollouts",
        "/v1/rollouts?status=queued",
        "/v1/rollouts?status=running",
    ] {
        let (status, page) = env.admin_get(path).await;
        assert_eq!(status, StatusCode::OK, "{path}: {page}");
    }
    let (status, page) = env.admin_get("/v1/rollouts?status=running").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(page["rollouts"].as_array().map(Vec::len), Some(1));
    // Deep but within the limit is taken and read back as sent.
    let ok = nested(100);
    let (status, _) = env
        .admin_post(
            "/v1/rollouts/r1/events",
            format!(r#"{{"kind":"log","payload":{ok}}}"#),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let (_, page) = env.admin_get("/v1/rollouts/r1/events").await;
    assert_eq!(page["events"][0]["payload"].to_string(), ok);
    // An admin-written model_request must read back as a record.
    let (status, _) = env
        .admin_post(
            "/v1/rollouts/r1/events",
            r#"{"kind":"model_request","payload":{"x":1}}"#.into(),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    env.store
        .export_rollout("r1")
        .await
        .expect("export still reads");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_accepted_rollout_id_reaches_exactly_its_rollout() {
    let env = gateway(GatewayConfig::default()).await;
    for bad in [
        "..", ".", "a%2Fb", "x%41", "a?b", "a#b", "a\u{0}b", "a\nb", "a/b", "", "a b",
    ] {
        let body = json!({"rollouts": [{"rollout_id": bad}]}).to_string();
        let (status, answer) = env.admin_post("/v1/rollouts", body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad:?}: {answer}");
    }
    let long = "x".repeat(129);
    let (status, _) = env
        .admin_post(
            "/v1/rollouts",
            json!({"rollouts": [{"rollout_id": long}]}).to_string(),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    // The look-alikes of the refused ids are plain rollouts of their own.
    let ids = ["xA", "...", "a.b", "-", "_x_", "A-1.2_3", &"y".repeat(128)];
    let items: Vec<Value> = ids.iter().map(|id| json!({"rollout_id": id})).collect();
    let (status, created) = env
        .admin_post("/v1/rollouts", json!({"rollouts": items}).to_string())
        .await;
    assert_eq!(status, StatusCode::OK, "{created}");
    let http = reqwest::Client::new();
    for view in created["rollouts"].as_array().expect("rollouts") {
        let id = view["id"].as_str().expect("id");
        env.store
            .set_status(id, &StatusPatch::to(1, RolloutStatus::Running))
            .await
            .expect("running");
        let token = view["token"].as_str().expect("token");
        let chat = format!(
            "{}/chat/completions",
            view["proxy_base_url"].as_str().expect("url")
        );
        let resp = http
            .post(&chat)
            .bearer_auth(token)
            .json(&json!({"messages": [{"role": "user", "content": id}]}))
            .send()
            .await
            .expect("proxy");
        assert_eq!(resp.status(), StatusCode::OK, "{id}: {chat}");
        let resp = http
            .post(view["events_url"].as_str().expect("events url"))
            .bearer_auth(token)
            .json(&json!({"kind": "log", "payload": id}))
            .send()
            .await
            .expect("event");
        assert_eq!(resp.status(), StatusCode::OK, "{id}");
    }
    for id in ids {
        let events = env.store.list_events(id, 0, 10).await.expect("events");
        let kinds: Vec<&str> = events.iter().map(|e| e.kind.as_str()).collect();
        assert_eq!(kinds, ["model_request", "log"], "{id}");
        assert_eq!(events[1].payload.parse().expect("payload"), json!(id));
        let call = events[0].payload.parse().expect("call");
        assert_eq!(call["request"]["messages"][0]["content"], json!(id));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_and_idle_connections_are_closed_and_capped() {
    let env = gateway(GatewayConfig {
        max_connections: 8,
        header_timeout_secs: 1.0,
        body_timeout_secs: 1.0,
        ..GatewayConfig::default()
    })
    .await;
    let addr = env.base.trim_start_matches("http://").to_string();
    // Slowloris: one header byte at a time, never finishing.
    let mut slow = Vec::new();
    for _ in 0..4 {
        let mut s = TcpStream::connect(&addr).await.expect("connect");
        s.write_all(b"GET /healthz HTTP/1.1\r\nHo")
            .await
            .expect("write");
        slow.push(s);
    }
    // Idle sockets, more than the cap.
    let mut idle = Vec::new();
    for _ in 0..20 {
        idle.push(TcpStream::connect(&addr).await.expect("connect"));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        env.metrics.open_connections() <= 8,
        "{}",
        env.metrics.open_connections()
    );
    for s in &mut slow {
        let _ = s.write_all(b"s").await;
    }
    // Past the head deadline the slow and idle ones are closed by the server.
    for s in slow.iter_mut().chain(idle.iter_mut()) {
        let mut buf = [0u8; 256];
        let read = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf)).await;
        let n = read.expect("the server closes it").unwrap_or(0);
        let text = String::from_utf8_lossy(&buf[..n]);
        assert!(n == 0 || text.starts_with("HTTP/1.1 408"), "{text}");
    }
    // A body that trickles is cut off with 408.
    let mut s = TcpStream::connect(&addr).await.expect("connect");
    let head = format!(
        "POST /v1/rollouts HTTP/1.1\r\nhost: {addr}\r\nauthorization: Bearer {ADMIN}\r\n\
         content-type: application/json\r\ncontent-length: 100\r\n\r\n{{"
    );
    s.write_all(head.as_bytes()).await.expect("write");
    let mut answer = String::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_string(&mut answer)).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    // And the gateway still serves everyone else.
    let resp = reqwest::get(format!("{}/healthz", env.base))
        .await
        .expect("healthz");
    assert_eq!(resp.status(), StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_stops_its_engine_work_and_is_recorded_cancelled() {
    let env = start_local(
        engine(&"word ".repeat(60)).with_faults(Faults {
            chunk_latency: Duration::from_millis(20),
            ..Faults::default()
        }),
        GatewayConfig::default(),
    )
    .await;
    env.running(&["s".to_string(), "n".to_string()]).await;
    // Streamed: read one chunk, then leave.
    let mut resp = reqwest::Client::new()
        .post(env.chat_url("s"))
        .bearer_auth(ADMIN)
        .json(&json!({"stream": true, "messages": [{"role": "user", "content": "go"}]}))
        .send()
        .await
        .expect("send");
    assert!(resp.chunk().await.expect("chunk").is_some());
    drop(resp);
    // Not streamed: the client gives up while the engine is still working.
    env.engine.set_faults(Faults {
        first_byte_latency: Duration::from_secs(3),
        ..Faults::default()
    });
    let gave_up = reqwest::Client::new()
        .post(env.chat_url("n"))
        .bearer_auth(ADMIN)
        .timeout(Duration::from_millis(300))
        .json(&json!({"messages": [{"role": "user", "content": "go"}]}))
        .send()
        .await;
    assert!(gave_up.is_err());
    // Both engine answers end abandoned. An answer the gateway kept reading
    // (60 chunks x 20 ms, or the 3 s one) would end done instead, so the
    // count says what happened however long this waits (up to 10 s).
    let mut waited = 0;
    while env.engine.state().abandoned() < 2 && waited < 200 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        waited += 1;
    }
    assert_eq!(env.engine.state().abandoned(), 2);
    for id in ["s", "n"] {
        let mut events = Vec::new();
        for _ in 0..200 {
            events = env.store.list_events(id, 0, 10).await.expect("events");
            if !events.is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(events.len(), 1, "{id}");
        let call = events[0].payload.parse().expect("payload");
        assert_eq!(call["status"], "cancelled", "{id}: {call}");
        let exported = env.store.export_rollout(id).await.expect("export");
        assert!(
            exported.calls.is_empty(),
            "a cancelled call is not training data"
        );
    }
    let metrics = reqwest::get(format!("{}/metrics", env.base))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    assert!(
        metrics.contains("agl_proxy_cancelled_calls_total 2"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_huge_request_is_not_stored_whole() {
    let env = gateway(GatewayConfig::default()).await;
    env.running(&["r1".to_string()]).await;
    env.engine.set_faults(Faults {
        fail_next: 1,
        fail_status: 400,
        ..Faults::default()
    });
    let big = "x".repeat(3 << 20);
    let resp = reqwest::Client::new()
        .post(env.chat_url("r1"))
        .bearer_auth(ADMIN)
        .json(&json!({"messages": [{"role": "user", "content": big}]}))
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    let events = env.store.list_events("r1", 0, 10).await.expect("events");
    assert_eq!(events.len(), 1);
    assert!(events[0].payload.as_str().len() < 64 * 1024);
    let call = events[0].payload.parse().expect("payload");
    assert_eq!(call["status"], "error");
    assert_eq!(call["request"], Value::Null);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_attempts_token_is_refused_on_the_new_attempt() {
    let env = gateway(GatewayConfig::default()).await;
    env.running(&["r1".to_string()]).await;
    let old = env.auth.rollout_token("r1", 1);
    env.store
        .set_status(
            "r1",
            &StatusPatch {
                failure: Some(FailureKind::System),
                reason: Some("pod lost".into()),
                ..StatusPatch::to(1, RolloutStatus::Failed)
            },
        )
        .await
        .expect("fail");
    // Within the retry budget: the store re-queued it as attempt 2.
    assert_eq!(env.store.get_rollout("r1").await.expect("get").attempt, 2);
    env.store
        .set_status("r1", &StatusPatch::to(2, RolloutStatus::Running))
        .await
        .expect("running");
    let (_, view) = env.admin_get("/v1/rollouts/r1").await;
    let new = view["token"].as_str().expect("token").to_string();
    assert_ne!(new, old);
    let http = reqwest::Client::new();
    let proxy = format!(
        "{}/chat/completions",
        view["proxy_base_url"].as_str().expect("url")
    );
    let events = view["events_url"].as_str().expect("events url").to_string();
    let chat = json!({"messages": [{"role": "user", "content": "hi"}]});
    let reward = json!({"kind": "reward", "payload": {"value": 1.0}});
    for (token, want) in [(&old, StatusCode::FORBIDDEN), (&new, StatusCode::OK)] {
        let resp = http
            .post(&proxy)
            .bearer_auth(token)
            .json(&chat)
            .send()
            .await
            .expect("proxy");
        assert_eq!(resp.status(), want);
        let resp = http
            .post(&events)
            .bearer_auth(token)
            .json(&reward)
            .send()
            .await
            .expect("event");
        assert_eq!(resp.status(), want);
        let resp = http
            .get(&events)
            .bearer_auth(token)
            .send()
            .await
            .expect("list");
        assert_eq!(resp.status(), want);
    }
    // Naming the old attempt explicitly does not help either.
    let stale = json!({"kind": "reward", "attempt": 1, "payload": {"value": 1.0}});
    let resp = http
        .post(&events)
        .bearer_auth(&new)
        .json(&stale)
        .send()
        .await
        .expect("event");
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    let attempt2 = env.store.list_events("r1", 0, 10).await.expect("events");
    assert_eq!(attempt2.iter().filter(|e| e.kind == "reward").count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mode_comes_from_the_rollout_not_the_path() {
    let env = gateway(GatewayConfig {
        train_temperature: 1.0,
        val_temperature: 0.0,
        ..GatewayConfig::default()
    })
    .await;
    let batch = vec![NewRollout {
        id: Some("v1".into()),
        group_id: "g".into(),
        mode: Mode::Val,
        input: Default::default(),
        config: Default::default(),
    }];
    env.store.create_rollouts(batch).await.expect("create");
    env.store
        .set_status("v1", &StatusPatch::to(1, RolloutStatus::Running))
        .await
        .expect("running");
    env.running(&["t1".to_string()]).await;
    let chat = json!({"messages": [{"role": "user", "content": "hi"}]});
    let http = reqwest::Client::new();
    let call = |id: &str, mode: &str| {
        let url = format!(
            "{}/proxy/{id}/1/{mode}/openai/v1/chat/completions",
            env.base
        );
        let token = env.auth.rollout_token(id, 1);
        http.post(url).bearer_auth(token).json(&chat).send()
    };
    assert_eq!(
        call("t1", "val").await.expect("send").status(),
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        call("v1", "train").await.expect("send").status(),
        StatusCode::FORBIDDEN
    );
    assert!(env.engine.requests().is_empty());
    assert_eq!(
        call("t1", "train").await.expect("send").status(),
        StatusCode::OK
    );
    assert_eq!(
        call("v1", "val").await.expect("send").status(),
        StatusCode::OK
    );
    let temps: Vec<Value> = env
        .engine
        .requests()
        .iter()
        .map(|r| r.body.as_ref().expect("body")["temperature"].clone())
        .collect();
    assert_eq!(temps, [json!(1.0), json!(0.0)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_auth_off_a_web_page_cannot_drive_the_gateway() {
    let env = gateway(GatewayConfig::default()).await;
    // `start_local` turns auth on; this one runs without an admin key.
    let dir = tempfile::tempdir().expect("tempdir");
    let store = agl_store::Store::open(dir.path().join("agl.db")).expect("store");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let gw = agl_gateway::Gateway::new(
        store.clone(),
        GatewayConfig {
            listen: addr.to_string(),
            ..GatewayConfig::default()
        },
    );
    tokio::spawn(gw.serve(listener, std::future::pending()));
    let base = format!("http://{addr}");
    let engine =
        json!({"name": "evil", "base_url": env.engine.base_url(), "model": "m"}).to_string();
    let http = reqwest::Client::new();
    let post = |headers: &[(&str, &str)]| {
        let mut req = http.post(format!("{base}/v1/engines")).body(engine.clone());
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        req.send()
    };
    // A cross-site form or fetch sends text/plain (no preflight).
    let resp = post(&[("content-type", "text/plain")]).await.expect("send");
    assert_eq!(resp.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let resp = post(&[]).await.expect("send");
    assert_eq!(resp.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let json_type = ("content-type", "application/json");
    let resp = post(&[json_type, ("origin", "https://evil.example")])
        .await
        .expect("send");
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    // DNS rebinding: the page's own name pointing at 127.0.0.1.
    let resp = post(&[json_type, ("host", "evil.example")])
        .await
        .expect("send");
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    let body: Value = resp.json().await.expect("json");
    assert_eq!(body["error"]["type"], "permission_error");
    // A bodiless POST from a page (pause) is refused by its Origin.
    let resp = http
        .post(format!("{base}/v1/proxy/pause"))
        .header("origin", "https://evil.example")
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    assert!(store.list_engines().await.expect("engines").is_empty());
    // A local client sending JSON is served.
    let resp = post(&[json_type, ("origin", "http://localhost:3000")])
        .await
        .expect("send");
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(store.list_engines().await.expect("engines").len(), 1);
}
