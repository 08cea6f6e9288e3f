//! Points this crate's test and bench binaries at the libtorch agl-model
//! linked (see `../link_libtorch.rs`).

include!("../link_libtorch.rs");

fn main() {
    link_libtorch_from("DEP_AGL_MODEL_LIBTORCH_LIB");
}
