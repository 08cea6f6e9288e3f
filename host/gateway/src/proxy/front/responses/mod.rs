//! OpenAI Responses (`.../openai/v1/responses`), rendered by the gateway
//! only: the request read by `read.rs` (a
//! `previous_response_id` expanded from the store, `previous.rs`), the
//! answer a `response` of output items with status and usage, streamed as
//! numbered Responses events (`events.rs`); a streamed call refused before
//! the engine was asked gets `response.failed`, where its clients read why.

mod events;
mod previous;
mod read;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::response::{IntoResponse, Response};
use serde_json::Value;
use serde_json::value::RawValue;

use agl_conversation::{AssistantTurn, Conversation, ConversationError};
use agl_wire::openai::ChatLogprobs;
use agl_wire::responses::{IncompleteDetails, OutputContent, OutputItem, ResponseUsage};
use agl_wire::rollout::ApiKind;
use agl_wire::{responses as wire, urls};

use super::{Earlier, Front, FrontStream, Reply};
use crate::AppState;
use crate::error::ApiError;
use crate::extract::ApiBody;
use crate::openapi::OpenAiCallErrors;
use crate::proxy::rendered::{RenderedCall, content_logprobs, now_secs, written};
use crate::proxy::{ProxyPath, serve};
use events::ResponseEvents;
pub use previous::ResponsesIndex;

pub struct Responses;

/// Responses' `include` entry that asks for the output text's logprobs.
const INCLUDE_LOGPROBS: &str = "message.output_text.logprobs";

/// A Responses call, recorded (`render = "gateway"` engines).
#[utoipa::path(
    post,
    path = "/proxy/{rollout_id}/{attempt}/{mode}/openai/v1/responses",
    operation_id = "responses",
    tag = "openai",
    security(("rollout_token" = []), ("admin_key" = [])),
    params(urls::ProxyPath),
    request_body(content = Object, description = "A Responses request.",
                 content_type = "application/json"),
    responses(
        (status = 200, description = "The response; with `stream: true`, SSE frames of \
            numbered `ResponsesStreamEvent`s.", content(
            (wire::Response = "application/json"),
            (String = "text/event-stream"),
        )),
        OpenAiCallErrors,
    ),
)]
pub async fn handler(
    st: State<AppState>,
    path: ProxyPath,
    headers: HeaderMap,
    body: Result<ApiBody, ApiError>,
) -> Response {
    serve(&Responses, st, path, headers, body).await
}

/// What a response's item ids are made of: the rollout and the prompt's
/// length name one call.
fn response_id(call: &RenderedCall, id_prefix: &str) -> String {
    format!("{id_prefix}_{}", call.prompt_ids.len())
}

impl Front for Responses {
    fn kind(&self) -> ApiKind {
        ApiKind::Responses
    }

    fn conversation(&self, body: &Value) -> Result<Conversation, ConversationError> {
        read::conversation(body)
    }

    fn asks_logprobs(&self, body: &Value) -> bool {
        body.get("include")
            .and_then(Value::as_array)
            .is_some_and(|i| i.iter().any(|v| v == INCLUDE_LOGPROBS))
    }

    fn names_earlier(&self, body: &Value) -> bool {
        body.get("previous_response_id")
            .is_some_and(Value::is_string)
    }

    fn expand(&self, body: Value, earlier: &Earlier) -> Result<Value, ApiError> {
        earlier.0.expand(body)
    }

    /// The `response` for a reply (also the record of a streamed one, and
    /// what its `response.completed` event carries).
    fn reply(&self, call: &RenderedCall, reply: Reply, id_prefix: &str) -> Option<Box<RawValue>> {
        let cut = reply.finish == Some("length");
        let id = response_id(call, id_prefix);
        let mut output = read::output_items(reply.turn, &id);
        if cut {
            // Cut at max_output_tokens: the items are as far as they got.
            for item in &mut output {
                item.set_status("incomplete");
            }
        }
        let status = if cut { "incomplete" } else { "completed" };
        let mut response = wire::Response {
            incomplete_details: cut.then(|| IncompleteDetails {
                reason: "max_output_tokens".to_string(),
            }),
            output,
            usage: Some(ResponseUsage::new(
                call.prompt_ids.len(),
                reply.output_tokens,
            )),
            ..wire::Response::new(
                format!("resp_{id}"),
                call.model().to_string(),
                now_secs(),
                status,
            )
        };
        if call.logprobs().is_some() {
            add_logprobs(&mut response, reply.turn, (reply.sampled, reply.logprobs));
        }
        Some(written(&response))
    }

    fn events(&self, call: &RenderedCall, id_prefix: &str) -> Option<Box<dyn FrontStream>> {
        Some(Box::new(ResponseEvents::new(
            &response_id(call, id_prefix),
            call.model().to_string(),
            now_secs(),
        )))
    }

    /// `response.failed` with the error's code, as the API does.
    fn refused_stream(
        &self,
        call: &RenderedCall,
        id_prefix: &str,
        e: &ApiError,
    ) -> Option<Response> {
        let mut events = ResponseEvents::new(
            &response_id(call, id_prefix),
            call.model().to_string(),
            now_secs(),
        );
        let mut frames = events.start();
        frames.push(events.failed(e.code.unwrap_or("invalid_request_error"), &e.message));
        let headers = [
            (CONTENT_TYPE, "text/event-stream"),
            (CACHE_CONTROL, "no-cache"),
        ];
        Some((headers, frames.concat()).into_response())
    }

    fn read_back(
        &self,
        request: Value,
        response: &Value,
        earlier: &Earlier,
    ) -> Option<(Conversation, AssistantTurn)> {
        let request = earlier.0.expand(request).ok()?;
        Some((
            read::conversation(&request).ok()?,
            read::assistant_turn(response.get("output")?).ok()?,
        ))
    }
}

impl FrontStream for ResponseEvents {
    fn start(&mut self) -> Vec<String> {
        ResponseEvents::start(self)
    }

    fn push(&mut self, chunk: &agl_wire::openai::ChatCompletionChunk) -> Vec<String> {
        ResponseEvents::push(self, chunk)
    }

    /// Responses has no ping event: an SSE comment, which every client skips.
    fn ping(&self) -> String {
        ": ping\n\n".to_string()
    }

    fn end(&mut self, record: &Value) -> Vec<String> {
        // The record is the response this stream built.
        let response = serde_json::from_value(record.clone()).unwrap_or_default();
        vec![ResponseEvents::end(self, response)]
    }

    fn failed(&mut self, message: &str) -> String {
        ResponseEvents::failed(self, "server_error", message)
    }
}

/// The message item's `output_text` gets the logprobs of the tokens that
/// wrote it (`include: ["message.output_text.logprobs"]`).
fn add_logprobs(
    response: &mut wire::Response,
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
