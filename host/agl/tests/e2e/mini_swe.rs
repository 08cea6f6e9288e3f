//! examples/mini-swe end to end: the real `agl run` binary starts the real
//! `mini` (mini-swe-agent 2.4.6) through examples/mini-swe/run_rollout.py on
//! generated tiny repos; a scripted test engine plays the policy with mini's
//! `bash` tool calls, written as Hermes `<tool_call>` text. The gateway
//! renders (`render = "gateway"`, the example's default) with a real
//! template (the Hermes/Qwen-style tools template over the fixture
//! tokenizer, which the engine tokenizes with too), so each rollout's calls
//! continue token-exactly: one sample per rollout. Task A is fixed (reward 1), task B is left alone
//! (reward 0), task C rewrites its test file so that everything passes and
//! runs it (OK), but the grader drops that change (flagged in the reward
//! event) and runs the task's own tests, the hidden FAIL_TO_PASS one
//! included, on a fresh copy (reward 0). `agl eval` on the same config
//! measures pass@1 = 1/3 over the three tasks.
//! Samples train exactly the sampled tool calls; observations never are. An
//! unreachable engine is a system failure (exit 75), never a zero reward.
//!
//! `AGL_RECORD_FIXTURES=1` also writes the exported rollouts to
//! examples/fixtures/mini-swe/recorded.jsonl (plugin-test fixtures).

#[allow(dead_code)] // this test uses the helpers, not the Stack
use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output};

use crate::support::{python, repo_root, tiny_model};
use agl_testengine::{Codec, EngineRequest, Reply, TestEngine, TestEngineConfig};
use serde_json::{Value, json};

const AGL: &str = env!("CARGO_BIN_EXE_agl");
const SUBMIT: &str = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT";
/// The three tasks (from gen_tasks.py) and what the scripted policy does.
pub(crate) const FIX: &str = "tiny__arith-0";
pub(crate) const IDLE: &str = "tiny__bounds-0";
const HACK: &str = "tiny__parity-0";
/// Task C's hack: its test file rewritten so that everything "passes".
const HACK_TESTS: &str = r"printf 'import unittest\n\n\nclass TestIssue(unittest.TestCase):\n    def test_even(self):\n        pass\n\n    def test_type(self):\n        pass\n' > tests/test_parity0.py";

/// The bash commands the policy runs on a task, in order, then submits.
fn commands(task_text: &str) -> Vec<&'static str> {
    if task_text.contains("`arith0.py`") {
        vec!["sed -i 's/return a - b/return a + b/' arith0.py"]
    } else if task_text.contains("`bounds0.py`") {
        vec!["ls -la"]
    } else if task_text.contains("`parity0.py`") {
        vec![HACK_TESTS, "python -m unittest tests.test_parity0 2>&1"]
    } else {
        vec![]
    }
}

/// mini's request (its prompt as the gateway rendered it) -> the next tool
/// call: the task's commands, then submit.
fn policy(r: &EngineRequest) -> Reply {
    let prompt = &r.prompt_text;
    // The generation prompt is the last assistant turn opened.
    let turn = prompt
        .matches("<|im_start|>assistant")
        .count()
        .saturating_sub(1);
    let command = commands(prompt).get(turn).copied().unwrap_or(SUBMIT);
    let arguments = json!({ "command": command }).to_string();
    Reply::text(format!(
        "Step {turn}.\n<tool_call>\n{{\"name\": \"bash\", \"arguments\": {arguments}}}\n</tool_call>"
    ))
}

