//! kill -9 of `agl serve` under concurrent proxy load, then a restart on the
//! same store: every call whose response a client fully received must be in
//! the store, with its token ids. Once with two dozen agents alternating
//! streamed and whole answers, once with a thousand streaming agents at
//! once.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::{ADMIN, spawn_serve};
use agl_testengine::{Faults, Reply, TestEngine, TestEngineConfig, tokens};
use serde_json::{Value, json};

const REPLY: &str = "ok, done";

/// Whether call `i` of an agent is streamed.
type Streamed = fn(usize) -> bool;

/// Posts calls back to back on one rollout until the server goes away;
/// returns the markers of the calls whose response arrived in full.
async fn client(
    url: String,
    token: String,
    tag: usize,
    streamed: Streamed,
    done: Arc<Mutex<BTreeSet<String>>>,
) {
    let http = reqwest::Client::new();
    for i in 0.. {
        let marker = format!("call {tag}-{i}");
        let stream = streamed(i);
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
    kill_under_load(24, 300, |i| i % 2 == 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_amid_a_thousand_streaming_agents_loses_no_received_call() {
    // Bounded: a stalled gateway fails the test instead of hanging CI.
    let run = kill_under_load(1000, 1500, |_| true);
    tokio::time::timeout(Duration::from_secs(240), run)
        .await
        .expect("1,000 agents, a kill and a restart within 4 minutes");
}

/// `clients` agents on their own rollouts; SIGKILL once `kill_after` calls
/// were received in full; restart and look every received call up.
async fn kill_under_load(clients: usize, kill_after: usize, streamed: Streamed) {
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
    let rollouts: Vec<Value> = (0..clients)
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
    // Every rollout running first, then every agent at once.
    let views = created["rollouts"].as_array().expect("list").clone();
    let mut patches = tokio::task::JoinSet::new();
    for r in &views {
        let url = format!(
            "{}/v1/rollouts/{}",
            served.base,
            r["id"].as_str().expect("id")
        );
        let patch = admin(http.patch(url)).json(&json!({"attempt": 1, "status": "running"}));
        patches.spawn(async move { patch.send().await.expect("patch").status() });
    }
    while let Some(status) = patches.join_next().await {
        assert!(status.expect("patch task").is_success());
    }
    let done = Arc::new(Mutex::new(BTreeSet::new()));
    let mut tasks = Vec::new();
    for (i, r) in views.iter().enumerate() {
        let url = format!(
            "{}/chat/completions",
            r["proxy_base_url"].as_str().expect("url")
        );
        let token = r["token"].as_str().expect("token").to_string();
        tasks.push(tokio::spawn(client(url, token, i, streamed, done.clone())));
    }
    // Let load build up, then SIGKILL mid-traffic.
    while done.lock().unwrap().len() < kill_after {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut served = served;
    served.child.kill().expect("SIGKILL agl serve");
    served.child.wait().expect("reap");
    for t in tasks {
        t.await.expect("client task");
    }
    let received = done.lock().unwrap().clone();
    assert!(received.len() >= kill_after);

    // Restart on the same file and read every rollout back over the API.
    let served = spawn_serve(&db);
    let mut reads = tokio::task::JoinSet::new();
    for i in 0..clients {
        reads.spawn(recorded_calls(
            http.clone(),
            served.base.clone(),
            format!("d{i}"),
        ));
    }
    let mut recorded = BTreeSet::new();
    while let Some(markers) = reads.join_next().await {
        recorded.extend(markers.expect("read task"));
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

/// The markers of rollout `id`'s recorded, successful calls, read over the
/// API page by page; checks each call's token ids on the way.
async fn recorded_calls(http: reqwest::Client, base: String, id: String) -> Vec<String> {
    let mut markers = Vec::new();
    let mut after = 0;
    loop {
        let url = format!("{base}/v1/rollouts/{id}/events?after={after}&limit=1000");
        let resp = http
            .get(url)
            .bearer_auth(ADMIN)
            .send()
            .await
            .expect("events");
        assert!(resp.status().is_success(), "{resp:?}");
        let page: Value = resp.json().await.expect("json");
        let events = page["events"].as_array().expect("events").clone();
        if events.is_empty() {
            return markers;
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
            markers.push(marker.to_string());
        }
    }
}
