//! The gateway's management API over real HTTP (reqwest and curl) against a
//! temp store.

use std::process::Command;
use std::sync::Arc;

use agl_gateway::GatewayConfig;
use agl_gateway::{Gateway, ProxyControl};
use agl_store::Store;
use reqwest::{Client, Method, StatusCode};
use serde_json::{Value, json};

struct Server {
    base: String,
    control: Arc<ProxyControl>,
    http: Client,
    admin: Option<String>,
    _dir: tempfile::TempDir,
}

async fn start(config: GatewayConfig) -> Server {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path().join("agl.db")).expect("open store");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let config = GatewayConfig {
        listen: addr.to_string(),
        ..config
    };
    let admin = config.admin_key.clone();
    let gateway = Gateway::new(store, config);
    let control = gateway.control();
    tokio::spawn(gateway.serve(listener, std::future::pending()));
    Server {
        base: format!("http://{addr}"),
        control,
        http: Client::new(),
        admin,
        _dir: dir,
    }
}

fn with_key(key: &str) -> GatewayConfig {
    GatewayConfig {
        admin_key: Some(key.into()),
        ..GatewayConfig::default()
    }
}

impl Server {
    /// Sends `body` (JSON unless `None`) as the admin; returns status and JSON.
    async fn call(&self, method: Method, path: &str, body: Option<Value>) -> (StatusCode, Value) {
        let token = self.admin.clone();
        self.call_as(token.as_deref(), method, path, body).await
    }

    async fn call_as(
        &self,
        token: Option<&str>,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let mut req = self.http.request(method, format!("{}{path}", self.base));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.expect("send");
        let status = resp.status();
        let text = resp.text().await.expect("body");
        let json = serde_json::from_str(&text).unwrap_or(Value::String(text));
        (status, json)
    }

    async fn raw(&self, method: Method, path: &str, body: Vec<u8>) -> (StatusCode, Value) {
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.base))
            .body(body);
        if let Some(k) = &self.admin {
            req = req.bearer_auth(k);
        }
        let resp = req.send().await.expect("send");
        let status = resp.status();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    async fn create(&self, ids: &[&str]) -> Vec<Value> {
        let items: Vec<Value> = ids
            .iter()
            .map(|id| json!({"rollout_id": id, "group_id": "g", "mode": "train", "input": {"q": id}}))
            .collect();
        let (s, body) = self
            .call(
                Method::POST,
                "/v1/rollouts",
                Some(json!({"rollouts": items})),
            )
            .await;
        assert_eq!(s, StatusCode::OK, "{body}");
        body["rollouts"].as_array().expect("rollouts").clone()
    }
}

