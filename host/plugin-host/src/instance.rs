//! One live plugin instance: a store, its instance and its captured stderr.
//!
//! Calls run through wasmtime's async API. The guest yields to the runtime
//! at every epoch tick, so `tokio::time::timeout` can cancel a runaway call
//! and a slow guest never holds an executor thread for more than one tick.
//! The sync API with an epoch trap would stop a spinning guest too, but not
//! one blocked in a host call (e.g. a WASI poll), and it would need
//! `spawn_blocking` to keep the caller's runtime responsive.

use std::sync::Arc;

use tokio::time::error::Elapsed;
use wasmtime::component::{ComponentNamedList, ComponentType, Instance, Lift, Lower};
use wasmtime::{Store, WasmBacktrace};

use super::PluginLimits;
use super::bindings::{v0_1, v0_2, v0_3, v0_4, v0_5, v0_6, wit};
use super::error::PluginErrorKind;
use super::sandbox::STDERR_TAIL;
use super::state::{PluginEnv, PluginState};
use super::stdio::TailPipe;
use super::view::{
    CallsView, ModelCallView, ModelCallViewV0_1, ModelCallViewV0_2, ModelCallViewV0_3,
    ModelCallViewV0_4, RolloutView,
};
use super::world::{WitVersion, World, WorldPre};
use agl_samples::links::Link;
use agl_wire::rollout::{Rollout, Sample};

/// Why a guest call produced no result. The instance is unusable afterwards.
pub(crate) struct Fault {
    pub kind: PluginErrorKind,
    pub stderr: String,
}

pub(crate) struct Live {
    store: Store<PluginState>,
    instance: Instance,
    world: World,
    version: WitVersion,
    stderr: TailPipe,
    limits: PluginLimits,
}

impl Live {
    pub(crate) async fn start(
        pre: &WorldPre,
        env: &Arc<PluginEnv>,
        limits: PluginLimits,
    ) -> Result<Self, Fault> {
        let stderr = TailPipe::new(STDERR_TAIL);
        let state = PluginState::new(env.clone(), limits.memory_bytes, &stderr);
        let mut store = Store::new(pre.engine(), state);
        store.limiter(|state| &mut state.limits);
        store.set_epoch_deadline(1);
        store.epoch_deadline_async_yield_and_update(1);
        let outcome = tokio::time::timeout(limits.deadline, pre.instantiate(&mut store)).await;
        let instance = match outcome {
            Ok(Err(e))
                if e.downcast_ref::<wasmtime::Trap>().is_none()
                    && !store.data().limits.exceeded =>
            {
                return Err(Fault {
                    kind: PluginErrorKind::Instantiate(format!("{e:#}")),
                    stderr: stderr.contents(),
                });
            }
            outcome => classify(outcome, &store, &stderr, limits)?,
        };
        Ok(Self {
            store,
            instance,
            world: pre.world(),
            version: pre.version(),
            stderr,
            limits,
        })
    }

    pub(crate) async fn describe(&mut self) -> Result<wit::PluginInfo, Fault> {
        self.stderr.clear();
        let call =
            call_entry::<(), wit::PluginInfo>(&mut self.store, &self.instance, "describe", ());
        let outcome = tokio::time::timeout(self.limits.deadline, call).await;
        classify(outcome, &self.store, &self.stderr, self.limits)
    }

    /// `None` if this instance is not a sample adapter.
    pub(crate) async fn build_samples(
        &mut self,
        rollout: &Arc<Rollout>,
    ) -> Option<Result<Result<Vec<Sample>, String>, Fault>> {
        if self.world != World::SampleAdapter {
            return None;
        }
        self.stderr.clear();
        self.store.data_mut().serve(Some(rollout.clone()));
        let (store, instance, version) = (&mut self.store, &self.instance, self.version);
        let call = async move {
            match version {
                // 0.6 adds an import; its call record is 0.5's.
                WitVersion::V0_6 => {
                    samples_as::<ModelCallView, v0_6::wit::Sample>(store, instance, rollout).await
                }
                WitVersion::V0_5 => {
                    samples_as::<ModelCallView, v0_5::wit::Sample>(store, instance, rollout).await
                }
                WitVersion::V0_4 => {
                    samples_as::<ModelCallViewV0_4, v0_4::wit::Sample>(store, instance, rollout)
                        .await
                }
                WitVersion::V0_3 => {
                    samples_as::<ModelCallViewV0_3, v0_3::wit::Sample>(store, instance, rollout)
                        .await
                }
                WitVersion::V0_2 => {
                    samples_as::<ModelCallViewV0_2, v0_2::wit::Sample>(store, instance, rollout)
                        .await
                }
                WitVersion::V0_1 => {
                    samples_as::<ModelCallViewV0_1, v0_1::wit::Sample>(store, instance, rollout)
                        .await
                }
            }
        };
        let outcome = tokio::time::timeout(self.limits.deadline, call).await;
        self.store.data_mut().serve(None);
        Some(classify(outcome, &self.store, &self.stderr, self.limits))
    }

