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

/// The operation left out of the fuzzing (see the module docs).
const LEFT_OUT: &str = "register_engine";

/// The fewest test cases a run at the default 200 examples per operation
/// may have generated: schemathesis stops an operation early only when its
/// inputs run out, which for most of agl's (free-form JSON bodies, ids)
/// they do not. (A run at the defaults generated 5,778 on 2026-12-07.)
const MIN_TEST_CASES: u64 = 3000;

/// The operation ids `/openapi.json` describes, but its own (schemathesis
/// does not test the document it was given).
fn operation_ids(spec: &serde_json::Value) -> Vec<String> {
    let mut ids: Vec<String> = spec["paths"]
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(path, _)| *path != "/openapi.json")
        .filter_map(|(_, item)| item.as_object())
        .flat_map(|methods| methods.values())
        .filter_map(|op| op["operationId"].as_str().map(String::from))
        .collect();
    ids.sort();
    ids
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

    let spec: serde_json::Value = http
        .get(format!("{base}/openapi.json"))
        .send()
        .await
        .expect("openapi.json")
        .json()
        .await
        .expect("a JSON spec");
    let operations = operation_ids(&spec);
    assert!(
        operations.iter().any(|o| o == LEFT_OUT),
        "{LEFT_OUT} not among {operations:?}"
    );
    let report = dir.path().join("schemathesis.json");

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
        .args(["--exclude-operation-id", LEFT_OUT])
        .args(["--report", "json", "--report-json-path"])
        .arg(&report)
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
    assert!(out.status.success(), "schemathesis failed:\n{text}");
    // Schemathesis' own report of the run: every operation but the one
    // left out selected and tested, enough test cases, nothing found.
    let found: serde_json::Value = serde_json::from_slice(
        &std::fs::read(&report).unwrap_or_else(|e| panic!("no report ({e}):\n{text}")),
    )
    .expect("a JSON report");
    let ops = &found["operations"];
    let generated = found["test_cases"]["generated"].as_u64().unwrap_or(0);
    println!(
        "schemathesis figures: operations {} selected of {} ({LEFT_OUT} left out), {} tested; \
         {generated} test cases",
        ops["selected"], ops["total"], ops["tested"]
    );
    let n = operations.len() as u64;
    assert_eq!(ops["total"].as_u64(), Some(n), "{found}");
    assert_eq!(ops["selected"].as_u64(), Some(n - 1), "{found}");
    assert_eq!(ops["tested"].as_u64(), Some(n - 1), "{found}");
    assert_eq!(ops["errored"].as_u64(), Some(0), "{found}");
    assert_eq!(found["complete"], true, "{found}");
    assert_eq!(found["failures"], json!([]), "{found}");
    assert_eq!(found["errors"], json!([]), "{found}");
    if examples == "200" {
        assert!(
            generated >= MIN_TEST_CASES,
            "{generated} test cases: {found}"
        );
    }

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
