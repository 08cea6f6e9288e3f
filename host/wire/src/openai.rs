//! The OpenAI Chat Completions and Completions bodies agl builds, with
//! vLLM's token fields (`prompt_token_ids`, `token_ids`): the embedded
//! inference server's answers and stream chunks, the gateway's rendered
//! answers and the records it assembles from streams, the test engine's
//! answers. Every field reads back with a default, so a reader (a test, a
//! client) takes what a peer engine leaves out.

use indexmap::IndexMap;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

/// `object` of a whole chat answer.
pub const CHAT_COMPLETION: &str = "chat.completion";
/// `object` of a chat stream chunk.
pub const CHAT_COMPLETION_CHUNK: &str = "chat.completion.chunk";
/// `object` of a completions answer and of its chunks.
pub const TEXT_COMPLETION: &str = "text_completion";

/// Token counts of one call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
}

impl Usage {
    pub fn new(prompt_tokens: usize, completion_tokens: usize) -> Usage {
        Usage {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
        }
    }
}

/// `chat.completion`: a whole chat answer.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct ChatCompletion {
    pub id: String,
    pub object: String,
    pub created: u64,
    pub model: String,
    /// vLLM's `return_token_ids`: the prompt as the engine tokenized it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_token_ids: Option<Vec<u32>>,
    pub choices: Vec<ChatChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// The weight version that served the call, as the engine names it
    /// (agl's engine a number, SGLang a string).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weight_version: Option<Value>,
}

/// One choice of a whole chat answer.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct ChatChoice {
    pub index: usize,
    pub message: ChatMessage,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: Option<String>,
    /// vLLM's: the stop string or token that ended the choice, if one did.
    pub stop_reason: Option<Value>,
    /// vLLM's `return_token_ids`: the sampled ids.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_ids: Option<Vec<u32>>,
    /// agl's engine, beside `token_ids`: the weight version that sampled
    /// each token (two versions when an update came while the choice ran).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_weight_versions: Option<Vec<u64>>,
}

/// The assistant `message` of a chat answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct ChatMessage {
    pub role: String,
    /// `null` beside tool calls that came with no text.
    pub content: Option<String>,
    /// The reasoning before the reply (vLLM's `reasoning_content`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    pub tool_calls: Vec<ToolCall>,
}

impl Default for ChatMessage {
    fn default() -> Self {
        ChatMessage {
            role: ASSISTANT.to_string(),
            content: None,
            reasoning_content: None,
            tool_calls: Vec::new(),
        }
    }
}

const ASSISTANT: &str = "assistant";
const FUNCTION: &str = "function";

/// A whole tool call.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct ToolCall {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub function: FunctionCall,
}

impl ToolCall {
    pub fn function(id: String, name: String, arguments: String) -> ToolCall {
        ToolCall {
            id,
            kind: FUNCTION.to_string(),
            function: FunctionCall { name, arguments },
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct FunctionCall {
    pub name: String,
    /// The arguments' JSON text, as the model wrote it.
    pub arguments: String,
}

/// Chat logprobs: one entry per sampled token.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct ChatLogprobs {
    pub content: Vec<TokenLogprob>,
}

/// One sampled token, its logprob and its most likely alternatives.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct TokenLogprob {
    pub token: String,
    pub logprob: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bytes: Option<Vec<u8>>,
    pub top_logprobs: Vec<TopLogprob>,
}

/// One alternative of a sampled token.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct TopLogprob {
    pub token: String,
    pub logprob: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bytes: Option<Vec<u8>>,
}

impl TopLogprob {
    /// An alternative with its text's bytes.
    pub fn new(token: String, logprob: f64) -> TopLogprob {
        let bytes = Some(token.as_bytes().to_vec());
        TopLogprob {
            token,
            logprob,
            bytes,
        }
    }
}

/// `chat.completion.chunk`: one event of a streamed chat answer (a usage
/// chunk has no choices).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct ChatCompletionChunk {
    pub id: String,
    pub object: String,
    pub created: u64,
    pub model: String,
    /// vLLM sends the prompt ids once, on the first chunk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_token_ids: Option<Vec<u32>>,
    pub choices: Vec<ChunkChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weight_version: Option<Value>,
}

/// One choice's part of a chat chunk.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct ChunkChoice {
    pub index: usize,
    pub delta: Delta,
    pub logprobs: Option<ChatLogprobs>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_ids: Option<Vec<u32>>,
    /// agl's engine: the version that sampled each of `token_ids`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_weight_versions: Option<Vec<u64>>,
    pub finish_reason: Option<String>,
    /// vLLM's, on the closing chunk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<Value>,
}

/// What a chat chunk adds to its choice.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct Delta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCallDelta>,
}

impl Delta {
    /// The opening delta: the role and empty content.
    pub fn opening() -> Delta {
        Delta {
            role: Some(ASSISTANT.to_string()),
            content: Some(String::new()),
            ..Delta::default()
        }
    }

    pub fn content(text: impl Into<String>) -> Delta {
        Delta {
            content: Some(text.into()),
            ..Delta::default()
        }
    }

    pub fn is_empty(&self) -> bool {
        *self == Delta::default()
    }
}

/// A piece of tool call `index`: its id, type and name when it starts, then
/// pieces of its arguments.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct ToolCallDelta {
    pub index: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    pub function: FunctionDelta,
}

impl ToolCallDelta {
    /// A call's start: id, type, name and empty arguments.
    pub fn start(index: usize, id: String, name: String) -> ToolCallDelta {
        ToolCallDelta {
            index,
            id: Some(id),
            kind: Some(FUNCTION.to_string()),
            function: FunctionDelta {
                name: Some(name),
                arguments: Some(String::new()),
            },
        }
    }

