//! agl's one conversation core (no HTTP, no engine):
//! - [`message`]: the conversation every front-end maps into (system, user,
//!   assistant with text, reasoning and tool calls, tool results, tools),
//!   compared on its parsed form;
//! - [`openai_chat`]: Chat Completions messages, in and out (the
//!   conversation's own notation; the gateway's `front::chat` serves the
//!   API, and every API's reader lives with its front-end there);
//! - [`family`]: how a model family writes tool calls and reasoning, and
//!   parsing an output's text back into a turn;
//! - [`render`]: the policy's chat template and tokenizer, whole or only
//!   what follows a sampled turn;
//! - [`continuation`]: token-exact continuation of the chains a rollout
//!   attempt was served.

pub mod continuation;
pub mod family;
pub mod message;
pub mod openai_chat;
pub mod render;

pub use continuation::{Chains, Prompt, Served};
pub use family::{Family, ToolFormat, compact_schema};
pub use message::{AssistantTurn, Conversation, Message, ToolCall, ToolChoice};
pub use render::Renderer;

#[derive(Debug, thiserror::Error)]
pub enum ConversationError {
    /// A request part the conversation cannot hold (the front-end answers
    /// 400 in its own error shape).
    #[error("{0}")]
    Unsupported(String),
    #[error("rendering the conversation: {0}")]
    Render(String),
}

impl ConversationError {
    pub fn unsupported(message: impl Into<String>) -> Self {
        ConversationError::Unsupported(message.into())
    }
}
