//! `/openapi.json` fuzzed: schemathesis (pinned in deploy/setup.sh) against
//! a live `agl serve` with auth on and a test engine registered, a bounded
//! number of examples per operation (`AGL_FUZZ_EXAMPLES`, default 200;
//! `tests/fuzz_api.sh` runs the same with more; `AGL_FUZZ_SEED`,
//! `AGL_FUZZ_CHECKS` change the seed and the checks). Every answer must be
//! no 5xx, of a documented status and content type, and valid against its
//! schema (errors included: the documented error shapes); the store must
//! pass SQLite's integrity check afterwards.
//!
//! `POST /v1/engines` is left out: a registered engine is where the proxy
//! sends calls and where the gateway asks for `/v1/models`, and a fuzzer
//! must not aim the gateway at addresses off this machine.

use std::process::Command;

use agl_testengine::{TestEngine, TestEngineConfig};
use serde_json::json;

use crate::support::{ADMIN, python, repo_root, spawn_serve};

/// The engine the fuzzed gateway sends calls to (a name no generator guesses).
const ENGINE: &str = "fuzz-engine-7d1c";

/// What the run found, from schemathesis' summary.
struct Figures {
    operations: String,
    test_cases: String,
}

fn figures(output: &str) -> Figures {
    let after = |key: &str| {
        output
            .lines()
            .skip_while(|l| !l.trim_start().starts_with(key))
            .nth(1)
            .map(|l| l.trim().to_string())
            .unwrap_or_default()
    };
    Figures {
        operations: output
            .lines()
            .find(|l| l.trim_start().starts_with("Selected:"))
            .map(|l| l.trim().to_string())
            .unwrap_or_default(),
        test_cases: after("Test cases:"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schemathesis_finds_nothing_against_agl_serve() {
    let examples = std::env::var("AGL_FUZZ_EXAMPLES").unwrap_or_else(|_| "200".into());
    let seed = std::env::var("AGL_FUZZ_SEED").unwrap_or_else(|_| "20240934".into());
    let checks = std::env::var("AGL_FUZZ_CHECKS").unwrap_or_else(|_| {
        "not_a_server_error,status_code_conformance,content_type_conformance,\
         response_schema_conformance"
            .into()
    });
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("agl.db");
    let engine = TestEngine::start(TestEngineConfig::default())
        .await
        .expect("test engine");
    let mut served = spawn_serve(&db);
    let base = served.base.clone();
    let http = reqwest::Client::new();
    let registration = json!({"name": ENGINE, "base_url": engine.base_url(), "model": "policy"});
    let registered = http
        .post(format!("{base}/v1/engines"))
        .bearer_auth(ADMIN)
        .json(&registration)
        .send()
        .await
        .expect("register the engine");
    assert!(registered.status().is_success(), "{registered:?}");
    // A running rollout, so calls with its id reach the engine.
    for body in [
        json!({"rollouts": [{"id": "fuzz-1", "input": {"q": 1}}]}),
        json!({"rollouts": [{"id": "fuzz-2", "mode": "val"}]}),
    ] {
        let created = http
            .post(format!("{base}/v1/rollouts"))
            .bearer_auth(ADMIN)
            .json(&body)
            .send()
            .await
            .expect("create");
        assert!(created.status().is_success());
    }
    let running = http
        .patch(format!("{base}/v1/rollouts/fuzz-1"))
        .bearer_auth(ADMIN)
        .json(&json!({"attempt": 1, "status": "running"}))
        .send()
        .await
        .expect("patch");
    assert!(running.status().is_success());

    let schemathesis = python().parent().expect("venv bin").join("schemathesis");
    let mut cmd = Command::new(schemathesis);
    // The hooks keep the engine registered and the proxy serving.
    cmd.current_dir(dir.path())
        .env(
            "SCHEMATHESIS_HOOKS",
            repo_root().join("tests/python/fuzz_hooks.py"),
        )
        .env("AGL_FUZZ_BASE", &base)
        .env("AGL_FUZZ_ADMIN_KEY", ADMIN)
        .env("AGL_FUZZ_ENGINE", registration.to_string())
        .arg("--config-file")
        .arg(repo_root().join("tests/python/fuzz_api.toml"))
        .args(["run", &format!("{base}/openapi.json")])
        .args(["--header", &format!("Authorization: Bearer {ADMIN}")])
        .args(["--checks", &checks])
        .args(["--max-examples", &examples, "--seed", &seed])
        .args(["--exclude-operation-id", "register_engine"])
        .args(["--workers", "1", "--generation-database", "none"])
        // Generous: the suite runs this beside other heavy tests.
        .args(["--request-timeout", "60"])
        .args(["--no-color", "--output-truncate", "false"]);
    let out = tokio::task::spawn_blocking(move || cmd.output())
        .await
        .expect("join")
        .expect("run schemathesis (deploy/setup.sh installs it)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{text}");
    let found = figures(&text);
    println!(
        "schemathesis figures: operations {}; test cases {}",
        found.operations, found.test_cases
    );
    assert!(out.status.success(), "schemathesis failed:\n{text}");
    assert!(!found.test_cases.is_empty(), "no summary:\n{text}");

    // Still serving, then stopped the way an operator stops it.
    let health = http
        .get(format!("{base}/healthz"))
        .send()
        .await
        .expect("healthz");
    assert_eq!(health.status(), 200);
    let term = Command::new("kill")
        .args(["-TERM", &served.child.id().to_string()])
        .status()
        .expect("kill");
    assert!(term.success());
    let status = served.child.wait().expect("wait");
    assert!(status.success(), "agl serve exited with {status}");
    let check = Command::new(python())
        .args([
            "-c",
            "import sqlite3, sys\n\
             print(sqlite3.connect(sys.argv[1]).execute('PRAGMA integrity_check').fetchone()[0])",
        ])
        .arg(&db)
        .output()
        .expect("integrity check");
    let verdict = String::from_utf8_lossy(&check.stdout);
    assert_eq!(
        verdict.trim(),
        "ok",
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );
    engine.shutdown().await;
}
