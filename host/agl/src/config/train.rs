//! `[run]` and `[engine]` in `agl.toml` (and `[train]`, which agl-rl owns):
//! what `agl run` trains on, how, and which engine serves the policy.

use agl_conversation::ToolFormat;
use agl_wire::api::{EngineApi, Render};
use std::path::PathBuf;

use agl_engine::EngineConfig as TchEngineConfig;
use serde::{Deserialize, Serialize};

use agl_rl::ScheduleConfig;
/// `[train]` is the RL update's own section.
pub use agl_rl::config::TrainConfig;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LoopMode {
    /// Launch B groups, wait for all of them, train, repeat.
    Sync,
    /// Keep `groups_in_flight` groups running; train on the first
    /// `groups_per_step` complete ones and carry the rest.
    Async,
}

/// `[run] in_flight`: the model calls running when new weights are
/// published.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InFlightMode {
    /// Wait for them (up to `drain_timeout_secs`): every call is sampled by
    /// one version.
    #[default]
    Drain,
    /// Partial rollouts: the engine pauses them at a token boundary and
    /// they go on under the new weights, each token recorded with the
    /// version that sampled it; the update waits for no call.
    Continue,
}

impl InFlightMode {
    /// What the engine does with its running sequences.
    pub fn engine(self) -> agl_engine::InFlight {
        match self {
            InFlightMode::Drain => agl_engine::InFlight::Abort,
            InFlightMode::Continue => agl_engine::InFlight::Continue,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            InFlightMode::Drain => "drain",
            InFlightMode::Continue => "continue",
        }
    }
}

/// `[run]`: the data and the shape of the loop.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RunConfig {
    /// JSONL, one input per line; a row's `"split"` (`"train"` | `"val"`,
    /// default train) decides where it goes. The whole row is the rollout input.
    pub data: Option<PathBuf>,
    /// Run folder: store, checkpoints, metrics, plot (default `agl-runs/run`).
    pub out_dir: Option<PathBuf>,
    /// Optimizer updates to run.
    pub steps: u64,
    pub mode: LoopMode,
    /// Rollouts per input (n).
    pub group_size: usize,
    /// Groups trained per update (B_train).
    pub groups_per_step: usize,
    /// Groups kept in flight in async mode (B_async >= B_train).
    pub groups_in_flight: usize,
    /// Async: a complete group launched more than this many weight versions
    /// ago is dropped, not trained; under `in_flight = "continue"`, tokens
    /// sampled more than this many versions ago are masked instead.
    pub max_staleness: Option<u64>,
    /// Validate before training and every this many steps (0 = never).
    pub val_every: u64,
    /// Validate on at most this many val rows.
    pub val_size: usize,
    /// Checkpoint every this many steps (0 = only at the end).
    pub checkpoint_every: u64,
    pub keep_checkpoints: usize,
    /// What a weight update does with the model calls in flight: wait for
    /// them (`drain`) or let them go on under the new weights (`continue`).
    pub in_flight: InFlightMode,
    /// How long the gateway waits for in-flight calls before a weight update
    /// (`in_flight = "drain"`).
    pub drain_timeout_secs: u64,
    /// Seeds the data order.
    pub seed: u64,
    /// Progress bars on stderr (off when it is not a terminal anyway).
    pub progress: bool,
}

impl Default for RunConfig {
    fn default() -> Self {
        RunConfig {
            data: None,
            out_dir: None,
            steps: 10,
            mode: LoopMode::Sync,
            group_size: 4,
            groups_per_step: 4,
            groups_in_flight: 8,
            max_staleness: Some(2),
            val_every: 5,
            val_size: 32,
            checkpoint_every: 5,
            keep_checkpoints: 2,
            in_flight: InFlightMode::Drain,
            drain_timeout_secs: 60,
            seed: 0,
            progress: true,
        }
    }
}

impl RunConfig {
    pub fn schedule(&self) -> ScheduleConfig {
        match self.mode {
            LoopMode::Sync => ScheduleConfig::sync(self.groups_per_step),
            LoopMode::Async => ScheduleConfig {
                groups_in_flight: self.groups_in_flight.max(self.groups_per_step),
                groups_per_update: self.groups_per_step,
                // Partial rollouts: staleness is per token (the batch masks
                // tokens sampled too long ago), not per launch.
                max_staleness: match self.in_flight {
                    InFlightMode::Drain => self.max_staleness,
                    InFlightMode::Continue => None,
                },
            },
        }
    }

