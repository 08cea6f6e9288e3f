//! Gives agl's binaries (the CLI, tests, benches) an rpath to the libtorch
//! that agl-model linked (see trainer/README.md), and keeps
//! `libtorch_cuda.so` linked when that libtorch has it (see trainer/build_support.rs:
//! otherwise `--as-needed` drops it and no GPU is ever seen).
fn main() {
    println!("cargo:rerun-if-env-changed=DEP_AGL_MODEL_LIBTORCH_LIB");
    if let Ok(dir) = std::env::var("DEP_AGL_MODEL_LIBTORCH_LIB") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
        if std::path::Path::new(&dir).join("libtorch_cuda.so").exists() {
            println!("cargo:rustc-link-arg=-Wl,--no-as-needed,-L{dir},-ltorch_cuda,--as-needed");
        }
    }
}
