//! The deployment layout, as separate processes on one machine: `agl
//! engine serve` (SmolLM2, agl's own engine), `agl serve` (the gateway,
//! rendering with the policy its config names), `agl controller` (the calc
//! agents) and `agl train` (the trainer), all on one agl.toml (the calc
//! example's, shrunk). Two steps: the weight version advances on the engine
//! (its `/load_weights` route) and in the gateway's records, metrics and a
//! checkpoint are written; `agl train --resume` continues to a third step.
//! `agl eval --gateway` then measures the base and the newest checkpoint
//! through the same processes. The same config through `agl run`
//! (everything in one process, the engine embedded) gives the same
//! accounting.

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};

use serde_json::Value;

use crate::engine_server::smollm2_dir;
use crate::support::{AGL, repo_root, spawn_listening};

/// A child killed when dropped.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The calc example's agl.toml with the model, data and folders pointed at
/// the test's, two small steps, and `extra` overrides.
fn args(dir: &Path, model: &Path, extra: &[String]) -> Vec<String> {
    let config = repo_root().join("examples/calc/agl.toml");
    let at = |p: &str| format!("{:?}", dir.join(p).display().to_string());
    let mut args = vec!["--config".into(), config.display().to_string()];
    let sets = [
        format!("model.path={:?}", model.display().to_string()),
        format!("run.data={}", at("data.jsonl")),
        "run.steps=2".into(),
        "run.group_size=2".into(),
        "run.groups_per_step=2".into(),
        "run.val_every=2".into(),
        "run.val_size=2".into(),
        "run.checkpoint_every=1".into(),
        "run.keep_checkpoints=3".into(),
        "run.progress=false".into(),
        "controller.concurrency=4".into(),
        "controller.poll_interval_ms=100".into(),
        format!("controller.logs_dir={}", at("logs")),
        "gateway.max_tokens=24".into(),
    ];
    for s in sets.into_iter().chain(extra.iter().cloned()) {
        args.push("-o".into());
        args.push(s);
    }
    args
}

fn agl(args: &[String]) -> Command {
    let mut cmd = Command::new(AGL);
    cmd.args(args)
        .env_remove("AGL_CONFIG")
        .env_remove("AGL_ADMIN_KEY")
        .env_remove("AGL_LOG");
    cmd
}

async fn finish(mut cmd: Command) -> Output {
    tokio::task::spawn_blocking(move || {
        cmd.stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .output()
            .expect("run agl")
    })
    .await
    .expect("join")
}

