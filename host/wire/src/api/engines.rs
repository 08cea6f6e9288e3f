//! Engines (`/v1/engines`): the OpenAI-compatible servers the proxy sends
//! calls to.

use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

/// `POST /v1/engines`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RegisterEngine {
    /// Non-empty, without `/`; registering a name again replaces it.
    #[schema(min_length = 1, pattern = "^[^/]+$")]
    pub name: String,
    /// The server root or its `/v1` URL (`http://` or `https://`); stored
    /// in the `/v1` form (see [`crate::urls::engine_base_url`]).
    #[schema(pattern = "^https?://")]
    pub base_url: String,
    pub model: String,
    #[serde(default)]
    pub render: Render,
    #[serde(default)]
    pub api: EngineApi,
    /// `render = "gateway"`: the policy folder (tokenizer.json and its chat
    /// template, on the gateway's machine) the gateway renders with; none =
    /// the gateway's own policy (`[model]` of its config).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
    /// The engine's context (prompt + answer) in tokens; none = what the
    /// engine's `/v1/models` reports as `max_model_len`, when it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1)]
    pub context_len: Option<u64>,
}

impl RegisterEngine {
    /// A registration with the defaults: the engine renders, no policy.
    pub fn new(name: &str, base_url: &str, model: &str) -> RegisterEngine {
        RegisterEngine {
            name: name.into(),
            base_url: base_url.into(),
            model: model.into(),
            render: Render::default(),
            api: EngineApi::default(),
            policy: None,
            context_len: None,
        }
    }

    pub fn with_render(mut self, render: Render) -> RegisterEngine {
        self.render = render;
        self
    }

    pub fn with_api(mut self, api: EngineApi) -> RegisterEngine {
        self.api = api;
        self
    }

    pub fn with_policy(mut self, folder: impl Into<String>) -> RegisterEngine {
        self.policy = Some(folder.into());
        self
    }

    pub fn with_context_len(mut self, tokens: u64) -> RegisterEngine {
        self.context_len = Some(tokens);
        self
    }
}

/// Who renders a chat call's prompt for an engine.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Render {
    /// The engine's own chat template and tool parser: Chat Completions
    /// passed through.
    #[default]
    Engine,
    /// The gateway renders with the policy's template and tokenizer, sends
    /// token ids to the engine's `/v1/completions` and continues a
    /// conversation token-exactly (`agl-conversation`).
    Gateway,
}

impl Render {
    pub fn as_str(self) -> &'static str {
        match self {
            Render::Engine => "engine",
            Render::Gateway => "gateway",
        }
    }

    pub fn parse(s: &str) -> Option<Render> {
        match s {
            "engine" => Some(Render::Engine),
            "gateway" => Some(Render::Gateway),
            _ => None,
        }
    }
}

/// The token-in API the gateway speaks to an engine when it renders
/// (`render = "gateway"`); passthrough calls always use the engine's
/// OpenAI routes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum EngineApi {
    /// `/v1/completions` with a token-id `prompt`, `return_token_ids`
    /// (vLLM >= 0.10.2, agl's embedded engine).
    #[default]
    Openai,
    /// SGLang's native `/generate` with `input_ids`, `return_logprob`.
    Sglang,
}

impl EngineApi {
    pub fn as_str(self) -> &'static str {
        match self {
            EngineApi::Openai => "openai",
            EngineApi::Sglang => "sglang",
        }
    }

    pub fn parse(s: &str) -> Option<EngineApi> {
        match s {
            "openai" => Some(EngineApi::Openai),
            "sglang" => Some(EngineApi::Sglang),
            _ => None,
        }
    }
}

/// An OpenAI-compatible engine the proxy sends calls to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Engine {
    pub name: String,
    /// The base URL calls are made under, ending in `/v1`
    /// (`embedded://NAME` for an in-process engine).
    pub base_url: String,
    pub model: String,
    pub created_ms: u64,
    #[serde(default)]
    pub render: Render,
    #[serde(default)]
    pub api: EngineApi,
    /// See [`RegisterEngine::policy`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
    /// The context in tokens, when known (registered or reported).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_len: Option<u64>,
}

impl Engine {
    /// The registration that gives this engine again (with `model` moved,
    /// e.g. to a new LoRA adapter).
    pub fn registration(&self, model: &str) -> RegisterEngine {
        RegisterEngine {
            name: self.name.clone(),
            base_url: self.base_url.clone(),
            model: model.into(),
            render: self.render,
            api: self.api,
            policy: self.policy.clone(),
            context_len: self.context_len,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct EngineList {
    pub engines: Vec<Engine>,
}

/// `DELETE /v1/engines/{name}`: the engine is gone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct EngineRemoved {
    /// Its name.
    pub deleted: String,
}

/// The `{name}` of `/v1/engines/{name}`.
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct EnginePath {
    /// The engine's registered name.
    pub name: String,
}
