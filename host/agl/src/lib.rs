//! agl: harnessed agentic RL. The `agl` binary's library half: the config
//! that composes every subsystem's section, `agl run` (the training loop
//! over gateway, engine, controller, plugins and trainer) and
//! the plugin scaffold and builder. The subsystems are their own crates (see
//! ARCHITECTURE.md).

pub mod assembly;
pub mod config;
pub mod eval;
pub mod link;
pub mod logfile;
pub mod plugin_build;
pub mod plugins;
pub mod policy;
pub mod rollout_set;
pub mod run;
pub mod scaffold;
pub mod viewer;