fn text(out: &Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn metrics(out_dir: &Path) -> Vec<Value> {
    std::fs::read_to_string(out_dir.join("metrics.jsonl"))
        .expect("metrics.jsonl")
        .lines()
        .map(|l| serde_json::from_str(l).expect("a step record"))
        .collect()
}

/// Per step: rollouts, samples and what was excluded.
fn accounting(records: &[Value]) -> Vec<[u64; 6]> {
    let n = |r: &Value, k: &str| r[k].as_u64().unwrap_or(0);
    records
        .iter()
        .map(|r| {
            [
                n(r, "step"),
                n(r, "rollouts"),
                n(r, "samples"),
                n(r, "excluded_system"),
                n(r, "excluded_no_reward"),
                n(r, "plugin_failures"),
            ]
        })
        .collect()
}

async fn get(url: &str) -> Value {
    reqwest::get(url)
        .await
        .expect("get")
        .json()
        .await
        .expect("json")
}

/// Four training questions and two validation ones from the calc data.
fn data(dir: &Path) {
    let rows = std::fs::read_to_string(repo_root().join("examples/calc/data.jsonl")).unwrap();
    let rows: Vec<Value> = rows
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let train = rows.iter().filter(|r| r["split"] == "train").take(4);
    let val = rows.iter().filter(|r| r["split"] == "val").take(2);
    let text: String = train.chain(val).map(|r| format!("{r}\n")).collect();
    std::fs::write(dir.join("data.jsonl"), text).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_controller_train_and_engine_as_separate_processes() {
    let model = smollm2_dir();
    let dir = tempfile::tempdir().expect("tempdir");
    data(dir.path());

    let mut engine = agl(&[]);
    engine
        .args(["engine", "serve", "--listen", "127.0.0.1:0"])
        .args([
            "--served-model-name",
            "smollm2",
            "--max-seqs",
            "8",
            "--max-len",
            "512",
        ])
        .arg("--model")
        .arg(&model);
    let (child, port) = spawn_listening(&mut engine);
    let _engine = Running(child);
    let engine_url = format!("http://127.0.0.1:{port}");
    let remote = [
        "engine.kind=\"agl\"".to_string(),
        format!("engine.base_url={engine_url:?}"),
        format!(
            "run.out_dir={:?}",
            dir.path().join("train").display().to_string()
        ),
    ];
    let config = args(dir.path(), &model, &remote);

    let mut serve = agl(&config);
    serve
        .args(["serve", "--listen", "127.0.0.1:0", "--db"])
        .arg(dir.path().join("gateway.db"));
    let (child, port) = spawn_listening(&mut serve);
    let _serve = Running(child);
    let gateway = format!("http://127.0.0.1:{port}");

    let mut controller = agl(&config);
    controller
        .args(["controller", "--gateway", &gateway])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let _controller = Running(controller.spawn().expect("agl controller"));

    let mut train = agl(&config);
    train.args(["train", "--gateway", &gateway]);
    let out = finish(train).await;
    assert!(out.status.success(), "agl train: {}", text(&out));
    assert!(
        text(&out).contains("run finished after 2 steps"),
        "{}",
        text(&out)
    );

    // The engine serves version 2, and the gateway recorded it.
    let info = get(&format!("{engine_url}/weight_info")).await;
    assert_eq!(info["weight_version"], "2", "{info}");
    let weights = get(&format!("{gateway}/v1/weights")).await;
    assert_eq!(weights["latest"]["version"], 2, "{weights}");
    let train_dir = dir.path().join("train");
    let records = metrics(&train_dir);
    let steps: Vec<u64> = records
        .iter()
        .map(|r| r["step"].as_u64().unwrap())
        .collect();
    assert_eq!(steps, [0, 1, 2], "{}", text(&out));
    for r in &records[1..] {
        assert_eq!(r["rollouts"], 4, "{r}");
        assert_eq!(r["weight_version"], r["step"], "{r}");
    }
    assert!(
        train_dir
            .join("checkpoints/step-000002/meta.json")
            .is_file()
    );
    // The second step's groups were sampled by version 1 (sync mode).
    // Its rollouts are named after its run folder (`train`): another run
    // on the same gateway never adopts them.
    let second: Value = get(&format!("{gateway}/v1/rollouts/train-g000002-r0/export")).await;
    let versions: Vec<u64> = second["calls"]
        .as_array()
        .expect("calls")
        .iter()
        .map(|c| c["weight_version"].as_u64().expect("version"))
        .collect();
    assert!(
        !versions.is_empty() && versions.iter().all(|&v| v == 1),
        "{second}"
    );

    // Resumed for a third step.
    let mut resumed = agl(&[config.clone(), vec!["-o".into(), "run.steps=3".into()]].concat());
    resumed.args(["train", "--gateway", &gateway, "--resume"]);
    let out = finish(resumed).await;
    assert!(out.status.success(), "agl train --resume: {}", text(&out));
    let info = get(&format!("{engine_url}/weight_info")).await;
    assert_eq!(info["weight_version"], "3", "{info}");
    let steps: Vec<u64> = metrics(&train_dir)
        .iter()
        .map(|r| r["step"].as_u64().unwrap())
        .collect();
    assert_eq!(steps, [0, 1, 2, 3], "{}", text(&out));

    // `agl eval` through the same gateway: the base, then the newest
    // checkpoint, each loaded into the engine under a version of its own.
    let mut eval = agl(&config);
    eval.args([
        "eval",
        "--gateway",
        &gateway,
        "--policy",
        "base",
        "--policy",
    ])
    .arg(&train_dir)
    .arg("--out")
    .arg(dir.path().join("eval"));
    let out = finish(eval).await;
    assert!(out.status.success(), "agl eval --gateway: {}", text(&out));
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("eval/eval.json")).unwrap())
            .unwrap();
    let versions: Vec<u64> = report["policies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["weight_version"].as_u64().unwrap())
        .collect();
    assert_eq!(versions, [4, 5], "{report}");
    let info = get(&format!("{engine_url}/weight_info")).await;
    assert_eq!(info["weight_version"], "5", "{info}");
    let task = &report["policies"][1]["tasks"][0];
    assert_eq!(task["samples"], 1, "{report}");
    let id = task["rollouts"][0].as_str().unwrap();
    assert!(id.starts_with("eval-"), "{id}");
    let rollout: Value = get(&format!("{gateway}/v1/rollouts/{id}/export")).await;
    assert!(
        rollout["calls"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["weight_version"] == 5),
        "{rollout}"
    );

    // The same config in one process: the same accounting.
    let local = [format!(
        "run.out_dir={:?}",
        dir.path().join("run").display().to_string()
    )];
    let mut run = agl(&args(dir.path(), &model, &local));
    run.arg("run");
    let out = finish(run).await;
    assert!(out.status.success(), "agl run: {}", text(&out));
    let one = accounting(&metrics(&dir.path().join("run")));
    let apart = accounting(&records);
    assert_eq!(one, apart, "agl run vs agl serve + controller + train");
}
