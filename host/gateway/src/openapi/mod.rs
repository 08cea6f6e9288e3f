//! The gateway's OpenAPI 3.1 description, served at `GET /openapi.json`.
//!
//! Nothing here is written by hand twice: every route is mounted through
//! `utoipa_axum`'s `routes!` (`routes.rs`), which takes its path and
//! method from the handler's `#[utoipa::path]` and its schemas from the
//! `agl-wire` types the handler reads and writes, so the router and the
//! description come from one list. [`finish`] then adds what every
//! operation of a kind answers besides its own responses (the error
//! statuses of auth, body limits and the store), in the error shape of the
//! API it belongs to (`errors.rs`).

mod errors;

use std::sync::Arc;

use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use utoipa::Modify;
use utoipa::OpenApi;
use utoipa::openapi::security::{ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme};

use crate::AppState;
use agl_wire::anthropic;
use agl_wire::error::{AnthropicErrorBody, ErrorBody};
use agl_wire::openai;
use agl_wire::responses;

use errors::{AnthropicCallError, CallError, EngineError};
pub use errors::{AnthropicCallErrors, OpenAiCallErrors, finish};

// The security schemes' names. The `#[utoipa::path]` attributes spell them
// as literals (the macro takes nothing else); `tests/gateway/openapi.rs`
// checks that each names a scheme defined here.

/// The security scheme of the admin key (`gateway.admin_key`).
pub const ADMIN: &str = "admin_key";
/// The security scheme of a rollout attempt's token as a bearer token.
pub const ROLLOUT: &str = "rollout_token";
/// The same token as Anthropic clients send it, in `x-api-key`.
pub const ROLLOUT_X_API_KEY: &str = "rollout_token_x_api_key";

/// The document's fixed parts; the paths come from the router.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "agl gateway",
        description = "agl's HTTP service: the management API under `/v1` (rollouts, events, \
            engines, the proxy's pause and drain, weight versions, plugins, the viewer's reads) \
            and the recording model proxy under `/proxy/{rollout_id}/{attempt}/{mode}` \
            (OpenAI Chat Completions, Completions and Responses; Anthropic Messages). Every \
            error is `{\"error\": {\"message\", \"type\"}}` (`ErrorBody`), on the Anthropic \
            routes Anthropic's `{\"type\": \"error\", \"error\": {\"type\", \"message\"}}`. \
            With auth off (no admin key) no route asks for a key, and only loopback hosts \
            are answered.",
        license(name = "Apache-2.0", identifier = "Apache-2.0"),
    ),
    modifiers(&Security),
    tags(
        (name = "rollouts", description = "Create, list, move and export rollouts."),
        (name = "events", description = "A rollout's events: the admin's or its own agent's."),
        (name = "engines", description = "The engines the proxy sends calls to."),
        (name = "publish", description = "Pause, drain and resume the proxy; weight versions."),
        (name = "plugins", description = "A hosting `agl run`'s plugins."),
        (name = "viewer", description = "The rollout viewer (`/ui`) and what it reads."),
        (name = "service", description = "Health, metrics and this document."),
        (name = "openai", description = "The recording proxy's OpenAI APIs."),
        (name = "anthropic", description = "The recording proxy's Anthropic Messages API."),
    ),
    components(schemas(
        ErrorBody,
        AnthropicErrorBody,
        // What the model calls' error answers name (`OpenAiCallErrors`).
        EngineError,
        CallError,
        AnthropicCallError,
        openai::ChatCompletionChunk,
        anthropic::StreamEvent,
        responses::ResponseEvent,
    )),
)]
pub struct ApiDoc;

/// The three ways a caller authenticates.
struct Security;

impl Modify for Security {
    fn modify(&self, api: &mut utoipa::openapi::OpenApi) {
        let components = api.components.get_or_insert_with(Default::default);
        let bearer = |description: &str| {
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(description))
                    .build(),
            )
        };
        components.add_security_scheme(
            ADMIN,
            bearer(
                "The gateway's admin key (`gateway.admin_key`, `AGL_ADMIN_KEY`): every route. \
                 `x-api-key: KEY` is read as well when there is no Authorization header.",
            ),
        );
        components.add_security_scheme(
            ROLLOUT,
            bearer(
                "A rollout attempt's token (`RolloutView.token`, `agl-rt-...`): that \
                 attempt's proxy routes and its rollout's events, while it is the current one.",
            ),
        );
        components.add_security_scheme(
            ROLLOUT_X_API_KEY,
            SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::with_description(
                "x-api-key",
                "The rollout token as Anthropic clients send it.",
            ))),
        );
    }
}

/// The finished document as served, JSON text made once.
#[derive(Clone)]
pub struct Document(Arc<str>);

impl Document {
    pub fn new(api: &utoipa::openapi::OpenApi) -> Document {
        // A tree of plain data with string keys always serialises.
        Document(serde_json::to_string(api).unwrap_or_default().into())
    }
}

/// `GET /openapi.json`.
#[utoipa::path(
    get,
    path = "/openapi.json",
    operation_id = "openapi_document",
    tag = "service",
    responses((status = 200, description = "This document (OpenAPI 3.1).",
               content_type = "application/json", body = Object)),
)]
pub async fn document(State(state): State<AppState>) -> Response {
    let text = state.openapi.get().map_or("{}", |doc| &doc.0);
    ([(CONTENT_TYPE, "application/json")], text.to_owned()).into_response()
}
