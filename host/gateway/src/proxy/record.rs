//! What the proxy's `model_request` record (`agl_wire::record::ModelRequest`)
//! is filled from: the `x-agl-*` tags of a request and the token ids and
//! logprobs of a vLLM response body.

use std::collections::BTreeMap;

use axum::http::HeaderMap;
use serde::Deserialize;
use serde_json::Value;
use serde_json::value::RawValue;

use agl_wire::json;
use agl_wire::openai::Completion;
use agl_wire::rollout::ApiKind;
use serde::de::IgnoredAny;

/// `x-agl-*` request headers, lower-cased (header names already are).
pub fn agl_tags(headers: &HeaderMap) -> BTreeMap<String, String> {
    headers
        .iter()
        .filter(|(k, _)| k.as_str().starts_with("x-agl-"))
        .filter_map(|(k, v)| Some((k.as_str().to_string(), v.to_str().ok()?.to_string())))
        .collect()
}

/// Token data of a complete (non-streamed) response body.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Tokens {
    pub prompt_ids: Vec<u32>,
    pub response_ids: Vec<u32>,
    pub response_logprobs: Vec<f32>,
    pub finish_reason: Option<String>,
    /// The weight version the engine reported (`weight_version` at the
    /// top of its normalised answer).
    pub engine_weight_version: Option<String>,
    /// The version that sampled each response token, when the engine
    /// reports them (agl's `token_weight_versions`); empty when it does not.
    pub response_versions: Vec<u64>,
}

impl Tokens {
    /// The per-token versions to record for a call served at `version`:
    /// none when the engine gave none for these tokens or all are `version`.
    pub fn versions_to_record(&self, version: u64) -> Option<Vec<u64>> {
        let v = &self.response_versions;
        (v.len() == self.response_ids.len() && v.iter().any(|&x| x != version)).then(|| v.clone())
    }
}

/// The token fields of each choice of a complete response body through
/// serde alone (where `token_scan` does not answer). Id lists are read
/// off their text, never through a JSON tree.
pub(super) fn tokens_by_serde(body: &[u8]) -> Option<Vec<Tokens>> {
    // Id lists are taken as text and read by `json::u32_list`.
    #[derive(Deserialize)]
    struct Body<'a> {
        #[serde(borrow)]
        prompt_token_ids: Option<&'a RawValue>,
        #[serde(default, borrow)]
        choices: Vec<Choice<'a>>,
        #[serde(default)]
        weight_version: Option<Value>,
    }
    #[derive(Deserialize)]
    struct Choice<'a> {
        #[serde(borrow)]
        prompt_token_ids: Option<&'a RawValue>,
        #[serde(borrow)]
        token_ids: Option<&'a RawValue>,
        token_weight_versions: Option<Vec<u64>>,
        logprobs: Option<Logprobs>,
        finish_reason: Option<String>,
    }
    #[derive(Deserialize)]
    struct Logprobs {
        content: Option<Vec<Entry>>,
        token_logprobs: Option<Vec<Option<f64>>>,
    }
    #[derive(Deserialize)]
    struct Entry {
        logprob: f64,
    }
    let body: Body = serde_json::from_slice(body).ok()?;
    if body.choices.is_empty() {
        return None;
    }
    let version = body.weight_version.as_ref().and_then(version_text);
    let ids = |raw: Option<&RawValue>| raw.map(json::u32_list).transpose().ok();
    let prompt = ids(body.prompt_token_ids)?;
    let choices = body.choices.into_iter().map(|choice| {
        let prompt_ids = match &prompt {
            Some(ids) => Some(ids.clone()),
            None => ids(choice.prompt_token_ids)?,
        };
        let response_ids = ids(choice.token_ids)?;
        let logprobs = choice
            .logprobs
            .map(|l| match (l.content, l.token_logprobs) {
                (Some(c), _) => c.into_iter().map(|e| e.logprob as f32).collect(),
                (None, Some(t)) => t.into_iter().map(|x| x.unwrap_or(0.0) as f32).collect(),
                (None, None) => Vec::new(),
            });
        Some(Tokens {
            prompt_ids: prompt_ids.unwrap_or_default(),
            response_ids: response_ids.unwrap_or_default(),
            response_logprobs: logprobs.unwrap_or_default(),
            finish_reason: choice.finish_reason,
            engine_weight_version: version.clone(),
            response_versions: choice.token_weight_versions.unwrap_or_default(),
        })
    });
    choices.collect()
}

