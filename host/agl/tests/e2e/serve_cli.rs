//! `agl serve` and `agl rollouts` as a user runs them: the real binary, a
//! free port, the admin key from the environment, SIGTERM to stop.

use std::process::Command;

use serde_json::{Value, json};

use crate::support::{ADMIN, AGL, spawn_serve};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_then_read_back_with_the_rollouts_commands() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("agl.db");
    let mut served = spawn_serve(&db);
    let base = served.base.clone();
    let http = reqwest::Client::new();
    let unauth = http
        .get(format!("{base}/v1/rollouts"))
        .send()
        .await
        .expect("send");
    assert_eq!(unauth.status(), 401);
    let created: Value = http
        .post(format!("{base}/v1/rollouts"))
        .bearer_auth(ADMIN)
        .json(&json!({"rollouts": [{"rollout_id": "cli-1", "mode": "val", "input": {"q": 1}}]}))
        .send()
        .await
        .expect("send")
        .json()
        .await
        .expect("json");
    assert_eq!(
        created["rollouts"][0]["proxy_base_url"],
        format!("{base}/proxy/cli-1/1/val/openai/v1")
    );
    // Two recorded calls, the second continuing the first.
    let admin_post = |path: String, body: Value| {
        http.post(format!("{base}{path}"))
            .bearer_auth(ADMIN)
            .json(&body)
            .send()
    };
    let patch = http
        .patch(format!("{base}/v1/rollouts/cli-1"))
        .bearer_auth(ADMIN)
        .json(&json!({"attempt": 1, "status": "running"}))
        .send()
        .await
        .expect("patch");
    assert!(patch.status().is_success());
    let mut seqs = Vec::new();
    for continues in [None, Some(0)] {
        let mut call =
            json!({"api": "chat_completions", "prompt_ids": [1, 2, 3], "response_ids": [4]});
        if let Some(i) = continues {
            call["continues"] = json!(seqs[i]);
        }
        let resp = admin_post(
            "/v1/rollouts/cli-1/events".into(),
            json!({"kind": "model_request", "payload": call}),
        )
        .await
        .expect("event");
        assert!(resp.status().is_success());
        let v: Value = resp.json().await.expect("json");
        seqs.push(v["seq"].as_u64().expect("seq"));
    }

    let kill = Command::new("kill")
        .args(["-TERM", &served.child.id().to_string()])
        .status()
        .expect("kill");
    assert!(kill.success());
    let status = served.child.wait().expect("wait");
    assert!(status.success(), "agl serve exited with {status}");

    let run = |args: &[&str]| {
        let out = Command::new(AGL)
            .args(args)
            .arg("--db")
            .arg(&db)
            .output()
            .expect("run agl");
        assert!(out.status.success(), "{args:?}: {out:?}");
        String::from_utf8(out.stdout).expect("utf8")
    };
    let ls = run(&["rollouts", "ls"]);
    assert!(
        ls.lines()
            .any(|l| l.starts_with("cli-1") && l.contains("running")),
        "{ls}"
    );
    let show: Value = serde_json::from_str(&run(&["rollouts", "show", "cli-1"])).expect("json");
    assert_eq!(show["mode"], "val");
    let calls = show["calls"].as_array().expect("calls");
    assert_eq!(calls.len(), 2, "{show}");
    assert_eq!(calls[0]["continues"], Value::Null);
    assert_eq!(calls[1]["continues"], json!(seqs[0]));
    assert_eq!(calls[1]["prompt_tokens"], 3);
    let export = run(&["rollouts", "export"]);
    let rec: Value = serde_json::from_str(export.trim()).expect("one JSONL line");
    assert_eq!(rec["id"], "cli-1");
    assert_eq!(rec["input"], json!({"q": 1}));
}
