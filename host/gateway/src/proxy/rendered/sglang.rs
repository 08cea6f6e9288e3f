//! SGLang's native token-in API, `POST /generate`, for engines registered
//! with `render = "gateway"` and `api = "sglang"`. Its answers are turned
//! into the vLLM completions shape at this edge, so the rest of the
//! gateway-rendered path (the chat answer, the record, the chains) reads
//! one shape.
//!
//! Read from sgl-project/sglang 0.5.x (`python/sglang/srt/managers/io_struct.py`
//! `GenerateReqInput`, `sampling/sampling_params.py`, `managers/tokenizer_manager.py`
//! `_handle_batch_output`, `entrypoints/http_server.py` `generate_request`):
//! - request: `input_ids`, `sampling_params` {`max_new_tokens`, `temperature`,
//!   `top_p`, `top_k`, `min_p`, `stop`, `stop_token_ids`, `presence_penalty`,
//!   `frequency_penalty`, `repetition_penalty`, `sampling_seed`,
//!   `skip_special_tokens`}, `return_logprob`, `logprob_start_len` (-1: none
//!   of the prompt's), `stream`;
//! - answer: `{"text", "output_ids", "meta_info": {"id", "finish_reason":
//!   {"type": "stop"|"length"|"abort", ...}, "prompt_tokens",
//!   "completion_tokens", "output_token_logprobs": [[logprob, id, text|null]]}}`;
//!   the matched EOS is in the ids, not in `text`;
//! - stream: SSE `data: {...}` then `data: [DONE]`; by default every event is
//!   cumulative (`text`, `output_ids`, logprobs so far); with
//!   `--incremental-streaming-output` (or 0.5's `--stream-output`) some
//!   fields are deltas. Which one an event holds is read from its lengths
//!   against `completion_tokens`, so both server settings work.
//!
//! The sampled ids are taken from `output_token_logprobs` (one entry per
//! sampled token, as slime and miles read them), not `output_ids`: before
//! 0.5.5 `output_ids` could start with prompt tokens (sglang #10896).

use agl_wire::openai::{self, Completion, CompletionChoice, CompletionLogprobs, Usage};
use indexmap::IndexMap;
use serde_json::{Map, Value, json};

use super::super::rewrite::RawBody;

/// Chat request keys that map onto `sampling_params` as they are.
const SAMPLING_KEYS: [&str; 9] = [
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "stop",
    "stop_token_ids",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
];

