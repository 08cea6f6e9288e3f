//! Anthropic Messages (`.../{mode}/anthropic/v1/messages`, the rollout
//! token as `x-api-key` or Bearer), rendered by the gateway only: the
//! request read by `read.rs`, the answer a `message`
//! of content blocks and a `stop_reason`, streamed as Messages events
//! (`events.rs`), errors and the pause 429 in Anthropic's shape.

mod events;
mod read;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde_json::Value;
use serde_json::value::RawValue;

use agl_conversation::{AssistantTurn, Conversation, ConversationError};
use agl_wire::anthropic::{Message, MessageUsage};
use agl_wire::rollout::ApiKind;
use agl_wire::urls;

use super::{Earlier, Front, FrontStream, Reply};
use crate::AppState;
use crate::error::ApiError;
use crate::extract::ApiBody;
use crate::openapi::AnthropicCallErrors;
use crate::proxy::rendered::{RenderedCall, written};
use crate::proxy::{ProxyPath, serve};
use events::MessageEvents;

pub struct Messages;

/// An Anthropic Messages call, recorded (`render = "gateway"` engines;
/// `?beta=true` and other query strings tolerated).
#[utoipa::path(
    post,
    path = "/proxy/{rollout_id}/{attempt}/{mode}/anthropic/v1/messages",
    operation_id = "anthropic_messages",
    tag = "anthropic",
    security(("rollout_token" = []), ("rollout_token_x_api_key" = []), ("admin_key" = [])),
    params(urls::ProxyPath),
    request_body(content = Object, description = "A Messages request.",
                 content_type = "application/json"),
    responses(
        (status = 200, description = "The message; with `stream: true`, SSE frames of \
            `AnthropicStreamEvent`s.", content(
            (Message = "application/json"),
            (String = "text/event-stream"),
        )),
        AnthropicCallErrors,
    ),
)]
pub async fn handler(
    st: State<AppState>,
    path: ProxyPath,
    headers: HeaderMap,
    body: Result<ApiBody, ApiError>,
) -> Response {
    serve(&Messages, st, path, headers, body).await
}

/// `msg_...`: the rollout and the prompt's length name one call.
fn message_id(call: &RenderedCall, id_prefix: &str) -> String {
    format!("msg_{id_prefix}_{}", call.prompt_ids.len())
}

impl Front for Messages {
    fn kind(&self) -> ApiKind {
        ApiKind::AnthropicMessages
    }

    fn error(&self, e: ApiError) -> Response {
        (e.status, axum::Json(e.anthropic_body())).into_response()
    }

    fn conversation(&self, body: &Value) -> Result<Conversation, ConversationError> {
        read::conversation(body)
    }

    fn reply(&self, call: &RenderedCall, reply: Reply, id_prefix: &str) -> Option<Box<RawValue>> {
        let message = Message::assistant(
            message_id(call, id_prefix),
            call.model().to_string(),
            read::content_blocks(reply.turn, id_prefix),
            Some(read::stop_reason(reply.turn, reply.finish, None).to_string()),
            MessageUsage {
                input_tokens: call.prompt_ids.len(),
                output_tokens: reply.output_tokens,
            },
        );
        Some(written(&message))
    }

    fn events(&self, call: &RenderedCall, id_prefix: &str) -> Option<Box<dyn FrontStream>> {
        Some(Box::new(MessageEvents::new(
            message_id(call, id_prefix),
            id_prefix,
            call.model().to_string(),
            call.prompt_ids.len(),
        )))
    }

    fn read_back(
        &self,
        request: Value,
        response: &Value,
        _earlier: &Earlier,
    ) -> Option<(Conversation, AssistantTurn)> {
        Some((
            read::conversation(&request).ok()?,
            read::assistant_turn(response.get("content")?).ok()?,
        ))
    }
}
