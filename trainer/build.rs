//! Compiles the autocast shim (`csrc/autocast.cpp`) against the libtorch
//! torch-sys linked, points the trainer's own test/bench binaries at
//! libtorch, and hands the libtorch lib dir on to dependents.
//!
//! torch-sys (`links = "tch"`) exports the dir it linked against as
//! `DEP_TCH_LIBTORCH_LIB`; with `LIBTORCH_USE_PYTORCH=1` that is the venv's
//! `torch/lib`, which is not on the loader path, so binaries need an rpath.
//! Dependents (the `agl` binary) read `DEP_AGL_TRAINER_LIBTORCH_LIB` in their
//! own build scripts to add the same rpath. The shim's static library is
//! bundled into this crate's rlib, so dependents link it without help.
//!
//! With a CUDA build of torch, nothing in our code references a symbol of
//! `libtorch_cuda.so` (CUDA registers itself from that library's static
//! initialisers), so the linker's `--as-needed` drops it and
//! `tch::Cuda::is_available()` is always false. Linking it with
//! `--no-as-needed` keeps it a `NEEDED` entry (tch's documented fix).
use std::path::{Path, PathBuf};

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=csrc/autocast.cpp");
    println!("cargo:rerun-if-env-changed=DEP_TCH_LIBTORCH_LIB");
    println!("cargo:rerun-if-env-changed=LIBTORCH_CXX11_ABI");
    let Ok(dir) = std::env::var("DEP_TCH_LIBTORCH_LIB") else {
        panic!("torch-sys did not export DEP_TCH_LIBTORCH_LIB; cannot build the autocast shim");
    };
    let dir = PathBuf::from(dir);
    compile_shim(&dir);
    let dir = dir.display();
    println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
    println!("cargo:libtorch_lib={dir}");
    if Path::new(&format!("{dir}/libtorch_cuda.so")).exists() {
        println!("cargo:rustc-link-arg=-Wl,--no-as-needed,-L{dir},-ltorch_cuda,--as-needed");
    }
}

/// Mirrors torch-sys's own libtch build (torch-sys 0.26 `build.rs`): the
/// headers sit next to `lib/` in both a libtorch download and a torch wheel;
/// the C++11 ABI defaults to 1 as there (every torch 2.x wheel uses it),
/// overridable with torch-sys's `LIBTORCH_CXX11_ABI`.
fn compile_shim(lib_dir: &Path) {
    let root = lib_dir.parent().unwrap_or(lib_dir);
    let abi = std::env::var("LIBTORCH_CXX11_ABI").unwrap_or_else(|_| "1".to_owned());
    cc::Build::new()
        .cpp(true)
        .pic(true)
        .warnings(false)
        .include(root.join("include"))
        .include(root.join("include/torch/csrc/api/include"))
        .flag("-std=c++17")
        // torch 2.13's headers use C++20 bit-field initialisers; torch-sys
        // also builds them as C++17, so only the warning is silenced.
        .flag("-Wno-c++20-extensions")
        .flag(format!("-D_GLIBCXX_USE_CXX11_ABI={abi}"))
        .flag("-DGLOG_USE_GLOG_EXPORT")
        .file("csrc/autocast.cpp")
        .compile("agl_autocast");
}
