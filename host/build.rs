//! Gives agl's binaries (the CLI, tests, benches) an rpath to the libtorch
//! that agl-trainer linked (see trainer/README.md).
fn main() {
    println!("cargo:rerun-if-env-changed=DEP_AGL_TRAINER_LIBTORCH_LIB");
    if let Ok(dir) = std::env::var("DEP_AGL_TRAINER_LIBTORCH_LIB") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
    }
}
