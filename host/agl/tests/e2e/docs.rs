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
/// `#[ignore]`d (`deploy/gpu-check.sh` runs them with `--ignored`).
#[test]
fn cuda_tests_are_skipped_not_passed_without_a_gpu() {
    let path = repo_root().join("trainer/rl/tests/rl/cuda.rs");
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

/// What asks whether a device or CPU feature is here.
const PROBES: [&str; 5] = [
    "is_x86_feature_detected!",
    "Cuda::is_available",
    "agl_fused_supported",
    "available()",
    "usable(",
];

/// No test in the tree returns early on a missing device or CPU feature
/// without being reported skipped (`tests/support/skip.rs`, counted by
/// `tests/run.sh`): in the test code of every crate (its `tests/` and what
/// follows `#[cfg(test)]` in its sources), a function that probes for one
/// either reports the skip itself or asserts the device is there (a test
/// that returns on a helper's answer relies on the helper's report).
#[test]
fn no_test_returns_early_on_a_missing_device_unreported() {
    let root = repo_root();
    let mut files = Vec::new();
    for top in ["host", "trainer", "plugins"] {
        rust_files(&root.join(top), &mut files);
    }
    assert!(files.len() > 100, "{} files", files.len());
    let mut probing = 0;
    let mut unreported = Vec::new();
    for path in &files {
        let text = std::fs::read_to_string(path).expect("readable source");
        let in_tests = path.components().any(|c| c.as_os_str() == "tests");
        let code = match text.find("#[cfg(test)]") {
            _ if in_tests => &text[..],
            Some(at) => &text[at..],
            None => continue,
        };
        for (line, body) in functions(code) {
            if PROBES.iter().any(|p| body.contains(p)) {
                probing += 1;
                if !body.contains("skip(") && !body.contains("assert!(") {
                    unreported.push(format!(
                        "{}: fn at line {line} of its test code",
                        path.display()
                    ));
                }
            }
        }
    }
    // The fused ops', oneDNN's and the decode kernels' probes at least.
    assert!(probing >= 3, "found {probing} probing functions");
    assert!(
        unreported.is_empty(),
        "probes for a device or CPU feature, and neither reports a skip nor asserts:\n{}",
        unreported.join("\n")
    );
}

fn rust_files(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() && entry.file_name() != "target" && entry.file_name() != "node_modules" {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Each `fn`'s body in `code` (brace-matched from the signature) with the
/// line it starts on. Braces in strings and comments are rare enough in
/// test code that a miscount only merges two bodies.
fn functions(code: &str) -> Vec<(usize, &str)> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(at) = code[from..].find("fn ").map(|i| i + from) {
        from = at + 3;
        let word_start = at == 0 || !code.as_bytes()[at - 1].is_ascii_alphanumeric();
        let Some(open) = code[at..].find('{').map(|i| i + at) else {
            break;
        };
        if !word_start || code[at..open].contains(';') {
            continue;
        }
        let mut depth = 0usize;
        let mut end = code.len();
        for (i, c) in code[open..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = open + i + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        out.push((code[..at].lines().count() + 1, &code[open..end]));
    }
    out
}
