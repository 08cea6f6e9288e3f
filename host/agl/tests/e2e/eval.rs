//! `agl eval` end to end: the real binary, the calc harness (real Python
//! agents through the gateway), a scripted test engine that takes
//! SGLang-style weight reloads, and a checkpoint a real `agl run` wrote.
//! The engine answers by the weight version it serves: under the run's
//! checkpoint every answer is right; under the base, about every second
//! answer to a question is off by one. The expected pass@k comes from the
//! harness's own reward events, read back from the evaluation's store, by
//! the unbiased estimator; the reported counts are checked against them.
//! Then the arith example on SmolLM2 (embedded engine), checked the same
//! way.

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex, OnceLock};

use agl_store::Store;
use agl_testengine::{EngineRequest, EngineState, Reply};
use serde_json::Value;

use crate::agl_run::{Setup, finish};
use crate::engine_server::smollm2_dir;
use crate::support::{python, repo};

const AGL: &str = env!("CARGO_BIN_EXE_agl");

/// The calc protocol (a `CALC` call, then the answer), right or wrong by
/// the version the engine serves (see the module docs).
fn versioned_calc(
    state: Arc<OnceLock<Arc<EngineState>>>,
) -> impl Fn(&EngineRequest) -> Reply + Send + Sync + 'static {
    let answers: Mutex<HashMap<(String, String), usize>> = Mutex::default();
    move |r| {
        let messages = r.body()["messages"].as_array().cloned().unwrap_or_default();
        let content = messages
            .last()
            .map_or("", |m| m["content"].as_str().unwrap_or(""));
        let Some(result) = content.strip_prefix("RESULT ") else {
            let expr = content.trim_start_matches("What is ").trim_end_matches('?');
            return Reply::text(format!("CALC {expr}"));
        };
        let version = state
            .get()
            .map_or_else(String::new, |s| s.admin.weight_version());
        let question = messages
            .iter()
            .find(|m| m["role"] == "user")
            .map(|m| m["content"].to_string())
            .unwrap_or_default();
        let n = {
            let mut answers = answers.lock().unwrap();
            let n = answers.entry((question, version.clone())).or_insert(0);
            *n += 1;
            *n
        };
        let value: i64 = result
            .rsplit("= ")
            .next()
            .unwrap_or("0")
            .parse()
            .unwrap_or(0);
        let wrong = version != "1" && n % 2 == 0;
        Reply::text(format!("The answer is {}.", value + i64::from(wrong)))
    }
}

/// Runs `agl eval` (without the caller's AGL_CONFIG / AGL_ADMIN_KEY) and
/// returns its output, which must be a success.
fn succeeds(eval: &mut Command) -> String {
    let out = eval
        .env_remove("AGL_CONFIG")
        .env_remove("AGL_ADMIN_KEY")
        .output()
        .unwrap();
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "agl eval failed:\n{text}");
    text
}

fn read_json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// 1 - C(n - c, k) / C(n, k), by hand.
fn unbiased_pass_at(n: u64, c: u64, k: u64) -> f64 {
    let choose = |a: u64, b: u64| -> f64 {
        if b > a {
            return 0.0;
        }
        (0..b).map(|i| (a - i) as f64 / (b - i) as f64).product()
    };
    1.0 - choose(n - c, k) / choose(n, k)
}

fn close(a: &Value, b: f64) -> bool {
    a.as_f64().is_some_and(|a| (a - b).abs() < 1e-9)
}

/// A rollout's reward: the last `reward` event its harness posted.
async fn reward_of(store: &Store, rollout: &str) -> f64 {
    let rollout = store.export_rollout(rollout).await.expect("exported");
    let reward = rollout
        .events
        .iter()
        .rev()
        .find(|e| e.kind == "reward")
        .unwrap_or_else(|| panic!("{} posted no reward", rollout.id));
    let payload: Value = serde_json::from_str(reward.payload.as_str()).expect("JSON");
    payload
        .as_f64()
        .or_else(|| payload["value"].as_f64())
        .expect("a number")
}

