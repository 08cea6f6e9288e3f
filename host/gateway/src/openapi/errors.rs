//! The error answers every operation of a kind can give besides its own,
//! added to the description once for all: what the auth middleware, the
//! body extractors (`extract.rs`), the auth-off guard (`local.rs`) and the
//! store answer, whichever handler is behind them. Each is the error body
//! of the API the operation belongs to: Anthropic's on the Anthropic
//! routes, `ErrorBody` everywhere else. A model call's client errors may
//! also be the engine's own, passed through as it answered ([`CallError`]).

use std::collections::BTreeMap;

use utoipa::openapi::header::HeaderBuilder;
use utoipa::openapi::path::Operation;
use utoipa::openapi::schema::{AnyOfBuilder, ObjectBuilder, Schema, Type};
use utoipa::openapi::{ContentBuilder, OpenApi, Ref, RefOr, Response, ResponseBuilder};
use utoipa::{IntoResponses, PartialSchema, ToSchema};

use agl_wire::error::{AnthropicErrorBody, ErrorBody};

/// An engine's own client error, passed to the harness as the engine
/// answered it (vLLM's is `{"error": {"message", "type", "param", "code"}}`):
/// the gateway does not own its shape.
pub struct EngineError;

impl PartialSchema for EngineError {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::Object)
            .description(Some(
                "The engine's own error answer, passed through as it came (vLLM's is \
                 `{\"error\": {\"message\", \"type\", \"param\", \"code\"}}`).",
            ))
            .into()
    }
}

impl ToSchema for EngineError {}

/// A model call's client error: the gateway's (`ErrorBody`), or the
/// engine's passed through ([`EngineError`]).
pub struct CallError;

impl PartialSchema for CallError {
    fn schema() -> RefOr<Schema> {
        either::<ErrorBody>("The gateway's error, or the engine's own as it answered.")
    }
}

impl ToSchema for CallError {
    fn schemas(out: &mut Vec<(String, RefOr<Schema>)>) {
        out.push(("ErrorBody".into(), ErrorBody::schema()));
        out.push(("EngineError".into(), EngineError::schema()));
    }
}

/// [`CallError`] on the Anthropic routes.
pub struct AnthropicCallError;

impl PartialSchema for AnthropicCallError {
    fn schema() -> RefOr<Schema> {
        either::<AnthropicErrorBody>("The gateway's error, or the engine's own as it answered.")
    }
}

impl ToSchema for AnthropicCallError {
    fn schemas(out: &mut Vec<(String, RefOr<Schema>)>) {
        out.push(("AnthropicErrorBody".into(), AnthropicErrorBody::schema()));
        out.push(("EngineError".into(), EngineError::schema()));
    }
}

/// `Own`'s error body, or the engine's.
fn either<Own: ToSchema>(description: &str) -> RefOr<Schema> {
    AnyOfBuilder::new()
        .item(Ref::from_schema_name(Own::name()))
        .item(Ref::from_schema_name("EngineError"))
        .description(Some(description))
        .into()
}

/// The error answers of a model call through the proxy (every model API
/// route lists them), in the error shape `own` and, where the engine's
/// answer may pass through, `call` ([`CallError`] or its Anthropic twin).
fn call_errors(own: &str, call: &str) -> BTreeMap<String, RefOr<Response>> {
    let answer = |why: &str, schema: &str| {
        let content = ContentBuilder::new()
            .schema(Some(Ref::from_schema_name(schema)))
            .build();
        ResponseBuilder::new()
            .description(why)
            .content("application/json", content)
    };
    let retry_after = HeaderBuilder::new()
        .schema(u32::schema())
        .description(Some("Seconds."))
        .build();
    [
        (
            "4XX",
            answer(
                "The engine's own client error, as it answered.",
                "EngineError",
            ),
        ),
        (
            "400",
            answer("A malformed call, or the engine's own 400.", call),
        ),
        (
            "404",
            answer(
                "No such rollout, another mode, an unknown `previous_response_id` \
                 (Responses), or the engine's own 404.",
                call,
            ),
        ),
        (
            "409",
            answer(
                "The rollout has ended, or this is not its current attempt.",
                own,
            ),
        ),
        (
            "429",
            answer("The proxy is paused (a weight update): retry.", own)
                .header("Retry-After", retry_after),
        ),
        ("502", answer("The engine failed.", own)),
        ("503", answer("No engine is registered.", own)),
    ]
    .into_iter()
    .map(|(status, response)| (status.to_string(), response.build().into()))
    .collect()
}

