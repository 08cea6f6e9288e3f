//! The Kubernetes runner: one Job per rollout attempt.
//!
//! Jobs are rendered from the operator's template ([`render`]), created at a
//! bounded rate ([`rate`]), observed through a label-filtered list + watch of
//! Jobs and their pods ([`watch`]) and mapped to execution states
//! ([`state`], which documents the table). Everything the runner knows lives
//! in the cluster: after a restart, [`KubeRunner::list`] adopts the Jobs it
//! finds by label, and launching an attempt whose Job exists is a no-op.

mod names;
mod rate;
mod render;
mod state;
mod watch;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use ::kube::api::{Api, DeleteParams, ListParams, PostParams};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use serde::Deserialize;

pub use names::job_name;
pub use render::JobTemplate;
pub use watch::StateStream;

use render::MANAGED_SELECTOR;

/// `[controller.kube]` in `agl.toml`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KubeConfig {
    /// Namespace the Jobs run in.
    pub namespace: String,
    /// The Job template (YAML + minijinja); required by [`KubeRunner::new`].
    pub job_template: Option<PathBuf>,
    /// Image offered to the template as `image`.
    pub image: String,
    /// Job creations per minute (burst of as many, then evenly spaced).
    pub jobs_per_minute: u32,
    /// How long Kubernetes keeps a finished Job (and its pod logs).
    pub ttl_seconds_after_finished: i32,
    /// Seconds between full relists; each watch lasts at most this long.
    pub relist_secs: u64,
}

impl Default for KubeConfig {
    fn default() -> Self {
        KubeConfig {
            namespace: "default".into(),
            job_template: None,
            image: "agl-agent:latest".into(),
            jobs_per_minute: 100,
            ttl_seconds_after_finished: 600,
            relist_secs: 5,
        }
    }
}

/// The Job for one attempt of one rollout, as the controller asks for it.
#[derive(Debug, Clone, PartialEq)]
pub struct JobSpec {
    pub rollout_id: String,
    pub attempt: u32,
    pub input: serde_json::Value,
    /// Injected into every container, overriding same-named variables.
    pub env: BTreeMap<String, String>,
    /// Becomes the Job's `activeDeadlineSeconds`.
    pub timeout_secs: u64,
}

/// An execution is the Job of one attempt of one rollout.
pub use crate::runner::ExecKey;

