//! `/openapi.json`: valid OpenAPI 3.1 (checked by openapi-spec-validator
//! from the venv), one operation for every route the router serves and no
//! other, every secured operation naming schemes that exist, every error
//! answer in the error shape of its API.

use std::collections::BTreeSet;
use std::process::Command;

use agl_gateway::{Gateway, GatewayConfig};
use agl_store::Store;
use agl_testengine::{Faults, Reply, TestEngineConfig};
use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use serde_json::{Value, json};
use tower::ServiceExt;

use crate::process::python;
use crate::support::{ADMIN, start_local};

/// The methods a route may take (axum routes these; HEAD follows GET).
const METHODS: [Method; 5] = [
    Method::GET,
    Method::POST,
    Method::PUT,
    Method::PATCH,
    Method::DELETE,
];

fn gateway(dir: &tempfile::TempDir) -> Gateway {
    let store = Store::open(dir.path().join("agl.db")).expect("open store");
    let config = GatewayConfig {
        admin_key: Some(ADMIN.into()),
        ..GatewayConfig::default()
    };
    Gateway::new(store, config)
}

/// The document as `/openapi.json` serves it.
async fn served() -> Value {
    let local = start_local(TestEngineConfig::default(), GatewayConfig::default()).await;
    let resp = reqwest::get(format!("{}/openapi.json", local.base))
        .await
        .expect("GET /openapi.json");
    assert_eq!(resp.status(), 200);
    let kind = resp.headers()["content-type"].to_str().expect("type");
    assert!(kind.starts_with("application/json"), "{kind}");
    resp.json().await.expect("JSON")
}

