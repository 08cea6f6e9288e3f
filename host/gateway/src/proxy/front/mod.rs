//! The APIs a harness calls, one module each (`chat`, `completions`,
//! `messages`, `responses`): its route, how its request is read into a
//! conversation, how a rendered call is answered whole and streamed, how
//! a record reads back, and the shape of its errors. The proxy's core
//! (`handle`, `Serving`, `rendered/`) asks the [`Front`] of the route that
//! was called and never names an API; adding one is a module here plus its
//! wire types.

mod chat;
mod completions;
mod messages;
mod responses;

use axum::response::{IntoResponse, Response};
use serde::de::IgnoredAny;
use serde_json::Value;
use serde_json::value::RawValue;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use agl_conversation::{AssistantTurn, Conversation, ConversationError};
use agl_store::{Store, StoreError};
use agl_wire::json;
use agl_wire::openai::{ChatCompletionChunk, ChatLogprobs, Completion};
use agl_wire::record::ModelRequest;
use agl_wire::rollout::ApiKind;

use super::rendered::{RenderedCall, chat_logprobs, written};
use crate::{ApiError, AppState};

/// The proxy routes of every API.
pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(chat::handler))
        .routes(routes!(completions::handler))
        .routes(routes!(responses::handler))
        .routes(routes!(messages::handler))
}

/// The front-end of a recorded call's API.
pub fn of(api: ApiKind) -> &'static dyn Front {
    match api {
        ApiKind::ChatCompletions => &chat::Chat,
        ApiKind::Completions => &completions::Completions,
        ApiKind::AnthropicMessages => &messages::Messages,
        ApiKind::Responses => &responses::Responses,
    }
}

/// How an API is passed through to an engine that renders itself.
pub struct Passthrough {
    /// The engine's route, under its base URL.
    pub path: &'static str,
    /// `logprobs` is a flag (Chat Completions), else a count.
    pub logprobs_flag: bool,
    /// The engine itself constrains a forced `tool_choice`.
    pub forces_tool_choice: bool,
}

/// One sampled reply, as a single-choice API answers it.
pub struct Reply<'a> {
    pub turn: &'a AssistantTurn,
    pub finish: Option<&'a str>,
    /// The text the engine sampled (after a forced call's start).
    pub sampled: &'a str,
    /// Chat-shaped logprobs of its tokens.
    pub logprobs: Option<&'a ChatLogprobs>,
    pub output_tokens: usize,
}

/// A rendered call's whole answer in its API's shape.
pub struct Answered {
    pub body: Box<RawValue>,
    /// Whether `body` is within the limits a record's JSON is held to
    /// (`json::check_raw` at `MAX_DEPTH - 1`: a reply's parsed tool input
    /// nests as the model wrote it), checked before Chat Completions' prompt
    /// ids join it, which nest no deeper.
    pub within_limits: bool,
    /// Each choice's reply, parsed.
    pub replies: Vec<AssistantTurn>,
}

impl Answered {
    pub fn new(body: Box<RawValue>, replies: Vec<AssistantTurn>) -> Answered {
        let within_limits = json::check_raw(&body, json::MAX_DEPTH - 1).is_ok();
        Answered {
            body,
            within_limits,
            replies,
        }
    }
}

/// An API behind the proxy. Defaults are the common case: no `n`, no
/// passthrough (the gateway's rendering only), OpenAI's error shape, a
/// single-choice answer written by [`Front::reply`], no stream events of
/// its own (chat chunks).
pub trait Front: Sync {
    /// What the record names the API.
    fn kind(&self) -> ApiKind;

    /// An error in this API's shape.
    fn error(&self, e: ApiError) -> Response {
        e.into_response()
    }

    /// Whether a request may ask for `n` > 1 choices.
    fn has_n(&self) -> bool {
        false
    }

    /// How the call goes to an engine that renders itself; `None`: only
    /// the gateway's rendering serves this API.
    fn passthrough(&self) -> Option<Passthrough> {
        None
    }

    /// Whether the gateway renders this API's calls (a text prompt is not
    /// a conversation: passed through).
    fn renders(&self) -> bool {
        true
    }

