//! The stream of a gateway-rendered Messages or Responses call: the chat
//! chunks the engine's completion becomes, translated into that API's
//! events, opened at once, kept alive while the engine is silent, and
//! closed (or failed) in that API's own way after the record is committed.

use agl_wire::openai::ChatCompletionChunk;
use serde_json::Value;

use super::{MessageEvents, ResponseEvents, events};

pub enum FrontEvents {
    Messages(MessageEvents),
    Responses(ResponseEvents),
}

impl FrontEvents {
    /// The frames that open the stream, the first time they are asked for.
    pub fn start(&mut self) -> Vec<String> {
        match self {
            FrontEvents::Messages(e) => e.start(),
            FrontEvents::Responses(e) => e.start(),
        }
    }

    /// The frames one chat chunk becomes.
    pub fn push(&mut self, chunk: &ChatCompletionChunk) -> Vec<String> {
        match self {
            FrontEvents::Messages(e) => e.push(chunk),
            FrontEvents::Responses(e) => e.push(chunk),
        }
    }

    /// A frame that keeps a silent stream alive (Messages' `ping` event;
    /// Responses has none, so an SSE comment, which every client skips).
    pub fn ping(&self) -> String {
        match self {
            FrontEvents::Messages(_) => events::message_ping(),
            FrontEvents::Responses(_) => ": ping\n\n".to_string(),
        }
    }

    /// The frames that end the stream once `record` (the answer in this
    /// API's shape) is committed.
    pub fn end(&mut self, record: &Value) -> Vec<String> {
        match self {
            FrontEvents::Messages(_) => vec![events::message_stop()],
            FrontEvents::Responses(e) => {
                // The record is the response this stream built.
                let response = serde_json::from_value(record.clone()).unwrap_or_default();
                vec![e.end(response)]
            }
        }
    }

    /// The frame that reports a failed call in the stream.
    pub fn failed(&mut self, message: &str) -> String {
        match self {
            FrontEvents::Messages(_) => events::message_error(message),
            FrontEvents::Responses(e) => e.failed("server_error", message),
        }
    }
}
