//! Points this crate's test and bench binaries at the libtorch agl-model
//! linked (`DEP_AGL_MODEL_LIBTORCH_LIB`, see `../build_support.rs`), keeping
//! `libtorch_cuda.so` linked when that libtorch has it.

fn main() {
    println!("cargo:rerun-if-env-changed=DEP_AGL_MODEL_LIBTORCH_LIB");
    if let Ok(dir) = std::env::var("DEP_AGL_MODEL_LIBTORCH_LIB") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
        if std::path::Path::new(&dir).join("libtorch_cuda.so").exists() {
            println!("cargo:rustc-link-arg=-Wl,--no-as-needed,-L{dir},-ltorch_cuda,--as-needed");
        }
    }
}
