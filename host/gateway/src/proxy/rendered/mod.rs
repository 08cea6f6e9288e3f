//! Chat calls the gateway renders itself (engines registered with
//! `render = "gateway"`): the request becomes an `agl_conversation`
//! conversation, the prompt is the rollout attempt's chain continued
//! token-exactly (or a fresh render), the engine gets token ids on its
//! `/v1/completions`, and its completion is answered as Chat Completions,
//! tool calls and reasoning parsed as the policy's model family writes them.

mod choices;
mod chunks;
mod restore;
mod sampling;
mod sglang;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use serde::de::IgnoredAny;
use serde_json::value::RawValue;
use serde_json::{Value, json};

use agl_conversation::{AssistantTurn, Chains, Conversation, Family, Renderer, Served};
use agl_wire::openai::{ChatLogprobs, Completion};

pub use choices::ChoiceChunks;
pub use chunks::ChatChunks;
pub use restore::attempt_calls;
pub use sampling::{chat_logprobs, content_logprobs};
pub use sglang::GenerateChunks;

use super::front::{Answered, Earlier, Front, Reply};
use super::record::{Tokens, tokens_of_completion};
use super::rewrite::RawBody;
use crate::ApiError;
use agl_store::{Engine, EngineApi, Store};
use agl_wire::urls;
use sampling::{structured_outputs, top_logprobs_of};

/// One rollout attempt's chains, locked while a call finds its prompt.
type AttemptChains = Arc<Mutex<Chains>>;

/// The chains of every live rollout attempt.
#[derive(Clone, Default)]
pub struct ChainIndex(Arc<Mutex<HashMap<(String, u32), AttemptChains>>>);

impl ChainIndex {
    /// The attempt's chains; rebuilt from the store the first time an
    /// attempt is seen (after a restart it may have calls already).
    async fn of(
        &self,
        store: &Store,
        rollout_id: &str,
        attempt: u32,
    ) -> Result<AttemptChains, ApiError> {
        let key = (rollout_id.to_string(), attempt);
        if let Some(found) = self
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&key)
        {
            return Ok(found.clone());
        }
        let rebuilt = restore::chains_from_store(store, rollout_id, attempt).await?;
        let mut all = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        // A call that raced this one may have inserted it first: keep that.
        Ok(all
            .entry(key)
            .or_insert_with(|| Arc::new(Mutex::new(rebuilt)))
            .clone())
    }

    /// A copy of the attempt's chains as they are now.
    pub async fn snapshot(
        &self,
        store: &Store,
        rollout_id: &str,
        attempt: u32,
    ) -> Result<Chains, ApiError> {
        let chains = self.of(store, rollout_id, attempt).await?;
        let copy = chains
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        Ok(copy)
    }

    /// Drops a finished rollout's chains (every attempt).
    pub fn forget(&self, rollout_id: &str) {
        let mut all = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        all.retain(|(id, _), _| id != rollout_id);
    }
}

/// What a gateway-rendered call carries until its record is committed.
pub struct RenderedCall {
    pub conversation: Conversation,
    pub prompt_ids: Vec<u32>,
    /// `prompt_ids` as JSON text, written once for the engine's request
    /// and the answer's `prompt_token_ids`.
    prompt_json: Box<RawValue>,
    /// The call (store seq) this one continues; `None` = a new chain.
    pub continues: Option<u64>,
    /// The API the harness called.
    pub front: &'static dyn Front,
    /// The engine's token-in API and the model name it serves.
    pub api: EngineApi,
    model: String,
    chains: AttemptChains,
    /// How the answer is read (text only under `tool_choice` none).
    family: Family,
    /// A forced tool call's start, already in the prompt's ids (see
    /// [`Family::forced_call`]).
    forced: String,
    /// The alternatives per token the caller asked for with the sampled
    /// tokens' logprobs (`top_logprobs`); `None`: no logprobs asked for.
    logprobs: Option<usize>,
    /// The output constraint the engine samples under, as vLLM's
    /// `structured_outputs`, and the request field it comes from.
    constraint: Option<(&'static str, Value)>,
}

impl RenderedCall {
    /// The request field whose constraint the engine samples under.
    pub fn constraint_field(&self) -> Option<&'static str> {
        self.constraint.as_ref().map(|(field, _)| *field)
    }