/// Asserts the OpenAI error shape and returns the error type.
fn error_type(status: StatusCode, body: &Value, want: StatusCode) -> String {
    assert_eq!(status, want, "{body}");
    assert!(body["error"]["message"].is_string(), "{body}");
    body["error"]["type"].as_str().expect("type").to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_create_is_idempotent_and_returns_proxy_urls() {
    let srv = start(with_key("adm")).await;
    let first = srv.create(&["r1", "r2"]).await;
    assert_eq!(first.len(), 2);
    assert_eq!(first[0]["status"], "queued");
    assert_eq!(first[0]["attempt"], 1);
    assert_eq!(
        first[0]["proxy_base_url"],
        format!("{}/proxy/r1/1/train/openai/v1", srv.base)
    );
    assert_eq!(
        first[0]["events_url"],
        format!("{}/v1/rollouts/r1/events", srv.base)
    );
    assert!(first[0]["failure"].is_null());
    assert!(first[0]["token"].as_str().unwrap().starts_with("agl-rt-"));

    let (s, _) = srv
        .call(
            Method::PATCH,
            "/v1/rollouts/r1",
            Some(json!({"attempt": 1, "status": "running"})),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    // Re-creating returns the stored rollout, not a fresh queued one.
    let again = srv.create(&["r1", "r3"]).await;
    assert_eq!(again[0]["status"], "running");
    assert_eq!(again[0]["created_ms"], first[0]["created_ms"]);
    assert_eq!(again[0]["token"], first[0]["token"]);
    assert_eq!(again[1]["id"], "r3");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_pages_with_a_cursor_and_filters_by_status() {
    let srv = start(GatewayConfig::default()).await;
    srv.create(&["a", "b", "c"]).await;
    let (s, page1) = srv.call(Method::GET, "/v1/rollouts?limit=2", None).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(page1["rollouts"].as_array().unwrap().len(), 2);
    let cursor = page1["next_cursor"].as_str().expect("cursor").to_string();
    let (_, page2) = srv
        .call(
            Method::GET,
            &format!("/v1/rollouts?limit=2&cursor={cursor}"),
            None,
        )
        .await;
    let ids: Vec<&str> = page1["rollouts"]
        .as_array()
        .unwrap()
        .iter()
        .chain(page2["rollouts"].as_array().unwrap())
        .map(|r| r["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["a", "b", "c"]);
    assert!(page2["next_cursor"].is_null());

    srv.call(Method::POST, "/v1/rollouts/b/cancel", None).await;
    let (_, cancelled) = srv
        .call(Method::GET, "/v1/rollouts?status=cancelled", None)
        .await;
    let rs = cancelled["rollouts"].as_array().unwrap();
    assert_eq!(rs.len(), 1);
    assert_eq!(rs[0]["id"], "b");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn patch_follows_the_state_machine_and_retry_starts_a_new_attempt() {
    let srv = start(GatewayConfig::default()).await;
    srv.create(&["r"]).await;
    let patch = |status: &str, attempt: u32| {
        let mut p = json!({"attempt": attempt, "status": status, "reason": "test"});
        if status == "failed" {
            p["failure"] = json!("agent");
        }
        p
    };
    let (s, body) = srv
        .call(Method::PATCH, "/v1/rollouts/r", Some(patch("succeeded", 1)))
        .await;
    assert_eq!(error_type(s, &body, StatusCode::CONFLICT), "conflict_error");
    let (s, _) = srv
        .call(Method::PATCH, "/v1/rollouts/r", Some(patch("running", 1)))
        .await;
    assert_eq!(s, StatusCode::OK);
    // A failure must say whose it is.
    let untyped = json!({"attempt": 1, "status": "failed", "reason": "test"});
    let (s, body) = srv
        .call(Method::PATCH, "/v1/rollouts/r", Some(untyped))
        .await;
    assert!(
        error_type(s, &body, StatusCode::BAD_REQUEST).contains("invalid_request"),
        "{body}"
    );
    let (s, body) = srv
        .call(Method::PATCH, "/v1/rollouts/r", Some(patch("failed", 1)))
        .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(body["reason"], "test");
    assert_eq!(body["failure"], "agent");
    let (s, body) = srv.call(Method::POST, "/v1/rollouts/r/retry", None).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(body["attempt"], 2);
    assert_eq!(body["status"], "queued");
    assert!(
        body["proxy_base_url"]
            .as_str()
            .unwrap()
            .ends_with("/proxy/r/2/train/openai/v1")
    );
    // A stale controller naming attempt 1 cannot move attempt 2.
    let (s, body) = srv
        .call(Method::PATCH, "/v1/rollouts/r", Some(patch("running", 1)))
        .await;
    error_type(s, &body, StatusCode::CONFLICT);
    let (s, body) = srv
        .call(Method::GET, "/v1/rollouts/r?calls=true", None)
        .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(body["calls"], json!([]));
    let (_, body) = srv.call(Method::GET, "/v1/rollouts/r", None).await;
    assert!(body.get("calls").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_append_list_and_refuse_finished_rollouts() {
    let srv = start(GatewayConfig::default()).await;
    srv.create(&["r"]).await;
    let mut seqs = Vec::new();
    for i in 0..3 {
        let (s, body) = srv
            .call(
                Method::POST,
                "/v1/rollouts/r/events",
                Some(json!({"kind": "log", "payload": {"i": i}})),
            )
            .await;
        assert_eq!(s, StatusCode::OK, "{body}");
        assert_eq!(body["attempt"], 1);
        seqs.push(body["seq"].as_u64().unwrap());
    }
    let (_, all) = srv.call(Method::GET, "/v1/rollouts/r/events", None).await;
    let payloads: Vec<&Value> = all["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| &e["payload"])
        .collect();
    assert_eq!(
        payloads,
        [&json!({"i": 0}), &json!({"i": 1}), &json!({"i": 2})]
    );
    let (_, tail) = srv
        .call(
            Method::GET,
            &format!("/v1/rollouts/r/events?after={}&limit=1", seqs[0]),
            None,
        )
        .await;
    let tail = tail["events"].as_array().unwrap();
    assert_eq!(tail.len(), 1);
    assert_eq!(tail[0]["seq"].as_u64(), Some(seqs[1]));

    srv.call(Method::POST, "/v1/rollouts/r/cancel", None).await;
    let (s, body) = srv
        .call(
            Method::POST,
            "/v1/rollouts/r/events",
            Some(json!({"kind": "log", "payload": 1})),
        )
        .await;
    error_type(s, &body, StatusCode::CONFLICT);
    let (s, body) = srv
        .call(
            Method::POST,
            "/v1/rollouts/nope/events",
            Some(json!({"kind": "log"})),
        )
        .await;
    assert_eq!(
        error_type(s, &body, StatusCode::NOT_FOUND),
        "not_found_error"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engines_register_list_remove() {
    let srv = start(with_key("adm")).await;
    let engine = json!({"name": "e1", "base_url": "http://127.0.0.1:9/v1/", "model": "m"});
    let (s, body) = srv.call(Method::POST, "/v1/engines", Some(engine)).await;
    assert_eq!(s, StatusCode::OK, "{body}");
    assert_eq!(body["base_url"], "http://127.0.0.1:9/v1");
    let (_, list) = srv.call(Method::GET, "/v1/engines", None).await;
    assert_eq!(list["engines"][0]["name"], "e1");
    let (s, _) = srv.call(Method::DELETE, "/v1/engines/e1", None).await;
    assert_eq!(s, StatusCode::OK);
    let (_, list) = srv.call(Method::GET, "/v1/engines", None).await;
    assert_eq!(list["engines"], json!([]));
    let (s, body) = srv.call(Method::DELETE, "/v1/engines/e1", None).await;
    error_type(s, &body, StatusCode::NOT_FOUND);
    let bad = json!({"name": "e2", "base_url": "ftp://x", "model": "m"});
    let (s, body) = srv.call(Method::POST, "/v1/engines", Some(bad)).await;
    error_type(s, &body, StatusCode::BAD_REQUEST);
    // The server root works as well as its /v1 URL: one stored form.
    let root = json!({"name": "e3", "base_url": "http://127.0.0.1:9", "model": "m"});
    let (s, body) = srv.call(Method::POST, "/v1/engines", Some(root)).await;
    assert_eq!(s, StatusCode::OK, "{body}");
    assert_eq!(body["base_url"], "http://127.0.0.1:9/v1");
}

/// What `agl train` calls besides rollouts and the proxy: a rollout's
/// export, and the weight versions it publishes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weight_versions_and_exports_over_the_api() {
    let srv = start(with_key("adm")).await;
    let (s, latest) = srv.call(Method::GET, "/v1/weights", None).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(latest["latest"], Value::Null);
    for version in [0, 1] {
        let body = json!({"version": version, "meta": {"step": version}});
        let (s, rec) = srv.call(Method::POST, "/v1/weights", Some(body)).await;
        assert_eq!(s, StatusCode::OK, "{rec}");
        assert_eq!(rec["version"], version);
    }
    let (_, latest) = srv.call(Method::GET, "/v1/weights", None).await;
    assert_eq!(latest["latest"]["version"], 1);
    assert_eq!(latest["latest"]["meta"], json!({"step": 1}));
    // A version is published once.
    let (s, body) = srv
        .call(Method::POST, "/v1/weights", Some(json!({"version": 1})))
        .await;
    error_type(s, &body, StatusCode::CONFLICT);

    let new = json!({"rollouts": [{"rollout_id": "x1", "group_id": "g", "input": {"q": 2}}]});
    let (s, _) = srv.call(Method::POST, "/v1/rollouts", Some(new)).await;
    assert_eq!(s, StatusCode::OK);
    let (s, exported) = srv.call(Method::GET, "/v1/rollouts/x1/export", None).await;
    assert_eq!(s, StatusCode::OK, "{exported}");
    let rollout: agl_wire::rollout::Rollout =
        serde_json::from_value(exported.clone()).expect("the rollout JSONL shape");
    assert_eq!(
        (rollout.id.as_str(), rollout.group_id.as_str()),
        ("x1", "g")
    );
    assert_eq!(exported["input"], json!({"q": 2}));
    let (s, body) = srv
        .call(Method::GET, "/v1/rollouts/nope/export", None)
        .await;
    error_type(s, &body, StatusCode::NOT_FOUND);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugin_routes_need_a_hosting_run_and_the_admin() {
    let srv = start(with_key("adm")).await;
    let (s, body) = srv.call(Method::GET, "/v1/plugins", None).await;
    assert!(
        error_type(s, &body, StatusCode::NOT_FOUND).contains("not_found"),
        "{body}"
    );
    let swap = json!({"path": "/tmp/x.wasm"});
    let (s, body) = srv
        .call(Method::POST, "/v1/plugins/reward", Some(swap.clone()))
        .await;
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("agl run"),
        "{body}"
    );
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, _) = srv
        .call_as(None, Method::POST, "/v1/plugins/reward", Some(swap))
        .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_resume_state_and_drain() {
    let srv = start(with_key("adm")).await;
    let (s, body) = srv.call(Method::POST, "/v1/proxy/pause", None).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(body["paused"], true);
    assert!(srv.control.paused());
    let (_, state) = srv.call(Method::GET, "/v1/proxy/state", None).await;
    assert_eq!(state["paused"], true);
    srv.call(Method::POST, "/v1/proxy/resume", None).await;
    assert!(!srv.control.paused());

    let guard = srv.control.register("r9", 3);
    let (_, state) = srv.call(Method::GET, "/v1/proxy/state", None).await;
    assert_eq!(state["in_flight"][0]["rollout_id"], "r9");
    let (_, metrics) = srv.call(Method::GET, "/metrics", None).await;
    assert!(
        metrics
            .as_str()
            .unwrap()
            .contains("agl_proxy_inflight_calls 1")
    );
    let (s, body) = srv
        .call(
            Method::POST,
            "/v1/proxy/drain",
            Some(json!({"timeout_ms": 20})),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(body["drained"], false);
    assert_eq!(body["in_flight"][0]["rollout_id"], "r9");
    assert_eq!(body["in_flight"][0]["attempt"], 3);

    // A long drain ends as soon as the call finishes.
    let waiting = {
        let http = srv.http.clone();
        let url = format!("{}/v1/proxy/drain", srv.base);
        tokio::spawn(async move {
            http.post(url)
                .bearer_auth("adm")
                .json(&json!({"timeout_ms": 600_000}))
                .send()
                .await
                .expect("send")
                .json::<Value>()
                .await
                .expect("json")
        })
    };
    drop(guard);
    let body = waiting.await.expect("join");
    assert_eq!(body["drained"], true);
    assert_eq!(body["in_flight"], json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_matrix() {
    let srv = start(with_key("adm")).await;
    let rs = srv.create(&["mine", "theirs"]).await;
    let token = rs[0]["token"].as_str().unwrap().to_string();
    let other = rs[1]["token"].as_str().unwrap().to_string();
    let t = Some(token.as_str());
    let ev = || Some(json!({"kind": "log", "payload": {"x": 1}}));

    let (s, _) = srv
        .call_as(t, Method::POST, "/v1/rollouts/mine/events", ev())
        .await;
    assert_eq!(s, StatusCode::OK);
    let (s, _) = srv
        .call_as(t, Method::GET, "/v1/rollouts/mine/events", None)
        .await;
    assert_eq!(s, StatusCode::OK);
    for (method, path, body) in [
        (Method::POST, "/v1/rollouts/theirs/events", ev()),
        (Method::GET, "/v1/rollouts/theirs/events", None),
        (Method::GET, "/v1/rollouts/mine", None),
        (Method::GET, "/v1/rollouts", None),
        (Method::POST, "/v1/proxy/pause", None),
        (Method::GET, "/v1/engines", None),
        (Method::GET, "/v1/rollouts/mine/export", None),
        (Method::GET, "/v1/weights", None),
        (Method::POST, "/v1/weights", Some(json!({"version": 7}))),
    ] {
        let (s, b) = srv.call_as(t, method, path, body).await;
        assert_eq!(
            error_type(s, &b, StatusCode::FORBIDDEN),
            "permission_error",
            "{path}"
        );
    }
    assert!(!srv.control.paused());
    // Agents cannot forge training data.
    let (s, b) = srv
        .call_as(
            t,
            Method::POST,
            "/v1/rollouts/mine/events",
            Some(json!({"kind": "model_request", "payload": {"api": "chat_completions"}})),
        )
        .await;
    error_type(s, &b, StatusCode::FORBIDDEN);
    // The other rollout's token is valid for it only.
    let (s, _) = srv
        .call_as(
            Some(&other),
            Method::GET,
            "/v1/rollouts/theirs/events",
            None,
        )
        .await;
    assert_eq!(s, StatusCode::OK);

    let forged = format!("{}00", &token[..token.len() - 2]);
    for bad in [
        None,
        Some("garbage"),
        Some("agl-rt-xyz"),
        Some(forged.as_str()),
        Some("ADM"),
    ] {
        let (s, b) = srv
            .call_as(bad, Method::GET, "/v1/rollouts/mine/events", None)
            .await;
        let kind = error_type(s, &b, StatusCode::UNAUTHORIZED);
        assert_eq!(kind, "authentication_error", "{bad:?}");
        let (s, b) = srv.call_as(bad, Method::GET, "/v1/rollouts", None).await;
        error_type(s, &b, StatusCode::UNAUTHORIZED);
    }
    // Health and metrics need no key.
    let (s, _) = srv.call_as(None, Method::GET, "/healthz", None).await;
    assert_eq!(s, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_admin_key_turns_auth_off() {
    let srv = start(GatewayConfig::default()).await;
    srv.create(&["r"]).await;
    let (s, _) = srv.call_as(None, Method::GET, "/v1/rollouts/r", None).await;
    assert_eq!(s, StatusCode::OK);
    let (s, _) = srv
        .call_as(Some("anything"), Method::POST, "/v1/proxy/pause", None)
        .await;
    assert_eq!(s, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_answers_in_the_openai_error_shape() {
    let srv = start(GatewayConfig {
        admin_key: Some("adm".into()),
        body_limit_bytes: 1024,
        ..GatewayConfig::default()
    })
    .await;
    srv.create(&["r"]).await;
    let cases: Vec<(Method, &str, Vec<u8>, StatusCode, &str)> = vec![
        (
            Method::POST,
            "/v1/rollouts",
            b"{\"rollouts\": [".to_vec(),
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
        ),
        (
            Method::POST,
            "/v1/rollouts",
            b"hello, not json".to_vec(),
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
        ),
        (
            Method::POST,
            "/v1/rollouts",
            b"{\"rollouts\": []}".to_vec(),
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
        ),
        (
            Method::POST,
            "/v1/rollouts",
            b"{\"rollouts\": [{\"mode\": \"eval\"}]}".to_vec(),
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
        ),
        (
            Method::POST,
            "/v1/rollouts",
            vec![b' '; 4096],
            StatusCode::PAYLOAD_TOO_LARGE,
            "request_too_large",
        ),
        (
            Method::PATCH,
            "/v1/rollouts/r",
            b"{\"attempt\": 1, \"status\": \"done\"}".to_vec(),
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
        ),
        (
            Method::PATCH,
            "/v1/rollouts/ghost",
            b"{\"attempt\": 1, \"status\": \"running\"}".to_vec(),
            StatusCode::NOT_FOUND,
            "not_found_error",
        ),
        (
            Method::GET,
            "/v1/rollouts/ghost",
            vec![],
            StatusCode::NOT_FOUND,
            "not_found_error",
        ),
        (
            Method::POST,
            "/v1/rollouts/ghost/cancel",
            vec![],
            StatusCode::NOT_FOUND,
            "not_found_error",
        ),
        (
            Method::GET,
            "/v1/rollouts?limit=abc",
            vec![],
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
        ),
        (
            Method::GET,
            "/v1/rollouts?status=done",
            vec![],
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
        ),
        (
            Method::GET,
            "/v1/rollouts?cursor=zzz",
            vec![],
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
        ),
        (
            Method::POST,
            "/v1/rollouts/r/retry",
            vec![],
            StatusCode::CONFLICT,
            "conflict_error",
        ),
        (
            Method::GET,
            "/v1/nothing/here",
            vec![],
            StatusCode::NOT_FOUND,
            "not_found_error",
        ),
        (
            Method::DELETE,
            "/v1/rollouts",
            vec![],
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request_error",
        ),
        (
            Method::PUT,
            "/healthz",
            vec![],
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request_error",
        ),
        (
            Method::POST,
            "/v1/proxy/drain",
            b"{\"timeout_ms\": -1}".to_vec(),
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
        ),
    ];
    for (method, path, body, want, kind) in cases {
        let (s, b) = srv.raw(method.clone(), path, body).await;
        assert_eq!(error_type(s, &b, want), kind, "{method} {path}");
    }
    let (_, metrics) = srv.call(Method::GET, "/metrics", None).await;
    let metrics = metrics.as_str().unwrap().to_string();
    assert!(
        metrics.contains(
            r#"agl_http_requests_total{route="/v1/rollouts/{id}",method="GET",status="404"} 1"#
        ),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"route="unmatched",method="GET",status="404"}"#),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_creates_and_appends_with_form_encoded_bodies() {
    let srv = start(with_key("adm")).await;
    let curl = |args: &[&str]| -> (String, Value) {
        let out = Command::new("curl")
            .args([
                "-sS",
                "-w",
                "\n%{http_code}",
                "-H",
                "Authorization: Bearer adm",
            ])
            .args(args)
            .output()
            .expect("run curl");
        let text = String::from_utf8(out.stdout).expect("utf8");
        let (body, code) = text.rsplit_once('\n').expect("status line");
        (
            code.to_string(),
            serde_json::from_str(body).unwrap_or(Value::String(body.into())),
        )
    };
    // curl -d sends form encoding; the body is still read as JSON.
    let url = format!("{}/v1/rollouts", srv.base);
    let (code, body) = curl(&[
        "-d",
        r#"{"rollouts":[{"rollout_id":"c1","input":[1,2]}]}"#,
        &url,
    ]);
    assert_eq!(code, "200", "{body}");
    assert_eq!(body["rollouts"][0]["input"], json!([1, 2]));
    let (code, body) = curl(&["-d", "{oops", &url]);
    assert_eq!(code, "400");
    assert_eq!(body["error"]["type"], "invalid_request_error");
    let ev = format!("{}/v1/rollouts/c1/events", srv.base);
    let (code, body) = curl(&["-d", r#"{"kind":"note","payload":"hi"}"#, &ev]);
    assert_eq!(code, "200", "{body}");
    let (code, body) = curl(&[&ev]);
    assert_eq!(code, "200");
    assert_eq!(body["events"][0]["payload"], "hi");
}
