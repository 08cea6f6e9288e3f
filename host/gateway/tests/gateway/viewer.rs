//! The viewer's routes: `/ui` and its assets, `GET /v1/steps` over a run's
//! `metrics.jsonl` (missing, torn, broken), `GET /v1/rollouts/{id}/samples`
//! through a hosted `SampleViewer` (and without one).

use std::sync::Arc;

use agl_gateway::{Gateway, GatewayConfig, PluginFuture, SampleViewer};
use agl_store::{Mode, NewRollout, Store};
use agl_wire::api::{SampleList, SampleView};
use agl_wire::rollout::{Rollout, Sample, Span};
use serde_json::Value;

use crate::support::ADMIN;

/// One sample per call, its whole response trained; ids decode as `<id>`.
struct PerCall;

impl SampleViewer for PerCall {
    fn samples(&self, rollout: Rollout) -> PluginFuture<'_, SampleList> {
        Box::pin(async move {
            let sample = Sample {
                prompt_ids: vec![1],
                response_ids: vec![2, 3],
                trainable: vec![Span { start: 0, end: 1 }],
                logprobs: vec![0.0; 2],
                source_calls: vec![0],
                weight_version: 0,
                agent: None,
                break_before: None,
            };
            let decode = |ids: &[u32]| ids.iter().map(|i| format!("<{i}>")).collect();
            Ok(SampleList {
                rollout_id: rollout.id.clone(),
                adapter: "per-call 1".into(),
                reward: Some(0.5),
                reward_source: "harness".into(),
                reward_error: None,
                trained_tokens: 1,
                samples: vec![SampleView::of(0, &sample, &decode)],
            })
        })
    }
}

async fn start(viewer: bool) -> (String, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("agl.db")).unwrap();
    store
        .create_rollouts(vec![NewRollout {
            id: Some("r1".into()),
            group_id: "g".into(),
            mode: Mode::Train,
            input: Default::default(),
            config: Default::default(),
        }])
        .await
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let config = GatewayConfig {
        listen: addr.to_string(),
        admin_key: Some(ADMIN.into()),
        ..GatewayConfig::default()
    };
    let mut gateway =
        Gateway::new(store, config).with_metrics_file(dir.path().join("metrics.jsonl"));
    if viewer {
        gateway = gateway.with_sample_viewer(Arc::new(PerCall));
    }
    tokio::spawn(gateway.serve(listener, std::future::pending()));
    (format!("http://{addr}"), dir)
}

async fn get(url: String) -> (u16, Value) {
    let resp = reqwest::Client::new()
        .get(url)
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    (
        resp.status().as_u16(),
        resp.json().await.unwrap_or(Value::Null),
    )
}

#[tokio::test]
async fn steps_come_from_the_runs_metrics_file() {
    let (base, dir) = start(false).await;
    let (status, body) = get(format!("{base}/v1/steps")).await;
    assert_eq!(
        (status, body["steps"].as_array().unwrap().len()),
        (200, 0),
        "no file yet"
    );
    let file = dir.path().join("metrics.jsonl");
    std::fs::write(
        &file,
        "{\"step\": 0, \"val_reward\": 0.25}\n{\"step\": 1, \"reward_mean\": 0.5}\n{\"st",
    )
    .unwrap();
    let (status, body) = get(format!("{base}/v1/steps")).await;
    assert_eq!(status, 200);
    let steps: Vec<u64> = body["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["step"].as_u64().unwrap())
        .collect();
    assert_eq!(steps, [0, 1], "a torn last line is skipped");
    assert_eq!(body["steps"][0]["val_reward"], 0.25);
    std::fs::write(&file, "{\"step\": 0}\nnot json\n{\"step\": 1}\n").unwrap();
    let (status, body) = get(format!("{base}/v1/steps")).await;
    assert_eq!(status, 500);
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("line 2"), "{message}");
}

#[tokio::test]
async fn samples_come_from_the_hosted_viewer() {
    let (base, _dir) = start(false).await;
    let (status, body) = get(format!("{base}/v1/rollouts/r1/samples")).await;
    assert_eq!(status, 404);
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("plugins.adapter"),
        "{body}"
    );

    let (base, _dir) = start(true).await;
    let (status, body) = get(format!("{base}/v1/rollouts/r1/samples")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["rollout_id"], "r1");
    assert_eq!(body["samples"][0]["segments"][0]["text"], "<2>");
    assert_eq!(body["samples"][0]["segments"][1]["trained"], false);
    let (status, _) = get(format!("{base}/v1/rollouts/nope/samples")).await;
    assert_eq!(status, 404);

    // The page and its assets, each with its type; no key needed for them.
    for (path, kind) in [
        ("/ui", "text/html"),
        ("/ui/app.js", "text/javascript"),
        ("/ui/style.css", "text/css"),
    ] {
        let resp = reqwest::get(format!("{base}{path}")).await.unwrap();
        assert_eq!(resp.status(), 200, "{path}");
        let ct = resp.headers()["content-type"].to_str().unwrap().to_string();
        assert!(ct.starts_with(kind), "{path}: {ct}");
    }
}
