//! What the proxy changes in a harness's request before it goes upstream:
//! the model name, the train/val temperature, and the vLLM (>= 0.10.2) flags
//! that make the engine return token ids and logprobs.
//!
//! The body is handled as its top-level keys over raw JSON values: only
//! those few keys are touched, so the messages (most of a long agent
//! prompt) are copied through as text, never parsed into a tree.

use serde_json::Value;
use serde_json::value::RawValue;

use agl_wire::json;

use super::front::Front;

/// A request body's top-level object, values kept as JSON text, keys in
/// the client's order.
pub type RawBody = indexmap::IndexMap<String, Box<RawValue>>;

/// A call's body, parsed once: its top-level keys as raw JSON (what the
/// engine request is made of), the text it is recorded as, and, for a call
/// the gateway renders, its tree (the conversation is read from it).
pub struct Body {
    pub forward: RawBody,
    /// Checked against the limits every stored document is held to.
    pub record: Box<RawValue>,
    pub tree: Option<Value>,
}

impl Body {
    /// Reads `bytes` once: as a tree when the gateway renders the call (its
    /// keys then written as raw JSON from it), else as raw top-level keys
    /// (the messages, most of a long prompt, copied through as text). The
    /// record is written from the keys, in the client's order.
    pub fn read(bytes: &[u8], rendered: bool) -> Result<Body, String> {
        let (forward, tree) = if rendered {
            let tree: Value =
                serde_json::from_slice(bytes).map_err(|e| format!("invalid JSON body: {e}"))?;
            let Value::Object(keys) = &tree else {
                return Err(NOT_AN_OBJECT.to_string());
            };
            let forward = keys.iter().map(|(k, v)| (k.clone(), raw(v))).collect();
            (forward, Some(tree))
        } else {
            (parse(bytes)?, None)
        };
        let record = raw(&forward);
        json::check_raw(&record, json::MAX_DEPTH - 1)
            .map_err(|e| format!("invalid JSON body: {e}"))?;
        Ok(Body {
            forward,
            record,
            tree,
        })
    }
}

const NOT_AN_OBJECT: &str = "request body must be a JSON object";

/// Parses a request body that must be a JSON object.
fn parse(bytes: &[u8]) -> Result<RawBody, String> {
    serde_json::from_slice::<RawBody>(bytes).map_err(|e| {
        if e.is_data() {
            NOT_AN_OBJECT.to_string()
        } else {
            format!("invalid JSON body: {e}")
        }
    })
}

/// `value` as raw JSON, written by serde_json (so not parsed back).
fn raw<T: serde::Serialize + ?Sized>(value: &T) -> Box<RawValue> {
    // Only called with JSON read by serde_json, strings, finite numbers and
    // booleans, which serialise.
    serde_json::value::to_raw_value(value).unwrap_or_else(|_| RawValue::NULL.to_owned())
}

/// The number of choices a request asks for (`n`, as JSON text; absent or
/// `null` is 1). Each is recorded as its own call; only Chat Completions
/// and Completions have `n`, and at most `max` (`gateway.max_n`) are served.
pub fn choices(n: Option<&str>, front: &dyn Front, max: u32) -> Result<u32, String> {
    let Some(n) = n.map(str::trim).filter(|n| *n != "null") else {
        return Ok(1);
    };
    match n.parse::<u32>() {
        Ok(1) => Ok(1),
        Ok(n) if n > 1 && !front.has_n() => Err(format!(
            "`n` = {n}: this API has no `n`; make {n} calls instead"
        )),
        Ok(n) if n > max => Err(format!(
            "`n` = {n} is above this gateway's maximum of {max} choices per call (gateway.max_n)"
        )),
        Ok(n) if n > 1 => Ok(n),
        _ => Err(format!("`n` must be a positive integer, got {n}")),
    }
}