#[tokio::test]
async fn the_served_document_is_valid_openapi_3_1() {
    let doc = served().await;
    assert!(
        doc["openapi"]
            .as_str()
            .is_some_and(|v| v.starts_with("3.1")),
        "{}",
        doc["openapi"]
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("openapi.json");
    std::fs::write(&path, doc.to_string()).expect("write");
    let out = Command::new(python())
        .args([
            "-c",
            "import json, sys\n\
             from openapi_spec_validator import validate, OpenAPIV31SpecValidator\n\
             validate(json.load(open(sys.argv[1])), cls=OpenAPIV31SpecValidator)\n\
             print('valid')",
        ])
        .arg(&path)
        .output()
        .expect("run openapi-spec-validator");
    assert!(
        out.status.success(),
        "openapi-spec-validator: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The paths in the router's own route table, as axum's `Debug` prints it
/// (`paths: {RouteId(0): "/healthz", ...}`); a quoted string that is no
/// route is weeded out by [`serves`].
fn router_paths(router: &axum::Router) -> BTreeSet<String> {
    let shown = format!("{router:?}");
    assert!(shown.contains("paths: {"), "axum's route table: {shown}");
    shown
        .split('"')
        .skip(1)
        .step_by(2)
        .filter(|quoted| quoted.starts_with('/'))
        .map(str::to_string)
        .collect()
}

/// `path` with each `{param}` filled in, as a request would name it.
fn concrete(path: &str) -> String {
    path.split('/')
        .map(|seg| match seg {
            "{attempt}" => "1",
            "{mode}" => "train",
            "{role}" => "adapter",
            s if s.starts_with('{') => "x",
            s => s,
        })
        .collect::<Vec<_>>()
        .join("/")
}

/// Whether the router serves `method` on `path` (its fallbacks answer
/// anything else: 404 `no route`, 405 `does not accept`).
async fn serves(router: &axum::Router, method: &Method, path: &str) -> bool {
    let req = Request::builder()
        .method(method.clone())
        .uri(concrete(path))
        .header("authorization", "Bearer wrong")
        .body(Body::empty())
        .expect("request");
    let resp = router.clone().oneshot(req).await.expect("answer");
    let status = resp.status();
    let body = axum::body::to_bytes(resp.into_body(), 1 << 20)
        .await
        .expect("body");
    let text = String::from_utf8_lossy(&body);
    let fallback = (status == StatusCode::NOT_FOUND && text.contains("no route for"))
        || (status == StatusCode::METHOD_NOT_ALLOWED && text.contains("does not accept"));
    !fallback
}

#[tokio::test]
async fn every_route_the_router_serves_is_described_and_no_other() {
    let dir = tempfile::tempdir().expect("tempdir");
    let gateway = gateway(&dir);
    let router = gateway.router();
    let doc = serde_json::to_value(gateway.openapi()).expect("document");
    let described: BTreeSet<(String, String)> = doc["paths"]
        .as_object()
        .expect("paths")
        .iter()
        .flat_map(|(path, item)| {
            let item = item.as_object().expect("path item");
            item.keys()
                .filter(|m| METHODS.iter().any(|k| k.as_str().eq_ignore_ascii_case(m)))
                .map(|m| (path.clone(), m.to_ascii_uppercase()))
                .collect::<Vec<_>>()
        })
        .collect();
    let paths = router_paths(&router);
    assert!(paths.len() >= 30, "the route table: {paths:?}");
    let mut served = BTreeSet::new();
    for path in &paths {
        for method in &METHODS {
            if serves(&router, method, path).await {
                served.insert((path.clone(), method.as_str().to_string()));
            }
        }
    }
    let undescribed: Vec<_> = served.difference(&described).collect();
    assert!(
        undescribed.is_empty(),
        "served without a description in /openapi.json: {undescribed:?}"
    );
    let unserved: Vec<_> = described.difference(&served).collect();
    assert!(
        unserved.is_empty(),
        "described but not served: {unserved:?}"
    );
    // The proxy routes and the management API's families are all there.
    for path in [
        "/v1/rollouts/{id}/events",
        "/v1/proxy/drain",
        "/v1/plugins/{role}",
        "/proxy/{rollout_id}/{attempt}/{mode}/openai/v1/chat/completions",
        "/proxy/{rollout_id}/{attempt}/{mode}/openai/v1/responses",
        "/proxy/{rollout_id}/{attempt}/{mode}/anthropic/v1/messages/count_tokens",
        "/metrics",
        "/ui",
        "/openapi.json",
    ] {
        assert!(paths.contains(path), "{path} not routed");
    }
}

/// Whether `schema` is the schema `target` names, or an `anyOf` of it.
fn admits(doc: &Value, schema: &Value, target: &str) -> bool {
    if let Some(name) = schema["$ref"].as_str() {
        if name == target {
            return true;
        }
        let component = name.rsplit('/').next().unwrap_or_default();
        return admits(doc, &doc["components"]["schemas"][component], target);
    }
    schema["anyOf"]
        .as_array()
        .is_some_and(|items| items.iter().any(|s| admits(doc, s, target)))
}

/// Each operation's security, and the error shape of every error answer.
#[tokio::test]
async fn operations_name_their_auth_and_their_api_s_error_shape() {
    let dir = tempfile::tempdir().expect("tempdir");
    let doc = serde_json::to_value(gateway(&dir).openapi()).expect("document");
    let schemes = doc["components"]["securitySchemes"]
        .as_object()
        .expect("security schemes");
    let public = ["/healthz", "/metrics", "/openapi.json", "/ui"];
    let mut operations = 0;
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for (method, op) in item.as_object().expect("item") {
            let here = format!("{method} {path}");
            operations += 1;
            let security = op["security"].as_array().cloned().unwrap_or_default();
            if public.iter().any(|p| path.starts_with(p)) {
                assert!(security.is_empty(), "{here} is public");
            } else {
                assert!(!security.is_empty(), "{here} names no auth");
                for requirement in &security {
                    for name in requirement.as_object().expect("requirement").keys() {
                        assert!(schemes.contains_key(name), "{here}: no scheme {name}");
                    }
                }
                assert!(op["responses"].get("401").is_some(), "{here}: 401");
            }
            let shape = if path.contains("/anthropic/") {
                "#/components/schemas/AnthropicErrorBody"
            } else {
                "#/components/schemas/ErrorBody"
            };
            for (status, resp) in op["responses"].as_object().expect("responses") {
                // A common answer is a reference to the document's own.
                let resp = match resp["$ref"].as_str() {
                    Some(at) => {
                        let name = at.strip_prefix("#/components/responses/").expect(at);
                        &doc["components"]["responses"][name]
                    }
                    None => resp,
                };
                let schema = &resp["content"]["application/json"]["schema"];
                if status.starts_with('2') {
                    continue;
                }
                // What an engine answered goes through as it was.
                let own = if status == "4XX" {
                    "#/components/schemas/EngineError"
                } else {
                    shape
                };
                assert!(admits(&doc, schema, own), "{here} {status}: {schema}");
            }
        }
    }
    assert!(operations >= 35, "{operations} operations");
    let admin = &doc["paths"]["/v1/rollouts"]["post"]["security"];
    assert_eq!(admin, &serde_json::json!([{"admin_key": []}]));
    let events = &doc["paths"]["/v1/rollouts/{id}/events"]["post"]["security"];
    assert_eq!(
        events,
        &serde_json::json!([{"admin_key": []}, {"rollout_token": []}])
    );
}

#[tokio::test]
async fn the_viewer_links_the_description() {
    let local = start_local(TestEngineConfig::default(), GatewayConfig::default()).await;
    let page = reqwest::get(format!("{}/ui", local.base))
        .await
        .expect("GET /ui")
        .text()
        .await
        .expect("page");
    assert!(page.contains("href=\"/openapi.json\""), "{page}");
}

/// An Anthropic error body, as the description promises on those routes.
fn anthropic_error(body: &Value, kind: &str) {
    assert_eq!(body["type"], "error", "{body}");
    assert_eq!(body["error"]["type"], kind, "{body}");
    assert!(body["error"]["message"].is_string(), "{body}");
}

/// Regressions: three answers on the Anthropic routes came in OpenAI's
/// error shape, not the one the description names for them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_routes_answer_every_error_in_anthropic_s_shape() {
    let dir = tempfile::tempdir().expect("tempdir");
    let local = crate::harness::start(dir.path(), |_| Reply::text("hi")).await;
    let http = reqwest::Client::new();
    let body = json!({"model": "m", "max_tokens": 8,
                      "messages": [{"role": "user", "content": "hello"}]});
    // The engine fails every try: 502.
    local.engine.set_faults(Faults {
        fail_next: 100,
        fail_status: 500,
        ..Faults::default()
    });
    let url = format!("{}/proxy/r1/1/train/anthropic/v1/messages", local.base);
    let resp = http
        .post(&url)
        .header("x-api-key", ADMIN)
        .json(&body)
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), 502);
    anthropic_error(&resp.json().await.expect("json"), "api_error");
    local.engine.set_faults(Faults::default());
    // A path whose attempt is no number: 400.
    for route in ["messages", "messages/count_tokens", "models"] {
        let url = format!("{}/proxy/r1/one/train/anthropic/v1/{route}", local.base);
        let req = if route == "models" {
            http.get(&url)
        } else {
            http.post(&url).json(&body)
        };
        let resp = req.header("x-api-key", ADMIN).send().await.expect("send");
        assert_eq!(resp.status(), 400, "{route}");
        anthropic_error(&resp.json().await.expect("json"), "invalid_request_error");
    }
    // With auth off, a foreign Host is refused before any handler: 403.
    let gateway = Gateway::new(
        Store::open(dir.path().join("open.db")).expect("store"),
        GatewayConfig::default(),
    );
    let req = Request::post("/proxy/r1/1/train/anthropic/v1/messages")
        .header("host", "evil.example")
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .expect("request");
    let resp = gateway.router().oneshot(req).await.expect("answer");
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20)
        .await
        .expect("body");
    anthropic_error(
        &serde_json::from_slice(&bytes).expect("json"),
        "permission_error",
    );
}

