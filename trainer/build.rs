//! Points the trainer's own test/bench binaries at libtorch, and hands the
//! libtorch lib dir on to dependents.
//!
//! torch-sys (`links = "tch"`) exports the dir it linked against as
//! `DEP_TCH_LIBTORCH_LIB`; with `LIBTORCH_USE_PYTORCH=1` that is the venv's
//! `torch/lib`, which is not on the loader path, so binaries need an rpath.
//! Dependents (the `agl` binary) read `DEP_AGL_TRAINER_LIBTORCH_LIB` in their
//! own build scripts to add the same rpath.
//!
//! With a CUDA build of torch, nothing in our code references a symbol of
//! `libtorch_cuda.so` (CUDA registers itself from that library's static
//! initialisers), so the linker's `--as-needed` drops it and
//! `tch::Cuda::is_available()` is always false. Linking it with
//! `--no-as-needed` keeps it a `NEEDED` entry (tch's documented fix).
fn main() {
    println!("cargo:rerun-if-env-changed=DEP_TCH_LIBTORCH_LIB");
    match std::env::var("DEP_TCH_LIBTORCH_LIB") {
        Ok(dir) => {
            println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
            println!("cargo:libtorch_lib={dir}");
            if std::path::Path::new(&dir).join("libtorch_cuda.so").exists() {
                println!(
                    "cargo:rustc-link-arg=-Wl,--no-as-needed,-L{dir},-ltorch_cuda,--as-needed"
                );
            }
        }
        Err(_) => {
            println!("cargo:warning=torch-sys did not export DEP_TCH_LIBTORCH_LIB; no rpath set")
        }
    }
}
