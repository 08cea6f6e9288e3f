//! `agl serve` and `agl rollouts` as a user runs them: the real binary, a
//! free port, the admin key from the environment, SIGTERM to stop.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use serde_json::{Value, json};

const AGL: &str = env!("CARGO_BIN_EXE_agl");

/// The port from the "listening" log line (which may carry ANSI colours).
fn port_from(line: &str) -> Option<u16> {
    let rest = &line[line.find("http://127.0.0.1:")? + "http://127.0.0.1:".len()..];
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_then_read_back_with_the_rollouts_commands() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("agl.db");
    let mut child = Command::new(AGL)
        .args(["serve", "--listen", "127.0.0.1:0", "--db"])
        .arg(&db)
        .env("AGL_ADMIN_KEY", "k3y")
        .env_remove("AGL_CONFIG")
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn agl serve");
    let stderr = child.stderr.take().expect("stderr");
    let mut lines = BufReader::new(stderr).lines();
    let port = loop {
        let line = lines
            .next()
            .expect("agl serve exited before listening")
            .expect("read stderr");
        if let Some(p) = port_from(&line) {
            break p;
        }
    };
    // Keep draining stderr so the server never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});

    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    let unauth = http
        .get(format!("{base}/v1/rollouts"))
        .send()
        .await
        .expect("send");
    assert_eq!(unauth.status(), 401);
    let created: Value = http
        .post(format!("{base}/v1/rollouts"))
        .bearer_auth("k3y")
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
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(kill.success());
    let status = child.wait().expect("wait");
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
