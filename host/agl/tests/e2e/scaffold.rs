//! `agl plugin new`: the scaffolded crate passes its own test and builds to
//! a wasm component, outside this workspace and without its sources.

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A target root of its own, so the inner cargo never waits on the lock of
/// the cargo running this test.
fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("target"))
        .join("scaffold")
}

fn cargo(dir: &Path, args: &[&str]) {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(cargo)
        .args(args)
        .current_dir(dir)
        .env("CARGO_TARGET_DIR", target_dir())
        .output()
        .expect("cargo runs");
    assert!(
        out.status.success(),
        "cargo {args:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `agl plugin new` as a user runs it on a machine without the agl source:
/// the real binary, started outside the checkout with a fresh HOME, so the
/// SDK can only come from inside the binary.
#[test]
fn a_plugin_scaffolded_anywhere_passes_its_test_and_builds_to_wasm() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let home = tmp.path().join("home");
    let work = tmp.path().join("work");
    std::fs::create_dir_all(&home).unwrap();
    std::fs::create_dir_all(&work).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_agl"))
        .args(["plugin", "new", "scaffold-probe"])
        .current_dir(&work)
        .env("HOME", &home)
        .env_remove("AGL_CONFIG")
        .output()
        .expect("agl runs");
    assert!(
        out.status.success(),
        "agl plugin new: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dir = work.join("scaffold-probe");
    let manifest: toml::Table =
        toml::from_str(&std::fs::read_to_string(dir.join("Cargo.toml")).unwrap()).unwrap();
    let sdk = PathBuf::from(
        manifest["dependencies"]["agl-plugin"]["path"]
            .as_str()
            .expect("a path dependency"),
    );
    let repo = repo().canonicalize().unwrap();
    assert!(
        sdk.starts_with(&home) && !sdk.starts_with(&repo),
        "the SDK must come from the binary, not the checkout: {}",
        sdk.display()
    );
    // The workspace's lockfile pins the versions already downloaded, so the
    // build needs no registry access; cargo drops the unused entries.
    std::fs::copy(repo.join("Cargo.lock"), dir.join("Cargo.lock")).expect("lockfile");

    cargo(&dir, &["test", "--quiet"]);
    // `agl plugin build` runs cargo for wasm32-wasip2 and copies the
    // component beside the crate.
    let built = Command::new(env!("CARGO_BIN_EXE_agl"))
        .args(["plugin", "build", "."])
        .current_dir(&dir)
        .env("HOME", &home)
        .env("CARGO_TARGET_DIR", target_dir())
        .env_remove("AGL_CONFIG")
        .output()
        .expect("agl runs");
    assert!(
        built.status.success(),
        "agl plugin build: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    let wasm = dir.join("scaffold-probe.wasm");
    assert_eq!(
        String::from_utf8_lossy(&built.stdout).trim(),
        wasm.display().to_string()
    );
    let bytes = std::fs::read(&wasm).unwrap_or_else(|e| panic!("{}: {e}", wasm.display()));
    // A component (layer 1), not a core module.
    assert_eq!(
        &bytes[..8],
        b"\0asm\x0d\x00\x01\x00",
        "{} is not a component",
        wasm.display()
    );
}
