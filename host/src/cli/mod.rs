//! Subcommands of the `agl` binary.

pub mod plugin;
mod render;
pub mod rollouts;
pub mod serve;
