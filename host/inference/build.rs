//! Gives this crate's binaries (tests, benches) an rpath to the libtorch
//! that agl-model linked, keeping `libtorch_cuda.so` (see
//! `trainer/link_libtorch.rs`: otherwise `--as-needed` drops it and no GPU
//! is ever seen).

include!("../../trainer/link_libtorch.rs");

fn main() {
    println!("cargo:rerun-if-changed=../../trainer/link_libtorch.rs");
    link_libtorch_from("DEP_AGL_MODEL_LIBTORCH_LIB");
}
