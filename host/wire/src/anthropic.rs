//! The Anthropic Messages bodies agl builds: the gateway's rendered
//! `message` (whole, and as the record of a streamed call) and the stream's
//! events, each an SSE frame named by its `type`.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use crate::error::AnthropicErrorBody;

/// A whole `message`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
#[schema(as = AnthropicMessage)]
pub struct Message {
    pub id: String,
    /// Always `message`.
    #[serde(rename = "type")]
    pub kind: String,
    pub role: String,
    pub model: String,
    pub content: Vec<ContentBlock>,
    pub stop_reason: Option<String>,
    pub stop_sequence: Option<String>,
    pub usage: MessageUsage,
}

impl Message {
    /// An assistant message of `model` with its content and stop reason.
    pub fn assistant(
        id: String,
        model: String,
        content: Vec<ContentBlock>,
        stop_reason: Option<String>,
        usage: MessageUsage,
    ) -> Message {
        Message {
            id,
            kind: "message".to_string(),
            role: "assistant".to_string(),
            model,
            content,
            stop_reason,
            stop_sequence: None,
            usage,
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
#[schema(as = AnthropicUsage)]
pub struct MessageUsage {
    pub input_tokens: usize,
    pub output_tokens: usize,
}

/// A block of a message's `content`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
#[schema(as = AnthropicContentBlock)]
pub enum ContentBlock {
    Text {
        text: String,
    },
    Thinking {
        thinking: String,
        signature: String,
    },
    ToolUse {
        id: String,
        name: String,
        /// The call's arguments: an object.
        input: Value,
    },
}

/// One event of a streamed message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
#[schema(as = AnthropicStreamEvent)]
pub enum StreamEvent {
    MessageStart {
        message: Message,
    },
    ContentBlockStart {
        index: usize,
        content_block: ContentBlock,
    },
    ContentBlockDelta {
        index: usize,
        delta: BlockDelta,
    },
    ContentBlockStop {
        index: usize,
    },
    MessageDelta {
        delta: MessageDeltaBody,
        usage: DeltaUsage,
    },
    MessageStop,
    Ping,
}

impl StreamEvent {
    /// The event's name: its `type`.
    pub fn name(&self) -> &'static str {
        match self {
            StreamEvent::MessageStart { .. } => "message_start",
            StreamEvent::ContentBlockStart { .. } => "content_block_start",
            StreamEvent::ContentBlockDelta { .. } => "content_block_delta",
            StreamEvent::ContentBlockStop { .. } => "content_block_stop",
            StreamEvent::MessageDelta { .. } => "message_delta",
            StreamEvent::MessageStop => "message_stop",
            StreamEvent::Ping => "ping",
        }
    }

    /// The event as one SSE frame.
    pub fn frame(&self) -> String {
        sse(self.name(), self)
    }
}

/// An `error` event: a call that failed after its stream began.
pub fn error_frame(error: &AnthropicErrorBody) -> String {
    sse("error", error)
}

fn sse(name: &str, data: &impl Serialize) -> String {
    let data = serde_json::to_string(data).unwrap_or_default();
    format!("event: {name}\ndata: {data}\n\n")
}

/// What a `content_block_delta` adds to its block.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
#[schema(as = AnthropicBlockDelta)]
pub enum BlockDelta {
    TextDelta { text: String },
    ThinkingDelta { thinking: String },
    InputJsonDelta { partial_json: String },
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
#[schema(as = AnthropicMessageDelta)]
pub struct MessageDeltaBody {
    pub stop_reason: Option<String>,
    pub stop_sequence: Option<String>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
#[schema(as = AnthropicDeltaUsage)]
pub struct DeltaUsage {
    pub output_tokens: usize,
}

/// `GET /v1/models`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
#[schema(as = AnthropicModelList)]
pub struct ModelList {
    pub data: Vec<ModelInfo>,
    pub has_more: bool,
    pub first_id: Option<String>,
    pub last_id: Option<String>,
}

impl ModelList {
    pub fn of(data: Vec<ModelInfo>) -> ModelList {
        ModelList {
            first_id: data.first().map(|m| m.id.clone()),
            last_id: data.last().map(|m| m.id.clone()),
            data,
            has_more: false,
        }
    }
}

/// One model of the list.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
#[schema(as = AnthropicModelInfo)]
pub struct ModelInfo {
    /// Always `model`.
    #[serde(rename = "type")]
    pub kind: String,
    pub id: String,
    pub display_name: String,
    /// RFC 3339.
    pub created_at: String,
}

impl ModelInfo {
    /// A model named `id`, created at the epoch (agl does not know when).
    pub fn named(id: &str) -> ModelInfo {
        ModelInfo {
            kind: "model".to_string(),
            id: id.to_string(),
            display_name: id.to_string(),
            created_at: "1970-01-01T00:00:00Z".to_string(),
        }
    }
}

/// `POST /v1/messages/count_tokens`'s answer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
#[schema(as = AnthropicTokenCount)]
pub struct TokenCount {
    pub input_tokens: usize,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn events_are_named_by_their_type() {
        let e = StreamEvent::ContentBlockDelta {
            index: 1,
            delta: BlockDelta::InputJsonDelta {
                partial_json: "{".into(),
            },
        };
        let frame = e.frame();
        let (head, data) = frame.split_once('\n').unwrap();
        assert_eq!(head, "event: content_block_delta");
        let data: Value =
            serde_json::from_str(data.trim().strip_prefix("data: ").unwrap()).unwrap();
        assert_eq!(
            data,
            json!({"type": "content_block_delta", "index": 1,
                   "delta": {"type": "input_json_delta", "partial_json": "{"}})
        );
        assert_eq!(
            StreamEvent::MessageStop.frame(),
            "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
        );
    }
}
