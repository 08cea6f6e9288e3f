//! Gives agl's binaries (the CLI, tests, benches) an rpath to the libtorch
//! that agl-model linked, keeping `libtorch_cuda.so` when that libtorch has
//! it (see `trainer/link_libtorch.rs`: otherwise `--as-needed` drops it and
//! no GPU is ever seen).
//!
//! Also lists the guest SDK's sources and the WIT contract for
//! `agl plugin new`, which writes them out wherever agl runs (see
//! `src/scaffold.rs`).

use std::path::{Path, PathBuf};

include!("../../trainer/link_libtorch.rs");

fn main() {
    println!("cargo:rerun-if-changed=../../trainer/link_libtorch.rs");
    link_libtorch_from("DEP_AGL_MODEL_LIBTORCH_LIB");
    embed_sdk();
}

/// Writes `$OUT_DIR/sdk_files.rs`: `SDK_FILES`, each file of
/// `plugins/sdk/src`, the sample rules it builds on (`host/samples/src`),
/// `wit/` and the Python SDK (`plugins/python/agl_plugin`
/// and its builder `agl_build.py`) as (path from the repo root, contents).
fn embed_sdk() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let repo = manifest.join("../..");
    let mut files = Vec::new();
    for dir in [
        "plugins/sdk/src",
        "host/samples/src",
        "wit",
        "plugins/python/agl_plugin",
    ] {
        println!("cargo:rerun-if-changed={}", repo.join(dir).display());
        collect(&repo, &repo.join(dir), &mut files);
    }
    let builder = "plugins/python/agl_build.py";
    println!("cargo:rerun-if-changed={}", repo.join(builder).display());
    files.push(builder.to_string());
    files.sort();
    let mut out = String::from("pub const SDK_FILES: &[(&str, &str)] = &[\n");
    for rel in files {
        let abs = repo.join(&rel).canonicalize().expect("listed file exists");
        out.push_str(&format!(
            "    ({:?}, include_str!({:?})),\n",
            rel,
            abs.display().to_string()
        ));
    }
    out.push_str("];\n");
    let dest = PathBuf::from(std::env::var("OUT_DIR").expect("set by cargo")).join("sdk_files.rs");
    std::fs::write(dest, out).expect("write sdk_files.rs");
}

fn collect(repo: &Path, dir: &Path, files: &mut Vec<String>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("dir entry").path();
        if path.is_dir() && path.file_name().is_some_and(|n| n != "__pycache__") {
            println!("cargo:rerun-if-changed={}", path.display());
            collect(repo, &path, files);
        } else if path.is_file()
            && path
                .extension()
                .is_some_and(|e| e == "rs" || e == "wit" || e == "py")
        {
            let rel = path.strip_prefix(repo).expect("under the repo");
            files.push(rel.display().to_string().replace('\\', "/"));
        }
    }
}
