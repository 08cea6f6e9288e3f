//! Subcommands of the `agl` binary.

pub mod controller;
pub mod engine;
pub mod eval;
pub mod model;
pub mod plugin;
mod render;
pub mod rollouts;
mod rules;
pub mod run;
pub mod serve;
pub mod train;

use anyhow::Context;

/// The async runtime every subcommand that does I/O runs on.
fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    agl_gateway::runtime::build().context("cannot start the async runtime")
}