    /// More of a started call's arguments.
    pub fn arguments(index: usize, arguments: String) -> ToolCallDelta {
        ToolCallDelta {
            index,
            function: FunctionDelta {
                name: None,
                arguments: Some(arguments),
            },
            ..ToolCallDelta::default()
        }
    }

    /// A whole call in one delta (what a stream sends at its end).
    pub fn whole(index: usize, call: ToolCall) -> ToolCallDelta {
        ToolCallDelta {
            index,
            id: Some(call.id),
            kind: Some(call.kind),
            function: FunctionDelta {
                name: Some(call.function.name),
                arguments: Some(call.function.arguments),
            },
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct FunctionDelta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arguments: Option<String>,
}

/// `text_completion`: a whole completions answer, or one chunk of a
/// streamed one (the same shape). `P` is what `prompt_token_ids` is read
/// as: the ids, or [`IgnoredAny`](serde::de::IgnoredAny) for a reader that
/// sent them and skips the engine's echo (the gateway's rendered calls).
/// Every field has its own default (not the struct's), so `P` needs none.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Completion<P = Vec<u32>> {
    #[serde(default)]
    pub id: String,
    #[serde(default)]
    pub object: String,
    #[serde(default)]
    pub created: u64,
    #[serde(default)]
    pub model: String,
    #[serde(default)]
    pub choices: Vec<CompletionChoice<P>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight_version: Option<Value>,
}

/// One choice of a completions answer (or its part of a chunk).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CompletionChoice<P = Vec<u32>> {
    #[serde(default)]
    pub index: usize,
    #[serde(default)]
    pub text: String,
    #[serde(default)]
    pub logprobs: Option<CompletionLogprobs>,
    #[serde(default)]
    pub finish_reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<Value>,
    /// vLLM puts a completion's prompt ids on the choice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_token_ids: Option<P>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_ids: Option<Vec<u32>>,
    /// agl's engine: the version that sampled each of `token_ids`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_weight_versions: Option<Vec<u64>>,
}

/// Legacy (completions) logprobs: per token its text, logprob, a map of
/// the most likely tokens (the sampled one among them) to their logprobs,
/// and its text's offset.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct CompletionLogprobs {
    pub tokens: Vec<String>,
    pub token_logprobs: Vec<f64>,
    pub top_logprobs: Vec<IndexMap<String, f64>>,
    pub text_offset: Vec<usize>,
}

impl CompletionLogprobs {
    /// `tokens` with their logprobs and alternatives; offsets counted
    /// from `offset` by the tokens' byte lengths.
    pub fn new(
        tokens: Vec<String>,
        token_logprobs: Vec<f64>,
        top_logprobs: Vec<IndexMap<String, f64>>,
        offset: usize,
    ) -> CompletionLogprobs {
        let text_offset = tokens
            .iter()
            .scan(offset, |at, t| {
                let here = *at;
                *at += t.len();
                Some(here)
            })
            .collect();
        CompletionLogprobs {
            tokens,
            token_logprobs,
            top_logprobs,
            text_offset,
        }
    }
}

/// `GET /v1/models`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct ModelList {
    /// Always `list`.
    pub object: String,
    pub data: Vec<ModelCard>,
}

impl ModelList {
    pub fn of(data: Vec<ModelCard>) -> ModelList {
        ModelList {
            object: "list".to_string(),
            data,
        }
    }
}

/// One model of the list.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct ModelCard {
    pub id: String,
    /// Always `model`.
    pub object: String,
    pub created: u64,
    pub owned_by: String,
    /// vLLM's: the longest sequence (prompt + answer) the engine takes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_model_len: Option<u64>,
}

impl ModelCard {
    pub fn new(id: String, created: u64, owned_by: &str) -> ModelCard {
        ModelCard {
            id,
            object: "model".to_string(),
            created,
            owned_by: owned_by.to_string(),
            max_model_len: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn optional_vllm_fields_are_left_out_and_nulls_kept() {
        let chunk = ChatCompletionChunk {
            id: "c".into(),
            object: CHAT_COMPLETION_CHUNK.into(),
            choices: vec![ChunkChoice {
                delta: Delta::content("hi"),
                ..ChunkChoice::default()
            }],
            ..ChatCompletionChunk::default()
        };
        let v = serde_json::to_value(&chunk).unwrap();
        assert!(v.get("prompt_token_ids").is_none() && v.get("usage").is_none());
        let choice = &v["choices"][0];
        // Clients read these two as present-and-null until the end.
        assert!(choice["logprobs"].is_null() && choice.get("logprobs").is_some());
        assert!(choice.get("finish_reason").is_some());
        assert_eq!(choice["delta"], serde_json::json!({"content": "hi"}));
        let back: ChatCompletionChunk = serde_json::from_value(v).unwrap();
        assert_eq!(back, chunk);
    }

    #[test]
    fn a_peer_engines_sparse_answer_reads_with_defaults() {
        let body = r#"{"id": "x", "choices": [{"text": "a", "finish_reason": "stop",
                       "logprobs": {"tokens": ["a"], "token_logprobs": [-0.5]}}], "extra": 1}"#;
        let c: Completion = serde_json::from_str(body).unwrap();
        assert_eq!(c.choices[0].text, "a");
        assert_eq!(
            c.choices[0].logprobs.as_ref().unwrap().token_logprobs,
            [-0.5]
        );
        assert_eq!(c.usage, None);
    }

    #[test]
    fn offsets_follow_the_tokens_byte_lengths() {
        let lp = CompletionLogprobs::new(vec!["ab".into(), "é".into()], vec![0.0; 2], vec![], 3);
        assert_eq!(lp.text_offset, [3, 5]);
    }
}