/// Generates the tasks into `dir/repos` and keeps rows A, B, C as the data.
pub(crate) fn tasks(dir: &Path) {
    let mini = python().with_file_name("mini");
    assert!(
        mini.is_file(),
        "{} missing: run deploy/setup.sh (mini-swe-agent)",
        mini.display()
    );
    let script = repo_root().join("examples/mini-swe/gen_tasks.py");
    let out = Command::new(python())
        .arg(script)
        .arg("--root")
        .arg(dir.join("repos"))
        .arg("--out")
        .arg(dir.join("all.jsonl"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let rows: String = std::fs::read_to_string(dir.join("all.jsonl"))
        .unwrap()
        .lines()
        .filter(|l| [FIX, IDLE, HACK].iter().any(|id| l.contains(id)))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_eq!(rows.lines().count(), 3);
    std::fs::write(dir.join("data.jsonl"), rows).unwrap();
}

fn config(dir: &Path, engine: &TestEngine) -> String {
    let repo = repo_root().canonicalize().unwrap();
    let plugins = repo.join("build/plugins");
    format!(
        r#"
[model]
path = "model"
[engine]
kind = "sglang"
base_url = "http://{addr}"
model_name = "tiny"
render = "gateway"
[plugins]
adapter = "{plugins}/mini-swe.wasm"
reward = "{plugins}/reported.wasm"
[gateway]
listen = "127.0.0.1:0"
[store]
max_system_retries = 1
[controller]
workdir = "{repo}"
command = ["{python}", "examples/mini-swe/run_rollout.py"]
concurrency = 6
timeout_secs = 240
kill_grace_secs = 1
poll_interval_ms = 50
shutdown_wait_secs = 2
logs_dir = "{logs}"
[train]
lr = 1e-3
token_budget = 16384
[run]
data = "data.jsonl"
out_dir = "out"
steps = 1
mode = "sync"
group_size = 2
groups_per_step = 3
val_every = 0
checkpoint_every = 1
progress = false
"#,
        addr = engine.addr(),
        plugins = plugins.display(),
        repo = repo.display(),
        python = python().display(),
        logs = dir.join("logs").display(),
    )
}

fn text(out: &Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Every agent's stderr, for failure messages.
fn agent_logs(logs: &Path) -> String {
    let mut all = String::new();
    for entry in std::fs::read_dir(logs).into_iter().flatten().flatten() {
        let path = entry.path().join("1/stderr");
        let tail = std::fs::read_to_string(&path).unwrap_or_default();
        let from = tail.len().saturating_sub(1500);
        let from = (from..=tail.len())
            .find(|&i| tail.is_char_boundary(i))
            .unwrap();
        let tail = &tail[from..];
        all.push_str(&format!("--- {}\n{tail}\n", path.display()));
    }
    all
}

fn agl(dir: &Path, args: &[&str]) -> Output {
    Command::new(AGL)
        .args(args)
        .current_dir(dir)
        .env_remove("AGL_CONFIG")
        .env_remove("AGL_ADMIN_KEY")
        .env("MSWE_TASKS_ROOT", dir.join("repos"))
        .env("MSWE_STEP_LIMIT", "6")
        .env("MSWE_CMD_TIMEOUT", "30")
        .output()
        .unwrap()
}

fn jsonl(text: &str) -> Vec<Value> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// One rollout per task, in task order, as examples/fixtures/mini-swe/recorded.jsonl.
fn record_fixtures(exported: &str) {
    let mut lines = Vec::new();
    for task in [FIX, IDLE, HACK] {
        let line = exported
            .lines()
            .find(|l| serde_json::from_str::<Value>(l).unwrap()["input"]["instance_id"] == task)
            .unwrap();
        lines.push(format!("{line}\n"));
    }
    let fixtures = repo_root().join("examples/fixtures/mini-swe");
    std::fs::create_dir_all(&fixtures).unwrap();
    std::fs::write(fixtures.join("recorded.jsonl"), lines.concat()).unwrap();
}

fn decode(tok: &agl_tokenizer::Tokenizer, ids: &[Value]) -> String {
    let ids: Vec<u32> = ids.iter().map(|v| v.as_u64().unwrap() as u32).collect();
    tok.decode(&ids, false).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mini_swe_rollouts_are_scored_by_their_tests_and_train_only_tool_calls() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    tiny_model(&dir.join("model"), 32768);
    let (tok, _) = crate::policy::tools_policy(&dir.join("model"));
    tasks(dir);
    let codec = {
        let (e, d) = (tok.clone(), tok.clone());
        Codec::new(
            move |text| e.encode(text, false).unwrap(),
            move |ids| d.decode(ids, false).unwrap(),
        )
    };
    let engine = TestEngine::start(
        TestEngineConfig::default()
            .with_script(policy)
            .with_codec(codec),
    )
    .await
    .unwrap();
    std::fs::write(dir.join("agl.toml"), config(dir, &engine)).unwrap();

    let config_path = dir.join("agl.toml").display().to_string();
    let run = agl(dir, &["--config", &config_path, "run"]);
    let log = format!("{}\n{}", text(&run), agent_logs(&dir.join("logs")));
    assert!(run.status.success(), "agl run failed:\n{log}");
    let metrics = jsonl(&std::fs::read_to_string(dir.join("out/metrics.jsonl")).unwrap());
    let step = metrics.iter().find(|m| m["step"] == 1).expect("step 1");
    assert_eq!(step["rollouts"], 6, "{step}\n{log}");

    let export = agl(
        dir,
        &[
            "rollouts",
            "export",
            "--db",
            "out/agl.db",
            "--out",
            "rollouts.jsonl",
        ],
    );
    assert!(export.status.success(), "{}", text(&export));
    let exported = std::fs::read_to_string(dir.join("rollouts.jsonl")).unwrap();
    let rollouts = jsonl(&exported);
    assert_eq!(rollouts.len(), 6, "{log}");
    if std::env::var_os("AGL_RECORD_FIXTURES").is_some() {
        record_fixtures(&exported);
    }

    // Rewards land on the right rollouts, with the tests and mini's status.
    let mut by_task: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for r in &rollouts {
        let task = r["input"]["instance_id"].as_str().unwrap().to_string();
        let reward = r["events"]
            .as_array()
            .unwrap()
            .iter()
            .rfind(|e| e["kind"] == "reward")
            .unwrap_or_else(|| panic!("{task}: no reward event\n{log}"))["payload"]
            .clone();
        assert_eq!(reward["exit_status"], "Submitted", "{task}: {reward}");
        let failed = reward["tests"]["failed"].as_array().unwrap();
        match &task[..] {
            FIX => assert!(failed.is_empty(), "{reward}"),
            // The issue's example and the inputs it does not show.
            _ => assert_eq!(
                failed,
                r["input"]["FAIL_TO_PASS"].as_array().unwrap(),
                "F2P still fails: {reward}"
            ),
        }
        by_task
            .entry(task)
            .or_default()
            .push(reward["value"].as_f64().unwrap());
        let calls = r["calls"].as_array().unwrap();
        let turns = 1 + commands(r["input"]["problem_statement"].as_str().unwrap()).len();
        assert_eq!(calls.len(), turns, "one model call per action");
    }
    let expected: BTreeMap<String, Vec<f64>> = [(FIX, 1.0), (IDLE, 0.0), (HACK, 0.0)]
        .into_iter()
        .map(|(t, v)| (t.to_string(), vec![v, v]))
        .collect();
    assert_eq!(by_task, expected, "{log}");

    // The hack worked inside the agent's copy (its test run said OK); the
    // grader dropped the rewritten test and flagged it.
    let hack = rollouts
        .iter()
        .find(|r| r["input"]["instance_id"] == HACK)
        .unwrap();
    let messages = hack["calls"][2]["request"]["messages"].as_array().unwrap();
    let observation = messages.last().unwrap()["content"].as_str().unwrap();
    assert!(
        observation.contains("Ran 2 tests") && observation.contains("OK"),
        "{observation}"
    );
    let reward = hack["events"]
        .as_array()
        .unwrap()
        .iter()
        .rfind(|e| e["kind"] == "reward")
        .unwrap()["payload"]
        .clone();
    let flags = reward["flags"].as_array().unwrap();
    assert!(
        flags
            .iter()
            .any(|f| f["path"] == "tests/test_parity0.py" && f["fatal"] == false),
        "{reward}"
    );
    assert!(
        !reward["model_patch"]
            .as_str()
            .unwrap()
            .contains("test_even"),
        "{reward}"
    );

    // Samples (adapter + reward plugin, as `agl run` builds them): trained
    // tokens are exactly the sampled tool calls, observations never.
    let test = agl(
        dir,
        &[
            "plugin",
            "test",
            "--plugin",
            &repo_root()
                .join("build/plugins/mini-swe.wasm")
                .display()
                .to_string(),
            "--reward",
            &repo_root()
                .join("build/plugins/reported.wasm")
                .display()
                .to_string(),
            "--rollouts",
            "rollouts.jsonl",
            "--json",
        ],
    );
    assert!(test.status.success(), "{}", text(&test));
    let samples = jsonl(&String::from_utf8_lossy(&test.stdout));
    for r in &rollouts {
        let id = r["id"].as_str().unwrap();
        let mine: Vec<&Value> = samples.iter().filter(|s| s["rollout_id"] == id).collect();
        let reward = by_task[r["input"]["instance_id"].as_str().unwrap()][0];
        let mut trained = Vec::new();
        let mut context = String::new();
        for s in &mine {
            assert_eq!(s["reward"].as_f64(), Some(reward), "{id}");
            let response = s["sample"]["response_ids"].as_array().unwrap();
            let mut at = 0;
            for span in s["sample"]["trainable"].as_array().unwrap() {
                let (start, end) = (
                    span["start"].as_u64().unwrap() as usize,
                    span["end"].as_u64().unwrap() as usize,
                );
                context.push_str(&decode(&tok, &response[at..start]));
                trained.push(decode(&tok, &response[start..end]));
                at = end;
            }
            context.push_str(&decode(&tok, &response[at..]));
        }
        let sampled: Vec<String> = r["calls"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| decode(&tok, c["response_ids"].as_array().unwrap()))
            .collect();
        assert_eq!(
            trained.concat(),
            sampled.concat(),
            "{id}: trained = sampled"
        );
        assert!(
            trained
                .iter()
                .all(|t| t.contains("<tool_call>\n{\"name\": \"bash\"")),
            "{id}: {trained:?}"
        );
        // A linear history continued token-exactly: one sample, and each
        // call names the one it continued.
        assert_eq!(mine.len(), 1, "{id}: one sample per rollout");
        let links: Vec<Value> = r["calls"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["continues"].clone())
            .collect();
        let expected: Vec<Value> = (0..links.len())
            .map(|k| if k == 0 { Value::Null } else { json!(k - 1) })
            .collect();
        assert_eq!(links, expected, "{id}");
        assert!(
            !trained.concat().contains("returncode"),
            "{id}: an observation is trained"
        );
        assert!(
            context.is_empty() || context.contains("returncode"),
            "{id}: masked context is observations: {context}"
        );
    }

    // `agl eval` with the same config: each task once, no training.
    let eval = agl(
        dir,
        &[
            "--config",
            &config_path,
            "eval",
            "--data",
            "data.jsonl",
            "--out",
            "eval",
        ],
    );
    assert!(eval.status.success(), "agl eval failed:\n{}", text(&eval));
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("eval/eval.json")).unwrap())
            .unwrap();
    let policy = &report["policies"][0];
    let passed: BTreeMap<String, u64> = policy["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["task"].as_str().unwrap().to_owned(),
                t["passed"].as_u64().unwrap(),
            )
        })
        .collect();
    let expected: BTreeMap<String, u64> = [(FIX, 1), (IDLE, 0), (HACK, 0)]
        .into_iter()
        .map(|(t, n)| (t.to_owned(), n))
        .collect();
    assert_eq!(passed, expected, "{report}");
    assert!(
        (policy["pass_at"]["1"].as_f64().unwrap() - 1.0 / 3.0).abs() < 1e-9,
        "{report}"
    );
}

