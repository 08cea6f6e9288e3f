//! Every Kubernetes manifest in `deploy/` validates against the pinned
//! Kubernetes schema (kubernetes-validate, strict: unknown fields fail).
//! Job templates are rendered first by the controller's own renderer with a
//! sample rollout, exactly as `agl controller --runner k8s` would.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use agl_controller::kube::{JobSpec, JobTemplate, KubeConfig};
use serde_json::json;

use crate::support::{python, repo_root};

/// The schema version deploy/setup.sh pins (one definition).
fn schema_version() -> String {
    let setup = std::fs::read_to_string(repo_root().join("deploy/setup.sh")).unwrap();
    setup
        .lines()
        .find_map(|l| l.strip_prefix("KUBERNETES_SCHEMA_VERSION="))
        .expect("deploy/setup.sh pins KUBERNETES_SCHEMA_VERSION")
        .trim()
        .to_string()
}

fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            yaml_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
            out.push(path);
        }
    }
}

/// `kubernetes-validate --strict` on `files`: (success, output).
fn validate(files: &[PathBuf]) -> (bool, String) {
    let bin = python().with_file_name("kubernetes-validate");
    let out = Command::new(&bin)
        .args(["--strict", "-k", &schema_version()])
        .args(files)
        .output()
        .unwrap_or_else(|e| panic!("{}: {e} (run deploy/setup.sh)", bin.display()));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn every_manifest_in_deploy_validates_against_the_pinned_schema() {
    let mut files = Vec::new();
    yaml_files(&repo_root().join("deploy"), &mut files);
    files.sort();
    let names: Vec<String> = files
        .iter()
        .map(|f| f.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    for expected in [
        "controller.yaml",
        "rbac.yaml",
        "job-template.yaml",
        "trainer.yaml",
    ] {
        assert!(
            names.iter().any(|n| n == expected),
            "{expected} in {names:?}"
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let spec = JobSpec {
        rollout_id: "g000003-r1".into(),
        attempt: 2,
        // The keys both bundled templates read (the example agent's and
        // mini-swe's).
        input: json!({"task": "What is 6 * 7?", "meta": {"split": "train"},
                      "instance_id": "x", "repo_path": "x", "step_limit": 7}),
        env: BTreeMap::from([("AGL_ROLLOUT_ID".to_string(), "g000003-r1".to_string())]),
        timeout_secs: 600,
    };
    let config = KubeConfig {
        image: "agl-agent:1".into(),
        ..KubeConfig::default()
    };
    let mut checked = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        if text.contains("{{") {
            // A Job template: what the controller would create from it.
            let job = JobTemplate::new(&text)
                .and_then(|t| t.render(&spec, &config))
                .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            let rendered = dir.path().join(format!(
                "rendered-{}.json",
                file.file_stem().unwrap().to_string_lossy()
            ));
            std::fs::write(&rendered, serde_json::to_string(&job).unwrap()).unwrap();
            checked.push(rendered);
        } else {
            checked.push(file.clone());
        }
    }
    let (ok, text) = validate(&checked);
    assert!(ok, "{text}");
    let passed = text
        .lines()
        .filter(|l| l.contains(" passed for resource "))
        .count();
    // Every document of every file (a file may hold several).
    let documents: usize = checked
        .iter()
        .map(|f| {
            let t = std::fs::read_to_string(f).unwrap();
            if f.extension().is_some_and(|e| e == "json") {
                1
            } else {
                t.split("\n---").filter(|d| d.contains("kind:")).count()
            }
        })
        .sum();
    assert_eq!(passed, documents, "{text}");
}

#[test]
fn the_validator_rejects_a_misspelt_field() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.yaml");
    std::fs::write(
        &path,
        "apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: x\nspec:\n  completionz: 2\n  \
         template:\n    spec:\n      restartPolicy: Never\n      containers:\n        \
         - name: a\n          image: b\n",
    )
    .unwrap();
    let (ok, text) = validate(&[path]);
    assert!(!ok, "{text}");
    assert!(text.contains("completionz"), "{text}");
}

/// `agl controller --runner k8s --dry-run`: the Job for a sample rollout
/// (the mini-swe template, a row of its tasks) and for a rollout a live
/// `agl serve` holds (the generic template), both printed by the real
/// binary and both valid against the pinned schema; the second carries the
/// rollout's own token and URLs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dry_run_job_validates_and_carries_the_rollout() {
    use crate::support::{ADMIN, AGL, spawn_serve};

    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("agl.toml");
    let template = |name: &str| repo_root().join("deploy/k8s").join(name);
    let write_config = |template: &Path| {
        std::fs::write(
            &config,
            format!(
                "[gateway]\npublic_base_url = \"http://agl-gateway:8400\"\n[controller]\n\
                 runner = \"k8s\"\ntimeout_secs = 321\nenv_map = {{ MSWE_STEP_LIMIT = \
                 \"input.step_limit\" }}\n[controller.kube]\njob_template = {:?}\nimage = \
                 \"agl-agent:2\"\n",
                template.display().to_string()
            ),
        )
        .unwrap();
    };
    let dry_run = |args: &[&str]| {
        let out = Command::new(AGL)
            .arg("--config")
            .arg(&config)
            .args(["controller", "--dry-run"])
            .args(args)
            .env_remove("AGL_CONFIG")
            .env("AGL_ADMIN_KEY", ADMIN)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let job: serde_json::Value = serde_json::from_str(&text).unwrap();
        job
    };
    let env_of = |job: &serde_json::Value| -> BTreeMap<String, String> {
        job["spec"]["template"]["spec"]["containers"][0]["env"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                (
                    e["name"].as_str().unwrap().to_owned(),
                    e["value"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect()
    };

    // A sample rollout of a mini-swe task row.
    write_config(&template("mini-swe-job.yaml"));
    let row = std::fs::read_to_string(repo_root().join("examples/mini-swe/tasks.jsonl")).unwrap();
    let row = row.lines().next().unwrap();
    let sample = dry_run(&["--input", row]);
    let env = env_of(&sample);
    assert_eq!(
        env["AGL_INPUT"],
        serde_json::from_str::<serde_json::Value>(row)
            .unwrap()
            .to_string()
    );
    assert_eq!(
        env["OPENAI_BASE_URL"],
        "http://agl-gateway:8400/proxy/dry-run/1/train/openai/v1"
    );
    assert_eq!(sample["spec"]["activeDeadlineSeconds"], 321);
    assert_eq!(
        sample["spec"]["template"]["spec"]["containers"][0]["image"],
        "agl-agent:2"
    );

    // A rollout in a live gateway's store.
    write_config(&template("job-template.yaml"));
    let served = spawn_serve(&dir.path().join("agl.db"));
    let created: serde_json::Value = reqwest::Client::new()
        .post(format!("{}/v1/rollouts", served.base))
        .bearer_auth(ADMIN)
        .json(&json!({"rollouts": [{"rollout_id": "dry-1", "mode": "val",
                      "input": {"task": "What is 6 * 7?", "step_limit": 9}}]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let rollout = &created["rollouts"][0];
    let live = dry_run(&["--gateway", &served.base, "--rollout", "dry-1"]);
    let env = env_of(&live);
    assert_eq!(env["OPENAI_API_KEY"], rollout["token"].as_str().unwrap());
    assert_eq!(
        env["OPENAI_BASE_URL"],
        rollout["proxy_base_url"].as_str().unwrap()
    );
    assert_eq!(env["MSWE_STEP_LIMIT"], "9");

    let files: Vec<PathBuf> = [("sample", &sample), ("live", &live)]
        .iter()
        .map(|(name, job)| {
            let path = dir.path().join(format!("{name}.json"));
            std::fs::write(&path, serde_json::to_string(job).unwrap()).unwrap();
            path
        })
        .collect();
    let (ok, text) = validate(&files);
    assert!(ok, "{text}");
    assert_eq!(text.matches(" passed for resource ").count(), 2, "{text}");
}
