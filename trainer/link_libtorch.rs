// How a binary that links libtorch finds it at run time (`include!`d by
// the build scripts of the trainer crates, `agl-inference` and `agl`).
//
// torch-sys (`links = "tch"`) exports the dir it linked against as
// `DEP_TCH_LIBTORCH_LIB`, and agl-model passes it on as
// `DEP_AGL_MODEL_LIBTORCH_LIB`; with `LIBTORCH_USE_PYTORCH=1` that is the
// venv's `torch/lib`, which is not on the loader path, so binaries need an
// rpath.
//
// With a CUDA build of torch, nothing in our code references a symbol of
// `libtorch_cuda.so` (CUDA registers itself from that library's static
// initialisers), so the linker's `--as-needed` drops it and
// `tch::Cuda::is_available()` is always false. Linking it with
// `--no-as-needed` keeps it a `NEEDED` entry (tch's documented fix).

/// This crate's binaries (tests, benches, the CLI) find libtorch in `dir`
/// and keep its CUDA library.
fn link_libtorch(dir: &std::path::Path) {
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.display());
    if dir.join("libtorch_cuda.so").exists() {
        println!(
            "cargo:rustc-link-arg=-Wl,--no-as-needed,-L{},-ltorch_cuda,--as-needed",
            dir.display()
        );
    }
}

/// [`link_libtorch`] for the dir a dependency exported as `var`.
#[allow(dead_code)] // the crates that compile against libtorch call `link_libtorch`
fn link_libtorch_from(var: &str) {
    println!("cargo:rerun-if-env-changed={var}");
    if let Ok(dir) = std::env::var(var) {
        link_libtorch(std::path::Path::new(&dir));
    }
}
