//! Test helpers shared by the crates' test binaries (each includes this
//! file with `#[path]`): the repo root, the venv's Python, process checks.
//! Every includer lives at `host/<crate>`, so the repo root is `../..`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `$AGL_VENV/bin/python` (relative paths from the repo root, as setup.sh
/// resolves them; default `<repo>/.venv`), checked to import `openai`.
pub fn python() -> PathBuf {
    let repo = repo_root();
    let venv = std::env::var_os("AGL_VENV").map_or_else(|| repo.join(".venv"), |v| repo.join(v));
    let python = venv.join("bin/python");
    let ok = Command::new(&python)
        .args(["-c", "import openai"])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        ok,
        "{} cannot import `openai`: run deploy/setup.sh (AGL_VENV={})",
        python.display(),
        venv.display()
    );
    python
}

pub async fn wait_until(limit: Duration, cond: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + limit;
    while !cond() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Whether `pid` is a live process (a zombie counts as gone).
pub fn pid_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat
                .rsplit(')')
                .next()
                .and_then(|r| r.split_whitespace().next());
            state != Some("Z") && state != Some("X")
        }
        Err(_) => false,
    }
}

/// A coding-agent CLI deploy/setup.sh installed from npm
/// (`$AGL_VENV/node/node_modules/.bin/{claude,codex,opencode}`).
pub fn node_cli(name: &str) -> PathBuf {
    let repo = repo_root();
    let venv = std::env::var_os("AGL_VENV").map_or_else(|| repo.join(".venv"), |v| repo.join(v));
    let bin = venv.join("node/node_modules/.bin").join(name);
    assert!(
        bin.exists(),
        "{} missing: run deploy/setup.sh (it installs the pinned CLIs from npm)",
        bin.display()
    );
    bin
}
