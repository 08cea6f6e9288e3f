//! A gateway-rendered stream answered as Anthropic Messages events: the chat
//! chunks `rendered::ChatChunks` makes of the engine's completion chunks
//! (reasoning, content, tool-call deltas) become `message_start`,
//! `content_block_start` / `_delta` (`thinking_delta`, `text_delta`,
//! `input_json_delta`) / `_stop`, `message_delta` (stop reason, usage);
//! `message_stop` is the stream's end, sent once the record is committed;
//! `ping` keeps a silent stream alive.

use agl_wire::anthropic::{
    BlockDelta, ContentBlock, DeltaUsage, Message, MessageDeltaBody, MessageUsage, StreamEvent,
    error_frame,
};
use agl_wire::error::{AnthropicErrorBody, AnthropicErrorDetail};
use agl_wire::openai::ChatCompletionChunk;
use serde_json::json;

use crate::proxy::front::FrontStream;

/// The block being streamed.
#[derive(Clone, Copy, PartialEq)]
enum Block {
    Thinking,
    Text,
    /// The chat chunk's tool-call index.
    Tool(usize),
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
            let usage = MessageUsage {
                input_tokens: self.input_tokens,
                output_tokens: 0,
            };
            let message =
                Message::assistant(self.id.clone(), self.model.clone(), Vec::new(), None, usage);
            out.push(StreamEvent::MessageStart { message }.frame());
        }
        out
    }

    /// The frames one chat chunk becomes.
    pub fn push(&mut self, chunk: &ChatCompletionChunk) -> Vec<String> {
        let mut out = self.start();
        let Some(choice) = chunk.choices.first() else {
            return out;
        };
        self.output_tokens += choice.token_ids.as_ref().map_or(0, Vec::len);
        let delta = &choice.delta;
        if let Some(r) = delta.reasoning_content.as_ref().filter(|r| !r.is_empty()) {
            let index = self.open_block(Block::Thinking, &mut out, || ContentBlock::Thinking {
                thinking: String::new(),
                signature: String::new(),
            });
            let thinking = r.clone();
            out.push(delta_frame(index, BlockDelta::ThinkingDelta { thinking }));
        }
        if let Some(t) = delta.content.as_ref().filter(|t| !t.is_empty()) {
            let index = self.open_block(Block::Text, &mut out, || ContentBlock::Text {
                text: String::new(),
            });
            out.push(delta_frame(
                index,
                BlockDelta::TextDelta { text: t.clone() },
            ));
        }
        for call in &delta.tool_calls {
            let i = call.index;
            let id = super::read::tool_use_id(&self.id_prefix, i);
            let name = call.function.name.clone().unwrap_or_default();
            let index = self.open_block(Block::Tool(i), &mut out, || ContentBlock::ToolUse {
                id,
                name,
                input: json!({}),
            });
            if let Some(args) = call.function.arguments.as_ref().filter(|a| !a.is_empty()) {
                let partial_json = args.clone();
                out.push(delta_frame(
                    index,
                    BlockDelta::InputJsonDelta { partial_json },
                ));
            }
        }
        if let Some(finish) = &choice.finish_reason {
            self.close(&mut out);
            let stop_reason = match finish.as_str() {
                "tool_calls" => "tool_use",
                "length" => "max_tokens",
                _ => "end_turn",
            };
            let event = StreamEvent::MessageDelta {
                delta: MessageDeltaBody {
                    stop_reason: Some(stop_reason.to_string()),
                    stop_sequence: None,
                },
                usage: DeltaUsage {
                    output_tokens: self.output_tokens,
                },
            };
            out.push(event.frame());
        }
        out
    }

    /// The index of `block`, opened (and the previous one closed) if it is
    /// not the open one.
    fn open_block(
        &mut self,
        block: Block,
        out: &mut Vec<String>,
        start: impl FnOnce() -> ContentBlock,
    ) -> usize {
        if let Some((index, open)) = self.open
            && open == block
        {
            return index;
        }
        self.close(out);
        let index = self.next_index;
        self.next_index += 1;
        let event = StreamEvent::ContentBlockStart {
            index,
            content_block: start(),
        };
        out.push(event.frame());
        self.open = Some((index, block));
        index
    }

    fn close(&mut self, out: &mut Vec<String>) {
        if let Some((index, _)) = self.open.take() {
            out.push(StreamEvent::ContentBlockStop { index }.frame());
        }
    }
}

impl FrontStream for MessageEvents {
    fn start(&mut self) -> Vec<String> {
        MessageEvents::start(self)
    }

    fn push(&mut self, chunk: &ChatCompletionChunk) -> Vec<String> {
        MessageEvents::push(self, chunk)
    }

    fn ping(&self) -> String {
        StreamEvent::Ping.frame()
    }

    /// `message_stop`, once the record is committed.
    fn end(&mut self, _record: &serde_json::Value) -> Vec<String> {
        vec![StreamEvent::MessageStop.frame()]
    }

    /// An `error` event: a call that failed after its stream began.
    fn failed(&mut self, message: &str) -> String {
        error_frame(&AnthropicErrorBody {
            kind: "error".to_string(),
            error: AnthropicErrorDetail {
                kind: "api_error".to_string(),
                message: message.to_string(),
            },
        })
    }
}

fn delta_frame(index: usize, delta: BlockDelta) -> String {
    StreamEvent::ContentBlockDelta { index, delta }.frame()
}
