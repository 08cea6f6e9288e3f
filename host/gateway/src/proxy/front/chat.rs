//! OpenAI Chat Completions: passed through to an engine that renders
//! itself, or rendered by the gateway and answered as `chat.completion`
//! (each of `n` choices its reply, vLLM's token fields, the prompt's ids
//! first); streamed as the chat chunks `rendered/chunks.rs` writes.

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use serde::de::IgnoredAny;
use serde_json::Value;

use agl_conversation::{AssistantTurn, Conversation, ConversationError, openai_chat};
use agl_wire::openai::{self, ChatChoice, ChatCompletion, Completion, CompletionChoice};
use agl_wire::rollout::ApiKind;
use agl_wire::{json, urls};

use super::{Answered, Earlier, Front, Passthrough};
use crate::AppState;
use crate::error::ApiError;
use crate::extract::ApiBody;
use crate::openapi::OpenAiCallErrors;
use crate::proxy::rendered::{RenderedCall, chat_logprobs, choice_prefix, written};
use crate::proxy::{ProxyPath, serve};

pub struct Chat;

/// A chat choice's finish reason when it ends in tool calls.
const TOOL_CALLS: &str = "tool_calls";

/// A Chat Completions call, recorded.
///
/// The body goes to the rollout's engine with `model`, the mode's
/// `temperature`, `return_token_ids` and `logprobs` rewritten (rendered by
/// the gateway instead when the engine is registered with `render =
/// "gateway"`). `x-agl-*` request headers are kept as the call's tags.
#[utoipa::path(
    post,
    path = "/proxy/{rollout_id}/{attempt}/{mode}/openai/v1/chat/completions",
    operation_id = "chat_completions",
    tag = "openai",
    security(("rollout_token" = []), ("admin_key" = [])),
    params(urls::ProxyPath),
    request_body(content = Object, description = "A Chat Completions request.",
                 content_type = "application/json"),
    responses(
        (status = 200, description = "The answer; with `stream: true`, SSE frames of \
            `ChatCompletionChunk` ending in `data: [DONE]`.", content(
            (openai::ChatCompletion = "application/json"),
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
    serve(&Chat, st, path, headers, body).await
}

impl Front for Chat {
    fn kind(&self) -> ApiKind {
        ApiKind::ChatCompletions
    }

    fn has_n(&self) -> bool {
        true
    }

    fn passthrough(&self) -> Option<Passthrough> {
        Some(Passthrough {
            path: "chat/completions",
            logprobs_flag: true,
            forces_tool_choice: true,
        })
    }

    fn conversation(&self, body: &Value) -> Result<Conversation, ConversationError> {
        openai_chat::conversation(body)
    }

    fn asks_logprobs(&self, body: &Value) -> bool {
        body.get("logprobs") == Some(&Value::Bool(true))
    }

    /// Each choice's reply as a chat message, with vLLM's token fields so
    /// the record reads the same as a passthrough. Read and written
    /// without a JSON tree for the (long) id lists: the prompt's ids join
    /// the body as the text they were written as, after the limits check.
    fn answer(
        &self,
        call: &RenderedCall,
        completion: Completion<IgnoredAny>,
        id_prefix: &str,
    ) -> Answered {
        let mut engine_choices = completion.choices;
        if engine_choices.is_empty() {
            engine_choices.push(CompletionChoice::default());
        }
        let mut turns = Vec::with_capacity(engine_choices.len());
        let mut choices = Vec::with_capacity(engine_choices.len());
        for (i, choice) in engine_choices.into_iter().enumerate() {
            let turn = call.parse(&call.whole(&choice.text));
            let finish_reason = if turn.tool_calls.is_empty() {
                choice.finish_reason
            } else {
                Some(TOOL_CALLS.to_string())
            };
            choices.push(ChatChoice {
                index: i,
                message: openai_chat::response_message(&turn, &choice_prefix(id_prefix, i)),
                logprobs: chat_logprobs(choice.logprobs.as_ref(), call.top_logprobs()),
                finish_reason,
                stop_reason: None,
                token_ids: Some(choice.token_ids.unwrap_or_default()),
                token_weight_versions: choice.token_weight_versions,
            });
            turns.push(turn);
        }
        let id = match completion.id {
            id if id.is_empty() => id_prefix.to_string(),
            id => id,
        };
        let body = ChatCompletion {
            id,
            object: openai::CHAT_COMPLETION.to_string(),
            created: completion.created,
            model: completion.model,
            prompt_token_ids: None,
            choices,
            usage: completion.usage,
            weight_version: None,
        };
        let mut answered = Answered::new(written(&body), turns);
        if let Some(with_ids) =
            json::with_first_field(&answered.body, "prompt_token_ids", call.prompt_json())
        {
            answered.body = with_ids;
        }
        answered
    }

    fn read_back(
        &self,
        request: Value,
        response: &Value,
        _earlier: &Earlier,
    ) -> Option<(Conversation, AssistantTurn)> {
        Some((
            openai_chat::conversation(&request).ok()?,
            openai_chat::assistant_turn(response.pointer("/choices/0/message")?).ok()?,
        ))
    }
}
