//! A closure-based fake of the host tokenizer.

use std::cell::RefCell;

type Decode = Box<dyn Fn(&[u32], bool) -> Result<String, String>>;
type Encode = Box<dyn Fn(&str, bool) -> Result<Vec<u32>, String>>;
type ChatTemplate = Box<dyn Fn(&str, Option<&str>, bool) -> Result<String, String>>;

/// What `agl_plugin::tokenizer` answers natively once installed with
/// [`set_tokenizer`]. Each function is a closure; unset ones err.
pub struct FakeTokenizer {
    vocab_size: u32,
    decode: Option<Decode>,
    encode: Option<Encode>,
    chat_template: Option<ChatTemplate>,
}

impl FakeTokenizer {
    /// A tokenizer with no functions: `available()` is true, every call errs.
    pub fn new(vocab_size: u32) -> Self {
        FakeTokenizer {
            vocab_size,
            decode: None,
            encode: None,
            chat_template: None,
        }
    }

    /// A vocabulary of text pieces: decode concatenates pieces (an unknown
    /// id errs), encode matches the longest piece greedily.
    pub fn from_pieces(pieces: &[(u32, &str)]) -> Self {
        let table: Vec<(u32, String)> = pieces
            .iter()
            .map(|(id, p)| (*id, (*p).to_owned()))
            .collect();
        let for_encode = table.clone();
        let size = table.iter().map(|(id, _)| id + 1).max().unwrap_or(0);
        FakeTokenizer::new(size)
            .with_decode(move |ids, _| {
                ids.iter()
                    .map(|id| {
                        let piece = table.iter().find(|(known, _)| known == id);
                        piece
                            .map(|(_, p)| p.as_str())
                            .ok_or(format!("unknown id {id}"))
                    })
                    .collect()
            })
            .with_encode(move |text, _| greedy_encode(&for_encode, text))
    }

    pub fn with_decode(
        mut self,
        f: impl Fn(&[u32], bool) -> Result<String, String> + 'static,
    ) -> Self {
        self.decode = Some(Box::new(f));
        self
    }

    pub fn with_encode(
        mut self,
        f: impl Fn(&str, bool) -> Result<Vec<u32>, String> + 'static,
    ) -> Self {
        self.encode = Some(Box::new(f));
        self
    }

    pub fn with_chat_template(
        mut self,
        f: impl Fn(&str, Option<&str>, bool) -> Result<String, String> + 'static,
    ) -> Self {
        self.chat_template = Some(Box::new(f));
        self
    }
}

fn greedy_encode(table: &[(u32, String)], mut text: &str) -> Result<Vec<u32>, String> {
    let mut ids = Vec::new();
    while !text.is_empty() {
        let longest = table
            .iter()
            .filter(|(_, p)| !p.is_empty() && text.starts_with(p.as_str()))
            .max_by_key(|(_, p)| p.len())
            .ok_or_else(|| format!("no piece for {text:?}"))?;
        ids.push(longest.0);
        text = &text[longest.1.len()..];
    }
    Ok(ids)
}

thread_local! {
    static TOKENIZER: RefCell<Option<FakeTokenizer>> = const { RefCell::new(None) };
}

/// Installs `fake` as this thread's tokenizer.
pub fn set_tokenizer(fake: FakeTokenizer) {
    TOKENIZER.with(|t| *t.borrow_mut() = Some(fake));
}

/// Removes the fake: `available()` is false again.
pub fn clear_tokenizer() {
    TOKENIZER.with(|t| *t.borrow_mut() = None);
}

/// The native side of `agl_plugin::tokenizer`, mirroring the import.
pub(crate) mod host {
    use super::{FakeTokenizer, TOKENIZER};

    const NONE: &str =
        "no tokenizer configured (install one with agl_plugin::testing::set_tokenizer)";

    fn with<T>(f: impl FnOnce(&FakeTokenizer) -> Result<T, String>) -> Result<T, String> {
        TOKENIZER.with(|t| t.borrow().as_ref().map_or(Err(NONE.to_owned()), f))
    }

    fn missing<T>(what: &str) -> Result<T, String> {
        Err(format!("the fake tokenizer has no {what}"))
    }

    pub fn available() -> bool {
        TOKENIZER.with(|t| t.borrow().is_some())
    }

    pub fn vocab_size() -> Result<u32, String> {
        with(|t| Ok(t.vocab_size))
    }

    pub fn encode(text: &str, add_special_tokens: bool) -> Result<Vec<u32>, String> {
        with(|t| {
            t.encode
                .as_ref()
                .map_or_else(|| missing("encode"), |f| f(text, add_special_tokens))
        })
    }

    pub fn decode(ids: &[u32], skip_special_tokens: bool) -> Result<String, String> {
        with(|t| {
            t.decode
                .as_ref()
                .map_or_else(|| missing("decode"), |f| f(ids, skip_special_tokens))
        })
    }

    pub fn apply_chat_template(
        messages_json: &str,
        tools_json: Option<&str>,
        add_generation_prompt: bool,
    ) -> Result<String, String> {
        with(|t| match &t.chat_template {
            Some(f) => f(messages_json, tools_json, add_generation_prompt),
            None => missing("chat template"),
        })
    }
}
