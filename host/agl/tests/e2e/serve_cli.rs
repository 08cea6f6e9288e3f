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
            .any(|l| l.starts_with("cli-1") && l.contains("queued")),
        "{ls}"
    );
    let show: Value = serde_json::from_str(&run(&["rollouts", "show", "cli-1"])).expect("json");
    assert_eq!(show["mode"], "val");
    let export = run(&["rollouts", "export"]);
    let rec: Value = serde_json::from_str(export.trim()).expect("one JSONL line");
    assert_eq!(rec["id"], "cli-1");
    assert_eq!(rec["input"], json!({"q": 1}));
}
