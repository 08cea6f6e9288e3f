//! Which of the two worlds a component implements, and its typed bindings.

use std::fmt;

use serde::Serialize;
use wasmtime::component::types::ComponentItem;
use wasmtime::component::{Component, Instance, InstancePre, Linker};
use wasmtime::{Engine, Store};

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
/// Its current version. The host serves every [`WitVersion`]: a component
/// built against a semver-compatible version of one of them loads (the same
/// major; for 0.x, the same minor, as semver and wasmtime's linker count
/// it); any other is refused with the versions named.
pub const WIT_VERSION: &str = "0.6.0";

/// The `agl:adapter` versions the host serves, newest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum WitVersion {
    /// `wit/agl.wit`: the host merges and classifies breaks (`samples`).
    #[serde(rename = "0.6.0")]
    V0_6,
    /// `wit/v0.5/agl.wit`, frozen: `model-call.prompt` as what it adds to
    /// an earlier call, the JSON and whole prompts on demand
    /// (`rollout-data`).
    #[serde(rename = "0.5.0")]
    V0_5,
    /// `wit/v0.4/agl.wit`, frozen: `model-call.response-versions`.
    #[serde(rename = "0.4.0")]
    V0_4,
    /// `wit/v0.3/agl.wit`, frozen: `model-call.choice` and
    /// `model-call.constrained`.
    #[serde(rename = "0.3.0")]
    V0_3,
    /// `wit/v0.2/agl.wit`, frozen: `model-call.continues`, break kinds
    /// `summary`, `sub-agent`.
    #[serde(rename = "0.2.0")]
    V0_2,
    /// `wit/v0.1/agl.wit`, frozen.
    #[serde(rename = "0.1.0")]
    V0_1,
}

impl WitVersion {
    pub const ALL: [WitVersion; 6] = [
        WitVersion::V0_6,
        WitVersion::V0_5,
        WitVersion::V0_4,
        WitVersion::V0_3,
        WitVersion::V0_2,
        WitVersion::V0_1,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            WitVersion::V0_6 => "0.6.0",
            WitVersion::V0_5 => "0.5.0",
            WitVersion::V0_4 => "0.4.0",
            WitVersion::V0_3 => "0.3.0",
            WitVersion::V0_2 => "0.2.0",
            WitVersion::V0_1 => "0.1.0",
        }
    }

    /// The served version `version` is compatible with.
    fn matching(version: &str) -> Option<WitVersion> {
        let track = compat_track(version);
        Self::ALL
            .into_iter()
            .find(|v| compat_track(v.as_str()) == track)
    }
}

impl fmt::Display for WitVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

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

