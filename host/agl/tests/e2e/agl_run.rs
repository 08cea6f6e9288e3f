//! `agl run` end to end: the real binary, the calc harness (real Python
//! agent processes through the gateway), a scripted test engine that takes
//! SGLang-style weight reloads, and a tiny random policy trained for real.
//! Two sync steps; then an async run killed with SIGKILL after its second
//! checkpoint and resumed to step four.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::{python, repo_root, tiny_model};
use agl_store::Store;
use agl_testengine::{EngineRequest, Reply, TestEngine, TestEngineConfig};
use serde_json::Value;

const AGL: &str = env!("CARGO_BIN_EXE_agl");

/// Calc model: a `CALC` call (the calc agent's text protocol), then the
/// answer; every second final answer to the same question is off by one,
/// so each group (one question, two rollouts) has reward variance whatever
/// order its rollouts finish in.
fn calc_script(answers: Arc<Mutex<HashMap<String, usize>>>) -> impl Fn(&EngineRequest) -> Reply {
    move |r| {
        let messages = r.body()["messages"].as_array().cloned().unwrap_or_default();
        let last = messages.last().cloned().unwrap_or(Value::Null);
        let content = last["content"].as_str().unwrap_or("");
        if let Some(result) = content.strip_prefix("RESULT ") {
            let question = messages.iter().rev().find(|m| {
                m["role"] == "user" && m["content"].as_str().is_some_and(|c| c.starts_with("What"))
            });
            let question = question
                .map(|m| m["content"].to_string())
                .unwrap_or_default();
            let n = {
                let mut answers = answers.lock().unwrap();
                let n = answers.entry(question).or_insert(0);
                *n += 1;
                *n
            };
            // `RESULT 58 * 16 = 928`: the value after the `=`.
            let value = result.rsplit("= ").next().unwrap_or(result);
            let answer = match value.parse::<i64>() {
                Ok(v) if n % 2 == 0 => (v + 1).to_string(),
                _ => value.to_string(),
            };
            return Reply::text(format!("The answer is {answer}."));
        }
        let expr = content.trim_start_matches("What is ").trim_end_matches('?');
        Reply::text(format!("CALC {expr}"))
    }
}

pub(crate) struct Setup {
    dir: tempfile::TempDir,
    engine: TestEngine,
}

impl Setup {
    pub(crate) async fn new() -> Setup {
        Setup::with_script(calc_script(Arc::default())).await
    }

    /// The same with the engine answering by `script`.
    pub(crate) async fn with_script(
        script: impl Fn(&EngineRequest) -> Reply + Send + Sync + 'static,
    ) -> Setup {
        let dir = tempfile::tempdir().unwrap();
        tiny_model(&dir.path().join("model"), 4096);
        let rows = std::fs::read_to_string(repo_root().join("examples/calc/data.jsonl")).unwrap();
        let rows: Vec<Value> = rows
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let train = rows.iter().filter(|r| r["split"] == "train").take(12);
        let val = rows.iter().filter(|r| r["split"] == "val").take(2);
        let data: String = train.chain(val).map(|r| format!("{r}\n")).collect();
        std::fs::write(dir.path().join("data.jsonl"), data).unwrap();
        let engine = TestEngine::start(TestEngineConfig::default().with_script(script))
            .await
            .unwrap();
        Setup { dir, engine }
    }

    /// An agl.toml for `out` with `extra` [run] lines, scored by the
    /// `reported` reward plugin.
    pub(crate) fn config(&self, out: &str, run: &str) -> PathBuf {
        self.config_with(out, run, Some("reported"), "")
    }