/// Each task's samples and passes (reward >= 1) as its rollouts' reward
/// events in `store` give them, checked against the counts `policy`
/// reports; and the pass@k each `k` must then have, from those events.
async fn pass_at_from_the_store(
    store: &Store,
    policy: &Value,
    ks: &[u64],
) -> (Vec<(u64, u64)>, Vec<f64>) {
    let tasks = policy["tasks"].as_array().expect("tasks");
    let mut counts = Vec::new();
    for task in tasks {
        let ids = task["rollouts"].as_array().expect("the task's rollouts");
        let mut passed = 0;
        for id in ids {
            passed += u64::from(reward_of(store, id.as_str().expect("an id")).await >= 1.0);
        }
        let n = ids.len() as u64;
        assert_eq!(task["samples"].as_u64(), Some(n), "{task}");
        assert_eq!(task["passed"].as_u64(), Some(passed), "{task}");
        counts.push((n, passed));
    }
    let expected = ks
        .iter()
        .map(|&k| {
            counts
                .iter()
                .map(|&(n, c)| unbiased_pass_at(n, c, k))
                .sum::<f64>()
                / counts.len() as f64
        })
        .collect();
    (counts, expected)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eval_compares_the_base_with_a_checkpoint_by_pass_at_k() {
    let state = Arc::new(OnceLock::new());
    let setup = Setup::with_script(versioned_calc(state.clone())).await;
    let _ = state.set(setup.engine().state().clone());
    // A checkpoint of a real (tiny) run.
    let config = setup.config("run", "steps = 1");
    finish(setup.spawn(&config, false));
    let checkpoint = setup.out("run/checkpoints/step-000001");
    assert!(checkpoint.join("meta.json").is_file());

    let json = setup.out("report.json");
    let mut eval = Command::new(AGL);
    eval.arg("--config")
        .arg(&config)
        .args([
            "eval",
            "--k",
            "4",
            "--temperature",
            "1",
            "--policy",
            "base",
            "--policy",
        ])
        .arg(setup.out("run"))
        .arg("--out")
        .arg(setup.out("eval"))
        .arg("--json")
        .arg(&json)
        .current_dir(setup.out(""));
    let text = succeeds(&mut eval);
    let report = read_json(&json);
    assert_eq!(report, read_json(&setup.out("eval/eval.json")));
    assert_eq!(
        (report["split"].as_str(), report["k"].as_u64()),
        (Some("val"), Some(4))
    );
    let [base, trained] = report["policies"].as_array().unwrap().as_slice() else {
        panic!("two policies: {report}");
    };
    assert_eq!(base["policy"], "base");
    assert_eq!(
        trained["policy"],
        checkpoint.canonicalize().unwrap().display().to_string()
    );
    // Two val tasks, 4 samples each. The scripted engine answers every
    // other call for a question wrong under the base, so about half pass
    // (exactly how many depends on how the calls interleave): the expected
    // pass@k is computed from the reward events in the evaluation's store.
    let store = Store::open(setup.out("eval/agl.db")).expect("the eval's store");
    let (counts, expected) = pass_at_from_the_store(&store, base, &[1, 2, 4]).await;
    assert_eq!(counts.len(), 2, "{base}");
    for &(n, c) in &counts {
        assert_eq!(n, 4, "{base}");
        assert!(
            (1..=3).contains(&c),
            "some but not all pass under the base: {base}"
        );
    }
    for (k, want) in ["1", "2", "4"].into_iter().zip(expected.iter().copied()) {
        assert!(close(&base["pass_at"][k], want), "pass@{k} {want}: {base}");
    }
    let (counts, _) = pass_at_from_the_store(&store, trained, &[1]).await;
    assert!(counts.iter().all(|&(n, c)| n == 4 && c == 4), "{trained}");
    for k in ["1", "2", "4"] {
        assert!(close(&trained["pass_at"][k], 1.0), "{trained}");
    }
    assert_eq!(
        (
            base["weight_version"].as_u64(),
            trained["weight_version"].as_u64()
        ),
        (Some(0), Some(1))
    );
    // The engine was given the base, then the checkpoint.
    let reloads: Vec<String> = setup
        .engine()
        .requests()
        .iter()
        .filter(|r| r.path == "/update_weights_from_disk")
        .map(|r| {
            r.body.as_ref().unwrap()["weight_version"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(reloads[reloads.len() - 2..], ["0", "1"], "{reloads:?}");
    // The table shows them side by side.
    let pass2 = text.lines().find(|l| l.starts_with("pass@2")).unwrap();
    assert!(
        pass2.contains(&format!("{:.3}", expected[1])) && pass2.trim_end().ends_with("1.000"),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with("task") && l.contains("run/step-000001")),
        "{text}"
    );
}

/// The arith example as a user runs it (its agl.toml, the embedded engine
/// on SmolLM2, the harness's own rewards), its first 4 val rows given as a
/// parquet file (pyarrow writes it, as a Hugging Face dataset's): 2 samples
/// each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eval_runs_the_arith_example_on_smollm2() {
    let model = smollm2_dir();
    let dir = tempfile::tempdir().unwrap();
    let rows: Vec<Value> = std::fs::read_to_string(repo().join("examples/arith/data.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|r| r["split"] == "val")
        .take(4)
        .collect();
    let parquet = dir.path().join("val.parquet");
    let written = Command::new(python())
        .arg("-c")
        .arg("import json, sys, pyarrow as pa, pyarrow.parquet as pq; pq.write_table(pa.Table.from_pylist(json.loads(sys.argv[1])), sys.argv[2])")
        .arg(Value::from(rows.clone()).to_string())
        .arg(&parquet)
        .status()
        .unwrap();
    assert!(written.success());
    let mut eval = Command::new(AGL);
    eval.arg("--config")
        .arg(repo().join("examples/arith/agl.toml"))
        .arg("-o")
        .arg(format!("model.path={}", model.display()))
        .arg("-o")
        .arg(format!(
            "controller.logs_dir={}",
            dir.path().join("logs").display()
        ))
        .args(["-o", "gateway.listen=127.0.0.1:0"])
        .args(["eval", "--k", "2", "--temperature", "1.0", "--data"])
        .arg(&parquet)
        .arg("--out")
        .arg(dir.path().join("eval"))
        .current_dir(repo());
    let text = succeeds(&mut eval);
    let report = read_json(&dir.path().join("eval/eval.json"));
    assert_eq!(report["split"], "all");
    let policy = &report["policies"][0];
    let tasks = policy["tasks"].as_array().unwrap();
    let names: Vec<&str> = tasks.iter().map(|t| t["task"].as_str().unwrap()).collect();
    let ids: Vec<&str> = rows.iter().map(|r| r["id"].as_str().unwrap()).collect();
    assert_eq!(names, ids);
    // Every count is the harness's own reward events, read back from the
    // evaluation's store; each rollout's input is its parquet row.
    let store = Store::open(dir.path().join("eval/agl.db")).unwrap();
    for (task, row) in tasks.iter().zip(&rows) {
        assert_eq!(task["samples"].as_u64(), Some(2), "{task}");
        for id in task["rollouts"].as_array().unwrap() {
            let rollout = store.export_rollout(id.as_str().unwrap()).await.unwrap();
            let input: Value = serde_json::from_str(rollout.input.as_str()).unwrap();
            assert_eq!(&input, row);
        }
    }
    let (_, expected) = pass_at_from_the_store(&store, policy, &[1, 2]).await;
    for (k, want) in ["1", "2"].into_iter().zip(expected) {
        assert!(
            close(&policy["pass_at"][k], want),
            "pass@{k} {want}: {policy}"
        );
    }
    assert!(text.contains("pass@1") && text.contains("pass@2"), "{text}");
}