/// The token fields of a completions answer the caller has read into
/// its wire type already, each choice's prompt being `prompt_ids`: the
/// rendered path sent those ids, so it skips the engine's echo of them (a
/// long list, the costliest part of the answer to read), and reads the
/// answer once, for the harness's answer and the record both.
pub fn tokens_of_completion(
    completion: &Completion<IgnoredAny>,
    prompt_ids: &[u32],
) -> Vec<Tokens> {
    let version = completion.weight_version.as_ref().and_then(version_text);
    let tokens = completion.choices.iter().map(|choice| Tokens {
        prompt_ids: prompt_ids.to_vec(),
        response_ids: choice.token_ids.clone().unwrap_or_default(),
        response_logprobs: choice
            .logprobs
            .as_ref()
            .map(|l| l.token_logprobs.iter().map(|&x| x as f32).collect())
            .unwrap_or_default(),
        finish_reason: choice.finish_reason.clone(),
        engine_weight_version: version.clone(),
        response_versions: choice.token_weight_versions.clone().unwrap_or_default(),
    });
    let tokens: Vec<Tokens> = tokens.collect();
    if tokens.is_empty() {
        // As `tokens_of` reads a body without choices.
        return vec![Tokens::default()];
    }
    tokens
}

/// Reads each choice of a chat or completions body (at least one, empty
/// for a body without choices). vLLM puts chat prompt ids at the top and
/// completions prompt ids on the choice; both are tried.
pub fn tokens_of(api: ApiKind, body: &Value) -> Vec<Tokens> {
    let none = [Value::Null];
    let choices = body
        .get("choices")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .filter(|c| !c.is_empty())
        .unwrap_or(&none);
    choices
        .iter()
        .map(|choice| {
            let prompt = body
                .get("prompt_token_ids")
                .or_else(|| choice.get("prompt_token_ids"));
            Tokens {
                prompt_ids: ids(prompt),
                response_ids: ids(choice.get("token_ids")),
                response_logprobs: logprobs(api, choice.get("logprobs")),
                finish_reason: choice
                    .get("finish_reason")
                    .and_then(Value::as_str)
                    .map(str::to_string),
                engine_weight_version: body.get("weight_version").and_then(version_text),
                response_versions: versions(choice.get("token_weight_versions")),
            }
        })
        .collect()
}

/// A body of several choices as one body per choice (each holding only
/// its choice, so every reader of `choices[0]` reads it); `None` for a body
/// of one choice or none.
pub fn split_choices(body: &str) -> Option<Vec<Value>> {
    let mut whole: Value = serde_json::from_str(body).ok()?;
    let choices = whole
        .get_mut("choices")?
        .as_array_mut()
        .map(std::mem::take)?;
    if choices.len() < 2 {
        return None;
    }
    Some(
        choices
            .into_iter()
            .map(|choice| {
                let mut one = whole.clone();
                one["choices"] = Value::Array(vec![choice]);
                one
            })
            .collect(),
    )
}

/// An engine's weight version (a string, or a number) as text.
pub fn version_text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// A JSON list of token ids; anything else is empty.
/// A list of versions (`token_weight_versions`); empty when absent or not
/// a list of whole numbers.
pub fn versions(v: Option<&Value>) -> Vec<u64> {
    let list = v
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    list.iter()
        .map(Value::as_u64)
        .collect::<Option<_>>()
        .unwrap_or_default()
}

