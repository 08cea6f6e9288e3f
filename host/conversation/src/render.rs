//! Rendering a conversation with the policy's chat template and tokenizer,
//! as vLLM and transformers do (`apply_chat_template`, then encode without
//! special tokens), and rendering only what follows a sampled assistant turn.
//!
//! What follows a turn is found with a probe: the template renders
//! `[user, assistant(PROBE)]`, then the same plus the new messages and the
//! generation prompt. When the first is a prefix of the second, the rest is
//! exactly what the template writes for the new messages after an assistant
//! turn, and the text between `PROBE` and the end of the first is the turn's
//! closing (`<|im_end|>\n`). The model sampled its own end-of-turn token, so
//! only the closing's remainder (`\n`) is added: context, never trained.

use std::sync::Arc;

use serde_json::{Value, json};

use agl_tokenizer::Tokenizer;

use crate::ConversationError;
use crate::family::Family;
use crate::message::{Conversation, Message};

/// Probe content no template rewrites (no whitespace to trim, no markup).
const PROBE: &str = "AGLPROBEq7Zk";

#[derive(Clone)]
pub struct Renderer {
    tokenizer: Arc<Tokenizer>,
    family: Family,
    /// The text of the tokens that end a turn (EOS), longest first.
    turn_ends: Arc<[String]>,
}

impl Renderer {
    /// `eos_ids`: the ids that end the model's turn.
    pub fn new(tokenizer: Arc<Tokenizer>, eos_ids: &[u32]) -> Result<Renderer, ConversationError> {
        let source = tokenizer.chat_template_source().ok_or_else(|| {
            ConversationError::Render("the tokenizer has no chat template".into())
        })?;
        let family = Family::detect(source);
        let mut turn_ends: Vec<String> = eos_ids
            .iter()
            .filter_map(|&id| tokenizer.decode(&[id], false).ok())
            .filter(|t| !t.is_empty())
            .collect();
        turn_ends.sort_by_key(|t| std::cmp::Reverse(t.len()));
        Ok(Renderer {
            tokenizer,
            family,
            turn_ends: turn_ends.into(),
        })
    }

    /// The policy of a Hugging Face model folder: its `tokenizer.json`,
    /// chat template and end-of-turn ids.
    pub fn from_folder(dir: &std::path::Path) -> Result<Renderer, ConversationError> {
        let tokenizer = Tokenizer::from_file(&dir.join("tokenizer.json"))
            .map_err(|e| ConversationError::Render(e.to_string()))?;
        let eos = tokenizer.eos_ids(dir);
        Renderer::new(Arc::new(tokenizer), &eos)
    }

    pub fn family(&self) -> Family {
        self.family
    }

    /// Parses outputs as `family` instead of the one the template implies
    /// (a template that does not show how the model writes its calls).
    pub fn with_family(mut self, family: Family) -> Renderer {
        self.family = family;
        self
    }

    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.tokenizer
    }

    fn text(
        &self,
        messages: &Value,
        tools: Option<&Value>,
        add_generation_prompt: bool,
    ) -> Result<String, ConversationError> {
        let tools = tools.map(Value::to_string);
        self.tokenizer
            .apply_chat_template(
                &messages.to_string(),
                tools.as_deref(),
                add_generation_prompt,
            )
            .map_err(|e| ConversationError::Render(e.to_string()))
    }

    fn encode(&self, text: &str) -> Result<Vec<u32>, ConversationError> {
        self.tokenizer
            .encode(text, false)
            .map_err(|e| ConversationError::Render(e.to_string()))
    }

    /// The whole conversation's prompt, generation prompt included.
    pub fn fresh(&self, conv: &Conversation) -> Result<Vec<u32>, ConversationError> {
        let text = self.text(&conv.template_messages(), conv.tools.as_ref(), true)?;
        self.encode(&text)
    }

    /// The tokens that follow a sampled assistant turn whose last token
    /// decodes to `sampled_end`: the rest of the turn's closing, `new`
    /// rendered as the template renders them after an assistant turn, and
    /// the generation prompt. `None` when the template does not render
    /// appended messages as a plain suffix.
    pub fn appended(
        &self,
        new: &[Message],
        tools: Option<&Value>,
        sampled_end: &str,
    ) -> Result<Option<Vec<u32>>, ConversationError> {
        let probe = vec![
            json!({"role": "user", "content": "hi"}),
            json!({"role": "assistant", "content": PROBE}),
        ];
        let base = self.text(&Value::Array(probe.clone()), tools, false)?;
        let mut with_new = probe;
        with_new.extend(new.iter().map(Message::to_template));
        let full = self.text(&Value::Array(with_new), tools, true)?;
        let (Some(delta), Some(at)) = (full.strip_prefix(base.as_str()), base.rfind(PROBE)) else {
            return Ok(None);
        };
        let closing = &base[at + PROBE.len()..];
        let bridge = self
            .turn_ends
            .iter()
            .filter(|end| sampled_end.ends_with(end.as_str()))
            .find_map(|end| {
                closing
                    .find(end.as_str())
                    .map(|i| &closing[i + end.len()..])
            })
            .unwrap_or(closing);
        self.encode(&format!("{bridge}{delta}")).map(Some)
    }
}
