//! `agl controller` (the real binary) against `agl serve` (the real
//! binary): SIGKILL the controller mid-run, start it again, and every
//! rollout still ends, with no (rollout, attempt) executed twice.

// Only the process helpers are used here.
#[allow(dead_code)]
use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::support::{pid_alive, wait_until};
use serde_json::{Value, json};

const AGL: &str = env!("CARGO_BIN_EXE_agl");
const KEY: &str = "k3y";

/// The port from the "listening" log line (which may carry ANSI colours).
fn port_from(line: &str) -> Option<u16> {
    let rest = &line[line.find("http://127.0.0.1:")? + "http://127.0.0.1:".len()..];
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

fn serve(dir: &std::path::Path) -> (Child, String) {
    // The store's retry budget is in the config.
    let mut child = Command::new(AGL)
        .arg("--config")
        .arg(dir.join("agl.toml"))
        .args(["serve", "--listen", "127.0.0.1:0", "--db"])
        .arg(dir.join("agl.db"))
        .env("AGL_ADMIN_KEY", KEY)
        .env_remove("AGL_CONFIG")
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn agl serve");
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let port = loop {
        let line = lines.next().expect("agl serve exited").expect("stderr");
        if let Some(p) = port_from(&line) {
            break p;
        }
    };
    std::thread::spawn(move || for _ in lines {});
    (child, format!("http://127.0.0.1:{port}"))
}

fn controller(dir: &std::path::Path, base: &str, log: &std::path::Path) -> Child {
    Command::new(AGL)
        .args(["--config"])
        .arg(dir.join("agl.toml"))
        .args(["controller", "--gateway", base])
        .env("AGL_ADMIN_KEY", KEY)
        .stderr(std::fs::File::create(log).expect("log file"))
        .spawn()
        .expect("spawn agl controller")
}

async fn rollouts(http: &reqwest::Client, base: &str) -> Vec<Value> {
    let page: Value = http
        .get(format!("{base}/v1/rollouts?limit=1000"))
        .bearer_auth(KEY)
        .send()
        .await
        .expect("list")
        .json()
        .await
        .expect("json");
    page["rollouts"].as_array().cloned().unwrap_or_default()
}

fn count(rs: &[Value], status: &str) -> usize {
    rs.iter().filter(|r| r["status"] == status).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_controller_restarts_and_every_rollout_converges() {
    let dir = tempfile::tempdir().expect("tempdir");
    let runs = dir.path().join("runs.log");
    // Each execution logs itself (with its pid) and works for a while.
    std::fs::write(
        dir.path().join("agl.toml"),
        format!(
            "[store]\nmax_system_retries = 3\n\
             [controller]\nrunner = \"local\"\nconcurrency = 4\ntimeout_secs = 60\n\
             kill_grace_secs = 1\npoll_interval_ms = 50\n\
             logs_dir = \"logs\"\n\
             command = 'echo \"$AGL_ROLLOUT_ID $AGL_ATTEMPT $$\" >> {}; sleep 0.4'\n",
            runs.display()
        ),
    )
    .expect("write config");
    let (mut server, base) = serve(dir.path());
    let http = reqwest::Client::new();
    let items: Vec<Value> = (0..24)
        .map(|i| json!({"rollout_id": format!("k-{i:02}"), "input": {"i": i}}))
        .collect();
    let created = http
        .post(format!("{base}/v1/rollouts"))
        .bearer_auth(KEY)
        .json(&json!({ "rollouts": items }))
        .send()
        .await
        .expect("create");
    assert!(created.status().is_success());

    let mut first = controller(dir.path(), &base, &dir.path().join("ctl1.log"));
    // Kill it while agents run and some rollouts are done.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let rs = rollouts(&http, &base).await;
        if count(&rs, "succeeded") >= 4 && count(&rs, "running") > 0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no progress: {rs:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    first.kill().expect("SIGKILL controller");
    first.wait().expect("reap");
    let orphaned = count(&rollouts(&http, &base).await, "running");
    assert!(orphaned > 0);

    let mut second = controller(dir.path(), &base, &dir.path().join("ctl2.log"));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    let final_states = loop {
        let rs = rollouts(&http, &base).await;
        if count(&rs, "succeeded") == 24 {
            break rs;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "did not converge: {rs:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    Command::new("kill")
        .args(["-TERM", &second.id().to_string()])
        .status()
        .expect("kill");
    assert!(second.wait().expect("wait").success());

    let lines = std::fs::read_to_string(&runs).expect("runs log");
    let mut per_attempt: HashMap<(String, u32), usize> = HashMap::new();
    let mut pids = Vec::new();
    for line in lines.lines() {
        let p: Vec<&str> = line.split(' ').collect();
        *per_attempt
            .entry((p[0].to_string(), p[1].parse().unwrap()))
            .or_default() += 1;
        pids.push(p[2].parse::<u32>().unwrap());
    }
    assert!(
        per_attempt.values().all(|&n| n == 1),
        "an attempt ran twice: {per_attempt:?}"
    );
    let retried: Vec<&Value> = final_states.iter().filter(|r| r["attempt"] != 1).collect();
    assert!(!retried.is_empty(), "the orphaned attempts were retried");
    for r in &retried {
        let id = r["id"].as_str().unwrap();
        let events: Value = http
            .get(format!("{base}/v1/rollouts/{id}/events?limit=1000"))
            .bearer_auth(KEY)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let failures: Vec<&Value> = events["events"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["kind"] == "failure")
            .collect();
        assert_eq!(
            failures[0]["payload"],
            json!({"kind": "system", "reason": "controller restarted"}),
            "{id}"
        );
        let executions = events["events"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["kind"] == "execution")
            .count();
        // At most one per attempt (a kill between spawn and record leaves one out).
        assert!(
            executions as u64 <= r["attempt"].as_u64().unwrap(),
            "{id}: executions"
        );
    }
    wait_until(Duration::from_secs(5), || {
        pids.iter().all(|&p| !pid_alive(p))
    })
    .await;
    assert!(
        pids.iter().all(|&p| !pid_alive(p)),
        "an agent outlived the controllers"
    );
    Command::new("kill")
        .args(["-TERM", &server.id().to_string()])
        .status()
        .expect("kill");
    server.wait().expect("wait");
}
