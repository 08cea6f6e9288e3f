//! What the Messages and Responses front-ends answer a rendered call
//! with: the `message` / `response` bodies (also what a streamed call's
//! record and final event hold), their ids, and their event translators.

use serde::Serialize;
use serde_json::Value;

use agl_conversation::{AssistantTurn, anthropic, responses};
use agl_wire::anthropic::{Message, MessageUsage};
use agl_wire::openai::ChatLogprobs;
use agl_wire::responses::{IncompleteDetails, OutputContent, OutputItem, Response, ResponseUsage};
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

/// What a Messages or Responses call is answered with.
#[derive(Serialize)]
#[serde(untagged)]
pub enum FrontAnswer {
    Message(Message),
    Response(Response),
}

impl RenderedCall {
    /// A Messages `message` or a Responses `response` for a reply (a chat
    /// call's answer is its chat body, or its assembled chunks: `None`).
    /// `spoken`: the completion's text and its chat-shaped logprobs.
    pub(super) fn front_answer(
        &self,
        turn: &AssistantTurn,
        finish: Option<&str>,
        spoken: (&str, Option<&ChatLogprobs>),
        output_tokens: usize,
        id_prefix: &str,
    ) -> Option<FrontAnswer> {
        match self.front {
            ApiKind::AnthropicMessages => Some(FrontAnswer::Message(self.message(
                turn,
                finish,
                output_tokens,
                id_prefix,
            ))),
            ApiKind::Responses => {
                let mut response = self.response(turn, finish, output_tokens, id_prefix);
                if self.output_logprobs {
                    add_logprobs(&mut response, turn, spoken);
                }
                Some(FrontAnswer::Response(response))
            }
            _ => None,
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
    ) -> Response {
        let cut = finish == Some("length");
        let id = self.response_id(id_prefix);
        let mut output = responses::output_items(turn, &id);
        if cut {
            // Cut at max_output_tokens: the items are as far as they got.
            for item in &mut output {
                item.set_status("incomplete");
            }
        }
        let status = if cut { "incomplete" } else { "completed" };
        Response {
            incomplete_details: cut.then(|| IncompleteDetails {
                reason: "max_output_tokens".to_string(),
            }),
            output,
            usage: Some(ResponseUsage::new(self.prompt_ids.len(), output_tokens)),
            ..Response::new(format!("resp_{id}"), self.model.clone(), now_secs(), status)
        }
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
    ) -> Message {
        Message::assistant(
            self.message_id(id_prefix),
            self.model.clone(),
            anthropic::content_blocks(turn, id_prefix),
            Some(anthropic::stop_reason(turn, finish, None).to_string()),
            MessageUsage {
                input_tokens: self.prompt_ids.len(),
                output_tokens,
            },
        )
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
        logprobs: Option<&ChatLogprobs>,
        output_tokens: usize,
        id_prefix: &str,
    ) -> Option<Value> {
        let sampled = text.strip_prefix(self.forced.as_str()).unwrap_or(text);
        let spoken = (sampled, logprobs);
        let answer =
            self.front_answer(&self.parse(text), finish, spoken, output_tokens, id_prefix)?;
        serde_json::to_value(answer).ok()
    }
}

/// The message item's `output_text` gets the logprobs of the tokens that
/// wrote it (`include: ["message.output_text.logprobs"]`).
fn add_logprobs(
    response: &mut Response,
    turn: &AssistantTurn,
    (text, lp): (&str, Option<&ChatLogprobs>),
) {
    let entries = lp.map_or(&[][..], |lp| &lp.content);
    let content = turn.content.as_deref().unwrap_or_default();
    let part = content_logprobs(entries, text, content);
    for item in &mut response.output {
        if let OutputItem::Message { content, .. } = item
            && let Some(OutputContent::OutputText { logprobs, .. }) = content.first_mut()
        {
            *logprobs = Some(part.clone());
        }
    }
}
