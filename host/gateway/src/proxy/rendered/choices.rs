//! A gateway-rendered stream of `n` > 1 choices: the engine interleaves
//! completion chunks of every choice (each with its `index`); each choice
//! has a chat translator of its own, and its chat chunks carry its index.

use agl_wire::openai::{ChatCompletionChunk, Completion};

use super::{ChatChunks, choice_prefix};

pub struct ChoiceChunks {
    /// Choice 0's translator as it starts; the others are copies of it.
    fresh: ChatChunks,
    id_prefix: String,
    by_index: Vec<ChatChunks>,
}

impl ChoiceChunks {
    pub fn new(fresh: ChatChunks, id_prefix: &str) -> ChoiceChunks {
        ChoiceChunks {
            by_index: vec![fresh.clone()],
            fresh,
            id_prefix: id_prefix.to_string(),
        }
    }

    /// One completions chunk in, the chat chunks of its choice out. A
    /// chunk without choices (usage) goes through choice 0; an index past
    /// the choices seen is garbage and yields nothing.
    pub fn push(&mut self, chunk: &Completion) -> Vec<ChatCompletionChunk> {
        let index = chunk.choices.first().map_or(0, |c| c.index);
        if index == self.by_index.len() {
            let prefix = choice_prefix(&self.id_prefix, index);
            self.by_index.push(self.fresh.for_choice(prefix));
        }
        let Some(t) = self.by_index.get_mut(index) else {
            return Vec::new();
        };
        let mut out = t.push(chunk);
        if index > 0 {
            for choice in out.iter_mut().flat_map(|c| &mut c.choices) {
                choice.index = index;
            }
        }
        out
    }

    /// Choice `index`'s text so far (empty for one never seen).
    pub fn text(&self, index: usize) -> &str {
        self.by_index.get(index).map_or("", ChatChunks::text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agl_conversation::{Family, ToolFormat};
    use serde_json::{Value, json};

    #[test]
    fn each_choice_is_translated_apart_under_its_index() {
        let family = Family {
            tools: ToolFormat::Hermes,
            reasoning: false,
        };
        let fresh = ChatChunks::new(family, vec![1, 2], "r");
        let mut chunks = ChoiceChunks::new(fresh, "r");
        let chunk = |i: usize, text: &str, finish: Option<&str>| {
            serde_json::from_value::<Completion>(json!({"id": "c", "choices": [{"index": i,
                   "text": text, "token_ids": [7], "finish_reason": finish}]}))
            .unwrap()
        };
        let mut out = Vec::new();
        for (i, text, finish) in [
            (0, "hel", None),
            (1, "<tool_call>{\"name\": \"f\", ", None),
            (0, "lo", Some("stop")),
            (1, "\"arguments\": {}}</tool_call>", Some("stop")),
        ] {
            let chat = chunks.push(&chunk(i, text, finish));
            out.extend(chat.iter().map(|c| serde_json::to_value(c).unwrap()));
        }
        assert_eq!(chunks.text(0), "hello");
        assert!(chunks.text(1).starts_with("<tool_call>"));
        assert_eq!(chunks.text(5), "");
        let of = |i: u64| -> Vec<&Value> {
            out.iter()
                .filter(|c| c["choices"][0]["index"] == i)
                .collect()
        };
        let content: String = of(0)
            .iter()
            .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
            .collect();
        assert_eq!(content, "hello");
        let calls: Vec<&Value> = of(1)
            .into_iter()
            .filter_map(|c| c["choices"][0]["delta"].get("tool_calls"))
            .collect();
        assert!(!calls.is_empty());
        // Choice 1's call ids are its own.
        let id = calls
            .iter()
            .find_map(|c| c[0]["id"].as_str())
            .expect("an id");
        assert!(id.contains("r_1"), "{id}");
        assert!(chunks.push(&chunk(9, "?", None)).is_empty());
    }
}
