//! Plugins written in Python (plugins/python, built by plugins/build.sh with
//! componentize-py) score and build samples exactly as their Rust
//! originals on the project's fixtures, run through the real `agl plugin
//! test`; and a Python plugin scaffolded outside the checkout builds, passes
//! its own test and runs there.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::support::fixtures;
use serde_json::{Value, json};

fn plugin(name: &str) -> String {
    crate::support::built_plugin(name)
}

/// `agl --config CONFIG plugin test ARGS --json`, with the tests' compile cache.
fn plugin_test(config: &Path, args: &[&str]) -> Output {
    let cache = std::env::temp_dir().join("agl-cli-test-cache");
    Command::new(env!("CARGO_BIN_EXE_agl"))
        .arg("--config")
        .arg(config)
        .arg("-o")
        .arg(format!(
            "plugins.cache_dir={:?}",
            cache.display().to_string()
        ))
        .args(["plugin", "test", "--json"])
        .args(args)
        .output()
        .expect("agl runs")
}

fn lines(out: &Output) -> Vec<Value> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect()
}

/// What `reward` gives each rollout: a reward (or none), or the failure.
fn scores(
    config: &Path,
    reward: &str,
    rollouts: &Path,
) -> BTreeMap<String, Result<Option<f64>, ()>> {
    let out = plugin_test(
        config,
        &[
            "--reward",
            &plugin(reward),
            "--rollouts",
            &rollouts.display().to_string(),
        ],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    let mut scores: BTreeMap<String, Result<Option<f64>, ()>> = lines(&out)
        .iter()
        .map(|l| {
            (
                l["rollout_id"].as_str().unwrap().to_string(),
                Ok(l["reward"].as_f64()),
            )
        })
        .collect();
    for line in stderr.lines() {
        if let Some(id) = line
            .strip_prefix("rollout ")
            .and_then(|l| l.split(": reward failed").next())
            && line.contains(": reward failed")
        {
            scores.insert(id.to_string(), Err(()));
        }
    }
    assert!(!scores.is_empty(), "{stderr}");
    scores
}

/// A config file whose `[plugin.NAME]` and `[plugin.NAME-py]` tables are `table`.
fn config_for(dir: &Path, name: &str, table: &str) -> PathBuf {
    let path = dir.join(format!(
        "{name}-{}.toml",
        blake3::hash(table.as_bytes()).to_hex()
    ));
    let tokenizer = fixtures().join("tokenizer/tokenizer.json");
    std::fs::write(
        &path,
        format!(
            "[model]\ntokenizer = {:?}\n[plugin.{name}]\n{table}\n[plugin.{name}-py]\n{table}\n",
            tokenizer.display().to_string()
        ),
    )
    .unwrap();
    path
}

fn rows(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn write_rows(path: &Path, rows: &[Value]) {
    let text: String = rows.iter().map(|r| format!("{r}\n")).collect();
    std::fs::write(path, text).unwrap();
}

/// The fixture rollouts, and variants of the first one whose final answer
/// and input exercise each rule of `exact-match`.
fn exact_match_rollouts(dir: &Path) -> PathBuf {
    let mut all = rows(&fixtures().join("rollouts.jsonl"));
    let base = all[0].clone();
    let cases = [
        ("The answer is 87.0", json!({"answer": "87"})),
        ("the ANSWER is 87", json!({"answer": 87})),
        ("  87  ", json!({"answer": "87", "label": "87"})),
        ("Cat", json!({"answer": "cat", "label": "cat"})),
        (
            "the answer is 1, no, the answer is 2",
            json!({"answer": "2"}),
        ),
        ("no number here", json!({"answer": "87"})),
        ("the answer is 87", json!({"question": "no answer field"})),
        ("the answer is 87", json!({"answer": [87]})),
        ("the answer is 87", json!({"answer": 87.5})),
    ];
    for (i, (text, input)) in cases.into_iter().enumerate() {
        let mut r = base.clone();
        r["id"] = json!(format!("case-{i}"));
        r["input"] = input;
        let last = r["calls"].as_array_mut().unwrap().last_mut().unwrap();
        last["response"]["choices"][0]["message"]["content"] = json!(text);
        all.push(r);
    }
    // Only tool calls: no final text.
    let mut r = base.clone();
    r["id"] = json!("no-text");
    let last = r["calls"].as_array_mut().unwrap().last_mut().unwrap();
    last["response"]["choices"][0]["message"]["content"] = Value::Null;
    all.push(r);
    let path = dir.join("exact-match.jsonl");
    write_rows(&path, &all);
    path
}

#[test]
fn the_python_exact_match_scores_as_the_rust_one() {
    let dir = tempfile::tempdir().unwrap();
    let rollouts = exact_match_rollouts(dir.path());
    for table in [
        r#"pattern = '(?:answer|result) is (-?[0-9.]+)'"#,
        "",
        "case_sensitive = true\nanswer_field = \"label\"",
        "pattern = '(unclosed'",
    ] {
        let config = config_for(dir.path(), "exact-match", table);
        let rust = scores(&config, "exact-match", &rollouts);
        let python = scores(&config, "exact-match-py", &rollouts);
        assert_eq!(python, rust, "config {table:?}");
        assert!(rust.values().any(|s| *s == Ok(Some(1.0))) || table.contains("unclosed"));
    }
}

/// The recorded mini-swe rollouts, one without a reward event and one whose
/// last reward event has no number.
fn tests_pass_rollouts(dir: &Path) -> PathBuf {
    let mut all = rows(&fixtures().join("mini-swe/recorded.jsonl"));
    let mut unscored = all[0].clone();
    unscored["id"] = json!("unscored");
    unscored["events"] = json!([]);
    let mut bad = all[1].clone();
    bad["id"] = json!("bad");
    bad["events"]
        .as_array_mut()
        .unwrap()
        .push(json!({"kind": "reward", "payload": {"value": "high"}, "timestamp_ms": 9}));
    all.extend([unscored, bad]);
    let path = dir.join("tests-pass.jsonl");
    write_rows(&path, &all);
    path
}

#[test]
fn the_python_tests_pass_scores_as_the_rust_one() {
    let dir = tempfile::tempdir().unwrap();
    let rollouts = tests_pass_rollouts(dir.path());
    for table in [
        "",
        "step_penalty = 0.1\nmin_reward = 0.5",
        "step_penalty = 0.3",
        "step_penalty = -1.0",
    ] {
        let config = config_for(dir.path(), "tests-pass", table);
        let rust = scores(&config, "tests-pass", &rollouts);
        let python = scores(&config, "tests-pass-py", &rollouts);
        assert_eq!(python, rust, "config {table:?}");
        assert_eq!(rust["bad"], Err(()));
        if !table.contains('-') {
            assert_eq!(rust["unscored"], Ok(None));
        }
    }
}

/// The built-in `reported` in Python, on the recorded rollouts.
#[test]
fn the_python_reported_scores_as_the_rust_one() {
    let dir = tempfile::tempdir().unwrap();
    let rollouts = tests_pass_rollouts(dir.path());
    let config = config_for(dir.path(), "reported", "");
    let rust = scores(&config, "reported", &rollouts);
    assert_eq!(scores(&config, "reported-py", &rollouts), rust);
    assert_eq!((rust["unscored"], rust["bad"]), (Ok(None), Err(())));
}

/// The Python `trajectory` (the SDK's merge and break classifier, on 0.5's
/// linked prompts and data fetched on demand) builds the Rust one's
/// samples, break kinds and details included.
#[test]
fn the_python_trajectory_builds_the_rust_samples() {
    let dir = tempfile::tempdir().unwrap();
    let with_tokenizer = |table| config_for(dir.path(), "trajectory", table);
    for (rollouts, config) in [
        (
            fixtures().join("rollouts.jsonl"),
            with_tokenizer("chain_by_agent = true"),
        ),
        (
            fixtures().join("rollouts.jsonl"),
            with_tokenizer("chain_by_agent = false"),
        ),
        (
            fixtures().join("mini-swe/recorded.jsonl"),
            with_tokenizer(""),
        ),
        // Toy token ids: their own config, without a tokenizer.
        (
            fixtures().join("mini-swe/rollouts.jsonl"),
            fixtures().join("mini-swe/agl.toml"),
        ),
    ] {
        let samples = |adapter: &str| {
            let out = plugin_test(
                &config,
                &[
                    "--plugin",
                    &plugin(adapter),
                    "--rollouts",
                    &rollouts.display().to_string(),
                ],
            );
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            lines(&out)
        };
        let rust = samples("trajectory");
        assert!(rust.len() >= 3);
        assert_eq!(
            samples("trajectory-py"),
            rust,
            "{} {}",
            rollouts.display(),
            config.display()
        );
    }
}

/// The Python `trajectory`'s own tests (the SDK's merge on hand-made
/// rollouts) run natively under `agl plugin build`, which hands them this
/// agl to merge with: none is skipped.
#[test]
fn the_python_trajectory_tests_merge_by_the_host_rules() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = crate::support::repo_root().join("plugins/python/trajectory");
    let out = tmp.path().join("trajectory-py.wasm");
    let built = ok(Command::new(env!("CARGO_BIN_EXE_agl"))
        .args(["plugin", "build"])
        .arg(&dir)
        .arg("--out")
        .arg(&out)
        .output()
        .expect("agl runs"));
    let stderr = String::from_utf8_lossy(&built.stderr);
    assert!(stderr.contains("trajectory: Ran 9 tests"), "{stderr}");
    assert!(!stderr.contains("skipped"), "{stderr}");
    assert!(out.is_file());
}

fn agl_in(dir: &Path, home: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_agl"))
        .args(args)
        .current_dir(dir)
        .env("HOME", home)
        .env_remove("AGL_CONFIG")
        .output()
        .expect("agl runs")
}

fn ok(out: Output) -> Output {
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// `agl plugin new --lang python` -> `agl plugin build` (its test runs
/// first) -> `agl plugin test` on the fixtures, outside the checkout with a
/// fresh HOME: the SDK and the WIT come from inside the binary.
#[test]
fn a_python_reward_and_adapter_scaffold_build_and_run_on_the_fixtures() {
    let tmp = tempfile::tempdir().unwrap();
    let (home, work) = (tmp.path().join("home"), tmp.path().join("work"));
    std::fs::create_dir_all(&home).unwrap();
    std::fs::create_dir_all(&work).unwrap();
    let rollouts = fixtures().join("rollouts.jsonl").display().to_string();

    ok(agl_in(
        &work,
        &home,
        &[
            "plugin",
            "new",
            "--lang",
            "python",
            "--kind",
            "reward",
            "my-reward",
        ],
    ));
    let built = ok(agl_in(&work, &home, &["plugin", "build", "my-reward"]));
    let stderr = String::from_utf8_lossy(&built.stderr);
    assert!(stderr.contains("my-reward: Ran 3 tests"), "{stderr}");
    let wasm = work.join("my-reward/my-reward.wasm");
    assert_eq!(
        String::from_utf8_lossy(&built.stdout).trim(),
        wasm.display().to_string()
    );
    let out = ok(agl_in(
        &work,
        &home,
        &[
            "plugin",
            "test",
            "--json",
            "--reward",
            "my-reward/my-reward.wasm",
            "--rollouts",
            &rollouts,
        ],
    ));
    let rewards: Vec<Option<f64>> = lines(&out).iter().map(|l| l["reward"].as_f64()).collect();
    // Every fixture's final text holds its answer.
    assert_eq!(rewards, vec![Some(1.0); 5]);
    let inspect = ok(agl_in(
        &work,
        &home,
        &["plugin", "inspect", "my-reward/my-reward.wasm"],
    ));
    let shown = String::from_utf8_lossy(&inspect.stdout);
    assert!(
        shown.contains("my-reward 0.1.0") && shown.contains("world    reward"),
        "{shown}"
    );

    ok(agl_in(
        &work,
        &home,
        &["plugin", "new", "--lang", "python", "my-adapter"],
    ));
    let built = ok(agl_in(&work, &home, &["plugin", "build", "my-adapter"]));
    // Its test merged natively by this agl's rules (`agl plugin rules`).
    let stderr = String::from_utf8_lossy(&built.stderr);
    assert!(stderr.contains("my-adapter: Ran 1 test"), "{stderr}");
    assert!(!stderr.contains("skipped"), "{stderr}");
    let out = ok(agl_in(
        &work,
        &home,
        &[
            "plugin",
            "test",
            "--json",
            "--plugin",
            "my-adapter/my-adapter.wasm",
            "--rollouts",
            &rollouts,
        ],
    ));
    assert_eq!(lines(&out).len(), 9, "the fixtures' 9 chains");

    // A failing test stops the build before any component is written.
    let app = work.join("my-reward/app.py");
    let text = std::fs::read_to_string(&app)
        .unwrap()
        .replace("1.0 if", "0.5 if");
    std::fs::write(&app, text).unwrap();
    std::fs::remove_file(&wasm).unwrap();
    let failed = agl_in(&work, &home, &["plugin", "build", "my-reward"]);
    assert!(!failed.status.success());
    let why = String::from_utf8_lossy(&failed.stderr);
    assert!(
        why.contains("tests failed, nothing built") && why.contains("AssertionError"),
        "{why}"
    );
    assert!(!wasm.exists());
    let sdk = home.join(".cache/agl/sdk");
    assert!(sdk.is_dir(), "the SDK was written under the fresh HOME");
}