    /// The logprobs the caller asked for (`Some(top_logprobs)`), if any.
    pub fn logprobs(&self) -> Option<usize> {
        self.logprobs
    }

    /// Alternatives per sampled token to answer with.
    pub fn top_logprobs(&self) -> usize {
        self.logprobs.unwrap_or(0)
    }

    /// The model name the engine serves.
    pub fn model(&self) -> &str {
        &self.model
    }

    /// The prompt's ids as the JSON text the engine was sent.
    pub fn prompt_json(&self) -> &RawValue {
        &self.prompt_json
    }
}

impl RenderedCall {
    /// Reads the request `value` of API `front` and finds its prompt among
    /// the chains of the rollout attempt `(rollout_id, attempt)`.
    /// `choices`: the `n` the request asks for (checked).
    pub async fn prepare(
        renderer: Arc<Renderer>,
        (front, mut value, choices): (&'static dyn Front, Value, u32),
        engine: &Engine,
        (index, store): (&ChainIndex, &Store),
        (rollout_id, attempt): (&str, u32),
    ) -> Result<RenderedCall, ApiError> {
        if choices > 1 && engine.api == EngineApi::Sglang {
            return Err(ApiError::bad_request(format!(
                "`n` = {choices}: engine `{}` (api = \"sglang\") is rendered for one choice \
                 per call; make {choices} calls instead",
                engine.name
            )));
        }
        let logprobs = top_logprobs_of(front, &value)?;
        if front.names_earlier(&value) {
            let earlier = Earlier::load(store, rollout_id, attempt).await?;
            value = front.expand(value, &earlier)?;
        }
        let conversation = front
            .conversation(&value)
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
        let bad = |e: agl_conversation::ConversationError| ApiError::bad_request(e.to_string());
        renderer
            .family()
            .check_forced(&conversation.tool_choice)
            .map_err(bad)?;
        let chains = index.of(store, rollout_id, attempt).await?;
        // A continuation renders only the new messages: cheaper than the
        // hand-off to a blocking thread and back, so it runs here.
        let continued = chains
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .continued(&renderer, &conversation)
            .map_err(bad)?;
        let (mut prompt, conversation) = match continued {
            Some(prompt) => (prompt, conversation),
            // Rendering and tokenizing a whole (long) history is CPU work:
            // off the async workers.
            None => {
                let r = renderer.clone();
                let (ids, conversation) =
                    tokio::task::spawn_blocking(move || (r.fresh(&conversation), conversation))
                        .await
                        .map_err(|e| ApiError::internal(format!("rendering the prompt: {e}")))?;
                let prompt = agl_conversation::Prompt {
                    ids: ids.map_err(bad)?,
                    continues: None,
                };
                (prompt, conversation)
            }
        };
        let choice = &conversation.tool_choice;
        let forced = renderer.family().forced_call(choice);
        if !forced.is_empty() {
            let ids = renderer
                .tokenizer()
                .encode(&forced, false)
                .map_err(|e| ApiError::internal(format!("tokenizing the forced call: {e}")))?;
            prompt.ids.extend(ids);
        }
        // A forced call's arguments, masked to its tool's schema where the
        // family writes JSON calls; else a JSON `response_format`.
        // (SGLang takes no Lark grammar.)
        let constraint = renderer
            .family()
            .forced_grammar(choice, conversation.tools.as_ref())
            .filter(|_| engine.api != EngineApi::Sglang)
            .map(|lark| ("tool_choice", json!({"grammar": lark})))
            .or_else(|| structured_outputs(&value));
        Ok(RenderedCall {
            constraint,
            family: renderer.family().under(choice),
            forced,
            conversation,
            prompt_json: agl_wire::ids::json(&prompt.ids),
            prompt_ids: prompt.ids,
            continues: prompt.continues,
            front,
            api: engine.api,
            model: engine.model.clone(),
            chains,
            logprobs,
        })
    }

    /// Where the engine request goes.
    pub fn url(&self, engine: &Engine) -> String {
        match self.api {
            EngineApi::Openai => format!("{}/completions", engine.base_url),
            EngineApi::Sglang => format!("{}/generate", urls::engine_root_url(&engine.base_url)),
        }
    }

    /// The engine request over the prompt ids, in the engine's API.
    /// `room`: the tokens the context has left after the prompt, when the
    /// gateway knows the context; `max_tokens` is clamped to it (and set to
    /// it when the harness asked for none).
    pub fn engine_body(&self, mut body: RawBody, stream: bool, room: Option<usize>) -> Vec<u8> {
        sampling_names(&mut body);
        if let Some(room) = room {
            let asked = body
                .get("max_tokens")
                .and_then(|v| v.get().parse::<u64>().ok());
            if asked.is_none_or(|a| a > room as u64) {
                let room = RawValue::from_string(room.to_string());
                if let Ok(room) = room {
                    body.insert("max_tokens".into(), room);
                }
            }
        }
        match self.api {
            EngineApi::Openai => self.completions_body(body),
            EngineApi::Sglang => sglang::generate_body(
                &body,
                &self.prompt_ids,
                stream,
                self.constraint.as_ref().map(|(_, c)| c),
                self.top_logprobs(),
            ),
        }
    }

    /// A non-streamed engine answer in the completions shape.
    pub fn completion_bytes(&self, engine: bytes::Bytes) -> bytes::Bytes {
        match self.api {
            EngineApi::Openai => engine,
            EngineApi::Sglang => {
                sglang::completion_bytes(&engine, self.prompt_ids.len(), &self.model).into()
            }
        }
    }

    /// The translator of the engine's stream events into completions
    /// chunks, when they are not completions chunks already.
    pub fn native_chunks(&self) -> Option<GenerateChunks> {
        (self.api == EngineApi::Sglang).then(|| GenerateChunks::new(&self.model))
    }

    /// The chat body's sampling options as a completions request over the
    /// prompt ids (vLLM's `return_token_ids` and one logprob per sampled
    /// token).
    fn completions_body(&self, mut body: RawBody) -> Vec<u8> {
        // What a completions request takes; the chat or Messages body's
        // other keys (messages, tools, system, ...) are the prompt now.
        const KEEP: [&str; 14] = [
            "model",
            "n",
            "max_tokens",
            "temperature",
            "top_p",
            "top_k",
            "min_p",
            "stop",
            "seed",
            "stream",
            "stream_options",
            "presence_penalty",
            "frequency_penalty",
            "repetition_penalty",
        ];
        body.retain(|k, _| KEEP.contains(&k.as_str()));
        let raw = |v: Value| {
            RawValue::from_string(v.to_string()).unwrap_or_else(|_| RawValue::NULL.to_owned())
        };
        // The (long) id list written straight to text, without a JSON tree.
        body.insert("prompt".into(), self.prompt_json.clone());
        body.insert("logprobs".into(), raw(json!(self.top_logprobs().max(1))));
        if let Some((_, structured)) = &self.constraint {
            body.insert("structured_outputs".into(), raw(structured.clone()));
        }
        body.insert("return_token_ids".into(), raw(json!(true)));
        // Markers like `<tool_call>` must reach the parser.
        body.insert("skip_special_tokens".into(), raw(json!(false)));
        serde_json::to_vec(&body).unwrap_or_default()
    }

    /// The reply parsed from the answer's whole text: a forced call's
    /// start, then what the engine generated.
    pub fn parse(&self, text: &str) -> AssistantTurn {
        self.family.parse(text)
    }

    /// The answer's whole text from a completion's text.
    pub fn whole(&self, completion: &str) -> String {
        format!("{}{completion}", self.forced)
    }

    /// The chat chunk translator of a streamed answer (one per choice),
    /// holding the forced call's start as text already written.
    pub fn chat_chunks(&self, id_prefix: &str) -> ChoiceChunks {
        let first = ChatChunks::new(self.family, self.prompt_ids.clone(), id_prefix)
            .with_text(&self.forced)
            .with_top_logprobs(self.top_logprobs());
        ChoiceChunks::new(first, id_prefix)
    }

    /// The engine's completions body answered in the called API's shape,
    /// the reply of each choice parsed from its text, and the token fields
    /// its record keeps: the body is read once for all three.
    pub fn answer(&self, completion: &[u8], id_prefix: &str) -> (Answered, Vec<Tokens>) {
        // The engine's echo of the prompt is most of the answer: cut
        // before serde reads the rest.
        let cut = super::token_scan::without_prompt_echo(completion);
        let completion: Completion<IgnoredAny> =
            serde_json::from_slice(cut.as_deref().unwrap_or(completion)).unwrap_or_default();
        let tokens = tokens_of_completion(&completion, &self.prompt_ids);
        (self.front.answer(self, completion, id_prefix), tokens)
    }

    /// What a streamed call's record holds as its response: the answer in
    /// the called API's shape (`None`: a chat call's, the assembled
    /// chunks). `text` is the whole answer's (a forced call's start
    /// first), `logprobs` the chat-shaped logprobs of its sampled tokens.
    pub fn streamed_record(
        &self,
        text: &str,
        finish: Option<&str>,
        logprobs: Option<&ChatLogprobs>,
        output_tokens: usize,
        id_prefix: &str,
    ) -> Option<Value> {
        let turn = self.parse(text);
        let reply = Reply {
            turn: &turn,
            finish,
            sampled: text.strip_prefix(self.forced.as_str()).unwrap_or(text),
            logprobs,
            output_tokens,
        };
        let answer = self.front.reply(self, reply, id_prefix)?;
        serde_json::from_str(answer.get()).ok()
    }

    /// Keeps the served call's choices (record seq and response ids, and
    /// the reply, each) for the next call to continue.
    pub fn served(&self, choices: impl IntoIterator<Item = ((u64, Vec<u32>), AssistantTurn)>) {
        let choices: Vec<Served> = choices
            .into_iter()
            .map(|((call, response_ids), reply)| Served {
                call,
                messages: self.conversation.messages.clone(),
                tools: self.conversation.tools.clone(),
                prompt_ids: self.prompt_ids.clone(),
                response_ids,
                reply,
            })
            .collect();
        self.chains
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .served_choices(choices, self.continues);
    }
}

/// What the gateway wrote (an answer), as JSON text: serialised straight
/// into the record's form, with no parse to check what agl itself wrote
/// (a typed body always serialises; `null` stands in should one not).
pub fn written(body: &impl serde::Serialize) -> Box<RawValue> {
    serde_json::value::to_raw_value(body).unwrap_or_else(|_| RawValue::NULL.to_owned())
}

/// The front-ends' names of the answer's length and stop texts as the
/// completions API names them (`max_tokens`, `stop`).
fn sampling_names(body: &mut RawBody) {
    for (theirs, ours) in [
        ("max_completion_tokens", "max_tokens"),
        ("max_output_tokens", "max_tokens"),
        ("stop_sequences", "stop"),
    ] {
        if let Some(v) = body.shift_remove(theirs) {
            body.insert(ours.into(), v);
        }
    }
}

/// Seconds since the epoch, as Responses' `created_at`.
pub fn now_secs() -> u64 {
    crate::control::now_ms() / 1000
}

/// What choice `index`'s tool call ids are made of: the call's own prefix
/// for the first, so the ids of an `n` = 1 call are unchanged.
pub fn choice_prefix(id_prefix: &str, index: usize) -> String {
    match index {
        0 => id_prefix.to_string(),
        i => format!("{id_prefix}_{i}"),
    }
}
