//! What the Messages and Responses front-ends answer a rendered call
//! with: the `message` / `response` bodies (also what a streamed call's
//! record and final event hold), their ids, and their event translators.

use serde_json::{Value, json};

use agl_conversation::{AssistantTurn, anthropic, responses};
use agl_wire::rollout::ApiKind;

use super::sampling::content_logprobs;
use super::{FrontEvents, MessageEvents, RenderedCall, ResponseEvents, now_secs};
use crate::ApiError;

/// A streamed Responses call refused before the engine was asked (its
/// prompt leaves no room): a stream that says so as `response.failed` with
/// the error's code, as the API does, since that is where Responses
/// clients read why.
pub fn failed_response_stream(
    call: &RenderedCall,
    id_prefix: &str,
    e: &ApiError,
) -> axum::response::Response {
    use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
    use axum::response::IntoResponse;
    let mut events =
        ResponseEvents::new(&call.response_id(id_prefix), call.model.clone(), now_secs());
    let mut frames = events.start();
    frames.push(events.failed(e.code.unwrap_or("invalid_request_error"), &e.message));
    (
        [
            (CONTENT_TYPE, "text/event-stream"),
            (CACHE_CONTROL, "no-cache"),
        ],
        frames.concat(),
    )
        .into_response()
}

impl RenderedCall {
    /// A Messages `message` or a Responses `response` for a reply (a chat
    /// call's answer is its chat body, or its assembled chunks: `Null`).
    /// `spoken`: the completion's text and its chat-shaped logprobs.
    pub(super) fn front_answer(
        &self,
        turn: &AssistantTurn,
        finish: Option<&str>,
        spoken: (&str, &Value),
        output_tokens: usize,
        id_prefix: &str,
    ) -> Value {
        match self.front {
            ApiKind::AnthropicMessages => self.message(turn, finish, output_tokens, id_prefix),
            ApiKind::Responses => {
                let mut response = self.response(turn, finish, output_tokens, id_prefix);
                if self.output_logprobs {
                    self.add_logprobs(&mut response, turn, spoken);
                }
                response
            }
            _ => Value::Null,
        }
    }

    /// The message item's `output_text` gets the logprobs of the tokens
    /// that wrote it (`include: ["message.output_text.logprobs"]`).
    fn add_logprobs(&self, response: &mut Value, turn: &AssistantTurn, (text, lp): (&str, &Value)) {
        let entries = lp["content"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default();
        let content = turn.content.as_deref().unwrap_or_default();
        let part = content_logprobs(entries, text, content);
        let items = response["output"].as_array_mut().into_iter().flatten();
        for item in items.filter(|i| i["type"] == "message") {
            if let Some(first) = item["content"].get_mut(0) {
                first["logprobs"] = json!(part);
            }
        }
    }

    /// The Responses `response` for a reply (also the record of a streamed
    /// one, and what its `response.completed` event carries).
    fn response(
        &self,
        turn: &AssistantTurn,
        finish: Option<&str>,
        output_tokens: usize,
        id_prefix: &str,
    ) -> Value {
        let cut = finish == Some("length");
        let input = self.prompt_ids.len();
        let id = self.response_id(id_prefix);
        let mut output = responses::output_items(turn, &id);
        if cut {
            // Cut at max_output_tokens: the items are as far as they got.
            for item in &mut output {
                item["status"] = json!("incomplete");
            }
        }
        json!({
            "id": format!("resp_{id}"),
            "object": "response",
            "created_at": now_secs(),
            "status": if cut { "incomplete" } else { "completed" },
            "incomplete_details": if cut { json!({"reason": "max_output_tokens"}) } else { Value::Null },
            "model": self.model,
            "output": output,
            "usage": {"input_tokens": input, "output_tokens": output_tokens,
                      "total_tokens": input + output_tokens},
        })
    }

    /// What a response's item ids are made of: the rollout and the prompt's
    /// length name one call.
    fn response_id(&self, id_prefix: &str) -> String {
        format!("{id_prefix}_{}", self.prompt_ids.len())
    }

    /// The Messages `message` for a reply (also the record of a streamed one).
    fn message(
        &self,
        turn: &AssistantTurn,
        finish: Option<&str>,
        output_tokens: usize,
        id_prefix: &str,
    ) -> Value {
        json!({
            "id": self.message_id(id_prefix),
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": anthropic::content_blocks(turn, id_prefix),
            "stop_reason": anthropic::stop_reason(turn, finish, None),
            "stop_sequence": null,
            "usage": {"input_tokens": self.prompt_ids.len(), "output_tokens": output_tokens},
        })
    }

    /// `msg_...`: the rollout and the prompt's length name one call.
    pub fn message_id(&self, id_prefix: &str) -> String {
        format!("msg_{id_prefix}_{}", self.prompt_ids.len())
    }

    /// The event translator of a streamed Messages or Responses call (a
    /// chat call streams chat chunks as they are).
    pub fn front_events(&self, id_prefix: &str) -> Option<FrontEvents> {
        match self.front {
            ApiKind::AnthropicMessages => Some(FrontEvents::Messages(MessageEvents::new(
                self.message_id(id_prefix),
                id_prefix,
                self.model.clone(),
                self.prompt_ids.len(),
            ))),
            ApiKind::Responses => Some(FrontEvents::Responses(ResponseEvents::new(
                &self.response_id(id_prefix),
                self.model.clone(),
                now_secs(),
            ))),
            _ => None,
        }
    }

    /// What a streamed call's record holds as its response: the answer in
    /// the called API's shape (a chat call's is the assembled chunks).
    /// `text` is the whole answer's (a forced call's start first),
    /// `logprobs` the chat-shaped logprobs of its sampled tokens.
    pub fn streamed_record(
        &self,
        text: &str,
        finish: Option<&str>,
        logprobs: &Value,
        output_tokens: usize,
        id_prefix: &str,
    ) -> Option<Value> {
        let sampled = text.strip_prefix(self.forced.as_str()).unwrap_or(text);
        let spoken = (sampled, logprobs);
        let answer = self.front_answer(&self.parse(text), finish, spoken, output_tokens, id_prefix);
        (!answer.is_null()).then_some(answer)
    }
}
