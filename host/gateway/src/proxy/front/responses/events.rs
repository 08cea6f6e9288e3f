//! A gateway-rendered stream answered as OpenAI Responses events: the chat
//! chunks `rendered::ChatChunks` makes of the engine's completion chunks
//! become `response.created` / `.in_progress`, then per output item
//! `response.output_item.added`, its deltas (`reasoning_summary_text`,
//! `output_text` inside a `content_part`, `function_call_arguments`), their
//! `.done` events and `response.output_item.done` with the whole item (Codex
//! takes each item from there); `response.completed` (or `.incomplete`)
//! with the whole response ends the stream once the record is committed,
//! `response.failed` reports an engine error. Every event has its
//! `sequence_number`; item ids are the ones the whole answer and the record
//! give (`read::ids`).

use super::read::{self, ids};
use agl_wire::openai::ChatCompletionChunk;
use agl_wire::responses::{
    OutputContent, OutputItem, Response, ResponseError, ResponseEvent, SummaryPart,
};

/// The output item being streamed and what it has so far.
enum Item {
    Reasoning(String),
    Message(String),
    /// The chat chunk's tool-call index, its call id, name and arguments.
    Call {
        index: usize,
        call_id: String,
        name: String,
        arguments: String,
    },
}

pub struct ResponseEvents {
    /// The id items are named from (`resp_{id}` is the response's).
    id: String,
    model: String,
    created_at: u64,
    sequence: u64,
    started: bool,
    /// The open item and its output index.
    open: Option<(usize, Item)>,
    next_index: usize,
}

impl ResponseEvents {
    pub fn new(id: &str, model: String, created_at: u64) -> Self {
        ResponseEvents {
            id: id.to_string(),
            model,
            created_at,
            sequence: 0,
            started: false,
            open: None,
            next_index: 0,
        }
    }

    /// One SSE frame, numbered.
    fn frame(&mut self, event: ResponseEvent) -> String {
        let frame = event.frame(self.sequence);
        self.sequence += 1;
        frame
    }

    /// The response as it stands before it is done.
    fn shell(&self, status: &str) -> Response {
        let id = format!("resp_{}", self.id);
        Response::new(id, self.model.clone(), self.created_at, status)
    }

    /// `response.created` and `response.in_progress`, the first time.
    pub fn start(&mut self) -> Vec<String> {
        if std::mem::replace(&mut self.started, true) {
            return Vec::new();
        }
        let shell = self.shell("in_progress");
        vec![
            self.frame(ResponseEvent::Created {
                response: shell.clone(),
            }),
            self.frame(ResponseEvent::InProgress { response: shell }),
        ]
    }

    /// The frames one chat chunk becomes.
    pub fn push(&mut self, chunk: &ChatCompletionChunk) -> Vec<String> {
        let mut out = self.start();
        let Some(choice) = chunk.choices.first() else {
            return out;
        };
        let delta = &choice.delta;
        if let Some(r) = delta.reasoning_content.as_deref().filter(|r| !r.is_empty()) {
            self.append(Item::Reasoning(String::new()), r, &mut out);
        }
        if let Some(t) = delta.content.as_deref().filter(|t| !t.is_empty()) {
            self.append(Item::Message(String::new()), t, &mut out);
        }
        for call in &delta.tool_calls {
            let args = call.function.arguments.as_deref().unwrap_or_default();
            let fresh = Item::Call {
                index: call.index,
                call_id: ids::call(&self.id, call.index),
                name: call.function.name.clone().unwrap_or_default(),
                arguments: String::new(),
            };
            self.append(fresh, args, &mut out);
        }
        if choice.finish_reason.is_some() {
            self.close(&mut out);
        }
        out
    }