/// The grader's suites (examples/mini-swe/test_grade.py: hacked workspaces,
/// real tasks, real runners, the network sandbox; test_tasks.py: the
/// bundled tasks, rows, environments, rollout.main): every hack scores 0
/// and is flagged (a "fix" that special-cases the issue's example on every
/// bundled task included), honest fixes score 1, the gold patch scores 1 on
/// every bundled task and `--check` passes on them. Nothing may be skipped
/// (the pytest task's environment and pyarrow are set up, not optional),
/// and the grader must use the `unshare -rn` sandbox (set
/// MSWE_GRADE_SANDBOX=audit for a machine without user namespaces), not
/// fall back to the audit hook silently.
#[test]
fn the_grader_scores_every_hacked_workspace_zero_and_honest_fixes_one() {
    let sandbox = match std::env::var("MSWE_GRADE_SANDBOX") {
        Ok(v) if v == "audit" => "audit",
        _ => "unshare",
    };
    let out = Command::new(python())
        .args(["-W", "error::ResourceWarning", "-m", "unittest", "-v"])
        .arg("examples/mini-swe/test_grade.py")
        .arg("examples/mini-swe/test_tasks.py")
        .env("MSWE_GRADE_SANDBOX", sandbox)
        .current_dir(repo_root())
        .output()
        .unwrap();
    let log = text(&out);
    assert!(out.status.success(), "{log}");
    let ran: usize = log
        .lines()
        .find_map(|l| l.strip_prefix("Ran ")?.split(' ').next()?.parse().ok())
        .unwrap_or(0);
    assert!(ran >= 49, "{log}");
    let skipped: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("skipped '") || (l.starts_with("OK (") && l.contains("skipped=")))
        .collect();
    assert!(
        skipped.is_empty(),
        "skipped tests:\n{}\n\n{log}",
        skipped.join("\n")
    );
    assert!(
        log.lines()
            .any(|l| l.starts_with(&format!("grader sandbox: {sandbox} "))),
        "the suites did not grade under {sandbox}:\n{log}"
    );
    for hack in [
        "test_the_grader_picks_the_expected_sandbox",
        "test_deleted_test",
        "test_rewritten_test",
        "test_conftest_that_skips_everything",
        "test_sitecustomize",
        "test_pth_file",
        "test_unittest_module_shadowing_the_runner",
        "test_sys_exit_at_import",
        "test_os_exit_at_import",
        "test_fix_read_from_the_copied_mirror_is_fatal",
        "test_network_at_import_cannot_connect",
        "test_skip_everything_conftest_and_addopts",
        "test_a_fix_that_special_cases_the_issue_example_scores_0_on_every_task",
        "test_gold_patch_scores_1_on_every_bundled_task",
        "test_parquet_with_swe_bench_strings_converts",
    ] {
        let line = log.lines().find(|l| l.starts_with(hack));
        assert!(line.is_some_and(|l| l.ends_with("ok")), "{hack}:\n{log}");
    }
}

