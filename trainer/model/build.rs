//! Compiles the model's C++ shims against the libtorch torch-sys linked
//! (oneDNN's linear with its backward, `csrc/onednn_linear.cpp`; the fused
//! elementwise ops, `csrc/fused.cpp` and `csrc/fused_kernels.cpp`), points
//! this crate's own test binaries at libtorch, and hands the libtorch lib
//! dir on to dependents: `links = "agl_model"` makes it
//! `DEP_AGL_MODEL_LIBTORCH_LIB` in their build scripts, which add the same
//! rpath (the `agl` binary, agl-engine's tests). The shims' static
//! libraries are bundled into this crate's rlib, so dependents link them
//! without help.

use std::path::Path;

include!("../build_support.rs");
include!("../link_libtorch.rs");

fn main() {
    let dir = libtorch_lib();
    torch_cpp(&dir)
        .file("../csrc/onednn_linear.cpp")
        .compile("agl_onednn_linear");
    compile_fused(&dir);
    link_libtorch(&dir);
    println!("cargo:libtorch_lib={}", dir.display());
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
        .file("../csrc/fused_kernels.cpp")
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
    build.file("../csrc/fused.cpp");
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