pub fn ids(v: Option<&Value>) -> Vec<u32> {
    v.and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_u64)
                .filter_map(|n| u32::try_from(n).ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Sampled-token logprobs of a chat (`content[].logprob`) or completions
/// (`token_logprobs[]`) logprobs object.
pub fn logprobs(api: ApiKind, v: Option<&Value>) -> Vec<f32> {
    let Some(v) = v else { return Vec::new() };
    let list = match api {
        ApiKind::ChatCompletions => v.get("content").and_then(Value::as_array).map(|c| {
            c.iter()
                .map(|e| e.get("logprob").and_then(Value::as_f64).unwrap_or(0.0))
                .collect::<Vec<_>>()
        }),
        _ => v.get("token_logprobs").and_then(Value::as_array).map(|c| {
            c.iter()
                .map(|x| x.as_f64().unwrap_or(0.0))
                .collect::<Vec<_>>()
        }),
    };
    list.unwrap_or_default()
        .into_iter()
        .map(|x| x as f32)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The token fields of a whole answer as the proxy reads them
    /// (`forward::complete`): walked by `token_scan`, or through serde
    /// where the walk does not answer.
    fn tokens_of_bytes(body: &[u8]) -> Option<Vec<Tokens>> {
        super::super::token_scan::scan(body).or_else(|| tokens_by_serde(body))
    }

    fn chat_one() -> Value {
        json!({"choices": [{"index": 0, "token_ids": [1]}]})
    }

    #[test]
    fn reads_chat_and_completion_tokens() {
        let chat = json!({"prompt_token_ids": [1, 2], "choices": [{"token_ids": [3],
            "logprobs": {"content": [{"logprob": -0.5}]}, "finish_reason": "stop"}]});
        let t = &tokens_of(ApiKind::ChatCompletions, &chat)[0];
        assert_eq!(t.prompt_ids, vec![1, 2]);
        assert_eq!(t.response_ids, vec![3]);
        assert_eq!(t.response_logprobs, vec![-0.5]);
        assert_eq!(t.finish_reason.as_deref(), Some("stop"));
        let comp = json!({"choices": [{"prompt_token_ids": [7], "token_ids": [8, 9],
            "token_weight_versions": [3, 4],
            "logprobs": {"token_logprobs": [-1.0, -2.0]}, "finish_reason": "length"}]});
        let t = &tokens_of(ApiKind::Completions, &comp)[0];
        assert_eq!(t.prompt_ids, vec![7]);
        assert_eq!(t.response_logprobs, vec![-1.0, -2.0]);
        // A partial rollout's tokens keep their versions; one version is
        // the call's own and recorded as such.
        assert_eq!(t.response_versions, vec![3, 4]);
        assert_eq!(t.versions_to_record(3), Some(vec![3, 4]));
        let same = Tokens {
            response_versions: vec![3, 3],
            ..t.clone()
        };
        assert_eq!(same.versions_to_record(3), None);
        let short = Tokens {
            response_versions: vec![4],
            ..t.clone()
        };
        assert_eq!(short.versions_to_record(3), None, "not one per token");
        assert_eq!(
            tokens_of(ApiKind::Completions, &json!(null)),
            [Tokens::default()]
        );
        for (api, body) in [
            (ApiKind::ChatCompletions, chat),
            (ApiKind::Completions, comp.clone()),
        ] {
            let bytes = serde_json::to_vec(&body).unwrap();
            assert_eq!(tokens_of_bytes(&bytes), Some(tokens_of(api, &body)));
        }
        // Every choice, the top-level prompt ids each one's.
        let two = json!({"prompt_token_ids": [1], "choices": [
            {"index": 0, "token_ids": [2], "finish_reason": "stop"},
            {"index": 1, "token_ids": [3, 4], "finish_reason": "length"}]});
        let t = tokens_of_bytes(&serde_json::to_vec(&two).unwrap()).unwrap();
        assert_eq!(t, tokens_of(ApiKind::ChatCompletions, &two));
        assert_eq!(
            (t[1].prompt_ids.clone(), t[1].response_ids.clone()),
            (vec![1], vec![3, 4])
        );
        // A completions answer read into its wire type, the echoed prompt
        // skipped, gives what its bytes do with the prompt the reader sent.
        let versioned = json!({"weight_version": 5, "choices": [comp["choices"][0],
            {"index": 1, "prompt_token_ids": [7], "token_ids": [6], "finish_reason": "stop"}]});
        let sent = [9, 8, 7];
        for body in [comp.clone(), versioned, json!({"choices": []})] {
            let completion: Completion<IgnoredAny> = serde_json::from_value(body.clone()).unwrap();
            let bytes = serde_json::to_vec(&body).unwrap();
            let mut read =
                tokens_of_bytes(&bytes).unwrap_or_else(|| tokens_of(ApiKind::Completions, &body));
            if !completion.choices.is_empty() {
                read.iter_mut().for_each(|t| t.prompt_ids = sent.to_vec());
            }
            assert_eq!(tokens_of_completion(&completion, &sent), read, "{body}");
        }
        let split = split_choices(&two.to_string()).unwrap();
        assert_eq!(split[1]["choices"], json!([two["choices"][1]]));
        assert_eq!(split[1]["prompt_token_ids"], json!([1]));
        assert_eq!(split_choices(&chat_one().to_string()), None);
        assert_eq!(
            tokens_of_bytes(br#"{"choices": [{"token_ids": ["x"]}]}"#),
            None
        );
    }
}