    /// `None` if this instance is not a reward plugin.
    pub(crate) async fn reward(
        &mut self,
        rollout: &Arc<Rollout>,
    ) -> Option<Result<Result<Option<f64>, String>, Fault>> {
        if self.world != World::Reward {
            return None;
        }
        self.stderr.clear();
        self.store.data_mut().serve(Some(rollout.clone()));
        let (store, instance, version) = (&mut self.store, &self.instance, self.version);
        let call = async move {
            match version {
                WitVersion::V0_6 | WitVersion::V0_5 => {
                    reward_as::<ModelCallView>(store, instance, rollout).await
                }
                WitVersion::V0_4 => reward_as::<ModelCallViewV0_4>(store, instance, rollout).await,
                WitVersion::V0_3 => reward_as::<ModelCallViewV0_3>(store, instance, rollout).await,
                WitVersion::V0_2 => reward_as::<ModelCallViewV0_2>(store, instance, rollout).await,
                WitVersion::V0_1 => reward_as::<ModelCallViewV0_1>(store, instance, rollout).await,
            }
        };
        let outcome = tokio::time::timeout(self.limits.deadline, call).await;
        self.store.data_mut().serve(None);
        Some(classify(outcome, &self.store, &self.stderr, self.limits))
    }

    /// The guest's stderr from the last call (for guest-reported errors).
    pub(crate) fn stderr(&self) -> String {
        self.stderr.contents()
    }
}

/// `build-samples` of a guest of the version whose call record is `V`
/// and whose sample is `S`, the samples as agl's.
async fn samples_as<'a, V, S>(
    store: &mut Store<PluginState>,
    instance: &Instance,
    rollout: &'a Rollout,
) -> wasmtime::Result<Result<Vec<Sample>, String>>
where
    V: CallsView<'a> + ComponentType + Lower + Send + Sync,
    S: ComponentType + Lift + Send + Sync + 'static,
    Sample: From<S>,
{
    let links = links_for::<V>(store);
    let view = RolloutView::<V>::new(rollout, &links);
    let samples: Result<Vec<S>, String> =
        call_entry(store, instance, "build-samples", (&view,)).await?;
    Ok(samples.map(|s| s.into_iter().map(Sample::from).collect()))
}

/// `reward` of a guest of the version whose call record is `V`.
async fn reward_as<'a, V>(
    store: &mut Store<PluginState>,
    instance: &Instance,
    rollout: &'a Rollout,
) -> wasmtime::Result<Result<Option<f64>, String>>
where
    V: CallsView<'a> + ComponentType + Lower + Send + Sync,
{
    let links = links_for::<V>(store);
    let view = RolloutView::<V>::new(rollout, &links);
    call_entry(store, instance, "reward", (&view,)).await
}

/// The prompt links of the rollout under way, where `V` hands prompts over
/// as links (found once, shared with the host's merge).
fn links_for<'a, V: CallsView<'a>>(store: &mut Store<PluginState>) -> Arc<Vec<Link>> {
    if V::LINKED {
        store.data_mut().links()
    } else {
        Arc::default()
    }
}

/// Calls an export `func(params) -> R`. Its type was checked at link time
/// (`WorldPre::new`); `typed` re-checks it cheaply.
async fn call_entry<P, R>(
    store: &mut Store<PluginState>,
    instance: &Instance,
    name: &str,
    params: P,
) -> wasmtime::Result<R>
where
    P: ComponentNamedList + Lower + Send + Sync,
    R: ComponentType + Lift + Send + Sync + 'static,
{
    let func = instance.get_typed_func::<P, (R,)>(&mut *store, name)?;
    let (result,) = func.call_async(&mut *store, params).await?;
    Ok(result)
}

fn classify<T>(
    outcome: Result<wasmtime::Result<T>, Elapsed>,
    store: &Store<PluginState>,
    stderr: &TailPipe,
    limits: PluginLimits,
) -> Result<T, Fault> {
    let kind = match outcome {
        Ok(Ok(value)) => return Ok(value),
        Err(_elapsed) => PluginErrorKind::Timeout(limits.deadline),
        Ok(Err(_)) if store.data().limits.exceeded => {
            PluginErrorKind::OutOfMemory(limits.memory_bytes)
        }
        Ok(Err(e)) => PluginErrorKind::Trap(trap_message(&e)),
    };
    Err(Fault {
        kind,
        stderr: stderr.contents(),
    })
}

/// The trap's reason chain on one line, then the wasm backtrace if any.
fn trap_message(error: &wasmtime::Error) -> String {
    let Some(backtrace) = error.downcast_ref::<WasmBacktrace>() else {
        return format!("{error:#}");
    };
    // The backtrace is the outermost context; the causes follow it.
    let reason: Vec<String> = error
        .chain()
        .skip(1)
        .map(|cause| cause.to_string())
        .collect();
    let backtrace = backtrace.to_string();
    let frames = backtrace
        .strip_prefix("error while executing at ")
        .unwrap_or(&backtrace);
    format!("{}\n{}", reason.join(": "), frames.trim_end())
}
