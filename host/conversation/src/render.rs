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

use std::sync::{Arc, Mutex, PoisonError};

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
    /// The probe's rendering by the tools' JSON text, most recent last:
    /// the same for every call of a rollout, so rendered once.
    probes: Arc<Mutex<Vec<Probe>>>,
}

/// A probe's rendering (the second) under the tools' JSON text (the first).
type Probe = (Option<String>, String);

/// How many tool sets' probe renderings are kept (rollouts running at once
/// with different tools).
const PROBES_KEPT: usize = 16;

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
            probes: Arc::default(),
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
        tools: Option<&str>,
        add_generation_prompt: bool,
    ) -> Result<String, ConversationError> {
        self.tokenizer
            .apply_chat_template(&messages.to_string(), tools, add_generation_prompt)
            .map_err(|e| ConversationError::Render(e.to_string()))
    }

    /// The template's rendering of `[user, assistant(PROBE)]` under `tools`
    /// (JSON text), from the cache when it was rendered before and not
    /// `again`.
    fn probe(&self, tools: Option<&str>, again: bool) -> Result<String, ConversationError> {
        let lock = || self.probes.lock().unwrap_or_else(PoisonError::into_inner);
        let cached = lock()
            .iter()
            .find(|(t, _)| t.as_deref() == tools)
            .map(|(_, base)| base.clone());
        if let Some(base) = cached.filter(|_| !again) {
            return Ok(base);
        }
        let probe = json!([
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": PROBE},
        ]);
        let base = self.text(&probe, tools, false)?;
        let mut all = lock();
        all.retain(|(t, _)| t.as_deref() != tools);
        if all.len() == PROBES_KEPT {
            all.remove(0);
        }
        all.push((tools.map(str::to_string), base.clone()));
        Ok(base)
    }

    fn encode(&self, text: &str) -> Result<Vec<u32>, ConversationError> {
        self.tokenizer
            .encode(text, false)
            .map_err(|e| ConversationError::Render(e.to_string()))
    }

    /// The whole conversation's prompt, generation prompt included.
    pub fn fresh(&self, conv: &Conversation) -> Result<Vec<u32>, ConversationError> {
        let tools = conv.tools.as_ref().map(Value::to_string);
        let text = self.text(&conv.template_messages(), tools.as_deref(), true)?;
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
        let tools = tools.map(Value::to_string);
        let mut base = self.probe(tools.as_deref(), false)?;
        let mut with_new = vec![
            json!({"role": "user", "content": "hi"}),
            json!({"role": "assistant", "content": PROBE}),
        ];
        with_new.extend(new.iter().map(Message::to_template));
        let full = self.text(&Value::Array(with_new), tools.as_deref(), true)?;
        if !full.starts_with(&base) {
            // A template whose text moves with time (a date it writes) has
            // moved since the probe was rendered: rendered again.
            base = self.probe(tools.as_deref(), true)?;
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The byte-level fixture tokenizer under the Hermes/Qwen-style tools
    /// template (as `tests/support/policy.rs` builds it).
    fn renderer(dir: &std::path::Path) -> Renderer {
        let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let fixture = repo.join("examples/fixtures/tokenizer");
        for file in ["tokenizer.json", "tokenizer_config.json"] {
            std::fs::copy(fixture.join(file), dir.join(file)).expect("copy");
        }
        let template = repo.join("tests/python/tools_template.jinja");
        std::fs::copy(template, dir.join("chat_template.jinja")).expect("copy");
        let tok = Tokenizer::from_file(&dir.join("tokenizer.json")).expect("tokenizer");
        let eos = tok.encode("<|im_end|>", false).expect("eos");
        Renderer::new(Arc::new(tok), &eos).expect("renderer")
    }

    #[test]
    fn appended_messages_render_alike_from_the_probe_cache() {
        let dir = tempfile::tempdir().expect("dir");
        let cached = renderer(dir.path());
        let tools = |name: &str| json!([{"type": "function", "function": {"name": name}}]);
        let new = [Message::Tool {
            call_id: Some("c0".into()),
            content: "3 files".into(),
        }];
        // Each tool set's probe is its own: alternating them, every call
        // gives what a renderer without a cache gives.
        for name in ["bash", "python", "bash", "python"] {
            let uncached = Renderer {
                probes: Arc::default(),
                ..cached.clone()
            };
            let tools = tools(name);
            let want = uncached.appended(&new, Some(&tools), "<|im_end|>").ok();
            assert!(want.as_ref().is_some_and(Option::is_some));
            assert_eq!(cached.appended(&new, Some(&tools), "<|im_end|>").ok(), want);
        }
        assert_eq!(cached.probes.lock().expect("lock").len(), 2);
        // A probe the template no longer renders (its text moved, as a date
        // it writes does) is rendered again, not taken.
        let tools = tools("bash");
        let want = cached.appended(&new, Some(&tools), "<|im_end|>").ok();
        for (t, base) in cached.probes.lock().expect("lock").iter_mut() {
            if t.as_deref() == Some(tools.to_string().as_str()) {
                *base = format!("<|im_start|>system\nYesterday{base}");
            }
        }
        assert_eq!(cached.appended(&new, Some(&tools), "<|im_end|>").ok(), want);
    }
}
