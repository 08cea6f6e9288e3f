//! The management API's request and response bodies (`/v1/...`), used by
//! the gateway that serves them and by every client (the controller,
//! `agl run`, tests).

use serde::{Deserialize, Serialize};

use crate::rollout::{FailureKind, JsonText, Mode, ModelCall, RolloutStatus};

/// `POST /v1/rollouts`: create a batch.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateRollouts {
    pub rollouts: Vec<NewRollout>,
}

/// One rollout to create. Creating an id that exists returns the existing
/// rollout.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewRollout {
    /// Caller-supplied id; `None` = the store makes one up.
    #[serde(default, alias = "rollout_id")]
    pub id: Option<String>,
    #[serde(default)]
    pub group_id: String,
    #[serde(default = "train")]
    pub mode: Mode,
    #[serde(default)]
    pub input: JsonText,
    /// Opaque to the store; read by the controller.
    #[serde(default)]
    pub config: JsonText,
}

fn train() -> Mode {
    Mode::Train
}

/// A rollout as the API shows it: the stored record plus what an agent of it
/// needs (its proxy base URL, events URL and token).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RolloutView {
    pub id: String,
    pub group_id: String,
    pub mode: Mode,
    pub status: RolloutStatus,
    pub attempt: u32,
    /// Why it failed (or was cancelled), in words.
    #[serde(default)]
    pub reason: Option<String>,
    /// Who is to blame for a failure; set exactly when `status` is `failed`.
    #[serde(default)]
    pub failure: Option<FailureKind>,
    #[serde(default)]
    pub input: JsonText,
    #[serde(default)]
    pub config: JsonText,
    pub created_ms: u64,
    pub updated_ms: u64,
    /// The OpenAI-style base URL the agent calls the model at.
    pub proxy_base_url: String,
    /// The same for Anthropic clients (`ANTHROPIC_BASE_URL`: they append
    /// `/v1/messages`).
    #[serde(default)]
    pub anthropic_base_url: String,
    /// Where the agent posts its events (e.g. its reward).
    pub events_url: String,
    /// The agent's bearer token for both URLs.
    pub token: String,
    /// The current attempt's calls, with `GET /v1/rollouts/{id}?calls=true`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calls: Option<Vec<ModelCall>>,
}

/// `GET /v1/rollouts?status=&cursor=&limit=`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListRollouts {
    #[serde(default)]
    pub status: Option<String>,
    /// Only this group's rollouts.
    #[serde(default)]
    pub group_id: Option<String>,
    /// `train` | `val`.
    #[serde(default)]
    pub mode: Option<String>,
    #[serde(default)]
    pub cursor: Option<String>,
    #[serde(default)]
    pub limit: Option<u32>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RolloutList {
    pub rollouts: Vec<RolloutView>,
    /// Pass back as `cursor` for the next page; `None` = this was the last.
    pub next_cursor: Option<String>,
}

/// `PATCH /v1/rollouts/{id}`: move the current attempt to `status`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StatusPatch {
    pub attempt: u32,
    pub status: RolloutStatus,
    #[serde(default)]
    pub reason: Option<String>,
    /// Required with `failed` (`system` | `agent`), refused otherwise.
    #[serde(default)]
    pub failure: Option<FailureKind>,
}

impl StatusPatch {
    /// Attempt `attempt` moves to `status` (not `failed`: see [`Self::failed`]).
    pub fn to(attempt: u32, status: RolloutStatus) -> Self {
        StatusPatch {
            attempt,
            status,
            reason: None,
            failure: None,
        }
    }

    /// Attempt `attempt` failed, blamed on `failure`, because `reason`.
    pub fn failed(attempt: u32, failure: FailureKind, reason: impl Into<String>) -> Self {
        StatusPatch {
            attempt,
            status: RolloutStatus::Failed,
            reason: Some(reason.into()),
            failure: Some(failure),
        }
    }

    pub fn with_reason(mut self, reason: impl Into<String>) -> Self {
        self.reason = Some(reason.into());
        self
    }

    /// The patch's own consistency: `failure` is given exactly with `failed`.
    pub fn check(&self) -> Result<(), String> {
        match (self.status, self.failure) {
            (RolloutStatus::Failed, None) => {
                Err("`failure` (`system` | `agent`) is required with status `failed`".into())
            }
            (RolloutStatus::Failed, Some(_)) | (_, None) => Ok(()),
            (other, Some(_)) => Err(format!(
                "`failure` is only for status `failed`, not `{}`",
                other.as_str()
            )),
        }
    }
}

