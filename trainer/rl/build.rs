//! Compiles the RL crate's C++ shims against the libtorch torch-sys linked
//! (the CUDA autocast dtype, `csrc/autocast.cpp`; the cache of large CPU
//! blocks, `csrc/block_cache.cpp`; the c10d process group, `csrc/c10d*.cpp`,
//! with its symbol check) and points this crate's own test and bench
//! binaries at libtorch.

use std::path::{Path, PathBuf};

include!("../build_support.rs");
include!("../link_libtorch.rs");

fn main() {
    let dir = libtorch_lib();
    torch_cpp(&dir)
        .file("../csrc/autocast.cpp")
        .compile("agl_autocast");
    torch_cpp(&dir)
        .file("../csrc/block_cache.cpp")
        .compile("agl_block_cache");
    compile_c10d(&dir);
    link_libtorch(&dir);
}

/// The c10d shim: the Gloo backend's construction alone against agl's
/// opaque gloo declarations (`csrc/gloo-decl`), NCCL's with the `nccl` feature, the rest through
/// `c10d::Backend`. Then the check that the archive defines nothing of gloo.
fn compile_c10d(lib_dir: &Path) {
    println!("cargo:rerun-if-env-changed=CARGO_FEATURE_NCCL");
    // torch's include dirs hold no gloo/ headers, so the declarations are
    // the only ones found.
    let mut gloo = torch_cpp(lib_dir);
    gloo.include("../csrc/gloo-decl")
        .flag("-DUSE_C10D_GLOO")
        .file("../csrc/c10d_gloo.cpp");
    let objects = gloo.compile_intermediates();
    let mut build = torch_cpp(lib_dir);
    build.file("../csrc/c10d.cpp").file("../csrc/c10d_nccl.cpp");
    if std::env::var_os("CARGO_FEATURE_NCCL").is_some() {
        let site = lib_dir.parent().and_then(Path::parent).unwrap_or(lib_dir);
        build
            .flag("-DAGL_NCCL")
            .flag("-DUSE_C10D_NCCL")
            .flag("-DUSE_CUDA")
            .include(site.join("nvidia/nccl/include"))
            .include(site.join("nvidia/cu13/include"));
        println!(
            "cargo:rustc-link-arg=-Wl,--no-as-needed,-L{},-ltorch_cuda,-lc10_cuda,--as-needed",
            lib_dir.display()
        );
    }
    for o in objects {
        build.object(o);
    }
    build.compile("agl_c10d");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    check_no_gloo(&out.join("libagl_c10d.a"));
}

/// Fails the build if the shim defines any gloo symbol, `GlooStore`,
/// `AsyncWork`, `SendWork`, `RecvWork`, or `ProcessGroupGloo`'s vtable or
/// typeinfo: those would be compiled from agl's opaque declarations instead
/// of gloo's, so a torch header that started holding a gloo type by value
/// must stop the build rather than miscompile.
fn check_no_gloo(archive: &Path) {
    let out = std::process::Command::new("nm")
        .args(["--defined-only", "--format=just-symbols"])
        .arg(archive)
        .output()
        .unwrap_or_else(|e| panic!("running nm on {}: {e}", archive.display()));
    assert!(
        out.status.success(),
        "nm {}: {}",
        archive.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let bad: Vec<&str> = text.lines().filter(|s| gloo_symbol(s)).collect();
    assert!(
        bad.is_empty(),
        "the c10d shim defines gloo symbols it must take from libtorch: {bad:?}"
    );
}

/// `(^|[^0-9])4gloo|9GlooStore|9AsyncWork|8SendWork|8RecvWork|^_ZT[VIS].*16ProcessGroupGloo`
fn gloo_symbol(s: &str) -> bool {
    let gloo_ns = s
        .match_indices("4gloo")
        .any(|(at, _)| at == 0 || !s.as_bytes()[at - 1].is_ascii_digit());
    let classes = ["9GlooStore", "9AsyncWork", "8SendWork", "8RecvWork"]
        .iter()
        .any(|c| s.contains(c));
    let vtable = ["_ZTV", "_ZTI", "_ZTS"].iter().any(|p| s.starts_with(p))
        && s.contains("16ProcessGroupGloo");
    gloo_ns || classes || vtable
}