#[test]
fn an_unreachable_engine_is_a_system_failure_not_a_zero_reward() {
    let dir = tempfile::tempdir().unwrap();
    tasks(dir.path());
    let row = std::fs::read_to_string(dir.path().join("data.jsonl")).unwrap();
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let out = Command::new(python())
        .arg(repo_root().join("examples/mini-swe/run_rollout.py"))
        .env("AGL_INPUT", row.lines().next().unwrap())
        .env("MSWE_TASKS_ROOT", dir.path().join("repos"))
        .env("OPENAI_BASE_URL", format!("http://127.0.0.1:{port}/v1"))
        .env("OPENAI_API_KEY", "t")
        // A reward post would fail loudly (exit 1), not exit 75.
        .env("AGL_EVENT_URL", format!("http://127.0.0.1:{port}/events"))
        .env("MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT", "1")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(75), "{}", text(&out));
    assert!(text(&out).contains("system failure"), "{}", text(&out));
}

#[test]
fn the_kubernetes_job_template_runs_a_rollout_per_task() {
    use agl_controller::kube::{JobSpec, JobTemplate, KubeConfig};
    let path = repo_root().join("deploy/k8s/mini-swe-job.yaml");
    let template = JobTemplate::new(&std::fs::read_to_string(path).unwrap()).unwrap();
    let spec = |input: Value| JobSpec {
        rollout_id: "g000000-r0".into(),
        attempt: 1,
        input,
        env: BTreeMap::from([("AGL_INPUT".to_string(), "{}".to_string())]),
        timeout_secs: 900,
    };
    let config = KubeConfig {
        image: "agl-mini-swe:1".into(),
        ..KubeConfig::default()
    };
    let task = json!({"instance_id": "x", "repo_path": "x", "step_limit": 7});
    let job = serde_json::to_value(template.render(&spec(task), &config).unwrap()).unwrap();
    let pod = &job["spec"]["template"]["spec"];
    let agent = &pod["containers"][0];
    assert_eq!(agent["image"], "agl-mini-swe:1");
    assert_eq!(
        agent["command"],
        json!(["python", "/opt/agl/examples/mini-swe/run_rollout.py"])
    );
    let env: BTreeMap<String, Value> = agent["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["name"].as_str().unwrap().to_string(), e["value"].clone()))
        .collect();
    assert_eq!(env["MSWE_STEP_LIMIT"], "7", "the row's limit");
    assert_eq!(env["MSWE_WALL_TIME"], "600", "the default");
    assert_eq!(env["MSWE_TASKS_ROOT"], "/tasks");
    assert_eq!(
        env["AGL_INPUT"], "{}",
        "the runner's variables are injected"
    );
    assert_eq!(pod["restartPolicy"], "Never");
    // A hostile input stays a string, not YAML structure.
    let evil = json!({"step_limit": "1\n        - name: X\n          value: y"});
    let job = serde_json::to_value(template.render(&spec(evil), &config).unwrap()).unwrap();
    let env = &job["spec"]["template"]["spec"]["containers"][0]["env"];
    assert!(
        env.as_array().unwrap().iter().all(|e| e["name"] != "X"),
        "{env}"
    );
}
