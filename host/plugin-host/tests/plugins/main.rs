//! The plugin host: loading, sandbox limits, every built-in plugin.
//! One test binary for the crate (each links the whole dependency tree).

mod host;
mod mini_swe;
mod python;
#[allow(dead_code)] // each module uses a subset
mod support;
