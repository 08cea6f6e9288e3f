// What the trainer crates' build scripts share (`include!`d by
// `model/build.rs` and `rl/build.rs`, with `link_libtorch.rs`): the libtorch
// torch-sys linked and a C++ build against its headers.
//
// torch-sys (`links = "tch"`) exports the dir it linked against as
// `DEP_TCH_LIBTORCH_LIB`; with `LIBTORCH_USE_PYTORCH=1` that is the venv's
// `torch/lib`, which is not on the loader path, so binaries need an rpath.
//
// With a CUDA build of torch, nothing in our code references a symbol of
// `libtorch_cuda.so` (CUDA registers itself from that library's static
// initialisers), so the linker's `--as-needed` drops it and
// `tch::Cuda::is_available()` is always false. Linking it with
// `--no-as-needed` keeps it a `NEEDED` entry (tch's documented fix).

/// The libtorch lib dir torch-sys linked; the build reruns when it or the
/// shared C++ sources change.
fn libtorch_lib() -> std::path::PathBuf {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=../build_support.rs");
    println!("cargo:rerun-if-changed=../link_libtorch.rs");
    println!("cargo:rerun-if-changed=../csrc");
    println!("cargo:rerun-if-env-changed=DEP_TCH_LIBTORCH_LIB");
    println!("cargo:rerun-if-env-changed=LIBTORCH_CXX11_ABI");
    let Ok(dir) = std::env::var("DEP_TCH_LIBTORCH_LIB") else {
        panic!("torch-sys did not export DEP_TCH_LIBTORCH_LIB; cannot build the C++ shims");
    };
    std::path::PathBuf::from(dir)
}

/// Mirrors torch-sys's own libtch build (torch-sys 0.26 `build.rs`): the
/// headers sit next to `lib/` in both a libtorch download and a torch wheel;
/// the C++11 ABI defaults to 1 as there (every torch 2.x wheel uses it),
/// overridable with torch-sys's `LIBTORCH_CXX11_ABI`.
/// A C++17 build against libtorch's headers (`../csrc`), as torch-sys builds libtch.
fn torch_cpp(lib_dir: &std::path::Path) -> cc::Build {
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

