//! The OpenAI Responses bodies agl builds: the gateway's rendered
//! `response` (whole, as the record of a streamed call, and inside the
//! stream's lifecycle events), its output items, and the stream's events.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::openai::TokenLogprob;

/// A `response`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
#[schema(as = ResponsesResponse)]
pub struct Response {
    pub id: String,
    /// Always `response`.
    pub object: String,
    pub created_at: u64,
    /// `in_progress`, `completed`, `incomplete` or `failed`.
    pub status: String,
    pub incomplete_details: Option<IncompleteDetails>,
    pub model: String,
    pub output: Vec<OutputItem>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<ResponseUsage>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<ResponseError>,
}

impl Response {
    /// A response with no output yet.
    pub fn new(id: String, model: String, created_at: u64, status: &str) -> Response {
        Response {
            id,
            object: "response".to_string(),
            created_at,
            status: status.to_string(),
            model,
            ..Response::default()
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
#[schema(as = ResponsesIncompleteDetails)]
pub struct IncompleteDetails {
    /// `max_output_tokens`.
    pub reason: String,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
#[schema(as = ResponsesUsage)]
pub struct ResponseUsage {
    pub input_tokens: usize,
    pub output_tokens: usize,
    pub total_tokens: usize,
}

impl ResponseUsage {
    pub fn new(input_tokens: usize, output_tokens: usize) -> ResponseUsage {
        ResponseUsage {
            input_tokens,
            output_tokens,
            total_tokens: input_tokens + output_tokens,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
#[schema(as = ResponsesError)]
pub struct ResponseError {
    pub code: String,
    pub message: String,
}

/// One item of a response's `output`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
#[schema(as = ResponsesOutputItem)]
pub enum OutputItem {
    Reasoning {
        id: String,
        summary: Vec<SummaryPart>,
    },
    Message {
        id: String,
        role: String,
        /// `in_progress`, `completed` or `incomplete`.
        status: String,
        content: Vec<OutputContent>,
    },
    FunctionCall {
        id: String,
        call_id: String,
        name: String,
        /// The arguments' JSON text, as the model wrote it.
        arguments: String,
        status: String,
    },
}

impl OutputItem {
    /// Sets the item's status (reasoning has none).
    pub fn set_status(&mut self, to: &str) {
        match self {
            OutputItem::Message { status, .. } | OutputItem::FunctionCall { status, .. } => {
                *status = to.to_string()
            }
            OutputItem::Reasoning { .. } => {}
        }
    }
}

/// A part of a reasoning item's summary.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
#[schema(as = ResponsesSummaryPart)]
pub enum SummaryPart {
    SummaryText { text: String },
}

/// A part of a message item's content.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
#[schema(as = ResponsesOutputContent)]
pub enum OutputContent {
    OutputText {
        text: String,
        annotations: Vec<serde_json::Value>,
        /// With `include: ["message.output_text.logprobs"]`: the tokens
        /// that wrote `text`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        logprobs: Option<Vec<TokenLogprob>>,
    },
}

impl OutputContent {
    pub fn text(text: impl Into<String>) -> OutputContent {
        OutputContent::OutputText {
            text: text.into(),
            annotations: Vec::new(),
            logprobs: None,
        }
    }
}

/// One event of a streamed response (its `type` names it); on the wire
/// each carries its `sequence_number` ([`ResponseEvent::frame`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type")]
#[schema(as = ResponsesStreamEvent)]
pub enum ResponseEvent {
    #[serde(rename = "response.created")]
    Created { response: Response },
    #[serde(rename = "response.in_progress")]
    InProgress { response: Response },
    #[serde(rename = "response.completed")]
    Completed { response: Response },
    #[serde(rename = "response.incomplete")]
    Incomplete { response: Response },
    #[serde(rename = "response.failed")]
    Failed { response: Response },
    #[serde(rename = "response.output_item.added")]
    OutputItemAdded {
        output_index: usize,
        item: OutputItem,
    },
    #[serde(rename = "response.output_item.done")]
    OutputItemDone {
        output_index: usize,
        item: OutputItem,
    },
    #[serde(rename = "response.content_part.added")]
    ContentPartAdded {
        item_id: String,
        output_index: usize,
        content_index: usize,
        part: OutputContent,
    },
    #[serde(rename = "response.content_part.done")]
    ContentPartDone {
        item_id: String,
        output_index: usize,
        content_index: usize,
        part: OutputContent,
    },
    #[serde(rename = "response.output_text.delta")]
    OutputTextDelta {
        item_id: String,
        output_index: usize,
        content_index: usize,
        delta: String,
    },
    #[serde(rename = "response.output_text.done")]
    OutputTextDone {
        item_id: String,
        output_index: usize,
        content_index: usize,
        text: String,
    },
    #[serde(rename = "response.reasoning_summary_part.added")]
    SummaryPartAdded {
        item_id: String,
        output_index: usize,
        summary_index: usize,
        part: SummaryPart,
    },
    #[serde(rename = "response.reasoning_summary_part.done")]
    SummaryPartDone {
        item_id: String,
        output_index: usize,
        summary_index: usize,
        part: SummaryPart,
    },
    #[serde(rename = "response.reasoning_summary_text.delta")]
    SummaryTextDelta {
        item_id: String,
        output_index: usize,
        summary_index: usize,
        delta: String,
    },
    #[serde(rename = "response.reasoning_summary_text.done")]
    SummaryTextDone {
        item_id: String,
        output_index: usize,
        summary_index: usize,
        text: String,
    },
    #[serde(rename = "response.function_call_arguments.delta")]
    ArgumentsDelta {
        item_id: String,
        output_index: usize,
        delta: String,
    },
    #[serde(rename = "response.function_call_arguments.done")]
    ArgumentsDone {
        item_id: String,
        output_index: usize,
        arguments: String,
    },
}

/// An event with its place in the stream.
#[derive(Serialize)]
struct Numbered<'a> {
    #[serde(flatten)]
    event: &'a ResponseEvent,
    sequence_number: u64,
}

impl ResponseEvent {
    /// The event as one SSE frame, numbered `sequence_number`.
    pub fn frame(&self, sequence_number: u64) -> String {
        let data = serde_json::to_value(Numbered {
            event: self,
            sequence_number,
        })
        .unwrap_or_default();
        let name = data["type"].as_str().unwrap_or_default();
        format!("event: {name}\ndata: {data}\n\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    #[test]
    fn events_are_named_numbered_and_read_back() {
        let e = ResponseEvent::ArgumentsDelta {
            item_id: "fc_1".into(),
            output_index: 2,
            delta: "{".into(),
        };
        let frame = e.frame(7);
        let mut lines = frame.lines();
        assert_eq!(
            lines.next(),
            Some("event: response.function_call_arguments.delta")
        );
        let data: Value =
            serde_json::from_str(lines.next().unwrap().strip_prefix("data: ").unwrap()).unwrap();
        assert_eq!(
            data,
            json!({"type": "response.function_call_arguments.delta", "item_id": "fc_1",
                   "output_index": 2, "delta": "{", "sequence_number": 7})
        );
        let back: ResponseEvent = serde_json::from_value(data).unwrap();
        assert_eq!(back, e);
    }

    #[test]
    fn items_carry_their_type() {
        let item = OutputItem::Message {
            id: "msg_1".into(),
            role: "assistant".into(),
            status: "completed".into(),
            content: vec![OutputContent::text("hi")],
        };
        assert_eq!(
            serde_json::to_value(&item).unwrap(),
            json!({"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
                   "content": [{"type": "output_text", "text": "hi", "annotations": []}]})
        );
    }
}
