//! Records the store takes and returns.

use serde::{Deserialize, Serialize};

use crate::rollout::{JsonText, RolloutStatus};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
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

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NewRollout {
    /// Caller-supplied id; creating the same id again returns the existing
    /// rollout. `None` = the store makes one up.
    #[serde(default)]
    pub id: Option<String>,
    #[serde(default)]
    pub group_id: String,
    pub mode: Mode,
    #[serde(default)]
    pub input: JsonText,
    /// Opaque to the store; read by the controller.
    #[serde(default)]
    pub config: JsonText,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RolloutRecord {
    pub id: String,
    pub group_id: String,
    pub mode: Mode,
    pub input: JsonText,
    pub config: JsonText,
    pub status: RolloutStatus,
    /// The current attempt, from 1.
    pub attempt: u32,
    pub reason: Option<String>,
    pub created_ms: u64,
    pub updated_ms: u64,
}

/// What the proxy needs to admit a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RolloutGate {
    pub status: RolloutStatus,
    pub attempt: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RolloutPage {
    pub rollouts: Vec<RolloutRecord>,
    /// Pass back to get the next page; `None` = this was the last.
    pub next_cursor: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventRecord {
    /// Global, strictly increasing across the whole store.
    pub seq: u64,
    pub rollout_id: String,
    pub attempt: u32,
    pub kind: String,
    pub payload: JsonText,
    pub created_ms: u64,
    pub superseded_by: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Engine {
    pub name: String,
    /// An OpenAI-compatible server's base URL.
    pub base_url: String,
    pub model: String,
    pub created_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WeightVersion {
    pub version: u64,
    pub created_ms: u64,
    pub meta: JsonText,
}
