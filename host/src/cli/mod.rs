//! Subcommands of the `agl` binary.

pub mod plugin;
mod render;
