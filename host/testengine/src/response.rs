//! Non-streamed response bodies and the logprob shapes shared with streams.

use agl_wire::openai::{
    self, ChatChoice, ChatCompletion, ChatCompletionChunk, ChatLogprobs, ChatMessage, ChunkChoice,
    Completion, CompletionChoice, CompletionLogprobs, TokenLogprob, ToolCall, TopLogprob, Usage,
};
use indexmap::IndexMap;
use serde_json::Value;

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
    pub fn usage(&self) -> Usage {
        Usage::new(self.params.prompt_ids.len(), self.plan.ids().len())
    }

    /// The complete response body, as JSON text: written straight from
    /// the typed answer (a tree of it first cost more than the gateway's
    /// own work on a long prompt's ids, benches/rendering.rs).
    pub fn body(&self) -> Vec<u8> {
        let text = match self.params.endpoint {
            Endpoint::Chat => serde_json::to_vec(&self.chat_body()),
            Endpoint::Completions => serde_json::to_vec(&self.completion_body()),
            Endpoint::Generate => serde_json::to_vec(&super::sglang::body(self)),
        };
        // Plain data with string keys always serialises.
        text.unwrap_or_default()
    }

    fn chat_body(&self) -> ChatCompletion {
        let ids = self.plan.ids();
        let tool_calls: Vec<ToolCall> = self
            .plan
            .tool_calls()
            .into_iter()
            .map(|c| ToolCall::function(c.id, c.name, c.arguments))
            .collect();
        let content = self.plan.content();
        // OpenAI sends null content beside tool calls.
        let content = (!content.is_empty() || tool_calls.is_empty()).then_some(content);
        let with_ids = self.params.return_token_ids;
        let choice = ChatChoice {
            index: 0,
            message: ChatMessage {
                content,
                tool_calls,
                ..ChatMessage::default()
            },
            logprobs: self.params.logprobs.map(|k| chat_logprobs(&ids, 0, k)),
            finish_reason: Some(self.plan.finish.as_str().to_string()),
            stop_reason: None,
            token_ids: with_ids.then(|| ids.clone()),
            token_weight_versions: None,
        };
        ChatCompletion {
            id: self.id.clone(),
            object: openai::CHAT_COMPLETION.to_string(),
            created: self.created,
            model: self.params.model.clone(),
            prompt_token_ids: with_ids.then(|| self.params.prompt_ids.clone()),
            choices: vec![choice],
            usage: Some(self.usage()),
            weight_version: None,
        }
    }

    fn completion_body(&self) -> Completion {
        let ids = self.plan.ids();
        let with_ids = self.params.return_token_ids;
        let choice = CompletionChoice {
            index: 0,
            text: self.plan.content(),
            logprobs: self
                .params
                .logprobs
                .map(|k| completion_logprobs(&ids, 0, k)),
            finish_reason: Some(self.plan.finish.as_str().to_string()),
            stop_reason: Some(Value::Null),
            // vLLM puts completions' prompt ids on the choice.
            prompt_token_ids: with_ids.then(|| self.params.prompt_ids.clone()),
            token_ids: with_ids.then_some(ids),
            token_weight_versions: None,
        };
        Completion {
            choices: vec![choice],
            usage: Some(self.usage()),
            ..self.completion_head()
        }
    }

    /// A chat chunk with `choices` (the head of every chat chunk).
    pub fn chat_chunk(&self, choices: Vec<ChunkChoice>) -> ChatCompletionChunk {
        ChatCompletionChunk {
            id: self.id.clone(),
            object: openai::CHAT_COMPLETION_CHUNK.to_string(),
            created: self.created,
            model: self.params.model.clone(),
            choices,
            ..ChatCompletionChunk::default()
        }
    }

    /// A completions body (or chunk) without choices.
    pub fn completion_head(&self) -> Completion {
        Completion {
            id: self.id.clone(),
            object: openai::TEXT_COMPLETION.to_string(),
            created: self.created,
            model: self.params.model.clone(),
            ..Completion::default()
        }
    }
}

/// Chat logprobs for `ids` sampled at positions `start..`, `top` alternatives each.
pub fn chat_logprobs(ids: &[u32], start: usize, top: usize) -> ChatLogprobs {
    let content = ids
        .iter()
        .enumerate()
        .map(|(offset, &id)| {
            let pos = start + offset;
            let top_logprobs = (0..top)
                .map(|rank| {
                    let alt = alternative(id, rank);
                    TopLogprob {
                        token: token_str(alt),
                        logprob: top_logprob(pos, rank),
                        bytes: Some(vec![id_byte(alt)]),
                    }
                })
                .collect();
            TokenLogprob {
                token: token_str(id),
                logprob: logprob(pos),
                bytes: Some(vec![id_byte(id)]),
                top_logprobs,
            }
        })
        .collect();
    ChatLogprobs { content }
}

/// Legacy completions logprobs; the sampled token is always among the tops.
pub fn completion_logprobs(ids: &[u32], start: usize, top: usize) -> CompletionLogprobs {
    let tops = ids
        .iter()
        .enumerate()
        .map(|(offset, &id)| {
            let mut map = IndexMap::new();
            for rank in (0..top.max(1)).rev() {
                // Reverse so the sampled token wins if two alternatives print alike.
                let alt = alternative(id, rank);
                map.insert(token_str(alt), top_logprob(start + offset, rank));
            }
            map
        })
        .collect();
    CompletionLogprobs {
        tokens: ids.iter().map(|&id| token_str(id)).collect(),
        token_logprobs: (0..ids.len()).map(|i| logprob(start + i)).collect(),
        top_logprobs: tops,
        // One byte per token, so a token's text offset is its position.
        text_offset: (start..start + ids.len()).collect(),
    }
}
