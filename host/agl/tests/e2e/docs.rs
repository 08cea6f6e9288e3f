//! What the README promises, checked against the repo.

use crate::support::repo_root;

/// The harnesses the README's first paragraph says agl trains each have a
/// runnable example (`examples/<name>`): the README names none that
/// nothing in the repo runs.
#[test]
fn the_readme_names_only_harnesses_with_an_example() {
    let readme = std::fs::read_to_string(repo_root().join("README.md")).expect("README");
    let start = readme.find("harnesses (").expect("the harness list") + "harnesses (".len();
    let list = &readme[start..start + readme[start..].find(')').expect("list end")];
    let list = list
        .split(';')
        .next()
        .unwrap_or_default()
        .replace('\n', " ");
    let examples: Vec<String> = std::fs::read_dir(repo_root().join("examples"))
        .expect("examples")
        .flatten()
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    let named: Vec<String> = list
        .split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty() && !n.contains("own loop"))
        .map(|n| n.to_lowercase().replace(' ', "-"))
        .collect();
    assert!(named.len() >= 4, "{list}");
    for name in &named {
        assert!(
            examples.iter().any(|e| name.starts_with(e.as_str())),
            "README names {name}, which has no example (examples: {examples:?})"
        );
    }
}

/// Without a GPU the CUDA tests are reported skipped, not passed: each is
/// `#[ignore]`d (`deploy/gpu-check.sh` runs them with `--ignored`), and no
/// other test returns early on a missing device.
#[test]
fn cuda_tests_are_skipped_not_passed_without_a_gpu() {
    let path = repo_root().join("trainer/tests/trainer/cuda.rs");
    let text = std::fs::read_to_string(&path).expect("cuda.rs");
    let lines: Vec<&str> = text.lines().collect();
    let tests: Vec<usize> = (0..lines.len())
        .filter(|&i| lines[i].trim() == "#[test]")
        .collect();
    assert!(tests.len() >= 5, "{}", path.display());
    for i in tests {
        assert!(
            lines[i + 1].trim_start().starts_with("#[ignore"),
            "{}:{} runs (and passes) without CUDA",
            path.display(),
            i + 1
        );
    }
    let gpu_check =
        std::fs::read_to_string(repo_root().join("deploy/gpu-check.sh")).expect("gpu-check.sh");
    assert!(gpu_check.contains("cuda --ignored"), "gpu-check runs them");
}
