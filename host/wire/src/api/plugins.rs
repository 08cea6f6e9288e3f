//! A hosting run's plugins (`/v1/plugins`).

use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

/// A plugin's role in a run.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, ToSchema,
)]
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
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SwapPlugin {
    /// Required.
    #[serde(default)]
    pub path: Option<String>,
    /// Which `[plugin.NAME]` table configures it; default: the file stem
    /// (for posted bytes: the name of the plugin it replaces).
    #[serde(default)]
    pub name: Option<String>,
}

/// A plugin serving a role, as `GET /v1/plugins` and a swap report it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
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

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct PluginList {
    pub plugins: Vec<LoadedPlugin>,
}

/// `POST /v1/plugins/{role}?name=`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct SwapPluginQuery {
    /// Which `[plugin.NAME]` table configures posted bytes (a JSON body's
    /// `name` comes first).
    #[serde(default)]
    pub name: Option<String>,
}

/// The `{role}` of `/v1/plugins/{role}`.
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct PluginPath {
    /// `adapter` | `reward` (another is a 404).
    #[param(value_type = PluginRole)]
    pub role: String,
}