/// The `/generate` request for `prompt_ids` with the chat body's sampling
/// options.
/// `structured` (vLLM's `structured_outputs` shape) maps onto SGLang's
/// `json_schema` / `regex`; a Lark grammar has no SGLang form and is left
/// out.
/// `top`: alternatives per token (`top_logprobs_num`, with their text).
pub fn generate_body(
    chat: &RawBody,
    prompt_ids: &[u32],
    stream: bool,
    structured: Option<&Value>,
    top: usize,
) -> Vec<u8> {
    let value = |k: &str| {
        chat.get(k)
            .and_then(|v| serde_json::from_str::<Value>(v.get()).ok())
            .filter(|v| !v.is_null())
    };
    let mut sampling = Map::new();
    for key in SAMPLING_KEYS {
        if let Some(v) = value(key) {
            sampling.insert(key.into(), v);
        }
    }
    if let Some(max) = value("max_completion_tokens").or_else(|| value("max_tokens")) {
        sampling.insert("max_new_tokens".into(), max);
    }
    if let Some(seed) = value("seed") {
        sampling.insert("sampling_seed".into(), seed);
    }
    // SGLang takes a JSON schema as text, a regex or an EBNF grammar.
    if let Some(structured) = structured {
        if structured["json_object"] == json!(true) {
            sampling.insert("json_schema".into(), json!(r#"{"type": "object"}"#));
        } else if let Some(schema) = structured.get("json") {
            let text = schema
                .as_str()
                .map_or_else(|| schema.to_string(), str::to_owned);
            sampling.insert("json_schema".into(), json!(text));
        } else if let Some(rx) = structured.get("regex") {
            sampling.insert("regex".into(), rx.clone());
        }
    }
    // Markers like `<tool_call>` must reach the parser.
    sampling.insert("skip_special_tokens".into(), json!(false));
    /// Written without a JSON tree for the (long) id list.
    #[derive(serde::Serialize)]
    struct Generate<'a> {
        input_ids: &'a [u32],
        sampling_params: Map<String, Value>,
        return_logprob: bool,
        logprob_start_len: i64,
        stream: bool,
        #[serde(skip_serializing_if = "Option::is_none")]
        top_logprobs_num: Option<usize>,
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        return_text_in_logprobs: bool,
    }
    let body = Generate {
        input_ids: prompt_ids,
        sampling_params: sampling,
        return_logprob: true,
        logprob_start_len: -1,
        stream,
        top_logprobs_num: (top > 0).then_some(top),
        return_text_in_logprobs: top > 0,
    };
    serde_json::to_vec(&body).unwrap_or_default()
}

/// The sampled tokens of one answer or event.
#[derive(Default)]
struct Sampled {
    ids: Vec<u32>,
    lps: Vec<f64>,
    texts: Vec<Value>,
    /// Per token, `output_top_logprobs`' `[logprob, id, text]` entries.
    tops: Vec<Value>,
}

impl Sampled {
    /// Drops the first `n` tokens (those already passed on).
    fn skip(&mut self, n: usize) {
        self.ids.drain(..n.min(self.ids.len()));
        self.lps.drain(..n.min(self.lps.len()));
        self.texts.drain(..n.min(self.texts.len()));
        self.tops.drain(..n.min(self.tops.len()));
    }
}

fn sampled(v: &Value) -> Sampled {
    let tops = v
        .pointer("/meta_info/output_top_logprobs")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let entries = v
        .pointer("/meta_info/output_token_logprobs")
        .and_then(Value::as_array);
    let Some(entries) = entries else {
        // No logprobs: the ids alone, less any leading prompt tokens.
        let ids: Vec<u32> = v["output_ids"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|x| x.as_u64())
                    .map(|x| x as u32)
                    .collect()
            })
            .unwrap_or_default();
        let n = completion_tokens(v).unwrap_or(ids.len()).min(ids.len());
        let ids = ids[ids.len() - n..].to_vec();
        return Sampled {
            lps: vec![0.0; ids.len()],
            texts: vec![Value::Null; ids.len()],
            ids,
            tops,
        };
    };
    let mut out = Sampled {
        tops,
        ..Sampled::default()
    };
    for e in entries {
        out.ids.push(e[1].as_u64().unwrap_or(0) as u32);
        out.lps.push(e[0].as_f64().unwrap_or(0.0));
        out.texts.push(e[2].clone());
    }
    out
}

fn completion_tokens(v: &Value) -> Option<usize> {
    v.pointer("/meta_info/completion_tokens")
        .and_then(Value::as_u64)
        .map(|n| n as usize)
}

fn finish_reason(v: &Value) -> Option<String> {
    v.pointer("/meta_info/finish_reason/type")
        .and_then(Value::as_str)
        .map(str::to_string)
}

/// Completions logprobs of the sampled tokens: one entry per token, and
/// `top_logprobs` maps of text to logprob when alternatives came back.
fn completion_logprobs(s: &Sampled) -> CompletionLogprobs {
    let tokens = s
        .texts
        .iter()
        .map(|t| t.as_str().unwrap_or_default().to_string())
        .collect();
    let top_logprobs = s
        .tops
        .iter()
        .map(|entries| {
            let mut map = IndexMap::new();
            for e in entries.as_array().into_iter().flatten() {
                let key = e[2].as_str().unwrap_or_default().to_string();
                map.entry(key)
                    .or_insert(e[0].as_f64().unwrap_or(f64::NEG_INFINITY));
            }
            map
        })
        .collect();
    CompletionLogprobs {
        tokens,
        token_logprobs: s.lps.clone(),
        top_logprobs,
        text_offset: Vec::new(),
    }
}