/// The field of `body` that asks the engine to constrain its output
/// (sample under a token mask): `response_format` JSON, vLLM's
/// `structured_outputs` / `guided_*`, or (Chat Completions, where the
/// engine forces it) `tool_choice` `required` or a named function.
pub fn constraint_field(body: &RawBody, front: &dyn Front) -> Option<&'static str> {
    // Most calls have none of them: one pass over the body's few keys
    // instead of a hashed lookup of each field.
    const FIELDS: [&str; 7] = [
        "response_format",
        "structured_outputs",
        "guided_json",
        "guided_regex",
        "guided_choice",
        "guided_grammar",
        "tool_choice",
    ];
    if !body.keys().any(|k| FIELDS.contains(&k.as_str())) {
        return None;
    }
    let value = |k: &str| {
        body.get(k)
            .and_then(|v| serde_json::from_str::<serde_json::Value>(v.get()).ok())
            .filter(|v| !v.is_null())
    };
    if value("response_format")
        .is_some_and(|f| matches!(f["type"].as_str(), Some("json_object" | "json_schema")))
    {
        return Some("response_format");
    }
    let guided = [
        "structured_outputs",
        "guided_json",
        "guided_regex",
        "guided_choice",
        "guided_grammar",
    ];
    if let Some(field) = guided.into_iter().find(|k| value(k).is_some()) {
        return Some(field);
    }
    let forced = match value("tool_choice") {
        Some(serde_json::Value::String(s)) => s == "required",
        Some(serde_json::Value::Object(_)) => true,
        _ => false,
    };
    let engine_forces = front.passthrough().is_some_and(|p| p.forces_tool_choice);
    (engine_forces && forced).then_some("tool_choice")
}

/// Rewrites `body` in place for `model` and `temperature`.
pub fn rewrite(body: &mut RawBody, front: &dyn Front, model: &str, temperature: f64) {
    body.insert("model".into(), raw(model));
    // serde_json writes a float with its decimal point, so 1.0 stays a
    // float as the client's JSON would have it; non-finite values cannot
    // come from the config.
    let temperature = if temperature.is_finite() {
        temperature
    } else {
        1.0
    };
    body.insert("temperature".into(), raw(&temperature));
    body.insert("return_token_ids".into(), raw(&true));
    match front.passthrough() {
        // Chat: `logprobs` is a flag; `top_logprobs` stays as the client set it.
        Some(p) if p.logprobs_flag => {
            body.insert("logprobs".into(), raw(&true));
        }
        // Completions: `logprobs` is the number of alternatives; keep a
        // larger one the client asked for.
        _ => {
            let asked = body
                .get("logprobs")
                .and_then(|v| v.get().trim().parse::<u64>().ok())
                .unwrap_or(0);
            body.insert("logprobs".into(), raw(&asked.max(1)));
        }
    }
}