    pub fn out_dir(&self) -> PathBuf {
        self.out_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from("agl-runs/run"))
    }

    pub fn validate(&self) -> Result<(), String> {
        if self.group_size == 0 || self.groups_per_step == 0 {
            return Err("run.group_size and run.groups_per_step must be >= 1".into());
        }
        if self.data.is_none() {
            return Err("run.data (a JSONL file of inputs) is required".into());
        }
        self.schedule().validate()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EngineKind {
    /// agl's own tch engine on the policy weights, in this process.
    Embedded,
    /// A vLLM server (0.33, dev mode: `VLLM_SERVER_DEV_MODE=1`, and
    /// `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True` for LoRA) at `base_url`; new
    /// weights through its RL routes (`policy/reload.rs`).
    Vllm,
    /// An SGLang server (0.5.23) at `base_url`; new weights through
    /// `update_weights_from_disk` / `load_lora_adapter`.
    Sglang,
    /// agl's own engine served apart (`agl engine serve`) at `base_url`;
    /// new weights (LoRA merged) through its `/load_weights` route. What
    /// `agl train` publishes to when the policy runs on agl's engine.
    Agl,
    /// Any OpenAI-compatible server at `base_url` that keeps its weights
    /// (evaluation-only runs: nothing is reloaded).
    External,
}

/// How a remote engine treats requests still in flight when it pauses
/// for new weights (the gateway has drained its own calls by then).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PauseMode {
    /// Frozen in place and continued on the new weights (vLLM `keep`,
    /// SGLang `in_place`).
    Keep,
    /// Aborted (vLLM and SGLang `abort`): the harness retries them.
    Abort,
}

/// `[engine]`: which engine serves the policy during `agl run`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PolicyEngineConfig {
    pub kind: EngineKind,
    /// External: the server's URL, its root or its `/v1` URL (either is
    /// accepted: calls go under `/v1`, reloads to the root).
    pub base_url: Option<String>,
    /// External: the model name it serves (default: the model folder's name).
    pub model_name: Option<String>,
    /// vLLM / SGLang: what the engine does with requests in flight while
    /// it loads new weights.
    pub pause_mode: PauseMode,
    /// Embedded: concurrent sequences and the longest prompt + response;
    /// defaults are the engine's own (`agl engine serve` uses the same).
    pub max_seqs: usize,
    pub max_len: usize,
    /// Who renders chat prompts: `"gateway"` (the policy's template,
    /// token ids to `/v1/completions`, token-exact continuation) or
    /// `"engine"` (its own template, Chat Completions passed through).
    /// Unset: `"gateway"` for agl's engine (`embedded`, `agl`: it takes
    /// token ids only), `"engine"` for the others ([`Self::render`]).
    pub render: Option<Render>,
    /// The token-in API of an external engine the gateway renders for:
    /// `"openai"` (vLLM's `/v1/completions` with token ids) or `"sglang"`
    /// (`/generate` with `input_ids`).
    pub api: EngineApi,
    /// Gateway rendering: how the model writes tool calls (`"hermes"`,
    /// `"qwen3_coder"`, `"llama3_json"`, `"none"`); unset: read from the
    /// chat template. (Not serialized: the exports record it as given.)
    #[serde(skip_serializing)]
    pub tool_parser: Option<ToolFormat>,
    /// Gateway rendering: whether outputs open with `<think>...</think>`;
    /// unset: read from the chat template.
    pub reasoning: Option<bool>,
}

impl PolicyEngineConfig {
    /// Who renders chat prompts, as set or as the engine's kind implies.
    pub fn render(&self) -> Render {
        self.render.unwrap_or(match self.kind {
            EngineKind::Embedded | EngineKind::Agl => Render::Gateway,
            _ => Render::Engine,
        })
    }

    /// Refuses what no engine of this kind serves: agl's engine renders no
    /// chat of its own, so the gateway renders for it.
    pub fn check(&self) -> Result<(), String> {
        match (self.kind, self.render) {
            (EngineKind::Embedded | EngineKind::Agl, Some(Render::Engine)) => Err(format!(
                "engine.render = \"engine\": agl's engine (engine.kind = \"{}\") takes token \
                 ids and renders no chat; the gateway renders for it (leave engine.render unset \
                 or set \"gateway\")",
                format!("{:?}", self.kind).to_lowercase()
            )),
            _ => Ok(()),
        }
    }
}

impl Default for PolicyEngineConfig {
    fn default() -> Self {
        PolicyEngineConfig {
            kind: EngineKind::Embedded,
            base_url: None,
            model_name: None,
            pause_mode: PauseMode::Keep,
            max_seqs: TchEngineConfig::default().max_seqs,
            max_len: TchEngineConfig::default().max_len,
            render: None,
            api: EngineApi::Openai,
            tool_parser: None,
            reasoning: None,
        }
    }
}
