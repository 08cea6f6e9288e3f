//! A loaded plugin: its compiled component and a small pool of live
//! instances that serve calls one at a time each.

use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::{Semaphore, SemaphorePermit};
use wasmtime::component::Component;

use super::engine::EpochTicker;
use super::error::{PluginError, PluginErrorKind};
use super::instance::{Fault, Live};
use super::state::PluginEnv;
use super::validate::{validate_reward, validate_samples};
use super::world::{WitVersion, World, WorldPre};
use super::{LoadReport, PluginInfo, PluginSpec};
use agl_wire::rollout::{Rollout, Sample};

/// A loaded plugin. Cloning is cheap and clones share the instance pool.
#[derive(Clone)]
pub struct Plugin {
    inner: Arc<Inner>,
}

struct Inner {
    spec: PluginSpec,
    info: PluginInfo,
    report: LoadReport,
    component: Component,
    pre: WorldPre,
    env: Arc<PluginEnv>,
    vocab_size: Option<u32>,
    /// Instances waiting for a call. Never locked across an await.
    idle: Mutex<Vec<Live>>,
    /// One permit per instance that may exist at once.
    permits: Semaphore,
    /// Deadlines need the epoch to advance as long as a plugin lives.
    _ticker: Arc<EpochTicker>,
}

/// What `PluginHost::load` has built, before the first instance describes it.
pub(crate) struct Parts {
    pub spec: PluginSpec,
    pub report: LoadReport,
    pub component: Component,
    pub pre: WorldPre,
    pub env: Arc<PluginEnv>,
    pub ticker: Arc<EpochTicker>,
}

impl Plugin {
    /// Starts one instance and asks it to describe itself; that instance
    /// then joins the pool.
    pub(crate) async fn start(parts: Parts) -> Result<Self, PluginError> {
        let Parts {
            spec,
            report,
            component,
            pre,
            env,
            ticker,
        } = parts;
        let fail = |fault: Fault| error(&spec, fault.kind, fault.stderr);
        let mut live = Live::start(&pre, &env, spec.limits).await.map_err(fail)?;
        let info = live.describe().await.map_err(fail)?.into();
        let vocab_size = spec.tokenizer.as_ref().map(|t| t.vocab_size());
        let permits = Semaphore::new(spec.limits.instances);
        Ok(Self {
            inner: Arc::new(Inner {
                info,
                report,
                component,
                pre,
                env,
                vocab_size,
                idle: Mutex::new(vec![live]),
                permits,
                _ticker: ticker,
                spec,
            }),
        })
    }

    /// The name it was loaded under (not necessarily `info().name`).
    pub fn name(&self) -> &str {
        &self.inner.spec.name
    }

    pub fn path(&self) -> &Path {
        &self.inner.spec.path
    }

    pub fn world(&self) -> World {
        self.inner.pre.world()
    }

    /// The `agl:adapter` version the component was built against.
    pub fn wit_version(&self) -> WitVersion {
        self.inner.pre.version()
    }

    /// What the plugin's `describe` export returned at load.
    pub fn info(&self) -> &PluginInfo {
        &self.inner.info
    }

    pub fn load_report(&self) -> &LoadReport {
        &self.inner.report
    }

    pub fn spec(&self) -> &PluginSpec {
        &self.inner.spec
    }

    pub(crate) fn component(&self) -> &Component {
        &self.inner.component
    }

    /// Runs `build-samples` and validates the result.
    pub async fn build_samples(&self, rollout: &Arc<Rollout>) -> Result<Vec<Sample>, PluginError> {
        self.require(World::SampleAdapter)?;
        let (mut live, _permit) = self.checkout().await?;
        let outcome = live.build_samples(rollout).await;
        let samples: Vec<Sample> = self.settle(live, outcome)?;
        validate_samples(&samples, rollout, self.inner.vocab_size)
            .map_err(|invalid| self.error(invalid.into(), String::new()))?;
        Ok(samples)
    }