/// Regressions from schemathesis' data checks: the model lists answered
/// 200 for a rollout or a mode there is not (a call there is a 404), and
/// an empty `cursor` was a 400 where every other empty filter means none.
#[tokio::test]
async fn model_lists_need_a_rollout_and_an_empty_cursor_is_the_first_page() {
    let local = start_local(TestEngineConfig::default(), GatewayConfig::default()).await;
    local.running(&["r1".into()]).await;
    let http = reqwest::Client::new();
    for (path, want) in [
        ("/proxy/r1/1/train/openai/v1/models", 200),
        ("/proxy/r1/1/train/anthropic/v1/models", 200),
        ("/proxy/r1/1/other/openai/v1/models", 404),
        ("/proxy/nope/1/train/openai/v1/models", 404),
        ("/proxy/nope/1/train/anthropic/v1/models", 404),
    ] {
        let resp = http
            .get(format!("{}{path}", local.base))
            .bearer_auth(ADMIN)
            .send()
            .await
            .expect("send");
        assert_eq!(resp.status(), want, "{path}");
        let body: Value = resp.json().await.expect("json");
        if want == 404 && path.contains("/anthropic/") {
            anthropic_error(&body, "not_found_error");
        } else if want == 404 {
            assert_eq!(body["error"]["type"], "not_found_error", "{body}");
        }
    }
    let page: Value = http
        .get(format!("{}/v1/rollouts?cursor=&limit=10", local.base))
        .bearer_auth(ADMIN)
        .send()
        .await
        .expect("send")
        .json()
        .await
        .expect("json");
    assert_eq!(page["rollouts"][0]["id"], "r1", "{page}");
}
