//! A gateway-rendered stream answered as Anthropic Messages events: the chat
//! chunks [`super::ChatChunks`] makes of the engine's completion chunks
//! (reasoning, content, tool-call deltas) become `message_start`,
//! `content_block_start` / `_delta` (`thinking_delta`, `text_delta`,
//! `input_json_delta`) / `_stop`, `message_delta` (stop reason, usage);
//! `message_stop` is the stream's end, sent once the record is committed;
//! `ping` keeps a silent stream alive.

use agl_conversation::anthropic;
use serde_json::{Value, json};

/// The block being streamed.
#[derive(Clone, Copy, PartialEq)]
enum Block {
    Thinking,
    Text,
    /// The chat chunk's tool-call index.
    Tool(u64),
}

pub struct MessageEvents {
    id: String,
    /// Names the tool_use blocks as the whole answer (and the record) does.
    id_prefix: String,
    model: String,
    input_tokens: usize,
    output_tokens: usize,
    started: bool,
    /// The open block and its index.
    open: Option<(usize, Block)>,
    next_index: usize,
}

/// One SSE frame.
fn frame(event: &str, data: Value) -> String {
    format!("event: {event}\ndata: {data}\n\n")
}

/// A keep-alive frame.
pub fn message_ping() -> String {
    frame("ping", json!({"type": "ping"}))
}

/// An `error` event: a call that failed after its stream began.
pub fn message_error(message: &str) -> String {
    frame(
        "error",
        json!({"type": "error", "error": {"type": "api_error", "message": message}}),
    )
}

/// The frame that ends a Messages stream.
pub fn message_stop() -> String {
    frame("message_stop", json!({"type": "message_stop"}))
}

impl MessageEvents {
    pub fn new(id: String, id_prefix: &str, model: String, input_tokens: usize) -> Self {
        MessageEvents {
            id,
            id_prefix: id_prefix.to_string(),
            model,
            input_tokens,
            output_tokens: 0,
            started: false,
            open: None,
            next_index: 0,
        }
    }

    /// `message_start`, the first time it is asked for.
    pub fn start(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        if !std::mem::replace(&mut self.started, true) {
            out.push(frame(
                "message_start",
                json!({"type": "message_start", "message": {
                    "id": self.id, "type": "message", "role": "assistant", "model": self.model,
                    "content": [], "stop_reason": null, "stop_sequence": null,
                    "usage": {"input_tokens": self.input_tokens, "output_tokens": 0}}}),
            ));
        }
        out
    }

    /// The frames one chat chunk becomes.
    pub fn push(&mut self, chunk: &Value) -> Vec<String> {
        let mut out = self.start();
        let Some(choice) = chunk.pointer("/choices/0") else {
            return out;
        };
        self.output_tokens += choice["token_ids"].as_array().map_or(0, Vec::len);
        let delta = &choice["delta"];
        if let Some(r) = delta["reasoning_content"]
            .as_str()
            .filter(|r| !r.is_empty())
        {
            let index = self.open_block(
                Block::Thinking,
                &mut out,
                || json!({"type": "thinking", "thinking": "", "signature": ""}),
            );
            out.push(delta_frame(
                index,
                json!({"type": "thinking_delta", "thinking": r}),
            ));
        }
        if let Some(t) = delta["content"].as_str().filter(|t| !t.is_empty()) {
            let index = self.open_block(
                Block::Text,
                &mut out,
                || json!({"type": "text", "text": ""}),
            );
            out.push(delta_frame(index, json!({"type": "text_delta", "text": t})));
        }
        for call in delta["tool_calls"].as_array().into_iter().flatten() {
            let i = call["index"].as_u64().unwrap_or(0);
            let function = &call["function"];
            let id = anthropic::tool_use_id(&self.id_prefix, i as usize);
            let index = self.open_block(
                Block::Tool(i),
                &mut out,
                || json!({"type": "tool_use", "id": id, "name": function["name"], "input": {}}),
            );
            if let Some(args) = function["arguments"].as_str().filter(|a| !a.is_empty()) {
                out.push(delta_frame(
                    index,
                    json!({"type": "input_json_delta", "partial_json": args}),
                ));
            }
        }
        if let Some(finish) = choice["finish_reason"].as_str() {
            self.close(&mut out);
            let stop_reason = match finish {
                "tool_calls" => "tool_use",
                "length" => "max_tokens",
                _ => "end_turn",
            };
            out.push(frame(
                "message_delta",
                json!({"type": "message_delta",
                       "delta": {"stop_reason": stop_reason, "stop_sequence": null},
                       "usage": {"output_tokens": self.output_tokens}}),
            ));
        }
        out
    }

    /// The index of `block`, opened (and the previous one closed) if it is
    /// not the open one.
    fn open_block(
        &mut self,
        block: Block,
        out: &mut Vec<String>,
        start: impl FnOnce() -> Value,
    ) -> usize {
        if let Some((index, open)) = self.open
            && open == block
        {
            return index;
        }
        self.close(out);
        let index = self.next_index;
        self.next_index += 1;
        out.push(frame(
            "content_block_start",
            json!({"type": "content_block_start", "index": index, "content_block": start()}),
        ));
        self.open = Some((index, block));
        index
    }

    fn close(&mut self, out: &mut Vec<String>) {
        if let Some((index, _)) = self.open.take() {
            out.push(frame(
                "content_block_stop",
                json!({"type": "content_block_stop", "index": index}),
            ));
        }
    }
}

fn delta_frame(index: usize, delta: Value) -> String {
    frame(
        "content_block_delta",
        json!({"type": "content_block_delta", "index": index, "delta": delta}),
    )
}
