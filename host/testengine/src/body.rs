//! A request body as the engine reads it.
//!
//! A gateway-rendered call sends its prompt as token ids (a completions
//! `prompt`, SGLang's `input_ids`): tens of thousands of numbers, which as a
//! JSON tree cost this engine more than the gateway spends on the call. So
//! that list is read straight into ids, and every other field into JSON.

use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

use super::api::VllmError;
use super::script::Endpoint;

/// The top-level fields of a JSON object body.
#[derive(Debug)]
pub(crate) struct Body {
    /// Every field but a token-id list read into `ids`.
    pub fields: Value,
    /// The endpoint's prompt field when it is a flat list of `u32`s.
    pub ids: Option<Vec<u32>>,
}

impl Body {
    /// Reads `bytes`; the errors are vLLM's for a body that is no JSON
    /// object.
    pub fn parse(endpoint: Endpoint, bytes: &[u8]) -> Result<Self, VllmError> {
        let ids_key = match endpoint {
            Endpoint::Chat => None,
            Endpoint::Completions => Some("prompt"),
            Endpoint::Generate => Some("input_ids"),
        };
        let mut de = serde_json::Deserializer::from_slice(bytes);
        let read = de
            .deserialize_map(Fields { ids_key })
            .and_then(|body| de.end().map(|()| body));
        read.map_err(|_| match serde_json::from_slice::<Value>(bytes) {
            Ok(_) => VllmError::bad_request("request body must be a JSON object"),
            Err(e) => VllmError::bad_request(format!("invalid JSON: {e}")),
        })
    }
}

struct Fields {
    ids_key: Option<&'static str>,
}

impl<'de> Visitor<'de> for Fields {
    type Value = Body;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Body, A::Error> {
        let mut fields = Map::new();
        let mut ids = None;
        while let Some(key) = map.next_key::<String>()? {
            if self.ids_key != Some(key.as_str()) {
                fields.insert(key, map.next_value()?);
                continue;
            }
            // A later duplicate key wins, as in a JSON tree.
            match map.next_value::<Prompt>()? {
                Prompt::Ids(list) => {
                    fields.remove(&key);
                    ids = Some(list);
                }
                Prompt::Json(value) => {
                    fields.insert(key, value);
                    ids = None;
                }
            }
        }
        Ok(Body {
            fields: Value::Object(fields),
            ids,
        })
    }
}

/// The endpoint's prompt field: a flat list of `u32`s, or any other JSON.
/// Read in one pass, each element as serde_json reads a number (~60
/// instructions an id); a raw value checked and then parsed again cost
/// ~160 (callgrind, the rendering bench's ~7k-id prompts).
enum Prompt {
    Ids(Vec<u32>),
    Json(Value),
}

impl<'de> Deserialize<'de> for Prompt {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(PromptVisitor)
    }
}

struct PromptVisitor;

impl<'de> Visitor<'de> for PromptVisitor {
    type Value = Prompt;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_seq<S: SeqAccess<'de>>(self, mut seq: S) -> Result<Prompt, S::Error> {
        let mut ids = Vec::with_capacity(seq.size_hint().unwrap_or(0));
        while let Some(item) = seq.next_element::<Value>()? {
            if let Some(id) = item.as_u64().and_then(|n| u32::try_from(n).ok()) {
                ids.push(id);
                continue;
            }
            // Not an id list: the whole array as JSON.
            let mut all: Vec<Value> = ids.into_iter().map(Value::from).collect();
            all.push(item);
            while let Some(item) = seq.next_element::<Value>()? {
                all.push(item);
            }
            return Ok(Prompt::Json(Value::Array(all)));
        }
        Ok(Prompt::Ids(ids))
    }

    fn visit_map<M: MapAccess<'de>>(self, map: M) -> Result<Prompt, M::Error> {
        Value::deserialize(de::value::MapAccessDeserializer::new(map)).map(Prompt::Json)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Prompt, E> {
        Ok(Prompt::Json(Value::from(v)))
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Prompt, E> {
        Ok(Prompt::Json(Value::from(v)))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Prompt, E> {
        Ok(Prompt::Json(Value::from(v)))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Prompt, E> {
        Ok(Prompt::Json(Value::from(v)))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Prompt, E> {
        Ok(Prompt::Json(Value::from(v)))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Prompt, E> {
        Ok(Prompt::Json(Value::Null))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prompt_of_ids_is_read_into_ids_and_the_rest_into_json() {
        let body = Body::parse(
            Endpoint::Completions,
            br#"{"model": "m", "prompt": [1, 2, 4294967295], "max_tokens": 3}"#,
        )
        .expect("body");
        assert_eq!(body.ids, Some(vec![1, 2, u32::MAX]));
        assert_eq!(body.fields.get("prompt"), None);
        assert_eq!(body.fields.get("max_tokens"), Some(&Value::from(3)));
    }

    #[test]
    fn a_prompt_that_is_no_id_list_stays_json() {
        for prompt in [
            r#""text""#,
            r#"["text"]"#,
            "[1, -2]",
            "[4294967296]",
            "[[1]]",
            "[1, 2.0]",
            "[1e3]",
            r#"{"a": [1]}"#,
            "7",
            "1.5",
            "null",
            "true",
            "[]",
        ] {
            let text = format!(r#"{{"prompt": {prompt}}}"#);
            let body = Body::parse(Endpoint::Completions, text.as_bytes()).expect("body");
            let want: Value = serde_json::from_str(prompt).expect("json");
            if prompt == "[]" {
                assert_eq!(body.ids, Some(Vec::new()), "{prompt}");
            } else {
                assert_eq!(body.ids, None, "{prompt}");
                assert_eq!(body.fields.get("prompt"), Some(&want), "{prompt}");
            }
        }
    }

    #[test]
    fn the_last_of_duplicate_keys_wins() {
        let body = Body::parse(
            Endpoint::Generate,
            br#"{"input_ids": [1], "input_ids": "x"}"#,
        )
        .expect("body");
        assert_eq!(body.ids, None);
        assert_eq!(body.fields.get("input_ids"), Some(&Value::from("x")));
        let body = Body::parse(
            Endpoint::Generate,
            br#"{"input_ids": "x", "input_ids": [7]}"#,
        )
        .expect("body");
        assert_eq!(body.fields.get("input_ids"), None);
        assert_eq!(body.ids, Some(vec![7]));
    }

    #[test]
    fn a_chat_body_keeps_every_field_as_json() {
        let body = Body::parse(Endpoint::Chat, br#"{"prompt": [1], "messages": []}"#).expect("b");
        assert_eq!(body.ids, None);
        assert_eq!(body.fields.get("prompt"), Some(&serde_json::json!([1])));
    }

    #[test]
    fn bodies_that_are_no_object_are_refused_by_what_is_wrong() {
        for (bytes, want) in [
            (&b"[1, 2]"[..], "request body must be a JSON object"),
            (b"{\"a\": 1} x", "invalid JSON"),
            (b"{\"prompt\": [1,", "invalid JSON"),
            (b"", "invalid JSON"),
        ] {
            let e = Body::parse(Endpoint::Completions, bytes).expect_err("refused");
            assert!(e.message.starts_with(want), "{:?}: {}", bytes, e.message);
        }
    }
}