/// Where an execution stands; see [`state`] for how it is read off a Job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecState {
    Pending,
    Running,
    Succeeded,
    /// `system` = the cluster failed the run (deadline, OOM, eviction, image),
    /// not the agent; such a failure is not a zero reward.
    Failed {
        system: bool,
        reason: String,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    #[error("kube runner config: {0}")]
    Config(String),
    #[error("cannot read Job template {path}: {source}")]
    ReadTemplate {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("Job template: {0}")]
    Template(String),
    #[error("invalid Job manifest: {0}")]
    InvalidJob(String),
    #[error("Kubernetes API: {0}")]
    Api(#[from] ::kube::Error),
}

/// Launches, cancels and observes rollout Jobs in one namespace.
#[derive(Clone)]
pub struct KubeRunner {
    inner: Arc<Inner>,
}

struct Inner {
    jobs: Api<Job>,
    pods: Api<Pod>,
    template: JobTemplate,
    config: KubeConfig,
    limiter: rate::RateLimiter,
}

impl KubeRunner {
    /// Reads and compiles the Job template named by `config.job_template`.
    pub async fn new(client: ::kube::Client, config: KubeConfig) -> Result<Self, KubeError> {
        let template = JobTemplate::of_config(&config)?;
        Self::with_template(client, config, template)
    }

    /// A runner with an already compiled template.
    pub fn with_template(
        client: ::kube::Client,
        config: KubeConfig,
        template: JobTemplate,
    ) -> Result<Self, KubeError> {
        if config.jobs_per_minute == 0 || config.relist_secs == 0 {
            return Err(KubeError::Config(
                "jobs_per_minute and relist_secs must be at least 1".into(),
            ));
        }
        let inner = Inner {
            jobs: Api::namespaced(client.clone(), &config.namespace),
            pods: Api::namespaced(client, &config.namespace),
            template,
            limiter: rate::RateLimiter::new(config.jobs_per_minute),
            config,
        };
        Ok(KubeRunner {
            inner: Arc::new(inner),
        })
    }

    /// Creates the attempt's Job, waiting for the creation rate limit. A Job
    /// that already exists (a restart between create and record) counts as
    /// launched: names are deterministic, so it is this attempt's Job.
    pub async fn launch(&self, spec: &JobSpec) -> Result<(), KubeError> {
        let job = self.inner.template.render(spec, &self.inner.config)?;
        self.inner.limiter.acquire().await;
        match self.inner.jobs.create(&PostParams::default(), &job).await {
            Ok(_) => Ok(()),
            Err(::kube::Error::Api(status)) if status.is_already_exists() => {
                tracing::info!(rollout = %spec.rollout_id, attempt = spec.attempt, "Job exists; adopted");
                Ok(())
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Deletes the attempt's Job and, in the background, its pods. Deleting
    /// a Job that is already gone succeeds.
    pub async fn cancel(&self, key: &ExecKey) -> Result<(), KubeError> {
        self.inner
            .delete(&job_name(&key.rollout_id, key.attempt))
            .await
    }

    /// Every Job of this runner (by label) with its state: adoption after a
    /// restart and the controller's relist. Jobs stuck on their image are
    /// deleted on the way.
    pub async fn list(&self) -> Result<Vec<(ExecKey, ExecState)>, KubeError> {
        let snapshot = self.inner.snapshot().await?;
        let states = snapshot.states();
        for (key, state) in &states {
            if state::is_image_pull_failure(state) {
                self.inner.reap(key).await;
            }
        }
        Ok(states)
    }

    /// State changes of this runner's executions, from a list + watch that
    /// restarts from a fresh list every `relist_secs` and whenever the watch
    /// ends or fails. Each state is reported once per change; the first
    /// report of every Job comes from the initial list.
    pub fn watch(&self) -> StateStream {
        watch::spawn(self.inner.clone())
    }
}

impl Inner {
    fn list_params(&self) -> ListParams {
        ListParams::default().labels(MANAGED_SELECTOR)
    }

    /// Jobs and pods of this runner, with the resource versions to watch from.
    async fn snapshot(&self) -> Result<watch::Snapshot, KubeError> {
        let jobs = self.jobs.list(&self.list_params()).await?;
        let pods = self.pods.list(&self.list_params()).await?;
        Ok(watch::Snapshot::new(jobs, pods))
    }

    async fn delete(&self, name: &str) -> Result<(), KubeError> {
        match self.jobs.delete(name, &DeleteParams::background()).await {
            Ok(_) => Ok(()),
            Err(::kube::Error::Api(status)) if status.is_not_found() => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Deletes a Job whose failure is already known; a failed delete is only
    /// logged (the active deadline still ends the Job).
    async fn reap(&self, key: &ExecKey) {
        let name = job_name(&key.rollout_id, key.attempt);
        if let Err(e) = self.delete(&name).await {
            tracing::warn!(job = %name, error = %e, "cannot delete a Job stuck on its image");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_defaults_and_toml_keys() {
        let config: KubeConfig = toml::from_str(
            "namespace = \"agents\"\njob_template = \"job.yaml\"\njobs_per_minute = 30\n",
        )
        .unwrap();
        assert_eq!(config.namespace, "agents");
        assert_eq!(config.jobs_per_minute, 30);
        assert_eq!(config.ttl_seconds_after_finished, 600);
        assert_eq!(config.relist_secs, 5);
        assert!(toml::from_str::<KubeConfig>("jobs_per_mintue = 3").is_err());
    }
}
