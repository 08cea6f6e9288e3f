//! The rollout record as agl stores and exports it, and the samples plugins
//! return. One rollout per line in the rollout JSONL format (see
//! `plugins/README.md`); `agl plugin test` reads it.

use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::Path;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

pub use crate::json::JsonText;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ApiKind {
    ChatCompletions,
    Completions,
    Responses,
    AnthropicMessages,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RolloutStatus {
    Queued,
    Running,
    Succeeded,
    Failed,
    Cancelled,
}

impl RolloutStatus {
    pub const ALL: [RolloutStatus; 5] = [
        RolloutStatus::Queued,
        RolloutStatus::Running,
        RolloutStatus::Succeeded,
        RolloutStatus::Failed,
        RolloutStatus::Cancelled,
    ];

    /// The name the API and the store use (`queued`, `running`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            RolloutStatus::Queued => "queued",
            RolloutStatus::Running => "running",
            RolloutStatus::Succeeded => "succeeded",
            RolloutStatus::Failed => "failed",
            RolloutStatus::Cancelled => "cancelled",
        }
    }

    pub fn parse(s: &str) -> Option<RolloutStatus> {
        Self::ALL.into_iter().find(|v| v.as_str() == s)
    }

    /// No further change happens to this attempt.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            RolloutStatus::Succeeded | RolloutStatus::Failed | RolloutStatus::Cancelled
        )
    }
}

/// Who a failed attempt's failure is blamed on. A `system` failure (the
/// harness crashed, timed out, lost its pod) is retried and never scored; an
/// `agent` failure is the policy's doing and is scored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum FailureKind {
    System,
    Agent,
}

impl FailureKind {
    pub fn as_str(self) -> &'static str {
        match self {
            FailureKind::System => "system",
            FailureKind::Agent => "agent",
        }
    }

    pub fn parse(s: &str) -> Option<FailureKind> {
        match s {
            "system" => Some(FailureKind::System),
            "agent" => Some(FailureKind::Agent),
            _ => None,
        }
    }
}

/// Whether a rollout trains the policy or only measures it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    Train,
    Val,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Train => "train",
            Mode::Val => "val",
        }
    }

    pub fn parse(s: &str) -> Option<Mode> {
        match s {
            "train" => Some(Mode::Train),
            "val" => Some(Mode::Val),
            _ => None,
        }
    }
}

/// One proxied model call with the token ids and log-probs the engine returned.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ModelCall {
    pub index: u32,
    pub api: ApiKind,
    /// Request body as the harness sent it.
    pub request: JsonText,
    /// Response body (assembled if streamed).
    pub response: JsonText,
    pub prompt_ids: Vec<u32>,
    pub response_ids: Vec<u32>,
    pub response_logprobs: Vec<f32>,
    #[serde(default)]
    pub weight_version: u64,
    /// The temperature the gateway sampled the call at (it sets every
    /// call's, `[gateway] train_temperature` or `val_temperature`): what the
    /// trainer scores the tokens at. `None` in records from before it was
    /// recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    /// The version that sampled each response token when not all are
    /// `weight_version` (see [`ModelCall::token_versions`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_versions: Option<Vec<u64>>,
    #[serde(default)]
    pub finish_reason: Option<String>,
    #[serde(default)]
    pub started_at_ms: u64,
    #[serde(default)]
    pub finished_at_ms: u64,
    /// `x-agl-*` request headers, lower-cased.
    #[serde(default)]
    pub tags: BTreeMap<String, String>,
    /// Index of the call whose prompt and response this call's prompt
    /// extends token-exactly, as the gateway served it (gateway-rendered
    /// calls); `None` for a fresh render or a passthrough call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub continues: Option<u32>,
    /// Sampled under a constraint: the logprobs are the masked ones.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub constrained: bool,
    /// Which of the request's `n` choices this call is (`n` > 1 only):
    /// each choice is its own call, its siblings the calls next to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub choice: Option<Choice>,
}

impl ModelCall {
    /// A Chat Completions call with these bodies and tokens, at weight
    /// version 0, and nothing else set: for fixtures and benches, which
    /// set the rest with struct-update syntax.
    pub fn chat(
        index: u32,
        (request, response): (JsonText, JsonText),
        (prompt_ids, response_ids): (Vec<u32>, Vec<u32>),
        response_logprobs: Vec<f32>,
    ) -> Self {
        Self {
            index,
            api: ApiKind::ChatCompletions,
            request,
            response,
            prompt_ids,
            response_ids,
            response_logprobs,
            weight_version: 0,
            temperature: None,
            response_versions: None,
            finish_reason: None,
            started_at_ms: 0,
            finished_at_ms: 0,
            tags: BTreeMap::new(),
            continues: None,
            constrained: false,
            choice: None,
        }
    }

    /// The weight version that sampled each response token: the recorded
    /// ones, or `weight_version` for all.
    pub fn token_versions(&self) -> Vec<u64> {
        match &self.response_versions {
            Some(v) if v.len() == self.response_ids.len() => v.clone(),
            _ => vec![self.weight_version; self.response_ids.len()],
        }
    }
}

/// One choice of a request that asked for `count` > 1 (`n`): the gateway
/// records each as its own call, the siblings committed together under
/// consecutive seqs, so the export numbers them `index - choice.index ..`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Choice {
    /// The choice's `index` in the answer, `0..count`.
    pub index: u32,
    pub count: u32,
}

/// Any non-model event: a harness-reported `reward`, log tails, custom events.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Event {
    pub kind: String,
    #[serde(default)]
    pub payload: JsonText,
    #[serde(default)]
    pub timestamp_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Rollout {
    pub id: String,
    #[serde(default)]
    pub group_id: String,
    #[serde(default)]
    pub attempt: u32,
    #[serde(default)]
    pub input: JsonText,
    pub status: RolloutStatus,
    /// Who is to blame, when `status` is `failed` (`system` failures are
    /// never scored).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<FailureKind>,
    #[serde(default)]
    pub calls: Vec<ModelCall>,
    #[serde(default)]
    pub events: Vec<Event>,
}

/// The samples a sample adapter builds: agl's sample rules own the types
/// (`agl-samples`, its `wire` feature adds serde and the OpenAPI schema).
pub use agl_samples::{BreakKind, ChainBreak, Sample, Span};

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}:{line}: not a rollout: {source}")]
    Parse {
        path: String,
        line: usize,
        source: serde_json::Error,
    },
}

/// Reads rollout JSONL; blank lines are skipped, a bad line names its number.
pub fn read_jsonl(path: &Path) -> Result<Vec<Rollout>, ReadError> {
    let shown = path.display().to_string();
    let io = |source| ReadError::Io {
        path: shown.clone(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    let mut rollouts = Vec::new();
    for (n, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.map_err(io)?;
        if line.trim().is_empty() {
            continue;
        }
        let rollout = serde_json::from_str(&line).map_err(|source| ReadError::Parse {
            path: shown.clone(),
            line: n + 1,
            source,
        })?;
        rollouts.push(rollout);
    }
    Ok(rollouts)
}