/// The completions head of an SGLang answer or event: its id and, for
/// the record, the engine's own weight version.
fn completion_head(v: &Value, model: &str) -> Completion {
    let text = |p: &str| v.pointer(p).and_then(Value::as_str).map(str::to_string);
    Completion {
        id: text("/meta_info/id").unwrap_or_default(),
        object: openai::TEXT_COMPLETION.to_string(),
        model: model.to_string(),
        weight_version: v
            .pointer("/meta_info/weight_version")
            .filter(|w| !w.is_null())
            .cloned(),
        ..Completion::default()
    }
}

/// An SGLang error answer (`{"error": {"message"}}` or `{"object":
/// "error", "message"}`), as its message.
pub fn error_message(v: &Value) -> Option<String> {
    let message = v.pointer("/error/message").or_else(|| {
        (v["object"] == "error")
            .then(|| &v["message"])
            .filter(|m| !m.is_null())
    })?;
    Some(
        message
            .as_str()
            .map_or_else(|| message.to_string(), str::to_owned),
    )
}

/// A non-streamed `/generate` answer as a vLLM completions body (the
/// fields [`super::RenderedCall::answer`] reads; the prompt's ids are the
/// call's own, so they are not written to be skipped).
pub fn completion_bytes(bytes: &[u8], prompt_len: usize, model: &str) -> Vec<u8> {
    let v: Value = serde_json::from_slice(bytes).unwrap_or(Value::Null);
    let s = sampled(&v);
    let body = Completion {
        choices: vec![CompletionChoice {
            index: 0,
            text: v["text"].as_str().unwrap_or_default().to_string(),
            logprobs: Some(completion_logprobs(&s)),
            finish_reason: finish_reason(&v),
            stop_reason: None,
            prompt_token_ids: None,
            token_ids: Some(s.ids.clone()),
            token_weight_versions: None,
        }],
        usage: Some(Usage::new(prompt_len, s.ids.len())),
        ..completion_head(&v, model)
    };
    serde_json::to_vec(&body).unwrap_or_default()
}

/// Streamed `/generate` events as vLLM completions chunks.
#[derive(Default)]
pub struct GenerateChunks {
    /// Tokens and text already passed on.
    tokens: usize,
    text: String,
    model: String,
}

impl GenerateChunks {
    pub fn new(model: &str) -> Self {
        GenerateChunks {
            model: model.to_owned(),
            ..Self::default()
        }
    }

