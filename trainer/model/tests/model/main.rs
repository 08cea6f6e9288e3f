//! agl-model: weights, scoring, parity with transformers. One
//! test binary (each links libtorch).

#[allow(dead_code)] // each module uses a subset
#[path = "../../../tests/common.rs"]
mod common;
mod hf_parity;
mod scoring;
mod weights;