    /// An agl.toml for `out`: `run` lines in [run], `reward` the reward
    /// plugin (none: the harness's own `reward` events), `extra` tables.
    fn config_with(&self, out: &str, run: &str, reward: Option<&str>, extra: &str) -> PathBuf {
        let repo = repo_root().canonicalize().unwrap();
        let plugins = repo.join("build/plugins");
        let python = python();
        let text = format!(
            r#"
[model]
path = "model"
[engine]
kind = "sglang"
base_url = "http://{addr}"
model_name = "tiny"
[plugins]
adapter = "{adapter}"
{reward}
[gateway]
listen = "127.0.0.1:0"
[store]
max_system_retries = 2
[controller]
workdir = "{repo}"
command = ["{python}", "examples/calc/agent.py"]
concurrency = 6
timeout_secs = 60
kill_grace_secs = 1
poll_interval_ms = 50
shutdown_wait_secs = 2
logs_dir = "{out}-logs"
env_map = {{ QUESTION = "input.question" }}
[train]
lr = 1e-3
token_budget = 4096
[run]
data = "data.jsonl"
out_dir = "{out}"
group_size = 2
groups_per_step = 2
val_every = 2
val_size = 2
checkpoint_every = 1
keep_checkpoints = 3
progress = false
{run}
{extra}
"#,
            addr = self.engine.addr(),
            adapter = plugins.join("trajectory.wasm").display(),
            reward = reward.map_or(String::new(), |r| format!(
                "reward = \"{}\"",
                plugins.join(format!("{r}.wasm")).display()
            )),
            repo = repo.display(),
            python = python.display(),
        );
        let path = self.dir.path().join(format!("{out}.toml"));
        std::fs::write(&path, text).unwrap();
        path
    }

    pub(crate) fn engine(&self) -> &TestEngine {
        &self.engine
    }

    pub(crate) fn spawn(&self, config: &Path, resume: bool) -> Child {
        let mut cmd = Command::new(AGL);
        cmd.arg("--config").arg(config).arg("run");
        if resume {
            cmd.arg("--resume");
        }
        cmd.current_dir(self.dir.path())
            .env_remove("AGL_CONFIG")
            .env_remove("AGL_ADMIN_KEY")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn agl run")
    }

    pub(crate) fn out(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Weight versions the engine was asked to load, in order.
    fn reloads(&self) -> Vec<String> {
        self.engine
            .requests()
            .iter()
            .filter(|r| r.path == "/update_weights_from_disk")
            .map(|r| {
                r.body.as_ref().unwrap()["weight_version"]
                    .as_str()
                    .unwrap()
                    .to_string()
            })
            .collect()
    }
}

pub(crate) fn finish(child: Child) -> String {
    let out = child.wait_with_output().unwrap();
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "agl run failed:\n{text}");
    text
}

/// The first agent's stderr, for failure messages.
fn agent_stderr(logs: &Path) -> String {
    let Some(first) = std::fs::read_dir(logs).ok().and_then(|mut d| d.next()) else {
        return "no agent logs".into();
    };
    let path = first.unwrap().path().join("1/stderr");
    std::fs::read_to_string(&path).unwrap_or_else(|e| format!("{}: {e}", path.display()))
}

