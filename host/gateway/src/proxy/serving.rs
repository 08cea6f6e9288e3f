//! How a call is served, chosen once in `handle`: passed through (the
//! engine's own API, its answer verbatim) or rendered by the gateway
//! (`rendered/`: token ids to the engine, the called API's shape back, the
//! conversation continued token-exactly). `forward.rs`, `stream.rs` and
//! `call.rs` ask the [`Serving`] and never branch on which one it is.

use agl_wire::openai::{ChatLogprobs, Completion};
use axum::body::Bytes;
use serde_json::Value;
use serde_json::value::RawValue;

use super::assemble::{Assembler, take_events};
use super::front::{Front, FrontStream, Passthrough};
use super::record::Tokens;
use super::rendered::{ChoiceChunks, GenerateChunks, RenderedCall};
use super::rewrite::RawBody;
use crate::{ApiError, AppState};
use agl_conversation::AssistantTurn;
use agl_store::{Engine, Render};
use agl_wire::rollout::ApiKind;
use axum::response::Response;

pub enum Serving {
    /// The engine's own API (`render = "engine"`, or an API the gateway
    /// does not render): passed through.
    Passthrough(&'static dyn Front, Passthrough),
    /// The gateway's rendering (`render = "gateway"`), for any front-end.
    Rendered(Box<RenderedCall>),
}

/// A whole successful answer as it goes out.
pub struct Whole {
    /// What the harness gets.
    pub client: Bytes,
    /// `client` as JSON text, when the gateway wrote it (rendered) within
    /// the limits a record's JSON is held to: the record takes it without
    /// parsing or checking it again. (Beyond them, `client` is read as an
    /// engine's own body is, and refused.)
    pub written: Option<Box<RawValue>>,
    /// The token fields of each choice, when the gateway read them already
    /// (rendered); else they are read from `client`, the engine's own body.
    pub tokens: Option<Vec<Tokens>>,
    /// Each choice's turn, for the chains (rendered only).
    pub replies: Vec<AssistantTurn>,
}

impl Serving {
    /// Whether the gateway renders `front`'s calls to `engine`: every API
    /// it renders, for an engine registered to render on the gateway.
    pub fn renders(front: &dyn Front, engine: &Engine) -> bool {
        engine.render == Render::Gateway && front.renders()
    }

    /// How `engine` serves a call of `front`'s API, whose body was read as
    /// a tree when the gateway renders it ([`Serving::renders`]); an engine
    /// that renders itself gets the APIs it serves passed through, and
    /// refuses those only the gateway's rendering serves.
    pub async fn choose(
        st: &AppState,
        (front, tree, choices): (&'static dyn Front, Option<Value>, u32),
        engine: &Engine,
        (rollout_id, attempt): (&str, u32),
    ) -> Result<Serving, ApiError> {
        if let Some(tree) = tree {
            let renderer = st.policies.for_engine(engine).await?;
            let call = RenderedCall::prepare(
                renderer,
                (front, tree, choices),
                engine,
                (&st.chains, &st.store),
                (rollout_id, attempt),
            )
            .await?;
            return Ok(Serving::Rendered(Box::new(call)));
        }
        match front.passthrough() {
            Some(how) => Ok(Serving::Passthrough(front, how)),
            None => Err(ApiError::bad_request(format!(
                "this API is served by the gateway's own rendering; engine `{}` is registered \
                 with render = \"engine\" (set render = \"gateway\")",
                engine.name
            ))),
        }
    }

    /// The request field whose constraint the engine samples under.
    pub fn constraint_field(&self, forward: &RawBody) -> Option<&'static str> {
        match self {
            Serving::Rendered(r) => r.constraint_field(),
            Serving::Passthrough(front, _) => super::rewrite::constraint_field(forward, *front),
        }
    }

    /// The prompt's length in tokens, when the gateway rendered it.
    pub fn prompt_len(&self) -> Option<usize> {
        match self {
            Serving::Rendered(r) => Some(r.prompt_ids.len()),
            Serving::Passthrough(..) => None,
        }
    }

    /// A context-length error as the called API reports it: a streamed
    /// Responses call gets the `response.failed` event Codex reads.
    pub fn context_error(
        &self,
        streaming: bool,
        rollout_id: &str,
        e: ApiError,
    ) -> Result<Response, ApiError> {
        match self {
            Serving::Rendered(r) if streaming => match r.front.refused_stream(r, rollout_id, &e) {
                Some(refused) => Ok(refused),
                None => Err(e),
            },
            _ => Err(e),
        }
    }

