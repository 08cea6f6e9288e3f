//! kill -9 of `agl serve` under concurrent proxy load, then a restart on the
//! same store: every call whose response a client fully received must be in
//! the store, with its token ids.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::{ADMIN, spawn_serve};
use agl_testengine::{Faults, Reply, TestEngine, TestEngineConfig, tokens};
use serde_json::{Value, json};

const CLIENTS: usize = 24;
const REPLY: &str = "ok, done";

/// Posts calls back to back on one rollout (alternating streamed and not)
/// until the server goes away; returns the markers of the calls whose
/// response arrived in full.
async fn client(url: String, token: String, tag: usize, done: Arc<Mutex<BTreeSet<String>>>) {
    let http = reqwest::Client::new();
    for i in 0.. {
        let marker = format!("call {tag}-{i}");
        let stream = i % 2 == 1;
        let sent = http
            .post(&url)
            .bearer_auth(&token)
            .json(&json!({
                "model": "m",
                "stream": stream,
                "messages": [{"role": "user", "content": marker}]
            }))
            .send()
            .await;
        let Ok(resp) = sent else { return };
        if resp.status() != 200 {
            return;
        }
        let Ok(body) = resp.text().await else { return };
        let complete = if stream {
            body.ends_with("data: [DONE]\n\n")
        } else {
            serde_json::from_str::<Value>(&body).is_ok_and(|v| v["choices"].is_array())
        };
        if !complete {
            return;
        }
        done.lock().unwrap().insert(marker);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_under_load_loses_no_received_call() {
    // Small per-chunk latency so streams are mid-flight at the kill.
    let engine = TestEngine::start(
        TestEngineConfig::default()
            .with_replies([Reply::text(REPLY)])
            .with_faults(Faults {
                chunk_latency: Duration::from_millis(1),
                ..Faults::default()
            }),
    )
    .await
    .expect("engine");
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("agl.db");
    let served = spawn_serve(&db);
    let http = reqwest::Client::new();
    let admin = |r: reqwest::RequestBuilder| r.bearer_auth(ADMIN);
    let ok = |r: reqwest::Response| {
        assert!(r.status().is_success(), "{r:?}");
        r
    };
    ok(admin(http.post(format!("{}/v1/engines", served.base)))
        .json(&json!({"name": "e1", "base_url": engine.base_url(), "model": "served"}))
        .send()
        .await
        .expect("register engine"));
    let rollouts: Vec<Value> = (0..CLIENTS)
        .map(|i| json!({"rollout_id": format!("d{i}"), "mode": "train"}))
        .collect();
    let created: Value = ok(admin(http.post(format!("{}/v1/rollouts", served.base)))
        .json(&json!({ "rollouts": rollouts }))
        .send()
        .await
        .expect("create"))
    .json()
    .await
    .expect("json");
    let done = Arc::new(Mutex::new(BTreeSet::new()));
    let mut tasks = Vec::new();
    for (i, r) in created["rollouts"]
        .as_array()
        .expect("list")
        .iter()
        .enumerate()
    {
        let id = r["id"].as_str().expect("id").to_string();
        ok(
            admin(http.patch(format!("{}/v1/rollouts/{id}", served.base)))
                .json(&json!({"attempt": 1, "status": "running"}))
                .send()
                .await
                .expect("patch"),
        );
        let url = format!(
            "{}/chat/completions",
            r["proxy_base_url"].as_str().expect("url")
        );
        let token = r["token"].as_str().expect("token").to_string();
        tasks.push(tokio::spawn(client(url, token, i, done.clone())));
    }

    // Let load build up, then SIGKILL mid-traffic.
    while done.lock().unwrap().len() < 300 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut served = served;
    served.child.kill().expect("SIGKILL agl serve");
    served.child.wait().expect("reap");
    for t in tasks {
        t.await.expect("client task");
    }
    let received = done.lock().unwrap().clone();
    assert!(received.len() >= 300);

    // Restart on the same file and read every rollout back over the API.
    let served = spawn_serve(&db);
    let mut recorded = BTreeSet::new();
    for i in 0..CLIENTS {
        let mut after = 0;
        loop {
            let page: Value = ok(admin(http.get(format!(
                "{}/v1/rollouts/d{i}/events?after={after}&limit=1000",
                served.base
            )))
            .send()
            .await
            .expect("events"))
            .json()
            .await
            .expect("json");
            let events = page["events"].as_array().expect("events").clone();
            if events.is_empty() {
                break;
            }
            for e in &events {
                after = e["seq"].as_u64().expect("seq");
                let p = &e["payload"];
                if e["kind"] != "model_request" || p["status"] != "ok" {
                    continue;
                }
                let ids: Vec<u32> = serde_json::from_value(p["response_ids"].clone()).expect("ids");
                assert_eq!(ids, tokens::encode(REPLY), "recorded token ids");
                let marker = p["request"]["messages"][0]["content"]
                    .as_str()
                    .expect("marker");
                recorded.insert(marker.to_string());
            }
        }
    }
    let lost: Vec<_> = received.difference(&recorded).collect();
    assert!(
        lost.is_empty(),
        "{} of {} fully received calls missing after kill -9: {lost:?}",
        lost.len(),
        received.len()
    );
    drop(served);
}
