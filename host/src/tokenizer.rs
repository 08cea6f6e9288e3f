//! The policy's tokenizer and chat template, as the plugin host's `tokenizer`
//! import (and later the engine) sees them.

use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("cannot load tokenizer {path}: {message}")]
    Load { path: PathBuf, message: String },
    #[error("tokenizer: {0}")]
    Tokenize(String),
    #[error("chat template: {0}")]
    Template(String),
    #[error("no chat template configured for this tokenizer")]
    NoTemplate,
}

/// A `tokenizer.json` (Hugging Face `tokenizers`) plus an optional chat
/// template, read from `tokenizer_config.json` beside it when present.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    template: Option<crate::chat_template::ChatTemplate>,
}

impl Tokenizer {
    pub fn from_file(path: &Path) -> Result<Self, TokenizerError> {
        let _ = path;
        todo!("implemented by the lead")
    }

    pub fn vocab_size(&self) -> u32 {
        self.inner.get_vocab_size(true) as u32
    }

    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, TokenizerError> {
        let _ = (text, add_special_tokens);
        todo!()
    }

    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, TokenizerError> {
        let _ = (ids, skip_special_tokens);
        todo!()
    }

    /// `messages_json`: an OpenAI `messages` array; `tools_json`: a `tools` array.
    pub fn apply_chat_template(
        &self,
        messages_json: &str,
        tools_json: Option<&str>,
        add_generation_prompt: bool,
    ) -> Result<String, TokenizerError> {
        let _ = (messages_json, tools_json, add_generation_prompt, &self.template);
        todo!()
    }
}
