//! The management API's request and response bodies (`/v1/...`), used by
//! the gateway that serves them and by every client (the controller,
//! `agl run`, tests). Each derives its OpenAPI schema (`utoipa::ToSchema`,
//! query strings `IntoParams`): the gateway's `/openapi.json` is generated
//! from these same types.
//!
//! - [`rollouts`]: rollouts, their events, the change counter.
//! - [`engines`]: engine registration.
//! - [`publish`]: the proxy's pause / drain / resume and weight versions.
//! - [`plugins`]: a hosting run's plugins.
//! - [`viewer`]: the viewer's step records and samples.

pub mod engines;
pub mod plugins;
pub mod publish;
pub mod rollouts;
pub mod viewer;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

pub use engines::{
    Engine, EngineApi, EngineList, EnginePath, EngineRemoved, RegisterEngine, Render,
};
pub use plugins::{LoadedPlugin, PluginList, PluginPath, PluginRole, SwapPlugin, SwapPluginQuery};
pub use publish::{
    DrainRequest, Drained, InFlightCall, LatestWeights, ProxyState, RecordWeightVersion,
    WeightVersion,
};
pub use rollouts::{
    AppendEvent, Changes, CreateRollouts, EventAppended, EventList, EventRecord, GetRollout,
    ListEvents, ListRollouts, NewRollout, RolloutList, RolloutPath, RolloutView, StatusPatch,
    WaitChanges,
};
pub use viewer::{SampleList, SampleView, Segment, StepList};

/// `GET /healthz`: the gateway is up.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Health {
    /// Always `ok`.
    pub status: String,
}

impl Health {
    pub fn ok() -> Health {
        Health {
            status: "ok".to_string(),
        }
    }
}
