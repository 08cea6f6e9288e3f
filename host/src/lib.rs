//! agl: harnessed agentic RL. The `agl` binary's library half.

pub mod chat_template;
pub mod rollout;
pub mod tokenizer;
