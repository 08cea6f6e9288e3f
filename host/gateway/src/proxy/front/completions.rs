//! OpenAI Completions: a text (or token-id) prompt, passed through to the
//! engine whatever its `render` (a prompt is not a conversation, so the
//! gateway has nothing to render), answered as the engine answers.

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use serde_json::Value;

use agl_conversation::{AssistantTurn, Conversation, ConversationError};
use agl_wire::rollout::ApiKind;
use agl_wire::{openai, urls};

use super::{Earlier, Front, Passthrough};
use crate::AppState;
use crate::error::ApiError;
use crate::extract::ApiBody;
use crate::openapi::OpenAiCallErrors;
use crate::proxy::{ProxyPath, serve};

pub struct Completions;

/// A Completions call, recorded (passed through to the engine).
#[utoipa::path(
    post,
    path = "/proxy/{rollout_id}/{attempt}/{mode}/openai/v1/completions",
    operation_id = "completions",
    tag = "openai",
    security(("rollout_token" = []), ("admin_key" = [])),
    params(urls::ProxyPath),
    request_body(content = Object, description = "A Completions request.",
                 content_type = "application/json"),
    responses(
        (status = 200, description = "The answer; with `stream: true`, SSE frames of \
            `Completion` chunks ending in `data: [DONE]`.", content(
            (openai::Completion = "application/json"),
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
    serve(&Completions, st, path, headers, body).await
}

impl Front for Completions {
    fn kind(&self) -> ApiKind {
        ApiKind::Completions
    }

    fn has_n(&self) -> bool {
        true
    }

    fn passthrough(&self) -> Option<Passthrough> {
        Some(Passthrough {
            path: "completions",
            logprobs_flag: false,
            forces_tool_choice: false,
        })
    }

    fn renders(&self) -> bool {
        false
    }

    fn conversation(&self, _body: &Value) -> Result<Conversation, ConversationError> {
        Err(ConversationError::unsupported(
            "a Completions prompt is text, not a conversation",
        ))
    }

    /// Not continued: a raw completion is no chain's turn.
    fn read_back(
        &self,
        _request: Value,
        _response: &Value,
        _earlier: &Earlier,
    ) -> Option<(Conversation, AssistantTurn)> {
        None
    }
}
