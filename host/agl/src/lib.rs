//! agl: harnessed agentic RL. The `agl` binary's library half: the config
//! that composes every subsystem's section, `agl run` (the training loop
//! over gateway, engine, controller, plugins and trainer), the runtime and
//! the plugin scaffold and builder. The subsystems are their own crates (see
//! ARCHITECTURE.md).

pub mod config;
pub mod logfile;
pub mod plugin_build;
pub mod run;
pub mod runtime;
pub mod scaffold;
