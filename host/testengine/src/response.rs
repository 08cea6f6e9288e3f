//! Non-streamed response bodies and the logprob shapes shared with streams.

use serde_json::{Map, Value, json};

use super::api::Params;
use super::plan::Plan;
use super::script::Endpoint;
use super::tokens::{alternative, id_byte, logprob, token_str, top_logprob};

/// Everything needed to answer one request.
#[derive(Debug, Clone)]
pub struct Call {
    pub id: String,
    pub created: u64,
    pub params: Params,
    pub plan: Plan,
    /// The weight version the engine serves (SGLang reports it).
    pub weight_version: String,
}

impl Call {
    pub fn usage(&self) -> Value {
        let prompt = self.params.prompt_ids.len();
        let completion = self.plan.ids().len();
        json!({
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        })
    }

    /// The complete response body.
    pub fn body(&self) -> Value {
        match self.params.endpoint {
            Endpoint::Chat => self.chat_body(),
            Endpoint::Completions => self.completion_body(),
            Endpoint::Generate => super::sglang::body(self),
        }
    }

    fn chat_body(&self) -> Value {
        let ids = self.plan.ids();
        let calls: Vec<Value> = self
            .plan
            .tool_calls()
            .into_iter()
            .map(|c| {
                json!({"id": c.id, "type": "function",
                       "function": {"name": c.name, "arguments": c.arguments}})
            })
            .collect();
        let content = self.plan.content();
        // OpenAI sends null content beside tool calls.
        let content = if content.is_empty() && !calls.is_empty() {
            Value::Null
        } else {
            Value::String(content)
        };
        let mut choice = json!({
            "index": 0,
            "message": {"role": "assistant", "content": content, "tool_calls": calls},
            "logprobs": self.params.logprobs.map(|k| chat_logprobs(&ids, 0, k)),
            "finish_reason": self.plan.finish.as_str(),
            "stop_reason": null,
        });
        let mut body = self.envelope("chat.completion");
        if self.params.return_token_ids {
            insert(&mut body, "prompt_token_ids", json!(self.params.prompt_ids));
            insert(&mut choice, "token_ids", json!(ids));
        }
        insert(&mut body, "choices", json!([choice]));
        insert(&mut body, "usage", self.usage());
        body
    }

    fn completion_body(&self) -> Value {
        let ids = self.plan.ids();
        let mut choice = json!({
            "index": 0,
            "text": self.plan.content(),
            "logprobs": self.params.logprobs.map(|k| completion_logprobs(&ids, 0, k)),
            "finish_reason": self.plan.finish.as_str(),
            "stop_reason": null,
        });
        if self.params.return_token_ids {
            // vLLM puts completions' prompt ids on the choice.
            insert(
                &mut choice,
                "prompt_token_ids",
                json!(self.params.prompt_ids),
            );
            insert(&mut choice, "token_ids", json!(ids));
        }
        let mut body = self.envelope("text_completion");
        insert(&mut body, "choices", json!([choice]));
        insert(&mut body, "usage", self.usage());
        body
    }

    /// `id`, `object`, `created`, `model`: the head of every body and chunk.
    pub fn envelope(&self, object: &str) -> Value {
        json!({"id": self.id, "object": object, "created": self.created, "model": self.params.model})
    }
}

/// Sets `key` on a JSON object (no-op on other values).
pub fn insert(target: &mut Value, key: &str, value: Value) {
    if let Some(map) = target.as_object_mut() {
        map.insert(key.to_owned(), value);
    }
}

/// Chat logprobs for `ids` sampled at positions `start..`, `top` alternatives each.
pub fn chat_logprobs(ids: &[u32], start: usize, top: usize) -> Value {
    let content: Vec<Value> = ids
        .iter()
        .enumerate()
        .map(|(offset, &id)| {
            let pos = start + offset;
            let tops: Vec<Value> = (0..top)
                .map(|rank| {
                    let alt = alternative(id, rank);
                    json!({"token": token_str(alt), "logprob": top_logprob(pos, rank),
                           "bytes": [id_byte(alt)]})
                })
                .collect();
            json!({"token": token_str(id), "logprob": logprob(pos), "bytes": [id_byte(id)],
                   "top_logprobs": tops})
        })
        .collect();
    json!({ "content": content })
}

/// Legacy completions logprobs; the sampled token is always among the tops.
pub fn completion_logprobs(ids: &[u32], start: usize, top: usize) -> Value {
    let tokens: Vec<String> = ids.iter().map(|&id| token_str(id)).collect();
    let lps: Vec<f64> = (0..ids.len()).map(|i| logprob(start + i)).collect();
    let tops: Vec<Value> = ids
        .iter()
        .enumerate()
        .map(|(offset, &id)| {
            let mut map = Map::new();
            for rank in (0..top.max(1)).rev() {
                // Reverse so the sampled token wins if two alternatives print alike.
                let alt = alternative(id, rank);
                map.insert(token_str(alt), json!(top_logprob(start + offset, rank)));
            }
            Value::Object(map)
        })
        .collect();
    // One byte per token, so a token's text offset is its position.
    let offsets: Vec<usize> = (start..start + ids.len()).collect();
    json!({"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets})
}