    /// The completions chunk one event becomes; `Err` for an error event.
    pub fn push(&mut self, event: &Value) -> Result<Completion, String> {
        if let Some(message) = error_message(event) {
            return Err(format!("engine stream error: {message}"));
        }
        let mut s = sampled(event);
        // Cumulative (the default): the list holds every token so far.
        let total = completion_tokens(event).unwrap_or(self.tokens + s.ids.len());
        let cumulative = s.ids.len() == total && total >= self.tokens && self.tokens > 0;
        if cumulative {
            s.skip(self.tokens);
        }
        self.tokens += s.ids.len();
        let text = event["text"].as_str().unwrap_or_default();
        // The text is cumulative when it extends what was passed on; the
        // incremental setting sends only the new part.
        let delta = match text.strip_prefix(self.text.as_str()) {
            Some(rest) if !self.text.is_empty() || cumulative => rest.to_owned(),
            _ => text.to_owned(),
        };
        self.text.push_str(&delta);
        Ok(Completion {
            choices: vec![CompletionChoice {
                text: delta,
                logprobs: Some(completion_logprobs(&s)),
                token_ids: Some(s.ids.clone()),
                finish_reason: finish_reason(event),
                ..CompletionChoice::default()
            }],
            ..completion_head(event, &self.model)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(text: &str, entries: &[(f64, u32)], total: usize, finish: Option<&str>) -> Value {
        let lps: Vec<Value> = entries
            .iter()
            .map(|(lp, id)| json!([lp, id, null]))
            .collect();
        json!({
            "text": text,
            "output_ids": entries.iter().map(|e| e.1).collect::<Vec<_>>(),
            "meta_info": {
                "id": "r1",
                "finish_reason": finish.map(|f| json!({"type": f, "matched": 2})),
                "completion_tokens": total,
                "output_token_logprobs": lps,
            },
        })
    }

    fn deltas(events: &[Value]) -> (String, Vec<u64>, Vec<Value>) {
        let mut chunks = GenerateChunks::new("m");
        let (mut text, mut ids, mut finish) = (String::new(), Vec::new(), Vec::new());
        for e in events {
            let c = serde_json::to_value(chunks.push(e).expect("chunk")).unwrap();
            text.push_str(c["choices"][0]["text"].as_str().unwrap());
            ids.extend(
                c["choices"][0]["token_ids"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_u64().unwrap()),
            );
            finish.push(c["choices"][0]["finish_reason"].clone());
        }
        (text, ids, finish)
    }

    #[test]
    fn cumulative_and_incremental_streams_give_the_same_deltas() {
        let cumulative = [
            event("Hel", &[(-0.1, 10)], 1, None),
            event("Hello", &[(-0.1, 10), (-0.2, 11)], 2, None),
            event(
                "Hello!",
                &[(-0.1, 10), (-0.2, 11), (-0.3, 2)],
                3,
                Some("stop"),
            ),
        ];
        let incremental = [
            event("Hel", &[(-0.1, 10)], 1, None),
            event("lo", &[(-0.2, 11)], 2, None),
            event("!", &[(-0.3, 2)], 3, Some("stop")),
        ];
        for events in [&cumulative, &incremental] {
            let (text, ids, finish) = deltas(events);
            assert_eq!(text, "Hello!");
            assert_eq!(ids, [10, 11, 2]);
            assert_eq!(finish, [Value::Null, Value::Null, json!("stop")]);
        }
    }

    #[test]
    fn a_whole_answer_reads_its_ids_from_the_logprobs() {
        // Before 0.5.5 `output_ids` could start with prompt tokens.
        let mut answer = event("Hi", &[(-0.5, 10), (-0.25, 2)], 2, Some("stop"));
        answer["output_ids"] = json!([7, 8, 10, 2]);
        let body: Value =
            serde_json::from_slice(&completion_bytes(answer.to_string().as_bytes(), 2, "m"))
                .unwrap();
        let choice = &body["choices"][0];
        assert_eq!(choice["token_ids"], json!([10, 2]));
        assert_eq!(choice["logprobs"]["token_logprobs"], json!([-0.5, -0.25]));
        assert_eq!(choice["finish_reason"], "stop");
        assert_eq!(choice["text"], "Hi");
        assert_eq!(body["usage"]["completion_tokens"], 2);
    }

    #[test]
    fn sampling_options_map_onto_sampling_params() {
        let chat: RawBody = serde_json::from_str(
            r#"{"messages": [], "temperature": 0.7, "max_completion_tokens": 9, "stop": ["x"], "seed": 3, "tools": []}"#,
        )
        .unwrap();
        let body: Value =
            serde_json::from_slice(&generate_body(&chat, &[5, 6], true, None, 0)).unwrap();
        assert_eq!(
            body,
            json!({
                "input_ids": [5, 6],
                "sampling_params": {"temperature": 0.7, "stop": ["x"], "max_new_tokens": 9,
                                    "sampling_seed": 3, "skip_special_tokens": false},
                "return_logprob": true,
                "logprob_start_len": -1,
                "stream": true,
            })
        );
    }
}