    /// Adds `text` to the open item if it is of `fresh`'s kind (the same
    /// call), else closes that one and opens `fresh`.
    fn append(&mut self, fresh: Item, text: &str, out: &mut Vec<String>) {
        let same = match (&self.open, &fresh) {
            (Some((_, Item::Reasoning(_))), Item::Reasoning(_))
            | (Some((_, Item::Message(_))), Item::Message(_)) => true,
            (Some((_, Item::Call { index: a, .. })), Item::Call { index: b, .. }) => a == b,
            _ => false,
        };
        if !same {
            self.close(out);
            let index = self.next_index;
            self.next_index += 1;
            self.open_item(index, &fresh, out);
            self.open = Some((index, fresh));
        }
        if text.is_empty() {
            return;
        }
        let Some((output_index, item)) = &mut self.open else {
            return;
        };
        let output_index = *output_index;
        let delta = text.to_string();
        let event = match item {
            Item::Reasoning(all) => {
                all.push_str(text);
                ResponseEvent::SummaryTextDelta {
                    item_id: ids::reasoning(&self.id),
                    output_index,
                    summary_index: 0,
                    delta,
                }
            }
            Item::Message(all) => {
                all.push_str(text);
                ResponseEvent::OutputTextDelta {
                    item_id: ids::message(&self.id),
                    output_index,
                    content_index: 0,
                    delta,
                }
            }
            Item::Call {
                index, arguments, ..
            } => {
                arguments.push_str(text);
                ResponseEvent::ArgumentsDelta {
                    item_id: ids::function_call(&self.id, *index),
                    output_index,
                    delta,
                }
            }
        };
        let frame = self.frame(event);
        out.push(frame);
    }

    /// `output_item.added` (and the part an item's text goes into).
    fn open_item(&mut self, output_index: usize, item: &Item, out: &mut Vec<String>) {
        let id = &self.id;
        let in_progress = "in_progress".to_string();
        let added = match item {
            Item::Reasoning(_) => OutputItem::Reasoning {
                id: ids::reasoning(id),
                summary: Vec::new(),
            },
            Item::Message(_) => OutputItem::Message {
                id: ids::message(id),
                role: "assistant".to_string(),
                status: in_progress,
                content: Vec::new(),
            },
            Item::Call {
                index,
                call_id,
                name,
                ..
            } => OutputItem::FunctionCall {
                id: ids::function_call(id, *index),
                call_id: call_id.clone(),
                name: name.clone(),
                arguments: String::new(),
                status: in_progress,
            },
        };
        let part = match item {
            Item::Reasoning(_) => Some(ResponseEvent::SummaryPartAdded {
                item_id: ids::reasoning(id),
                output_index,
                summary_index: 0,
                part: SummaryPart::SummaryText {
                    text: String::new(),
                },
            }),
            Item::Message(_) => Some(ResponseEvent::ContentPartAdded {
                item_id: ids::message(id),
                output_index,
                content_index: 0,
                part: OutputContent::text(""),
            }),
            Item::Call { .. } => None,
        };
        let frame = self.frame(ResponseEvent::OutputItemAdded {
            output_index,
            item: added,
        });
        out.push(frame);
        if let Some(part) = part {
            let frame = self.frame(part);
            out.push(frame);
        }
    }

    /// The open item's `.done` events and `output_item.done` with the
    /// whole item.
    fn close(&mut self, out: &mut Vec<String>) {
        let Some((output_index, item)) = self.open.take() else {
            return;
        };
        let id = self.id.clone();
        let (done, whole) = match item {
            Item::Reasoning(text) => (
                vec![
                    ResponseEvent::SummaryTextDone {
                        item_id: ids::reasoning(&id),
                        output_index,
                        summary_index: 0,
                        text: text.clone(),
                    },
                    ResponseEvent::SummaryPartDone {
                        item_id: ids::reasoning(&id),
                        output_index,
                        summary_index: 0,
                        part: SummaryPart::SummaryText { text: text.clone() },
                    },
                ],
                read::reasoning_item(&id, &text),
            ),
            Item::Message(text) => (
                vec![
                    ResponseEvent::OutputTextDone {
                        item_id: ids::message(&id),
                        output_index,
                        content_index: 0,
                        text: text.clone(),
                    },
                    ResponseEvent::ContentPartDone {
                        item_id: ids::message(&id),
                        output_index,
                        content_index: 0,
                        part: OutputContent::text(text.clone()),
                    },
                ],
                read::message_item(&id, &text),
            ),
            Item::Call {
                index,
                call_id,
                name,
                arguments,
            } => (
                vec![ResponseEvent::ArgumentsDone {
                    item_id: ids::function_call(&id, index),
                    output_index,
                    arguments: arguments.clone(),
                }],
                read::function_call_item(&id, index, &call_id, &name, &arguments),
            ),
        };
        for event in done {
            let frame = self.frame(event);
            out.push(frame);
        }
        let frame = self.frame(ResponseEvent::OutputItemDone {
            output_index,
            item: whole,
        });
        out.push(frame);
    }

