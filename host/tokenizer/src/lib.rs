//! The policy's tokenizer and chat template, as the plugin host's `tokenizer`
//! import, the inference server and the trainer's data path see them.

pub mod chat_template;

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::chat_template::ChatTemplate;

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
/// template, read from `chat_template.jinja` or `tokenizer_config.json`
/// beside it, as transformers does.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    template: Option<ChatTemplate>,
}

impl Tokenizer {
    pub fn from_file(path: &Path) -> Result<Self, TokenizerError> {
        let load_err = |message: String| TokenizerError::Load {
            path: path.to_path_buf(),
            message,
        };
        let inner = tokenizers::Tokenizer::from_file(path).map_err(|e| load_err(e.to_string()))?;
        let dir = path.parent().unwrap_or(Path::new("."));
        let template = load_template(dir).map_err(load_err)?;
        Ok(Self { inner, template })
    }

    /// `eos_token_id` of generation_config.json / config.json (int or list)
    /// in the model folder `dir`, plus the tokenizer config's `eos_token`:
    /// the ids that end the model's turn.
    pub fn eos_ids(&self, dir: &Path) -> Vec<u32> {
        let read = |file: &str| -> Value {
            std::fs::read_to_string(dir.join(file))
                .ok()
                .and_then(|t| serde_json::from_str(&t).ok())
                .unwrap_or(Value::Null)
        };
        let mut ids = Vec::new();
        for file in ["generation_config.json", "config.json"] {
            match read(file).get("eos_token_id") {
                Some(Value::Number(n)) => ids.extend(n.as_u64()),
                Some(Value::Array(list)) => ids.extend(list.iter().filter_map(Value::as_u64)),
                _ => {}
            }
        }
        let mut ids: Vec<u32> = ids
            .into_iter()
            .filter_map(|n| u32::try_from(n).ok())
            .collect();
        let token = read("tokenizer_config.json")
            .get("eos_token")
            .and_then(|t| t.as_str().or_else(|| t.get("content")?.as_str()))
            .map(str::to_owned);
        if let Some(token) = token
            && let Ok(found) = self.encode(&token, false)
            && found.len() == 1
        {
            ids.push(found[0]);
        }
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    /// The tokenizer as `tokenizer.json` text (what llguidance reads token
    /// bytes from).
    pub fn to_json(&self) -> Result<String, TokenizerError> {
        self.inner
            .to_string(false)
            .map_err(|e| TokenizerError::Tokenize(e.to_string()))
    }

    pub fn vocab_size(&self) -> u32 {
        self.inner.get_vocab_size(true) as u32
    }

    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, TokenizerError> {
        let encoding = self
            .inner
            .encode_fast(text, add_special_tokens)
            .map_err(|e| TokenizerError::Tokenize(e.to_string()))?;
        Ok(encoding.get_ids().to_vec())
    }

    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, TokenizerError> {
        self.inner
            .decode(ids, skip_special_tokens)
            .map_err(|e| TokenizerError::Tokenize(e.to_string()))
    }

    /// The chat template's source, if there is a template.
    pub fn chat_template_source(&self) -> Option<&str> {
        self.template.as_ref().map(ChatTemplate::source)
    }

    /// `messages_json`: an OpenAI `messages` array; `tools_json`: a `tools` array.
    pub fn apply_chat_template(
        &self,
        messages_json: &str,
        tools_json: Option<&str>,
        add_generation_prompt: bool,
    ) -> Result<String, TokenizerError> {
        let template = self.template.as_ref().ok_or(TokenizerError::NoTemplate)?;
        let parse = |what: &str, text: &str| {
            serde_json::from_str::<Value>(text)
                .map_err(|e| TokenizerError::Template(format!("{what} is not JSON: {e}")))
        };
        let messages = parse("messages", messages_json)?;
        if !messages.is_array() {
            return Err(TokenizerError::Template(
                "messages must be a JSON array".into(),
            ));
        }
        let tools = tools_json.map(|t| parse("tools", t)).transpose()?;
        template
            .render(&messages, tools.as_ref(), add_generation_prompt)
            .map_err(|e| TokenizerError::Template(format!("{e:#}")))
    }
}

/// Finds the chat template beside `tokenizer.json`; `Ok(None)` if there is none.
fn load_template(dir: &Path) -> Result<Option<ChatTemplate>, String> {
    let config: Value = match std::fs::read_to_string(dir.join("tokenizer_config.json")) {
        Ok(text) => {
            serde_json::from_str(&text).map_err(|e| format!("tokenizer_config.json: {e}"))?
        }
        Err(_) => Value::Null,
    };
    let source = match std::fs::read_to_string(dir.join("chat_template.jinja")) {
        Ok(text) => Some(text),
        Err(_) => template_from_config(&config),
    };
    let Some(source) = source else {
        return Ok(None);
    };
    let token = |key: &str| special_token(config.get(key));
    ChatTemplate::new(&source, token("bos_token"), token("eos_token"))
        .map(Some)
        .map_err(|e| format!("chat template does not compile: {e:#}"))
}

/// `chat_template` is a string, or a list of `{name, template}` (use "default").
fn template_from_config(config: &Value) -> Option<String> {
    match config.get("chat_template")? {
        Value::String(s) => Some(s.clone()),
        Value::Array(named) => named
            .iter()
            .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
            .or_else(|| named.first())
            .and_then(|t| t.get("template"))
            .and_then(Value::as_str)
            .map(str::to_owned),
        _ => None,
    }
}

/// Special tokens are a string or an `AddedToken` object with `content`.
fn special_token(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content")?.as_str().map(str::to_owned),
        _ => None,
    }
}
