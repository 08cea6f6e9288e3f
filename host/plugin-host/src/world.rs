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

/// The WIT package the host implements (`wit/agl.wit`).
pub const WIT_PACKAGE: &str = "agl:adapter";
/// Its version. A component built against a semver-compatible version loads
/// (the same major; for 0.x, the same minor, as semver and wasmtime's linker
/// count it); any other is refused with both versions named.
pub const WIT_VERSION: &str = "0.1.0";

/// The part of a version that must match: `1.4.2` -> `1`, `0.1.3` -> `0.1`.
fn compat_track(version: &str) -> String {
    let mut parts = version.split('.');
    match (parts.next(), parts.next()) {
        (Some("0"), Some(minor)) => format!("0.{minor}"),
        (Some(major), _) => major.to_string(),
        _ => String::new(),
    }
}

/// The `agl:adapter` versions `component` imports interfaces of (its
/// imports are named `agl:adapter/IFACE@VERSION`).
pub(crate) fn wit_versions(engine: &Engine, component: &Component) -> Vec<String> {
    let prefix = format!("{WIT_PACKAGE}/");
    let mut found: Vec<String> = component
        .component_type()
        .imports(engine)
        .filter_map(|(name, _)| {
            let rest = name.strip_prefix(&prefix)?;
            Some(rest.split_once('@').map_or("", |(_, v)| v).to_string())
        })
        .collect();
    found.sort();
    found.dedup();
    found
}

/// Refuses a component built against an `agl:adapter` version this host is
/// not compatible with, naming both versions.
pub(crate) fn check_version(engine: &Engine, component: &Component) -> Result<(), String> {
    for v in wit_versions(engine, component) {
        if v.is_empty() || compat_track(&v) != compat_track(WIT_VERSION) {
            let shown = if v.is_empty() { "(no version)" } else { &v };
            return Err(format!(
                "built against {WIT_PACKAGE}@{shown}, but this agl implements \
                 {WIT_PACKAGE}@{WIT_VERSION} (compatible: {}.x); rebuild the plugin against \
                 this agl's wit/ or use an agl that speaks its version",
                compat_track(WIT_VERSION)
            ));
        }
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compatibility_follows_semver() {
        assert_eq!(compat_track("0.1.0"), "0.1");
        assert_eq!(compat_track("0.1.7"), "0.1");
        assert_eq!(compat_track("1.4.2"), "1");
        assert_ne!(compat_track("0.2.0"), compat_track("0.1.0"));
    }

    #[test]
    fn the_version_is_the_wit_files() {
        let wit = include_str!("../../../wit/agl.wit");
        assert!(
            wit.contains(&format!("package {WIT_PACKAGE}@{WIT_VERSION};")),
            "wit/agl.wit declares another package version than WIT_VERSION"
        );
    }
}
