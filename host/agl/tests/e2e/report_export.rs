//! `[report]` exports end to end: `agl run` and `agl train` (the calc
//! harness on the scripted test engine, the tiny policy) with TensorBoard
//! and an offline W&B run on; both read back with the projects' own readers
//! (`tests/python/read_report.py`: TensorBoard's `EventAccumulator`, the
//! wandb package's transaction-log reader) hold every step's scalars as
//! `metrics.jsonl` has them, the run's config and the plugin hashes. A
//! resumed run replaces the steps logged past its checkpoint; a sidecar
//! that dies is a warning, and the run finishes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use agl::run::report::{StepRecord, read_records, scalars};
use serde_json::Value;

use crate::agl_run::{Setup, finish};
use crate::support::{ADMIN, AGL, python, python_json, repo_root, spawn_serve_with};

/// `agl --config CONFIG ARGS..`, W&B kept off the network and out of
/// `$HOME`.
fn agl(setup: &Setup, config: &Path, args: &[&str]) -> Command {
    let wandb_home = setup.out("wandb-home");
    let mut cmd = Command::new(AGL);
    cmd.arg("--config")
        .arg(config)
        .args(args)
        .current_dir(setup.out("."))
        .env_remove("AGL_CONFIG")
        .env_remove("AGL_ADMIN_KEY")
        .env_remove("WANDB_API_KEY")
        .env("WANDB_MODE", "offline")
        .env("WANDB_SILENT", "true")
        .env("WANDB_ERROR_REPORTING", "false")
        .env("WANDB_CONFIG_DIR", wandb_home.join("config"))
        .env("WANDB_CACHE_DIR", wandb_home.join("cache"))
        .env("WANDB_DATA_DIR", wandb_home.join("data"))
        .env("WANDB_ARTIFACT_DIR", wandb_home.join("artifacts"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

fn spawn(mut cmd: Command) -> Child {
    cmd.spawn().expect("spawn agl")
}

/// A child killed when dropped.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The config `Setup` writes for `out`, with `report` appended as the
/// `[report]` table.
fn config_with_report(setup: &Setup, out: &str, run: &str, report: &str) -> PathBuf {
    let config = setup.config(out, run);
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str("\n[report]\n");
    text.push_str(report);
    std::fs::write(&config, text).unwrap();
    config
}

/// Both exports, W&B offline, the sidecar run by the venv's Python.
fn both_exports() -> String {
    format!(
        "tensorboard = true\npython = \"{}\"\nwandb = {{ project = \"agl-e2e\", mode = \"offline\" }}\n",
        python().display()
    )
}

/// The run folder's exports as `read_report.py` reads them.
async fn read_back(out: &Path) -> Value {
    let mut cmd = Command::new(python());
    cmd.arg(repo_root().join("tests/python/read_report.py"))
        .arg(out);
    python_json(cmd).await
}

/// `tag -> step -> value` of the TensorBoard read-back.
fn tensorboard_scalars(read: &Value) -> BTreeMap<String, BTreeMap<u64, f64>> {
    let mut out: BTreeMap<String, BTreeMap<u64, f64>> = BTreeMap::new();
    for (tag, points) in read["tensorboard"]["scalars"].as_object().unwrap() {
        for p in points.as_array().unwrap() {
            let step = p[0].as_u64().unwrap();
            let prev = out
                .entry(tag.clone())
                .or_default()
                .insert(step, p[1].as_f64().unwrap());
            assert!(prev.is_none(), "{tag} logged twice at step {step}");
        }
    }
    out
}

/// TensorBoard holds every tag of every record, and nothing else. Its
/// scalars are float32 (`simple_value`), so each equals the record's value
/// rounded to f32 (compared as f32: serde_json may misread the last bit of
/// the f64 Python prints).
fn assert_tensorboard_holds(read: &Value, records: &[StepRecord]) {
    let tb = tensorboard_scalars(read);
    let mut logged = 0;
    for r in records {
        let expect = scalars(r);
        assert!(expect.len() > 3, "{expect:?}");
        for (tag, v) in &expect {
            let got = tb.get(tag).and_then(|s| s.get(&r.step));
            assert_eq!(
                got.map(|g| *g as f32),
                Some(*v as f32),
                "TensorBoard {tag} at step {}",
                r.step
            );
        }
        logged += expect.len();
    }
    let points: usize = tb.values().map(BTreeMap::len).sum();
    assert_eq!(points, logged, "no TensorBoard scalar beyond the records'");
}

/// A W&B run's history is a row per record with its scalars exactly (JSON
/// both ways; `_`-keys are W&B's own).
fn assert_wandb_history(run: &Value, records: &[StepRecord]) {
    assert_eq!(run["exit_code"], 0, "finished cleanly");
    let history = run["history"].as_array().unwrap();
    assert_eq!(history.len(), records.len(), "{history:?}");
    for (row, r) in history.iter().zip(records) {
        assert_eq!(row["step"], r.step, "{row}");
        let items: BTreeMap<String, f64> = row["items"]
            .as_object()
            .unwrap()
            .iter()
            .filter(|(k, _)| !k.starts_with('_'))
            .map(|(k, v)| (k.clone(), v.as_f64().unwrap()))
            .collect();
        assert_eq!(items, scalars(r), "W&B step {}", r.step);
    }
}

fn text_of(read: &Value, tag: &str) -> String {
    read["tensorboard"]["text"][tag][0][1]
        .as_str()
        .unwrap_or_else(|| panic!("no TensorBoard text {tag}: {}", read["tensorboard"]["text"]))
        .to_string()
}

fn steps(records: &[StepRecord]) -> Vec<u64> {
    records.iter().map(|r| r.step).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tensorboard_and_wandb_hold_every_step_of_metrics_jsonl() {
    let setup = Setup::new().await;
    let config = config_with_report(
        &setup,
        "export",
        "steps = 2\nmode = \"sync\"",
        &both_exports(),
    );
    let log = finish(spawn(agl(&setup, &config, &["run"])));
    let out = setup.out("export");
    let records = read_records(&out.join("metrics.jsonl")).unwrap();
    assert_eq!(
        steps(&records),
        [0, 1, 2],
        "baseline, then two steps:\n{log}"
    );
    assert!(
        log.contains("tensorboard: ") && log.contains("wandb: "),
        "where the exports are: {log}"
    );
    let agl_log = std::fs::read_to_string(out.join("agl.log")).unwrap();
    assert!(agl_log.contains("report sink started"), "{agl_log}");
    assert!(
        !agl_log
            .lines()
            .any(|l| l.contains("WARN") && l.contains("report")),
        "no export warning: {agl_log}"
    );

    let read = read_back(&out).await;
    assert_tensorboard_holds(&read, &records);
    // The figures the issue names are there for a training step.
    let tb = tensorboard_scalars(&read);
    for tag in [
        "train/reward",
        "val/reward",
        "train/calls_per_rollout",
        "train/samples_per_rollout",
        "breaks/retokenize",
        "update/mismatch_mean",
        "update/grad_norm",
        "update/entropy",
        "time/wait_s",
        "time/train_s",
        "time/drain_s",
    ] {
        assert!(tb.get(tag).is_some_and(|s| s.contains_key(&2)), "{tag}");
    }
    assert_eq!(
        tb["train/reward"][&1] as f32,
        records[1].reward_mean.unwrap() as f32
    );

    let runs = read["wandb"]["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 1, "one offline run: {}", read["wandb"]);
    let run = &runs[0];
    assert_eq!(run["project"], "agl-e2e");
    assert_wandb_history(run, &records);

    // The config: the run's sections with their defaults, the plugins with
    // their hashes; in W&B's run config and TensorBoard's text.
    let trained = &records[1].plugins;
    assert!(!trained.is_empty(), "{:?}", records[1]);
    let config = &run["config"];
    assert_eq!(config["run"]["steps"], 2, "{config}");
    assert_eq!(config["run"]["group_size"], 2, "{config}");
    assert_eq!(config["train"]["lr"], 1e-3, "{config}");
    assert_eq!(config["train"]["estimator"], "grpo", "a default: {config}");
    assert_eq!(config["report"]["tensorboard"], true, "{config}");
    assert_eq!(config["engine"]["kind"], "sglang", "{config}");
    let hashes = |v: &Value| -> Vec<String> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|p| p["wasm_hash"].as_str().unwrap().to_string())
            .collect()
    };
    let want: Vec<String> = trained.iter().map(|p| p.wasm_hash.clone()).collect();
    assert_eq!(hashes(&config["plugins"]), want, "{config}");
    assert_eq!(hashes(&run["summary"]["plugins"]), want);
    let text = text_of(&read, "config");
    assert!(text.contains("\"steps\": 2"), "{text}");
    let plugins = text_of(&read, "plugins");
    for hash in &want {
        assert!(plugins.contains(hash.as_str()), "{plugins}");
    }
}

/// A run resumed from an older checkpoint logs its later steps again:
/// TensorBoard keeps the new values only (the restart purges the old),
/// and W&B continues the same run id in a second offline directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_resumed_run_replaces_the_steps_past_its_checkpoint() {
    let setup = Setup::new().await;
    let config = config_with_report(
        &setup,
        "resumed",
        "steps = 2\nmode = \"sync\"",
        &both_exports(),
    );
    let log = finish(spawn(agl(&setup, &config, &["run"])));
    let out = setup.out("resumed");
    let first = read_records(&out.join("metrics.jsonl")).unwrap();
    assert_eq!(steps(&first), [0, 1, 2], "{log}");
    // As if the run had died before its step-2 checkpoint.
    std::fs::remove_dir_all(out.join("checkpoints/step-000002")).unwrap();
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, text.replace("steps = 2\n", "steps = 3\n")).unwrap();
    let log = finish(spawn(agl(&setup, &config, &["run", "--resume"])));
    let records = read_records(&out.join("metrics.jsonl")).unwrap();
    assert_eq!(steps(&records), [0, 1, 2, 3], "{log}");
    assert_ne!(records[2], first[2], "step 2 ran again");

    let read = read_back(&out).await;
    assert_tensorboard_holds(&read, &records);
    let runs = read["wandb"]["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2, "{}", read["wandb"]);
    assert_eq!(runs[0]["run_id"], runs[1]["run_id"], "one W&B run");
    assert_wandb_history(&runs[0], &first);
    assert_wandb_history(&runs[1], &records[2..]);
}

/// `agl train` (the trainer apart, against `agl serve` and `agl
/// controller`) exports the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn agl_train_exports_its_steps_too() {
    let setup = Setup::new().await;
    let config = config_with_report(
        &setup,
        "apart",
        "steps = 2\nmode = \"sync\"",
        &both_exports(),
    );
    let served = spawn_serve_with(&setup.out("apart.db"), Some(&config));
    let mut controller = agl(&setup, &config, &["controller", "--gateway", &served.base]);
    controller
        .env("AGL_ADMIN_KEY", ADMIN)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let _controller = Running(spawn(controller));
    let mut train = agl(&setup, &config, &["train", "--gateway", &served.base]);
    train.env("AGL_ADMIN_KEY", ADMIN);
    let log = finish(spawn(train));
    let out = setup.out("apart");
    let records = read_records(&out.join("metrics.jsonl")).unwrap();
    assert_eq!(steps(&records), [0, 1, 2], "{log}");
    assert!(log.contains("tensorboard: "), "{log}");

    let read = read_back(&out).await;
    assert_tensorboard_holds(&read, &records);
    let runs = read["wandb"]["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 1, "{}", read["wandb"]);
    assert_wandb_history(&runs[0], &records);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_report_sink_that_dies_is_a_warning_and_the_run_finishes() {
    let setup = Setup::new().await;
    let fake = setup.out("fake-python");
    std::fs::write(
        &fake,
        "#!/bin/sh\necho 'no module named wandb' >&2\nexit 3\n",
    )
    .unwrap();
    let mut perms = std::fs::metadata(&fake).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(&fake, perms).unwrap();
    let config = config_with_report(
        &setup,
        "dies",
        "steps = 1\nmode = \"sync\"",
        &format!(
            "tensorboard = true\npython = \"{}\"\nwandb = {{ project = \"p\" }}\n",
            fake.display()
        ),
    );
    let log = finish(spawn(agl(&setup, &config, &["run"])));
    let out = setup.out("dies");
    let records = read_records(&out.join("metrics.jsonl")).unwrap();
    assert_eq!(steps(&records), [0, 1], "{log}");
    assert!(
        log.contains("report sink exited") && log.contains("no module named wandb"),
        "a warning with the sink's own words: {log}"
    );
    let agl_log = std::fs::read_to_string(out.join("agl.log")).unwrap();
    assert!(agl_log.contains("report sink exited"), "{agl_log}");
    assert!(!out.join("tensorboard").exists());
}
