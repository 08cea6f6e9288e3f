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