/// [`call_errors`] on the OpenAI routes.
pub struct OpenAiCallErrors;

impl IntoResponses for OpenAiCallErrors {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        call_errors(ErrorBody::name().as_ref(), CallError::name().as_ref())
    }
}

/// [`call_errors`] on the Anthropic routes.
pub struct AnthropicCallErrors;

impl IntoResponses for AnthropicCallErrors {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        call_errors(
            AnthropicErrorBody::name().as_ref(),
            AnthropicCallError::name().as_ref(),
        )
    }
}

/// A common error answer: its status, its name among the document's
/// `components/responses` (prefixed `Anthropic` in that shape) and why it
/// is given.
struct Common {
    status: &'static str,
    name: &'static str,
    why: &'static str,
}

const BAD_REQUEST: Common = Common {
    status: "400",
    name: "BadRequest",
    why: "A path, query or body that does not parse or breaks a documented limit.",
};
const UNAUTHORIZED: Common = Common {
    status: "401",
    name: "Unauthorized",
    why: "No key, or a key or rollout token that is not valid (auth on).",
};
const FORBIDDEN: Common = Common {
    status: "403",
    name: "Forbidden",
    why: "A valid key that may not do this: a rollout token on a management route, or another \
          rollout's or attempt's token. With auth off: a Host that is not loopback (or the host \
          of `gateway.public_base_url`), or another site's Origin.",
};
const TIMEOUT: Common = Common {
    status: "408",
    name: "BodyTimeout",
    why: "The body did not arrive within `gateway.body_timeout_secs`.",
};
const TOO_LARGE: Common = Common {
    status: "413",
    name: "BodyTooLarge",
    why: "The body is over `gateway.body_limit_bytes`.",
};
const MEDIA_TYPE: Common = Common {
    status: "415",
    name: "MediaType",
    why: "With auth off: a body that is not `application/json` (or `application/wasm`).",
};
const STORE: Common = Common {
    status: "500",
    name: "StoreFailed",
    why: "The store failed (logged).",
};

const ALL: [Common; 7] = [
    BAD_REQUEST,
    UNAUTHORIZED,
    FORBIDDEN,
    TIMEOUT,
    TOO_LARGE,
    MEDIA_TYPE,
    STORE,
];

/// The error shapes: `ErrorBody`, and Anthropic's on its routes.
const SHAPES: [(&str, &str); 2] = [("", "ErrorBody"), ("Anthropic", "AnthropicErrorBody")];

/// Adds the common error answers to every operation of `api`, each a
/// reference to one of the document's `components/responses`.
pub fn finish(api: &mut OpenApi) {
    let components = api.components.get_or_insert_with(Default::default);
    for (prefix, shape) in SHAPES {
        for common in ALL {
            let content = ContentBuilder::new()
                .schema(Some(Ref::from_schema_name(shape)))
                .build();
            let response = ResponseBuilder::new()
                .description(common.why)
                .content("application/json", content)
                .build();
            let name = format!("{prefix}{}", common.name);
            components.responses.insert(name, response.into());
        }
    }
    for (path, item) in api.paths.paths.iter_mut() {
        let prefix = if path.contains("/anthropic/") {
            "Anthropic"
        } else {
            ""
        };
        let operations = [
            &mut item.get,
            &mut item.put,
            &mut item.post,
            &mut item.delete,
            &mut item.patch,
            &mut item.head,
            &mut item.options,
        ];
        for op in operations.into_iter().flatten() {
            for common in common(op) {
                let responses = &mut op.responses.responses;
                if !responses.contains_key(common.status) {
                    let at = format!("#/components/responses/{prefix}{}", common.name);
                    responses.insert(common.status.to_string(), Ref::new(at).into());
                }
            }
        }
    }
}

/// The common statuses `op` can answer, from what it takes.
fn common(op: &Operation) -> Vec<Common> {
    let body = op.request_body.is_some();
    let params = op.parameters.as_ref().is_some_and(|p| !p.is_empty());
    let secured = op.security.as_ref().is_some_and(|s| !s.is_empty());
    let mut out = vec![FORBIDDEN];
    if body || params {
        out.push(BAD_REQUEST);
    }
    if secured {
        out.extend([UNAUTHORIZED, STORE]);
    }
    if body {
        out.extend([TIMEOUT, TOO_LARGE, MEDIA_TYPE]);
    }
    out
}