/// The served version(s) `component` may be built against, from the
/// `agl:adapter` versions it imports: exactly one when it imports any,
/// every served one (newest first) when it imports none (its exports'
/// types then decide). Refuses an unserved or mixed version, naming them.
pub(crate) fn candidate_versions(
    engine: &Engine,
    component: &Component,
) -> Result<Vec<WitVersion>, String> {
    let served: Vec<String> = WitVersion::ALL
        .iter()
        .map(|v| format!("{WIT_PACKAGE}@{v}"))
        .collect();
    let mut found = Vec::new();
    for v in wit_versions(engine, component) {
        match WitVersion::matching(&v).filter(|_| !v.is_empty()) {
            Some(version) if !found.contains(&version) => found.push(version),
            Some(_) => {}
            None => {
                let shown = if v.is_empty() { "(no version)" } else { &v };
                return Err(format!(
                    "built against {WIT_PACKAGE}@{shown}, but this agl serves {}; rebuild the \
                     plugin against this agl's wit/ or use an agl that speaks its version",
                    served_list(&served)
                ));
            }
        }
    }
    match found.len() {
        0 => Ok(WitVersion::ALL.to_vec()),
        1 => Ok(found),
        _ => Err(format!(
            "imports more than one {WIT_PACKAGE} version ({}); a plugin is built against one",
            found
                .iter()
                .map(|v| v.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

/// `a, b and c`.
fn served_list(served: &[String]) -> String {
    match served.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} and {last}", rest.join(", ")),
        _ => served.concat(),
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

/// A component linked and type-checked against its world and version,
/// ready to instantiate. The entry points are called through the raw
/// instance with a borrowed [`RolloutView`] argument, which the generated
/// bindings (taking owned WIT values) cannot do; those bindings only check
/// the export types here.
///
/// [`RolloutView`]: super::view::RolloutView
#[derive(Clone)]
pub(crate) struct WorldPre {
    pre: InstancePre<PluginState>,
    world: World,
    version: WitVersion,
}

impl WorldPre {
    /// Fails if an import cannot be satisfied or an export is missing or
    /// has the wrong type for every candidate version (the newest
    /// candidate's error is the one reported).
    pub(crate) fn new(
        linker: &Linker<PluginState>,
        component: &Component,
        world: World,
        candidates: &[WitVersion],
    ) -> wasmtime::Result<Self> {
        let pre = linker.instantiate_pre(component)?;
        let mut first_error = None;
        for &version in candidates {
            match typecheck(&pre, world, version) {
                Ok(()) => {
                    return Ok(Self {
                        pre,
                        world,
                        version,
                    });
                }
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        Err(first_error.unwrap_or_else(|| wasmtime::format_err!("no agl:adapter version to check")))
    }

    pub(crate) fn world(&self) -> World {
        self.world
    }

    pub(crate) fn version(&self) -> WitVersion {
        self.version
    }

    pub(crate) fn engine(&self) -> &Engine {
        self.pre.engine()
    }

    pub(crate) async fn instantiate(
        &self,
        store: &mut Store<PluginState>,
    ) -> wasmtime::Result<Instance> {
        self.pre.instantiate_async(store).await
    }
}

/// Checks the component's exports against `world` at `version`.
fn typecheck(
    pre: &InstancePre<PluginState>,
    world: World,
    version: WitVersion,
) -> wasmtime::Result<()> {
    use super::bindings::{v0_1, v0_2, v0_3, v0_4, v0_5, v0_6};
    let pre = pre.clone();
    match (version, world) {
        (WitVersion::V0_6, World::SampleAdapter) => {
            v0_6::sample::SampleAdapterPre::new(pre).map(drop)
        }
        (WitVersion::V0_6, World::Reward) => v0_6::reward::RewardPre::new(pre).map(drop),
        (WitVersion::V0_5, World::SampleAdapter) => {
            v0_5::sample::SampleAdapterPre::new(pre).map(drop)
        }
        (WitVersion::V0_5, World::Reward) => v0_5::reward::RewardPre::new(pre).map(drop),
        (WitVersion::V0_4, World::SampleAdapter) => {
            v0_4::sample::SampleAdapterPre::new(pre).map(drop)
        }
        (WitVersion::V0_4, World::Reward) => v0_4::reward::RewardPre::new(pre).map(drop),
        (WitVersion::V0_3, World::SampleAdapter) => {
            v0_3::sample::SampleAdapterPre::new(pre).map(drop)
        }
        (WitVersion::V0_3, World::Reward) => v0_3::reward::RewardPre::new(pre).map(drop),
        (WitVersion::V0_2, World::SampleAdapter) => {
            v0_2::sample::SampleAdapterPre::new(pre).map(drop)
        }
        (WitVersion::V0_2, World::Reward) => v0_2::reward::RewardPre::new(pre).map(drop),
        (WitVersion::V0_1, World::SampleAdapter) => {
            v0_1::sample::SampleAdapterPre::new(pre).map(drop)
        }
        (WitVersion::V0_1, World::Reward) => v0_1::reward::RewardPre::new(pre).map(drop),
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
        assert_eq!(WitVersion::matching("0.1.4"), Some(WitVersion::V0_1));
        assert_eq!(WitVersion::matching("0.2.0"), Some(WitVersion::V0_2));
        assert_eq!(WitVersion::matching("0.3.0"), Some(WitVersion::V0_3));
        assert_eq!(WitVersion::matching("0.4.0"), Some(WitVersion::V0_4));
        assert_eq!(WitVersion::matching("0.5.0"), Some(WitVersion::V0_5));
        assert_eq!(WitVersion::matching("0.6.0"), Some(WitVersion::V0_6));
        assert_eq!(WitVersion::matching("0.7.0"), None);
        assert_eq!(WitVersion::matching("1.0.0"), None);
    }

    #[test]
    fn the_version_is_the_wit_files() {
        let wit = include_str!("../../../wit/agl.wit");
        assert!(
            wit.contains(&format!("package {WIT_PACKAGE}@{WIT_VERSION};")),
            "wit/agl.wit declares another package version than WIT_VERSION"
        );
        assert_eq!(WitVersion::ALL[0].as_str(), WIT_VERSION);
        let frozen = include_str!("../../../wit/v0.1/agl.wit");
        assert!(frozen.contains("package agl:adapter@0.1.0;"));
        let frozen = include_str!("../../../wit/v0.2/agl.wit");
        assert!(frozen.contains("package agl:adapter@0.2.0;"));
        let frozen = include_str!("../../../wit/v0.3/agl.wit");
        assert!(frozen.contains("package agl:adapter@0.3.0;"));
        let frozen = include_str!("../../../wit/v0.4/agl.wit");
        assert!(frozen.contains("package agl:adapter@0.4.0;"));
        let frozen = include_str!("../../../wit/v0.5/agl.wit");
        assert!(frozen.contains("package agl:adapter@0.5.0;"));
    }
}