    /// The engine URL and the body sent there. `room`: the most tokens the
    /// answer may take (the context left, the configured cap).
    pub fn request(
        &self,
        engine: &Engine,
        forward: RawBody,
        streaming: bool,
        room: Option<usize>,
    ) -> (String, Bytes) {
        match self {
            Serving::Rendered(r) => (
                r.url(engine),
                Bytes::from(r.engine_body(forward, streaming, room)),
            ),
            Serving::Passthrough(_, how) => {
                let body = serde_json::to_vec(&forward).unwrap_or_default();
                (
                    format!("{}/{}", engine.base_url, how.path),
                    Bytes::from(body),
                )
            }
        }
    }

    /// The earlier call this one continues (the rendered chains).
    pub fn continues(&self) -> Option<u64> {
        match self {
            Serving::Rendered(r) => r.continues,
            Serving::Passthrough(..) => None,
        }
    }

    /// A whole successful answer: the engine's body as the harness gets it.
    pub fn whole(&self, bytes: Bytes, rollout_id: &str) -> Whole {
        match self {
            Serving::Rendered(r) => {
                let (answer, tokens) = r.answer(&r.completion_bytes(bytes), rollout_id);
                Whole {
                    client: Bytes::copy_from_slice(answer.body.get().as_bytes()),
                    written: answer.within_limits.then_some(answer.body),
                    tokens: Some(tokens),
                    replies: answer.replies,
                }
            }
            Serving::Passthrough(..) => Whole {
                client: bytes,
                written: None,
                tokens: None,
                replies: Vec::new(),
            },
        }
    }

    /// The committed choices (their seqs, sampled ids and turns) join the
    /// attempt's chains, so the next call can continue them.
    pub fn served(
        &self,
        seqs: impl IntoIterator<Item = u64>,
        response_ids: Vec<Vec<u32>>,
        replies: Vec<AssistantTurn>,
    ) {
        if let Serving::Rendered(r) = self {
            r.served(seqs.into_iter().zip(response_ids).zip(replies));
        }
    }

    /// A streamed answer's translator, for `rollout_id`'s call.
    pub fn stream<'a>(&'a self, rollout_id: &'a str) -> StreamOut<'a> {
        match self {
            Serving::Passthrough(front, _) => StreamOut::Passthrough {
                asm: Assembler::new(front.kind()),
            },
            // Assembled from the chat chunks it becomes, whatever the API.
            Serving::Rendered(r) => StreamOut::Rendered {
                call: r,
                rollout_id,
                asm: Assembler::new(ApiKind::ChatCompletions),
                translate: r.chat_chunks(rollout_id),
                native: r.native_chunks(),
                events: r.front.events(r, rollout_id),
            },
        }
    }
}

/// A streamed answer on its way: engine events in, the client's frames
/// out, the record assembled. One per streamed call, held by its task for
/// the call's life: the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
pub enum StreamOut<'a> {
    /// The engine's events as they came.
    Passthrough { asm: Assembler },
    /// Completion chunks (or SGLang's, `native`) in; chat chunks out, or
    /// a Messages / Responses call's events (`events`).
    Rendered {
        call: &'a RenderedCall,
        rollout_id: &'a str,
        asm: Assembler,
        translate: ChoiceChunks,
        native: Option<GenerateChunks>,
        events: Option<Box<dyn FrontStream>>,
    },
}

/// What one read from the engine's stream gave.
pub enum Pushed {
    /// Frames for the client.
    Frames(Vec<String>),
    /// The engine's `[DONE]`.
    Done,
}

