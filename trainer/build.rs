//! Compiles the C++ shims against the libtorch torch-sys linked (the
//! autocast dtype, `csrc/autocast.cpp`; oneDNN's linear with its backward,
//! `csrc/onednn_linear.cpp`; the cache of large CPU blocks,
//! `csrc/block_cache.cpp`; the fused elementwise ops, `csrc/fused.cpp` and
//! `csrc/fused_kernels.cpp`; the c10d process group,
//! `csrc/c10d*.cpp`, with its symbol check), points the trainer's own
//! test/bench binaries at libtorch, and hands the libtorch lib dir on to
//! dependents.
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
    println!("cargo:rerun-if-changed=csrc");
    println!("cargo:rerun-if-env-changed=DEP_TCH_LIBTORCH_LIB");
    println!("cargo:rerun-if-env-changed=LIBTORCH_CXX11_ABI");
    let Ok(dir) = std::env::var("DEP_TCH_LIBTORCH_LIB") else {
        panic!("torch-sys did not export DEP_TCH_LIBTORCH_LIB; cannot build the autocast shim");
    };
    let dir = PathBuf::from(dir);
    compile_shim(&dir);
    compile_fused(&dir);
    compile_c10d(&dir);
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
    torch_cpp(lib_dir)
        .file("csrc/autocast.cpp")
        .compile("agl_autocast");
    torch_cpp(lib_dir)
        .file("csrc/onednn_linear.cpp")
        .compile("agl_onednn_linear");
    torch_cpp(lib_dir)
        .file("csrc/block_cache.cpp")
        .compile("agl_block_cache");
}

/// The fused elementwise ops (`csrc/fused.cpp`, their loops in
/// `csrc/fused_kernels.cpp`). On x86-64 the loops are built for AVX2 and FMA
/// as ATen builds its own AVX2 kernels (`CPU_CAPABILITY`), and run only
/// behind the CPU check in `fused_kernels.h`; elsewhere ATen's portable
/// vectors. Their threads are OpenMP's, as libtorch's: they link the
/// libgomp next to libtorch (the wheel's), the runtime libtorch itself uses.
fn compile_fused(lib_dir: &Path) {
    let mut kernels = torch_cpp(lib_dir);
    kernels
        .file("csrc/fused_kernels.cpp")
        .flag("-fopenmp")
        .opt_level(3);
    if std::env::var("CARGO_CFG_TARGET_ARCH").as_deref() == Ok("x86_64") {
        kernels
            .flag("-mavx2")
            .flag("-mfma")
            .define("CPU_CAPABILITY", "AVX2")
            .define("CPU_CAPABILITY_AVX2", None);
    } else {
        kernels.define("CPU_CAPABILITY", "DEFAULT");
    }
    let objects = kernels.compile_intermediates();
    let mut build = torch_cpp(lib_dir);
    build.file("csrc/fused.cpp");
    for o in objects {
        build.object(o);
    }
    build.compile("agl_fused");
    println!("cargo:rustc-link-lib=dylib:+verbatim={}", gomp(lib_dir));
}

/// The OpenMP runtime libtorch links: `libgomp.so.1` in a torch wheel,
/// `libgomp-<hash>.so.1` in a libtorch download; the system's otherwise.
fn gomp(lib_dir: &Path) -> String {
    let bundled = std::fs::read_dir(lib_dir).into_iter().flatten().flatten();
    bundled
        .filter_map(|e| e.file_name().into_string().ok())
        .find(|n| n.starts_with("libgomp") && n.contains(".so"))
        .unwrap_or_else(|| "libgomp.so.1".to_owned())
}

/// A C++17 build against libtorch's headers, as torch-sys builds libtch.
fn torch_cpp(lib_dir: &Path) -> cc::Build {
    let root = lib_dir.parent().unwrap_or(lib_dir);
    let abi = std::env::var("LIBTORCH_CXX11_ABI").unwrap_or_else(|_| "1".to_owned());
    let mut build = cc::Build::new();
    build
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
        .flag("-DGLOG_USE_GLOG_EXPORT");
    build
}

/// The c10d shim: the Gloo backend's construction alone against agl's
/// opaque gloo declarations (`csrc/gloo-decl`), NCCL's with the `nccl` feature, the rest through
/// `c10d::Backend`. Then the check that the archive defines nothing of gloo.
fn compile_c10d(lib_dir: &Path) {
    println!("cargo:rerun-if-env-changed=CARGO_FEATURE_NCCL");
    // torch's include dirs hold no gloo/ headers, so the declarations are
    // the only ones found.
    let mut gloo = torch_cpp(lib_dir);
    gloo.include("csrc/gloo-decl")
        .flag("-DUSE_C10D_GLOO")
        .file("csrc/c10d_gloo.cpp");
    let objects = gloo.compile_intermediates();
    let mut build = torch_cpp(lib_dir);
    build.file("csrc/c10d.cpp").file("csrc/c10d_nccl.cpp");
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