    /// Runs `reward`; `None` means the rollout has no reward.
    pub async fn reward(&self, rollout: &Arc<Rollout>) -> Result<Option<f64>, PluginError> {
        self.require(World::Reward)?;
        let (mut live, _permit) = self.checkout().await?;
        let outcome = live.reward(rollout).await;
        let reward = self.settle(live, outcome)?;
        validate_reward(reward)
            .map_err(|value| self.error(PluginErrorKind::InvalidReward(value), String::new()))
    }

    fn require(&self, expected: World) -> Result<(), PluginError> {
        let actual = self.world();
        if actual == expected {
            return Ok(());
        }
        Err(self.error(
            PluginErrorKind::WrongWorld { expected, actual },
            String::new(),
        ))
    }

    /// Starts instances until the pool holds as many as the plugin may have
    /// (`limits.instances`), so that the first calls do not pay for
    /// instantiation (a Python plugin's CPython heap) and a plugin that
    /// cannot run that many under its limits fails here rather than on a
    /// rollout. Returns how many it started.
    pub async fn prewarm(&self) -> Result<usize, PluginError> {
        let mut started = Vec::new();
        let mut permits = Vec::new();
        while let Ok(permit) = self.inner.permits.try_acquire() {
            permits.push(permit);
            if self.idle().len() + started.len() >= self.inner.spec.limits.instances {
                break;
            }
            let live = Live::start(&self.inner.pre, &self.inner.env, self.inner.spec.limits)
                .await
                .map_err(|fault| self.error(fault.kind, fault.stderr))?;
            started.push(live);
        }
        let count = started.len();
        self.idle().extend(started);
        Ok(count)
    }

    /// An idle instance, or a new one; waits while all are busy.
    async fn checkout(&self) -> Result<(Live, SemaphorePermit<'_>), PluginError> {
        let permit = self.inner.permits.acquire().await.map_err(|_| {
            let closed = PluginErrorKind::Instantiate("instance pool closed".to_string());
            self.error(closed, String::new())
        })?;
        let idle = self.idle().pop();
        let live = match idle {
            Some(live) => live,
            None => Live::start(&self.inner.pre, &self.inner.env, self.inner.spec.limits)
                .await
                .map_err(|fault| self.error(fault.kind, fault.stderr))?,
        };
        Ok((live, permit))
    }

    /// Returns a healthy instance to the pool; one that failed in any way is
    /// dropped (a trapped instance cannot be re-entered, and an erring guest
    /// may have left its state inconsistent).
    fn settle<T>(
        &self,
        live: Live,
        outcome: Option<Result<Result<T, String>, Fault>>,
    ) -> Result<T, PluginError> {
        match outcome {
            Some(Ok(Ok(value))) => {
                self.idle().push(live);
                Ok(value)
            }
            Some(Ok(Err(message))) => {
                Err(self.error(PluginErrorKind::GuestError(message), live.stderr()))
            }
            Some(Err(fault)) => Err(self.error(fault.kind, fault.stderr)),
            // `require` ran first, so the instance has the expected world.
            None => Err(self.error(
                PluginErrorKind::Instantiate("instance of the wrong world".to_string()),
                String::new(),
            )),
        }
    }

    fn idle(&self) -> MutexGuard<'_, Vec<Live>> {
        // Instances are pushed and popped whole; a poisoned lock holds no
        // half-made change.
        self.inner
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn error(&self, kind: PluginErrorKind, stderr: String) -> PluginError {
        error(&self.inner.spec, kind, stderr)
    }
}

pub(crate) fn error(spec: &PluginSpec, kind: PluginErrorKind, stderr: String) -> PluginError {
    PluginError {
        name: spec.name.clone(),
        path: spec.path.clone(),
        kind,
        stderr,
    }
}

impl std::fmt::Debug for Plugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plugin")
            .field("name", &self.name())
            .field("path", &self.path())
            .field("world", &self.world())
            .finish_non_exhaustive()
    }
}

/// `path` with the plugin's file name as a fallback name.
pub(crate) fn default_name(path: &Path) -> String {
    path.file_stem()
        .map(|stem| stem.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string())
}
