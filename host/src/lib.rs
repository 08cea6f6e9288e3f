//! agl: harnessed agentic RL. The `agl` binary's library half.

pub mod chat_template;
pub mod config;
pub mod controller;
pub mod gateway;
pub mod inference;
pub mod model;
pub mod plugin;
pub mod rollout;
pub mod run;
pub mod runtime;
pub mod scaffold;
pub mod store;
pub mod testengine;
pub mod tokenizer;