    /// The conversation a request holds.
    fn conversation(&self, body: &Value) -> Result<Conversation, ConversationError>;

    /// Whether the request asks for the sampled tokens' logprobs.
    fn asks_logprobs(&self, _body: &Value) -> bool {
        false
    }

    /// Whether the request names earlier answers it continues, so its
    /// history is read from the store first ([`Front::expand`]).
    fn names_earlier(&self, _body: &Value) -> bool {
        false
    }

    /// The request with the earlier answers it names spelled out.
    fn expand(&self, body: Value, _earlier: &Earlier) -> Result<Value, ApiError> {
        Ok(body)
    }

    /// The engine's completion answered in this API's shape.
    fn answer(
        &self,
        call: &RenderedCall,
        completion: Completion<IgnoredAny>,
        id_prefix: &str,
    ) -> Answered {
        let choice = completion.choices.into_iter().next().unwrap_or_default();
        let turn = call.parse(&call.whole(&choice.text));
        let logprobs = chat_logprobs(choice.logprobs.as_ref(), call.top_logprobs());
        let reply = Reply {
            turn: &turn,
            finish: choice.finish_reason.as_deref(),
            sampled: &choice.text,
            logprobs: logprobs.as_ref(),
            output_tokens: choice.token_ids.as_ref().map_or(0, Vec::len),
        };
        let body = self
            .reply(call, reply, id_prefix)
            .unwrap_or_else(|| written(&Value::Null));
        Answered::new(body, vec![turn])
    }

    /// One reply in this API's shape: the whole answer, and the record of
    /// a streamed call. `None`: the record is the chat chunks assembled.
    fn reply(
        &self,
        _call: &RenderedCall,
        _reply: Reply,
        _id_prefix: &str,
    ) -> Option<Box<RawValue>> {
        None
    }

    /// The events a streamed call is answered with; `None`: the chat
    /// chunks as they are.
    fn events(&self, _call: &RenderedCall, _id_prefix: &str) -> Option<Box<dyn FrontStream>> {
        None
    }

    /// How a streamed call refused before the engine was asked (its prompt
    /// leaves no room) is answered, when the API says so in its stream.
    fn refused_stream(
        &self,
        _call: &RenderedCall,
        _id_prefix: &str,
        _e: &ApiError,
    ) -> Option<Response> {
        None
    }

    /// A recorded successful call read back: its conversation and the
    /// reply it was answered with.
    fn read_back(
        &self,
        request: Value,
        response: &Value,
        earlier: &Earlier,
    ) -> Option<(Conversation, AssistantTurn)>;
}

/// A rendered stream in an API's own events, made from the chat chunks of
/// the engine's completion: opened at once, kept alive while the engine
/// is silent, closed (or failed) in that API's own way after the record is
/// committed.
pub trait FrontStream: Send {
    /// The frames that open the stream, the first time they are asked for.
    fn start(&mut self) -> Vec<String>;
    /// The frames one chat chunk becomes.
    fn push(&mut self, chunk: &ChatCompletionChunk) -> Vec<String>;
    /// A frame that keeps a silent stream alive.
    fn ping(&self) -> String;
    /// The frames that end the stream once `record` (the answer in this
    /// API's shape) is committed.
    fn end(&mut self, record: &Value) -> Vec<String>;
    /// The frame that reports a failed call in the stream.
    fn failed(&mut self, message: &str) -> String;
}

/// A rollout attempt's earlier answers by the ids a later request may name
/// (Responses' `previous_response_id`), from its recorded calls.
pub struct Earlier(responses::ResponsesIndex);

impl Earlier {
    /// Indexes the attempt's recorded calls.
    pub fn of(calls: &[(u64, ModelRequest)]) -> Earlier {
        Earlier(responses::ResponsesIndex::from_calls(calls))
    }

    /// Reads the attempt's calls from the store.
    pub async fn load(
        store: &Store,
        rollout_id: &str,
        attempt: u32,
    ) -> Result<Earlier, StoreError> {
        let calls = super::rendered::attempt_calls(store, rollout_id, attempt).await?;
        Ok(Earlier::of(&calls))
    }
}