/// True when the client asked for a streamed (SSE) response.
pub fn is_stream(body: &RawBody) -> bool {
    body.get("stream").is_some_and(|v| v.get().trim() == "true")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::front;
    use agl_wire::rollout::ApiKind;

    #[test]
    fn constrained_requests_are_told_by_their_field() {
        let field =
            |text: &str, api| constraint_field(&parse(text.as_bytes()).unwrap(), front::of(api));
        let chat = ApiKind::ChatCompletions;
        assert_eq!(
            field(r#"{"response_format": {"type": "json_object"}}"#, chat),
            Some("response_format")
        );
        assert_eq!(
            field(r#"{"response_format": {"type": "text"}}"#, chat),
            None
        );
        assert_eq!(
            field(
                r#"{"structured_outputs": {"regex": "a+"}}"#,
                ApiKind::Completions
            ),
            Some("structured_outputs")
        );
        assert_eq!(
            field(r#"{"tool_choice": "required"}"#, chat),
            Some("tool_choice")
        );
        assert_eq!(
            field(
                r#"{"tool_choice": {"type": "function", "function": {"name": "f"}}}"#,
                chat
            ),
            Some("tool_choice")
        );
        assert_eq!(
            field(r#"{"tool_choice": "auto", "guided_json": null}"#, chat),
            None
        );
    }

    #[test]
    fn choices_are_counted_within_the_maximum_naming_n() {
        let chat = ApiKind::ChatCompletions;
        for (n, want) in [
            (Some("1"), 1),
            (Some("null"), 1),
            (None, 1),
            (Some(" 3"), 3),
        ] {
            assert_eq!(choices(n, front::of(chat), 16), Ok(want), "{n:?}");
        }
        assert_eq!(
            choices(Some("16"), front::of(ApiKind::Completions), 16),
            Ok(16)
        );
        let e = choices(Some("17"), front::of(chat), 16).unwrap_err();
        assert!(
            e.starts_with("`n` = 17 is above") && e.contains("gateway.max_n"),
            "{e}"
        );
        let e = choices(Some("2"), front::of(ApiKind::AnthropicMessages), 16).unwrap_err();
        assert!(e.contains("no `n`"), "{e}");
        assert!(
            choices(Some("0"), front::of(chat), 16)
                .unwrap_err()
                .contains("positive")
        );
        assert!(choices(Some("\"2\""), front::of(chat), 16).is_err());
        assert!(choices(Some("-1"), front::of(chat), 16).is_err());
    }
    use serde_json::{Value, json};

    fn run(body: Value, api: ApiKind, model: &str, t: f64) -> Value {
        let mut b = parse(&serde_json::to_vec(&body).unwrap()).unwrap();
        rewrite(&mut b, front::of(api), model, t);
        serde_json::from_slice(&serde_json::to_vec(&b).unwrap()).unwrap()
    }

    #[test]
    fn forces_model_temperature_and_token_flags() {
        let chat = run(
            json!({"model": "x", "temperature": 0.2, "logprobs": false, "top_logprobs": 3,
                   "messages": [{"role": "user", "content": "hi \"there\""}]}),
            ApiKind::ChatCompletions,
            "m\"q",
            1.0,
        );
        assert_eq!(
            chat,
            json!({"model": "m\"q", "temperature": 1.0, "logprobs": true, "top_logprobs": 3,
                   "messages": [{"role": "user", "content": "hi \"there\""}],
                   "return_token_ids": true})
        );
        assert!(chat["temperature"].is_f64());
        let comp = run(
            json!({"prompt": "p", "logprobs": 5}),
            ApiKind::Completions,
            "m",
            0.0,
        );
        assert_eq!(comp["logprobs"], 5);
        assert_eq!(comp["temperature"], 0.0);
        let comp = run(json!({"prompt": "p"}), ApiKind::Completions, "m", 0.7);
        assert_eq!(comp["logprobs"], 1);
        assert_eq!(comp["temperature"], 0.7);
        assert_eq!(comp["return_token_ids"], true);
    }

    #[test]
    fn streaming_flag_and_bad_bodies() {
        assert!(is_stream(&parse(br#"{"stream": true}"#).unwrap()));
        assert!(!is_stream(&parse(br#"{"stream": false}"#).unwrap()));
        assert!(!is_stream(&parse(br#"{}"#).unwrap()));
        assert_eq!(
            parse(b"[1, 2]").unwrap_err(),
            "request body must be a JSON object"
        );
        assert!(
            parse(b"{\"a\": ")
                .unwrap_err()
                .starts_with("invalid JSON body")
        );
        assert!(parse(b"{} x").is_err());
    }

    #[test]
    fn a_body_reads_the_same_as_a_tree_or_as_raw_keys() {
        let text = br#"{"model": "x", "messages": [{"role": "user", "content": "1e5 \u00e9"}], "n": 2, "temperature": 1e-1}"#;
        let raw = Body::read(text, false).unwrap();
        let tree = Body::read(text, true).unwrap();
        assert!(raw.tree.is_none());
        let value = tree.tree.clone().expect("a tree when rendered");
        assert_eq!(value["n"], 2);
        // One record whichever way it was read: the keys in the client's
        // order, each value as sent where it was kept raw.
        let as_sent: Value = serde_json::from_slice(text).unwrap();
        for body in [&raw, &tree] {
            let record: Value = serde_json::from_str(body.record.get()).unwrap();
            assert_eq!(record, as_sent);
            let keys: Vec<_> = body.forward.keys().cloned().collect();
            assert_eq!(keys, ["model", "messages", "n", "temperature"]);
        }
        assert_eq!(raw.forward["temperature"].get(), "1e-1");
        for rendered in [false, true] {
            assert_eq!(
                Body::read(b"[1]", rendered).err().as_deref(),
                Some(NOT_AN_OBJECT)
            );
            let deep = format!(r#"{{"x": {}{}}}"#, "[".repeat(100), "]".repeat(100));
            let e = Body::read(deep.as_bytes(), rendered)
                .err()
                .expect("too deep");
            assert!(e.contains("nested deeper"), "{e}");
        }
    }
}