impl StreamOut<'_> {
    /// Frames the client gets before the engine says anything (a Messages
    /// or Responses stream opens at once).
    pub fn start(&mut self) -> Vec<String> {
        match self {
            StreamOut::Rendered {
                events: Some(e), ..
            } => e.start(),
            _ => Vec::new(),
        }
    }

    /// The keep-alive frame while the engine is silent, for front-ends that
    /// have one.
    pub fn ping(&self) -> Option<String> {
        match self {
            StreamOut::Rendered {
                events: Some(e), ..
            } => Some(e.ping()),
            _ => None,
        }
    }

    /// Takes the complete SSE events in `buf` (bytes read so far): the
    /// frames they become, or `[DONE]`; an error when the engine's stream
    /// cannot be read.
    pub fn push(&mut self, buf: &mut Vec<u8>) -> Result<Vec<Pushed>, String> {
        let mut out = Vec::new();
        for data in take_events(buf) {
            if data.trim() == "[DONE]" {
                out.push(Pushed::Done);
                return Ok(out);
            }
            out.push(Pushed::Frames(self.frames(&data)?));
        }
        Ok(out)
    }

    /// What one engine event becomes; each chunk is parsed and assembled
    /// once. An event that is not JSON is passed on as it came.
    fn frames(&mut self, data: &str) -> Result<Vec<String>, String> {
        let as_is = || Ok(vec![format!("data: {data}\n\n")]);
        match self {
            StreamOut::Passthrough { asm } => {
                if let Ok(v) = serde_json::from_str::<Value>(data) {
                    asm.push(&v);
                }
                as_is()
            }
            StreamOut::Rendered {
                asm,
                translate,
                native,
                events,
                ..
            } => {
                // SGLang's events are translated; completions chunks are
                // read straight into their type.
                let chunk = match native {
                    Some(n) => match serde_json::from_str::<Value>(data) {
                        Ok(v) => n.push(&v)?,
                        Err(_) => return as_is(),
                    },
                    None => match serde_json::from_str::<Completion>(data) {
                        Ok(c) => c,
                        Err(e) if e.is_data() => {
                            return Err(format!(
                                "the engine's stream event is not a completions chunk: {e}"
                            ));
                        }
                        Err(_) => return as_is(),
                    },
                };
                let mut out = Vec::new();
                for c in translate.push(&chunk) {
                    let v = serde_json::to_value(&c).unwrap_or_default();
                    asm.push(&v);
                    match events {
                        Some(e) => out.extend(e.push(&c)),
                        None => out.push(format!("data: {v}\n\n")),
                    }
                }
                Ok(out)
            }
        }
    }

    /// The answers to record, one per choice, each holding its choice
    /// alone; a rendered Messages or Responses call's holds the answer it
    /// streamed, in that API's shape.
    pub fn answers(&mut self) -> Vec<(Value, Tokens)> {
        match self {
            StreamOut::Passthrough { asm } => (0..asm.len()).map(|i| asm.choice(i)).collect(),
            StreamOut::Rendered {
                call,
                rollout_id,
                asm,
                translate,
                ..
            } => {
                let mut answers: Vec<(Value, Tokens)> =
                    (0..asm.len()).map(|i| asm.choice(i)).collect();
                if let Some((response, tokens)) = answers.first_mut() {
                    let finish = response
                        .pointer("/choices/0/finish_reason")
                        .and_then(Value::as_str);
                    let logprobs: Option<ChatLogprobs> = response
                        .pointer("/choices/0/logprobs")
                        .and_then(|lp| serde_json::from_value(lp.clone()).ok());
                    if let Some(answer) = call.streamed_record(
                        translate.text(0),
                        finish,
                        logprobs.as_ref(),
                        tokens.response_ids.len(),
                        rollout_id,
                    ) {
                        *response = answer;
                    }
                }
                answers
            }
        }
    }

    /// The committed choices join the attempt's chains (rendered).
    pub fn served(&self, seqs: Vec<u64>, response_ids: Vec<Vec<u32>>) {
        if let StreamOut::Rendered {
            call, translate, ..
        } = self
        {
            let replies = (0..seqs.len()).map(|i| call.parse(translate.text(i)));
            call.served(seqs.into_iter().zip(response_ids).zip(replies));
        }
    }

    /// The stream's last frames once the record is committed.
    pub fn end(&mut self, record: &Value) -> Bytes {
        match self {
            StreamOut::Rendered {
                events: Some(e), ..
            } => Bytes::from(e.end(record).concat()),
            _ => Bytes::from_static(b"data: [DONE]\n\n"),
        }
    }

    /// How the stream says it failed, for front-ends with an error event;
    /// none: the stream is cut.
    pub fn failed(&mut self, error: &str) -> Option<Bytes> {
        match self {
            StreamOut::Rendered {
                events: Some(e), ..
            } => Some(Bytes::from(e.failed(error))),
            _ => None,
        }
    }
}
