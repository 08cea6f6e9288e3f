//! agl-engine: the per-sequence cache against the model's full forward,
//! and the engine (scheduler, sampling, weight updates). One test binary
//! (each links libtorch).

mod cache;
#[allow(dead_code)] // each test binary uses a subset
#[path = "../../../tests/common.rs"]
mod common;
mod engine;
