//! Incremental detokenization with stop strings: which text may be sent
//! now, and the final text (cut before the first stop string, as vLLM does).

use std::sync::Arc;

use agl_tokenizer::Tokenizer;

pub struct TextState {
    tokenizer: Arc<Tokenizer>,
    /// Text that ends what may be shown: the stop strings.
    markers: Vec<String>,
    ids: Vec<u32>,
    /// Bytes of the text already handed out.
    sent: usize,
}

impl TextState {
    pub fn new(tokenizer: Arc<Tokenizer>, markers: Vec<String>) -> Self {
        TextState {
            tokenizer,
            markers,
            ids: Vec::new(),
            sent: 0,
        }
    }

    pub fn text_of(tokenizer: &Tokenizer, ids: &[u32]) -> String {
        tokenizer.decode(ids, true).unwrap_or_default()
    }

    /// Adds a sampled token; returns the text that is safe to send now:
    /// complete characters, before any marker, and holding back a tail that
    /// could still become a marker.
    pub fn push(&mut self, id: u32) -> String {
        self.ids.push(id);
        let text = Self::text_of(&self.tokenizer, &self.ids);
        let mut limit = text.trim_end_matches('\u{FFFD}').len();
        match first_marker(&text, &self.markers) {
            Some(at) => limit = limit.min(at),
            None => {
                let longest = self.markers.iter().map(String::len).max().unwrap_or(0);
                limit = limit.saturating_sub(longest.saturating_sub(1));
            }
        }
        while !text.is_char_boundary(limit) {
            limit -= 1;
        }
        if limit <= self.sent {
            return String::new();
        }
        let out = text[self.sent..limit].to_string();
        self.sent = limit;
        out
    }

    /// The rest of `full` (the final text) not yet sent; nothing if what
    /// was sent is not a prefix of it.
    pub fn rest<'a>(&self, full: &'a str) -> &'a str {
        let sent = Self::text_of(&self.tokenizer, &self.ids);
        match sent.get(..self.sent) {
            Some(prefix) if full.starts_with(prefix) => &full[self.sent..],
            _ => "",
        }
    }
}

/// Byte offset of the earliest marker in `text`.
pub fn first_marker(text: &str, markers: &[String]) -> Option<usize> {
    markers
        .iter()
        .filter(|m| !m.is_empty())
        .filter_map(|m| text.find(m.as_str()))
        .min()
}

/// The response text: decoded without special tokens, cut before the first
/// stop string.
pub fn final_text(tokenizer: &Tokenizer, ids: &[u32], stop: &[String]) -> String {
    let text = TextState::text_of(tokenizer, ids);
    match first_marker(&text, stop) {
        Some(at) => text[..at].to_string(),
        None => text,
    }
}
