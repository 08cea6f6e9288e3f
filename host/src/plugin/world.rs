//! Which of the two worlds a component implements, and its typed bindings.

use std::fmt;

use serde::Serialize;
use wasmtime::component::types::ComponentItem;
use wasmtime::component::{Component, Instance, Linker};
use wasmtime::{Engine, Store};

use super::bindings::reward::{Reward, RewardPre};
use super::bindings::sample::{SampleAdapter, SampleAdapterPre};
use super::state::PluginState;

/// The two kinds of plugin, named as in `wit/agl.wit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum World {
    SampleAdapter,
    Reward,
}

impl World {
    pub fn as_str(self) -> &'static str {
        match self {
            World::SampleAdapter => "sample-adapter",
            World::Reward => "reward",
        }
    }

    /// The export that tells this world apart from the other.
    fn entry_point(self) -> &'static str {
        match self {
            World::SampleAdapter => "build-samples",
            World::Reward => "reward",
        }
    }
}

impl fmt::Display for World {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The world whose entry point `component` exports (types unchecked).
pub(crate) fn detect(engine: &Engine, component: &Component) -> Result<World, String> {
    let ty = component.component_type();
    let funcs: Vec<String> = ty
        .exports(engine)
        .filter(|(_, item)| matches!(item.ty, ComponentItem::ComponentFunc(_)))
        .map(|(name, _)| name.to_string())
        .collect();
    let has = |world: World| funcs.iter().any(|f| f == world.entry_point());
    match (has(World::SampleAdapter), has(World::Reward)) {
        (true, false) => Ok(World::SampleAdapter),
        (false, true) => Ok(World::Reward),
        (true, true) => {
            Err("exports both `build-samples` and `reward`; a plugin implements one world".into())
        }
        (false, false) => Err(format!(
            "exports neither `build-samples` (world sample-adapter) nor `reward` (world reward); \
             its exported functions: [{}]",
            funcs.join(", ")
        )),
    }
}

/// A component linked and type-checked against its world, ready to instantiate.
#[derive(Clone)]
pub(crate) enum WorldPre {
    SampleAdapter(SampleAdapterPre<PluginState>),
    Reward(RewardPre<PluginState>),
}

/// A live instance's typed exports. The raw instance is kept too: the
/// entry points are called with a borrowed [`RolloutView`] argument, which
/// the generated bindings (taking owned WIT values) cannot do.
///
/// [`RolloutView`]: super::bindings::RolloutView
pub(crate) enum WorldExports {
    SampleAdapter(SampleAdapter, Instance),
    Reward(Reward, Instance),
}

impl WorldPre {
    /// Fails if an import cannot be satisfied or an export is missing or
    /// has the wrong type.
    pub(crate) fn new(
        linker: &Linker<PluginState>,
        component: &Component,
        world: World,
    ) -> wasmtime::Result<Self> {
        let pre = linker.instantiate_pre(component)?;
        Ok(match world {
            World::SampleAdapter => Self::SampleAdapter(SampleAdapterPre::new(pre)?),
            World::Reward => Self::Reward(RewardPre::new(pre)?),
        })
    }

    pub(crate) fn world(&self) -> World {
        match self {
            Self::SampleAdapter(_) => World::SampleAdapter,
            Self::Reward(_) => World::Reward,
        }
    }

    pub(crate) fn engine(&self) -> &Engine {
        match self {
            Self::SampleAdapter(pre) => pre.engine(),
            Self::Reward(pre) => pre.engine(),
        }
    }

    pub(crate) async fn instantiate(
        &self,
        store: &mut Store<PluginState>,
    ) -> wasmtime::Result<WorldExports> {
        Ok(match self {
            Self::SampleAdapter(pre) => {
                let instance = pre.instance_pre().instantiate_async(&mut *store).await?;
                WorldExports::SampleAdapter(SampleAdapter::new(&mut *store, &instance)?, instance)
            }
            Self::Reward(pre) => {
                let instance = pre.instance_pre().instantiate_async(&mut *store).await?;
                WorldExports::Reward(Reward::new(&mut *store, &instance)?, instance)
            }
        })
    }
}