/// `POST /v1/rollouts/{id}/events`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AppendEvent {
    /// Default: the rollout's current attempt.
    #[serde(default)]
    pub attempt: Option<u32>,
    pub kind: String,
    #[serde(default)]
    pub payload: JsonText,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventAppended {
    pub seq: u64,
    pub rollout_id: String,
    pub attempt: u32,
}

/// `GET /v1/rollouts/{id}/events?after=&limit=`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListEvents {
    #[serde(default)]
    pub after: u64,
    #[serde(default)]
    pub limit: Option<u32>,
}

/// One stored event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventRecord {
    /// Global, strictly increasing across the whole store.
    pub seq: u64,
    pub rollout_id: String,
    pub attempt: u32,
    pub kind: String,
    pub payload: JsonText,
    pub created_ms: u64,
    /// A `model_request` the client retried names the call that replaced it.
    pub superseded_by: Option<u64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EventList {
    pub events: Vec<EventRecord>,
    /// Pass back as `after` for the next page.
    pub last_seq: Option<u64>,
}

/// `POST /v1/engines`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegisterEngine {
    pub name: String,
    /// The server root or its `/v1` URL; stored in the `/v1` form (see
    /// [`crate::urls::engine_base_url`]).
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
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
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
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EngineList {
    pub engines: Vec<Engine>,
}

/// A plugin's role in a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PluginRole {
    /// The sample adapter (world `sample-adapter`).
    Adapter,
    /// The reward (world `reward`).
    Reward,
}

impl PluginRole {
    pub fn as_str(self) -> &'static str {
        match self {
            PluginRole::Adapter => "adapter",
            PluginRole::Reward => "reward",
        }
    }

    pub fn parse(s: &str) -> Option<PluginRole> {
        match s {
            "adapter" => Some(PluginRole::Adapter),
            "reward" => Some(PluginRole::Reward),
            _ => None,
        }
    }
}

/// `POST /v1/plugins/{adapter|reward}` with a JSON body: load the plugin at
/// `path` (a path on the machine running `agl run`). The `.wasm` bytes can
/// be posted instead, as `application/wasm`, with `?name=`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SwapPlugin {
    #[serde(default)]
    pub path: Option<String>,
    /// Which `[plugin.NAME]` table configures it; default: the file stem
    /// (for posted bytes: the name of the plugin it replaces).
    #[serde(default)]
    pub name: Option<String>,
}

/// A plugin serving a role, as `GET /v1/plugins` and a swap report it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoadedPlugin {
    pub role: PluginRole,
    /// Its config name (`[plugin.NAME]`).
    pub name: String,
    /// What its `describe()` says.
    pub version: String,
    /// blake3 of its `.wasm` bytes (hex).
    pub wasm_hash: String,
    pub path: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PluginList {
    pub plugins: Vec<LoadedPlugin>,
}

/// `GET /v1/steps`: the run's step records (its `metrics.jsonl`), oldest
/// first; empty when the gateway knows of no run or it has none yet.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StepList {
    pub steps: Vec<crate::metrics::StepRecord>,
}

/// `GET /v1/rollouts/{id}/samples`: the rollout's current attempt as the
/// hosting process's adapter turns it into training samples, decoded with
/// the policy's tokenizer, and its reward.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SampleList {
    pub rollout_id: String,
    /// The adapter plugin that built the samples (`name version`).
    pub adapter: String,
    /// `None`: unscored (no reward plugin answer, no `reward` event).
    pub reward: Option<f64>,
    /// Where the reward comes from: the reward plugin (`name version`),
    /// or `harness` (the rollout's own last `reward` event).
    pub reward_source: String,
    /// Why the reward plugin gave none, when it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reward_error: Option<String>,
    /// Trainable tokens over all samples (what the trainer learns from).
    pub trained_tokens: usize,
    pub samples: Vec<SampleView>,
}