fn metrics(out: &Path) -> Vec<Value> {
    std::fs::read_to_string(out.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Per rollout: the weight versions of its current attempt's calls.
async fn call_versions(out: &Path) -> BTreeMap<String, Vec<u64>> {
    let store = Store::open(out.join("agl.db")).unwrap();
    let mut by_rollout = BTreeMap::new();
    let mut cursor = None;
    loop {
        let page = store
            .list_rollouts(agl_store::RolloutFilter::default(), cursor.as_deref(), 500)
            .await
            .unwrap();
        for r in &page.rollouts {
            let exported = store.export_rollout(&r.id).await.unwrap();
            let versions: Vec<u64> = exported.calls.iter().map(|c| c.weight_version).collect();
            by_rollout.insert(r.id.clone(), versions);
        }
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    by_rollout
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_sync_steps_train_reload_and_version_every_call() {
    let setup = Setup::new().await;
    let config = setup.config("sync", "steps = 2\nmode = \"sync\"");
    // A KL term to the reference (the initial weights, frozen).
    let text = std::fs::read_to_string(&config).unwrap();
    let text = text.replace("token_budget = 4096", "token_budget = 4096\nkl_coef = 0.1");
    std::fs::write(&config, text).unwrap();
    let log = finish(setup.spawn(&config, false));
    let out = setup.out("sync");

    assert_eq!(
        setup.reloads(),
        ["1", "2"],
        "one engine reload per update:\n{log}\n{}",
        agent_stderr(&setup.out("sync-logs"))
    );
    let records = metrics(&out);
    let steps: Vec<u64> = records
        .iter()
        .map(|r| r["step"].as_u64().unwrap())
        .collect();
    assert_eq!(
        steps,
        [0, 1, 2],
        "baseline validation, then two steps:\n{log}"
    );
    for r in &records[1..] {
        assert_eq!(r["groups"], 2, "{r}");
        assert_eq!(r["rollouts"], 4, "{r}");
        assert!(r["samples"].as_u64().unwrap() >= 4, "{r}");
        assert!(r["tokens"].as_u64().unwrap() > 0, "{r}");
        assert!(r["loss"].as_f64().unwrap().is_finite(), "{r}");
        assert!(
            r["grad_norm"].as_f64().unwrap() > 0.0,
            "reward variance gives a gradient: {r}"
        );
        assert!(r["drain_s"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["ref_kl"].as_f64().is_some_and(|k| k >= 0.0), "{r}");
    }
    // The reference is the initial weights: step 1 trains them (KL 0),
    // step 2 has moved away from them.
    assert!(
        records[1]["ref_kl"].as_f64().unwrap() < 1e-6,
        "{}",
        records[1]
    );
    assert!(
        records[2]["ref_kl"].as_f64().unwrap() > 0.0,
        "{}",
        records[2]
    );
    assert!(records[0]["val_reward"].is_number(), "{}", records[0]);
    assert!(records[2]["val_reward"].is_number(), "{}", records[2]);

    // Sync: step 1 trains groups g0, g1 sampled by version 0; g2, g3 are
    // launched after the first update and sampled by version 1.
    let versions = call_versions(&out).await;
    for (id, v) in &versions {
        assert!(!v.is_empty(), "{id} made no model call");
        let expected = match &id[..] {
            x if x.starts_with("g000000") || x.starts_with("g000001") => 0,
            x if x.starts_with("g000002") || x.starts_with("g000003") => 1,
            x if x.starts_with("val0000") => 0,
            x if x.starts_with("val0002") => 2,
            other => panic!("unexpected rollout {other}"),
        };
        assert!(v.iter().all(|&x| x == expected), "{id}: {v:?}");
    }
    // The update was published behind a paused and drained proxy.
    let store = Store::open(out.join("agl.db")).unwrap();
    let last = store.latest_weight_version().await.unwrap().unwrap();
    assert_eq!(last.version, 2);
    let meta = last.meta.parse().unwrap();
    assert_eq!(meta["paused"], true, "{meta}");
    assert_eq!(meta["in_flight_after_drain"], 0, "{meta}");
    assert!(out.join("checkpoints/step-000002/meta.json").is_file());
    assert!(out.join("training.png").is_file());
    assert!(log.contains("run finished after 2 steps"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn async_run_survives_sigkill_and_resumes_from_its_checkpoint() {
    let setup = Setup::new().await;
    let config = setup.config(
        "async",
        "steps = 4\nmode = \"async\"\ngroups_in_flight = 3\nmax_staleness = 2",
    );
    let out = setup.out("async");
    let mut child = setup.spawn(&config, false);
    let second = out.join("checkpoints/step-000002/meta.json");
    let t = Instant::now();
    while !second.is_file() {
        assert!(child.try_wait().unwrap().is_none(), "agl run exited early");
        assert!(
            t.elapsed() < Duration::from_secs(240),
            "no second checkpoint"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let before = setup.reloads().len();
    assert!(before >= 2, "{:?}", setup.reloads());

    let log = finish(setup.spawn(&config, true));
    let reloads = setup.reloads();
    // Versions are never reused for other weights: the resume hands the
    // engine the checkpoint's weights again (under the same number, or a
    // new one if the killed run published past its checkpoint), then one
    // new version per update.
    let numbers: Vec<u64> = reloads.iter().map(|v| v.parse().unwrap()).collect();
    assert!(numbers.windows(2).all(|w| w[0] <= w[1]), "{reloads:?}");
    let repeats = numbers.windows(2).filter(|w| w[0] == w[1]).count();
    assert!(
        repeats <= 1,
        "only the resume may reload a version: {reloads:?}"
    );
    let store = Store::open(out.join("agl.db")).unwrap();
    let last = store.latest_weight_version().await.unwrap().unwrap();
    assert_eq!(Some(&last.version), numbers.last(), "{reloads:?}");
    let meta = last.meta.parse().unwrap();
    assert_eq!(meta["step"], 4, "{meta}");
    assert_eq!(meta["paused"], true, "{meta}");
    let records = metrics(&out);
    let steps: Vec<u64> = records
        .iter()
        .map(|r| r["step"].as_u64().unwrap())
        .collect();
    let mut sorted = steps.clone();
    sorted.dedup();
    assert_eq!(sorted, [0, 1, 2, 3, 4], "each step logged once:\n{log}");
    assert_eq!(steps, sorted, "no step logged twice");
    for r in &records[1..] {
        assert!(r["mean_staleness"].as_f64().unwrap() <= 2.0, "{r}");
        assert_eq!(r["groups"], 2, "{r}");
    }
    let versions = call_versions(&out).await;
    for (id, v) in &versions {
        // Within an attempt versions only move forward (an attempt cut by
        // the SIGKILL is retried after the resume), never past the last.
        if let Some(w) = v.windows(2).find(|w| w[0] > w[1]) {
            panic!("{id}: versions go backwards {w:?}");
        }
        assert!(v.iter().all(|&x| x <= last.version), "{id}: {v:?}");
    }
    assert!(out.join("checkpoints/step-000004/meta.json").is_file());
}

/// Without `--reward`, the harness's own `reward` events score the run:
/// the calc agent posts the documented `{"value": x, ...}` payload.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_a_reward_plugin_the_harness_reward_event_scores() {
    let setup = Setup::new().await;
    let config = setup.config_with("harness", "steps = 1\nmode = \"sync\"", None, "");
    let log = finish(setup.spawn(&config, false));
    let records = metrics(&setup.out("harness"));
    assert_eq!(records.len(), 2, "{log}");
    let step = &records[1];
    assert_eq!(step["rollouts"], 4, "{step}");
    assert_eq!(
        step["excluded_no_reward"], 0,
        "every rollout is scored: {step}"
    );
    assert_eq!(step["plugin_failures"], 0, "{step}");
    // Every second answer is off by one: half the rollouts earn 1.0.
    assert_eq!(step["reward_mean"], 0.5, "{step}");
    assert!(records[0]["val_reward"].is_number(), "{}", records[0]);
    let roles: Vec<&str> = step["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["adapter"], "no reward plugin: {step}");
}

/// The reward is swapped while the run goes (`agl plugin reload` through
/// the run's gateway): rewards change from that step on, metrics name the
/// plugin that scored each step, and a plugin that fails to load leaves
/// the current one serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reward_swapped_while_the_run_goes_scores_the_next_steps() {
    swap_a_reward_in("faulty-reward").await;
}

/// The same swap with a reward written in Python (plugins/python/faulty,
/// built with componentize-py): the run's plugin host serves it in the same
/// sandbox, from the step after the swap.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_python_reward_swapped_while_the_run_goes_scores_the_next_steps() {
    swap_a_reward_in("faulty-py").await;
}

/// Runs 4 sync steps scored by `reported` (0/1 per calc rollout) and swaps
/// in `reward` after step 1, configured with `fault = "calls"`: it scores a
/// rollout by its number of model calls, 2 for every calc rollout.
async fn swap_a_reward_in(reward: &str) {
    let setup = Setup::new().await;
    let config = setup.config_with(
        "swap",
        "steps = 4\nmode = \"sync\"",
        Some("reported"),
        &format!("[plugin.{reward}]\nfault = \"calls\""),
    );
    let plugins = repo_root().join("build/plugins");
    let wasm = plugins.join(format!("{reward}.wasm"));
    // Compiled into the component cache first (a Python component takes
    // seconds to compile).
    let inspect = Command::new(AGL)
        .arg("--config")
        .arg(&config)
        .args(["plugin", "inspect"])
        .arg(&wasm)
        .output()
        .unwrap();
    assert!(inspect.status.success(), "{inspect:?}");
    let out = setup.out("swap");
    // Step 2's calls wait at the engine until the swap is done: the agents
    // are faster than a component load, so without this the swap races them.
    setup.engine.state().admin.hold_after_next_reload();
    let mut child = setup.spawn(&config, false);
    let gateway = run_gateway_url(&mut child);
    let t = Instant::now();
    while !std::fs::read_to_string(out.join("metrics.jsonl"))
        .unwrap_or_default()
        .contains("\"step\":1,")
    {
        assert!(child.try_wait().unwrap().is_none(), "agl run exited early");
        assert!(t.elapsed() < Duration::from_secs(240), "no first step");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let broken = setup.dir.path().join("broken.wasm");
    std::fs::write(&broken, b"\0asm not a component").unwrap();
    let reload = |path: &Path| {
        Command::new(AGL)
            .args(["plugins", "reload", "--gateway", &gateway, "--reward"])
            .arg(path)
            .env_remove("AGL_ADMIN_KEY")
            .output()
            .unwrap()
    };
    let bad = reload(&broken);
    assert!(!bad.status.success());
    let why = String::from_utf8_lossy(&bad.stderr);
    assert!(why.contains("old plugin keeps serving"), "{why}");
    let good = reload(&wasm);
    assert!(
        good.status.success(),
        "{}",
        String::from_utf8_lossy(&good.stderr)
    );
    assert!(
        String::from_utf8_lossy(&good.stdout).starts_with(&format!("reward: {reward}")),
        "{}",
        String::from_utf8_lossy(&good.stdout)
    );
    setup.engine.state().admin.release();
    let log = finish(child);

    let hash = blake3_hex(&wasm);
    let records = metrics(&out);
    let scored_by = |r: &Value| -> Vec<String> {
        r["plugins"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["role"] == "reward")
            .map(|p| p["name"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(scored_by(&records[1]), ["reported"], "{log}");
    assert!(records[1]["reward_mean"].as_f64().unwrap() <= 1.0);
    let mut swapped = false;
    for r in &records[2..] {
        let by = scored_by(r);
        if by == [reward] {
            swapped = true;
            assert_eq!(r["reward_mean"], 2.0, "{r}");
            let p = r["plugins"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["role"] == "reward");
            assert_eq!(p.unwrap()["wasm_hash"], hash.as_str(), "{r}");
        } else {
            assert!(!swapped, "a step after the swap scored by {by:?}: {r}");
        }
    }
    // The swap returned before any call of step 2 was answered, so steps
    // 2 to 4 collected every rollout after it.
    assert_eq!(scored_by(&records[2]), [reward], "{log}");
    assert_eq!(scored_by(&records[3]), [reward], "{log}");
    assert_eq!(scored_by(&records[4]), [reward], "{log}");
}

/// The gateway URL from `agl serve`'s log; keeps draining its stderr.
pub(crate) fn gateway_url(child: &mut Child) -> String {
    let stderr = child.stderr.take().expect("stderr piped");
    url_after(stderr, "gateway listening")
}

/// The gateway URL from `agl run`'s first line on stdout (its log is in the
/// run folder); keeps draining its stdout.
pub(crate) fn run_gateway_url(child: &mut Child) -> String {
    let stdout = child.stdout.take().expect("stdout piped");
    url_after(stdout, "agl run: gateway")
}

fn url_after(stream: impl std::io::Read + Send + 'static, marker: &str) -> String {
    use std::io::{BufRead, BufReader};
    let mut lines = BufReader::new(stream).lines();
    let url = loop {
        let line = lines
            .next()
            .expect("agl exited before listening")
            .expect("read its output");
        if line.contains(marker)
            && let Some(at) = line.find("http://")
        {
            let url: String = line[at..]
                .chars()
                .take_while(|c| !c.is_whitespace() && *c != '\u{1b}')
                .collect();
            break url;
        }
    };
    std::thread::spawn(move || for _ in lines {});
    url
}

fn blake3_hex(path: &Path) -> String {
    blake3::hash(&std::fs::read(path).unwrap())
        .to_hex()
        .to_string()
}

/// `[train.lora]` on SGLang: each update loads the adapter (a PEFT
/// folder) under a new name and moves requests to it; checkpoints hold
/// PEFT's adapter folder; a run killed with SIGKILL resumes from it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lora_run_loads_each_adapter_and_resumes_after_sigkill() {
    let setup = Setup::new().await;
    let config = setup.config_with(
        "lora",
        "steps = 3",
        Some("reported"),
        "[train.lora]\nrank = 4\nalpha = 8\n",
    );
    let out = setup.out("lora");
    let mut child = setup.spawn(&config, false);
    let second = out.join("checkpoints/step-000002/meta.json");
    let t = Instant::now();
    while !second.is_file() {
        if child.try_wait().unwrap().is_some() {
            panic!("agl run exited early:\n{}", finish(child));
        }
        assert!(
            t.elapsed() < Duration::from_secs(240),
            "no second checkpoint"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let checkpoint = out.join("checkpoints/step-000002");
    assert!(checkpoint.join("adapter/adapter_config.json").is_file());
    assert!(
        checkpoint
            .join("adapter/adapter_model.safetensors")
            .is_file()
    );
    assert!(
        !checkpoint.join("model").exists(),
        "a LoRA checkpoint holds no base"
    );
    let adapter: Value = serde_json::from_str(
        &std::fs::read_to_string(checkpoint.join("adapter/adapter_config.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(adapter["peft_type"], "LORA");
    assert_eq!(adapter["r"], 4);

    let log = finish(setup.spawn(&config, true));
    assert!(log.contains("run finished after 3 steps"), "{log}");
    let store = Store::open(out.join("agl.db")).unwrap();
    let last = store.latest_weight_version().await.unwrap().unwrap();
    let meta = last.meta.parse().unwrap();
    assert_eq!(meta["step"], 3, "{meta}");

    // Each update is a new adapter (PEFT folder) under a new name,
    // requests move to it, and the one before is unloaded.
    let requests = setup.engine.requests();
    let loads: Vec<&Value> = requests
        .iter()
        .filter(|r| r.path == "/load_lora_adapter")
        .filter_map(|r| r.body.as_ref())
        .collect();
    assert!(loads.len() >= 3, "{loads:?}");
    assert!(
        !requests
            .iter()
            .any(|r| r.path == "/update_weights_from_disk"),
        "a LoRA run loads adapters, not whole weights"
    );
    let last = loads.last().unwrap();
    assert_eq!(last["lora_name"], format!("agl-v{}", 3));
    let folder = Path::new(last["lora_path"].as_str().unwrap());
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(folder.join("adapter_config.json")).unwrap())
            .unwrap();
    assert_eq!(config["r"], 4);
    let adapters = setup.engine.state().admin.adapters();
    assert_eq!(
        adapters.keys().collect::<Vec<_>>(),
        ["agl-v3"],
        "older adapters unloaded"
    );
    let models: Vec<&str> = requests
        .iter()
        .filter(|r| r.path == "/v1/chat/completions")
        .filter_map(|r| r.body.as_ref()?["model"].as_str())
        .collect();
    assert!(models.contains(&"tiny"), "{models:?}");
    assert!(models.contains(&"tiny:agl-v2"), "{models:?}");
}

impl Setup {
    /// [`Setup::config_with`] for an engine of `kind` (`vllm`, `sglang`).
    fn config_for(&self, kind: &str, out: &str, run: &str, extra: &str) -> PathBuf {
        let path = self.config_with(out, run, Some("reported"), extra);
        let text = std::fs::read_to_string(&path).unwrap();
        let text = text.replace("kind = \"sglang\"", &format!("kind = \"{kind}\""));
        std::fs::write(&path, text).unwrap();
        path
    }

    /// The weight-update calls the engine got, in order, as `path` and body.
    fn admin_calls(&self) -> Vec<(String, Value)> {
        const ADMIN: [&str; 11] = [
            "/pause",
            "/resume",
            "/collective_rpc",
            "/update_weight_version",
            "/v1/load_lora_adapter",
            "/v1/unload_lora_adapter",
            "/pause_generation",
            "/continue_generation",
            "/update_weights_from_disk",
            "/load_lora_adapter",
            "/unload_lora_adapter",
        ];
        self.engine
            .requests()
            .into_iter()
            .filter(|r| ADMIN.contains(&r.path.as_str()))
            .map(|r| (r.path, r.body.unwrap_or(Value::Null)))
            .collect()
    }
}

/// vLLM 0.33's RL routes, in order, per update: pause keeping requests,
/// reload from the folder, set the version, resume; the engine then
/// reports the version every later call is recorded under.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_vllm_engine_reloads_full_weights_through_its_rl_routes() {
    let setup = Setup::new().await;
    let config = setup.config_for("vllm", "vllm", "steps = 2", "");
    finish(setup.spawn(&config, false));
    let calls = setup.admin_calls();
    let paths: Vec<&str> = calls.iter().map(|(p, _)| p.as_str()).collect();
    let one = [
        "/pause",
        "/collective_rpc",
        "/update_weight_version",
        "/resume",
    ];
    assert_eq!(paths, [one, one].concat(), "{calls:?}");
    assert_eq!(calls[0].1["mode"], "keep");
    assert_eq!(calls[1].1["method"], "reload_weights");
    let folder = calls[5].1["kwargs"]["weights_path"].as_str().unwrap();
    assert!(Path::new(folder).join("config.json").is_file(), "{folder}");
    assert_eq!(calls[2].1["new_version"], "1");
    assert_eq!(calls[6].1["new_version"], "2");
    assert_eq!(setup.engine.state().admin.weight_version(), "2");
    assert!(!setup.engine.state().admin.paused());
    let versions = call_versions(&setup.out("vllm")).await;
    let all: std::collections::BTreeSet<u64> = versions.values().flatten().copied().collect();
    assert!(all.is_subset(&[0, 1, 2].into()), "{all:?}");
}

/// LoRA on vLLM: each update loads the adapter folder under a new name
/// (`/v1/load_lora_adapter`), requests move to it (vLLM serves an adapter
/// under its own name), the previous one is unloaded.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_vllm_engine_takes_each_lora_adapter_under_a_new_name() {
    let setup = Setup::new().await;
    let config = setup.config_for(
        "vllm",
        "vllm-lora",
        "steps = 2",
        "[train.lora]\nrank = 4\nalpha = 8\n",
    );
    finish(setup.spawn(&config, false));
    let calls = setup.admin_calls();
    let paths: Vec<&str> = calls.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(
        paths,
        [
            "/v1/unload_lora_adapter", // the first load clears its name
            "/v1/load_lora_adapter",
            "/v1/load_lora_adapter",
            "/v1/unload_lora_adapter",
        ],
        "{calls:?}"
    );
    assert_eq!(calls[1].1["lora_name"], "agl-v1");
    assert_eq!(calls[2].1["lora_name"], "agl-v2");
    assert_eq!(calls[3].1["lora_name"], "agl-v1");
    let folder = Path::new(calls[2].1["lora_path"].as_str().unwrap());
    assert!(folder.join("adapter_model.safetensors").is_file());
    let models: std::collections::BTreeSet<String> = setup
        .engine
        .requests()
        .iter()
        .filter(|r| r.path == "/v1/chat/completions")
        .filter_map(|r| Some(r.body.as_ref()?["model"].as_str()?.to_string()))
        .collect();
    assert!(
        models.contains("tiny") && models.contains("agl-v1"),
        "{models:?}"
    );
}

/// A reload the engine refuses stops the run with an error that says so,
/// leaves the proxy paused and the engine on its previous weights
/// (resumed), and loses no recorded rollout.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failed_reload_stops_the_run_paused_on_the_previous_version() {
    let setup = Setup::new().await;
    setup.engine.state().admin.fail_next_loads(1);
    let config = setup.config_for("sglang", "failed", "steps = 2", "");
    let out = setup.spawn(&config, false).wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{text}");
    assert!(
        text.contains("the engine did not take weight version 1")
            && text.contains("the proxy stays paused"),
        "{text}"
    );
    assert!(text.contains("update_weights_from_disk"), "{text}");
    let calls = setup.admin_calls();
    let paths: Vec<&str> = calls.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(
        paths,
        [
            "/pause_generation",
            "/update_weights_from_disk",
            "/continue_generation"
        ],
        "the engine is resumed on its old weights"
    );
    assert_eq!(setup.engine.state().admin.weight_version(), "default");
    let store = Store::open(setup.out("failed").join("agl.db")).unwrap();
    let last = store.latest_weight_version().await.unwrap().unwrap();
    assert_eq!(last.version, 0, "version 1 was never recorded");
    let versions = call_versions(&setup.out("failed")).await;
    assert!(
        versions.len() >= 4,
        "the step's rollouts are kept: {versions:?}"
    );
}
