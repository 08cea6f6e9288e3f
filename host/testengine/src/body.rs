//! A request body as the engine reads it.
//!
//! A gateway-rendered call sends its prompt as token ids (a completions
//! `prompt`, SGLang's `input_ids`): tens of thousands of numbers, which as a
//! JSON tree cost this engine more than the gateway spends on the call. So
//! that list is read straight into ids, and every other field into JSON.

use std::fmt;

use agl_wire::json::{self, walk::Walker};
use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

use super::api::VllmError;
use super::script::Endpoint;

/// The top-level fields of a JSON object body.
#[derive(Debug, PartialEq)]
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
        match ids_key.and_then(|key| walked(bytes, key)) {
            Some(body) => Ok(body),
            None => by_serde(bytes, ids_key),
        }
    }
}

/// The body as serde_json reads it, a flat list of `u32`s under `ids_key`
/// read into ids; the errors are vLLM's.
fn by_serde(bytes: &[u8], ids_key: Option<&'static str>) -> Result<Body, VllmError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let read = de
        .deserialize_map(Fields { ids_key })
        .and_then(|body| de.end().map(|()| body));
    read.map_err(|_| match serde_json::from_slice::<Value>(bytes) {
        Ok(_) => VllmError::bad_request("request body must be a JSON object"),
        Err(e) => VllmError::bad_request(format!("invalid JSON: {e}")),
    })
}

/// The body read by a walk over its text: a plain list of ids under
/// `ids_key` off its bytes (~10 instructions an id, where through serde
/// each id is ~240: callgrind, the rendering bench's ~7k-id prompts), every
/// other field through serde. `None` for what the walk does not read (an
/// escaped key, a deeper body, a value serde refuses): [`Body::parse`]'s
/// serde path decides those, as it reads them.
fn walked(bytes: &[u8], ids_key: &str) -> Option<Body> {
    let mut r = Walker::new(bytes, json::MAX_DEPTH);
    let mut fields = Map::new();
    let mut ids = None;
    r.object(|r, key| {
        let key = std::str::from_utf8(key).ok()?;
        // A later duplicate key wins, as in a JSON tree.
        if key == ids_key {
            if let Some(list) = r.read(json::u32_list_prefix) {
                fields.remove(key);
                ids = Some(list);
                return Some(());
            }
            ids = None;
        }
        let value = serde_json::from_slice(r.value()?).ok()?;
        fields.insert(key.to_string(), value);
        Some(())
    })?;
    r.at_end().then(|| Body {
        fields: Value::Object(fields),
        ids,
    })
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
    fn the_walk_reads_what_serde_reads_or_leaves_it_to_serde() {
        let bodies = [
            r#"{"model":"m","prompt":[1,22,333],"max_tokens":3,"stop":["\n"]}"#,
            r#" { "prompt" : [ 1 , 2 ] , "n" : null , "x" : {"a": [true, false, 1.5]} } "#,
            r#"{"prompt": [1, -2], "seed": 7}"#,
            r#"{"prompt": "text", "prompt": [3]}"#,
            r#"{"prompt": [3], "prompt": [[1]]}"#,
            r#"{"pro\u006dpt": [1]}"#,
            r#"{"prompt": [1], "s": "\ud800"}"#,
            r#"{"prompt": [1], "big": 1e999}"#,
            r#"{"prompt": [01]}"#,
            r#"{"prompt": [1]} x"#,
            r#"{"prompt": [1],}"#,
            r#"{"prompt": []}"#,
            "[1, 2]",
            "",
        ];
        let mut walked_some = 0;
        for body in bodies {
            let serde = by_serde(body.as_bytes(), Some("prompt"));
            match walked(body.as_bytes(), "prompt") {
                Some(walk) => {
                    walked_some += 1;
                    assert_eq!(serde.as_ref().ok(), Some(&walk), "{body}");
                }
                None => {
                    let parsed = Body::parse(Endpoint::Completions, body.as_bytes());
                    assert_eq!(parsed.ok(), serde.ok(), "{body}");
                }
            }
        }
        // The plain bodies are the walk's, not all left to serde.
        assert!(walked_some >= 5, "{walked_some}");
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
