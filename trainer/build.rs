//! Points the trainer's own test/bench binaries at libtorch, and hands the
//! libtorch lib dir on to dependents.
//!
//! torch-sys (`links = "tch"`) exports the dir it linked against as
//! `DEP_TCH_LIBTORCH_LIB`; with `LIBTORCH_USE_PYTORCH=1` that is the venv's
//! `torch/lib`, which is not on the loader path, so binaries need an rpath.
//! Dependents (the `agl` binary) read `DEP_AGL_TRAINER_LIBTORCH_LIB` in their
//! own build scripts to add the same rpath.
fn main() {
    println!("cargo:rerun-if-env-changed=DEP_TCH_LIBTORCH_LIB");
    match std::env::var("DEP_TCH_LIBTORCH_LIB") {
        Ok(dir) => {
            println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
            println!("cargo:libtorch_lib={dir}");
        }
        Err(_) => {
            println!("cargo:warning=torch-sys did not export DEP_TCH_LIBTORCH_LIB; no rpath set")
        }
    }
}