    /// `response.completed` (or `.incomplete`, as its status says) with the
    /// whole response.
    pub fn end(&mut self, response: Response) -> String {
        let event = match response.status.as_str() {
            "incomplete" => ResponseEvent::Incomplete { response },
            _ => ResponseEvent::Completed { response },
        };
        self.frame(event)
    }

    /// `response.failed` with an error `code` (`server_error`: the engine
    /// failed the call; `context_length_exceeded`).
    pub fn failed(&mut self, code: &str, message: &str) -> String {
        let mut response = self.shell("failed");
        response.error = Some(ResponseError {
            code: code.to_string(),
            message: message.to_string(),
        });
        self.frame(ResponseEvent::Failed { response })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn chunk(delta: Value, finish: Option<&str>) -> ChatCompletionChunk {
        serde_json::from_value(
            json!({"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}),
        )
        .unwrap()
    }

    fn item(item: OutputItem) -> Value {
        serde_json::to_value(item).unwrap()
    }

    fn events(frames: &[String]) -> Vec<Value> {
        frames
            .iter()
            .map(|f| {
                let data = f.lines().find_map(|l| l.strip_prefix("data: ")).unwrap();
                serde_json::from_str(data).unwrap()
            })
            .collect()
    }

    #[test]
    fn text_then_a_call_stream_as_items_with_their_done_events_numbered() {
        let mut e = ResponseEvents::new("r1_9", "m".into(), 1);
        let mut frames = e.start();
        frames.extend(e.push(&chunk(json!({"content": "Lis"}), None)));
        frames.extend(e.push(&chunk(json!({"content": "ting."}), None)));
        frames.extend(e.push(&chunk(
            json!({"tool_calls": [{"index": 0, "id": "x", "function": {"name": "shell", "arguments": ""}}]}),
            None,
        )));
        frames.extend(e.push(&chunk(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"cmd\":"}}]}),
            None,
        )));
        frames.extend(e.push(&chunk(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": "\"ls\"}"}}]}),
            Some("tool_calls"),
        )));
        let all = events(&frames);
        let kinds: Vec<&str> = all.iter().map(|v| v["type"].as_str().unwrap()).collect();
        assert_eq!(
            kinds,
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.done",
                "response.output_item.done",
            ]
        );
        for (i, v) in all.iter().enumerate() {
            assert_eq!(v["sequence_number"], i as u64);
        }
        // The whole items, as the whole answer names them.
        assert_eq!(all[8]["item"], item(read::message_item("r1_9", "Listing.")));
        assert_eq!(
            all[13]["item"],
            item(read::function_call_item(
                "r1_9",
                0,
                "call_r1_9_0",
                "shell",
                "{\"cmd\":\"ls\"}"
            ))
        );
        assert_eq!(all[13]["output_index"], 1);
        let end = events(&[e.end(Response::new("resp_1".into(), "m".into(), 1, "completed"))]);
        assert_eq!(end[0]["type"], "response.completed");
        assert_eq!(end[0]["sequence_number"], 14);
    }

    #[test]
    fn reasoning_is_a_summary_and_a_failure_says_failed() {
        let mut e = ResponseEvents::new("r1_9", "m".into(), 1);
        let mut frames = e.push(&chunk(json!({"reasoning_content": "think"}), None));
        frames.extend(e.push(&chunk(json!({"content": "ok"}), Some("stop"))));
        let all = events(&frames);
        assert_eq!(all[2]["item"]["type"], "reasoning");
        let done: Vec<&Value> = all
            .iter()
            .filter(|v| v["type"] == "response.output_item.done")
            .collect();
        assert_eq!(done[0]["item"], item(read::reasoning_item("r1_9", "think")));
        assert_eq!(done[1]["item"], item(read::message_item("r1_9", "ok")));
        let failed = events(&[e.failed("server_error", "engine down")]);
        assert_eq!(failed[0]["type"], "response.failed");
        assert_eq!(failed[0]["response"]["status"], "failed");
        assert_eq!(failed[0]["response"]["error"]["message"], "engine down");
    }
}