/// One sample of a [`SampleList`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SampleView {
    pub index: usize,
    /// Indices of the calls merged into it.
    pub source_calls: Vec<u32>,
    pub weight_version: u64,
    pub agent: Option<String>,
    /// Why the chain before it ended (kind, call, where the ids differ).
    pub break_before: Option<crate::rollout::ChainBreak>,
    pub prompt_tokens: usize,
    /// Response tokens the model sampled (trained).
    pub trained_tokens: usize,
    /// Response tokens it did not (observations, template glue: masked).
    pub masked_tokens: usize,
    /// The prompt as the policy's tokenizer decodes it (empty without one).
    pub prompt_text: String,
    /// The response in runs of trained and masked tokens, in order.
    pub segments: Vec<Segment>,
}

/// A run of response tokens that are all trained or all masked.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Segment {
    pub trained: bool,
    pub tokens: usize,
    /// Decoded (empty without a tokenizer).
    pub text: String,
}

impl SampleView {
    /// Sample `index` of a rollout, its text decoded by `decode`.
    pub fn of(
        index: usize,
        sample: &crate::rollout::Sample,
        decode: &dyn Fn(&[u32]) -> String,
    ) -> SampleView {
        let segments: Vec<Segment> = sample
            .runs()
            .into_iter()
            .map(|(trained, range)| Segment {
                trained,
                tokens: range.len(),
                text: decode(&sample.response_ids[range]),
            })
            .collect();
        let trained_tokens = sample.trainable_tokens();
        SampleView {
            index,
            source_calls: sample.source_calls.clone(),
            weight_version: sample.weight_version,
            agent: sample.agent.clone(),
            break_before: sample.break_before.clone(),
            prompt_tokens: sample.prompt_ids.len(),
            trained_tokens,
            masked_tokens: sample.response_ids.len() - trained_tokens,
            prompt_text: decode(&sample.prompt_ids),
            segments,
        }
    }
}

#[cfg(test)]
mod sample_view_tests {
    use super::*;
    use crate::rollout::{Sample, Span};

    #[test]
    fn a_sample_splits_into_trained_and_masked_runs() {
        let sample = Sample {
            prompt_ids: vec![1, 2],
            response_ids: vec![10, 11, 20, 21, 22, 12],
            trainable: vec![Span { start: 0, end: 2 }, Span { start: 5, end: 6 }],
            logprobs: vec![0.0; 6],
            source_calls: vec![0, 1],
            weight_version: 3,
            agent: None,
            break_before: None,
        };
        let decode = |ids: &[u32]| ids.iter().map(|i| format!("<{i}>")).collect::<String>();
        let view = SampleView::of(4, &sample, &decode);
        assert_eq!(
            (
                view.index,
                view.prompt_tokens,
                view.trained_tokens,
                view.masked_tokens
            ),
            (4, 2, 3, 3)
        );
        assert_eq!(view.trained_tokens, sample.trainable_tokens());
        assert_eq!(view.prompt_text, "<1><2>");
        let runs: Vec<(bool, usize, &str)> = view
            .segments
            .iter()
            .map(|s| (s.trained, s.tokens, s.text.as_str()))
            .collect();
        assert_eq!(
            runs,
            [
                (true, 2, "<10><11>"),
                (false, 3, "<20><21><22>"),
                (true, 1, "<12>")
            ]
        );
    }
}

/// A published weight version: calls recorded from its creation on carry it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WeightVersion {
    pub version: u64,
    pub created_ms: u64,
    pub meta: JsonText,
}

/// `POST /v1/weights`: record that the engine now serves `version` (the
/// store refuses a version twice: 409).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecordWeightVersion {
    pub version: u64,
    #[serde(default)]
    pub meta: JsonText,
}

/// `GET /v1/weights`: the newest published version, if any.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LatestWeights {
    pub latest: Option<WeightVersion>,
}

/// `POST /v1/proxy/drain`: wait up to `timeout_ms` for in-flight calls.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DrainRequest {
    pub timeout_ms: u64,
}

/// `GET /v1/changes?after=&wait_ms=`: waits up to `wait_ms` (at most a
/// minute) for the store's change counter to move from `after`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WaitChanges {
    #[serde(default)]
    pub after: u64,
    #[serde(default)]
    pub wait_ms: u64,
}

/// The store's change counter: bumped after every committed change of a
/// rollout's state (created, patched, retried, cancelled).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Changes {
    pub generation: u64,
}
