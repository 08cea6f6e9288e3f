//! The Kubernetes runner behind the controller's [`Runner`] trait: Jobs are
//! created and deleted by [`kube::KubeRunner`]; its watch stream is turned
//! into [`Ending`]s for the executions this controller tracks.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use futures_util::StreamExt;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::kube::{self, ExecState, KubeRunner};
use super::runner::{AttemptOutcome, Ending, ExecKey, LaunchSpec, Recovered, Runner, Verdict};

type Waiting = Arc<Mutex<HashMap<ExecKey, mpsc::UnboundedSender<Ending>>>>;

pub struct K8sRunner {
    kube: KubeRunner,
    timeout_secs: u64,
    /// Executions whose end has not been reported yet.
    waiting: Waiting,
    /// The background task feeding `waiting`; aborted on drop (dropping a
    /// `JoinHandle` alone would detach it and keep the watch running).
    watch: tokio::task::JoinHandle<()>,
}

impl Drop for K8sRunner {
    fn drop(&mut self) {
        self.watch.abort();
    }
}

impl K8sRunner {
    /// Starts watching this runner's Jobs. `timeout_secs` becomes each Job's
    /// `activeDeadlineSeconds`.
    pub fn new(kube: KubeRunner, timeout_secs: u64) -> Self {
        let waiting: Waiting = Arc::default();
        let mut states = kube.watch();
        let sink = waiting.clone();
        let watch = tokio::spawn(async move {
            while let Some((key, state)) = states.next().await {
                let Some(outcome) = finished(&state) else {
                    continue;
                };
                let tx = sink
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .remove(&key);
                if let Some(tx) = tx {
                    let _ = tx.send((key, outcome));
                }
            }
        });
        K8sRunner {
            kube,
            timeout_secs,
            waiting,
            watch,
        }
    }

    fn wait_for(&self, key: &ExecKey, updates: mpsc::UnboundedSender<Ending>) {
        self.waiting
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(key.clone(), updates);
    }

    fn forget(&self, key: &ExecKey) -> Option<mpsc::UnboundedSender<Ending>> {
        self.waiting
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(key)
    }
}

/// The Job request of one launch: its key, input and environment, with the
/// controller's timeout as the Job's deadline.
fn job_spec(spec: LaunchSpec, timeout_secs: u64) -> kube::JobSpec {
    kube::JobSpec {
        rollout_id: spec.key.rollout_id,
        attempt: spec.key.attempt,
        input: spec.input,
        env: spec.env.into_iter().collect(),
        timeout_secs,
    }
}

/// The Job the controller would create for `rollout` (`agl controller
/// --runner k8s --dry-run`): the launch's own environment, template and
/// config, rendered without a cluster.
pub fn dry_run_job(
    rollout: &agl_wire::api::RolloutView,
    config: &crate::ControllerConfig,
) -> Result<k8s_openapi::api::batch::v1::Job, kube::KubeError> {
    let template = kube::JobTemplate::of_config(&config.kube)?;
    let launch = crate::reconcile::launch_spec(rollout, &config.env_map);
    template.render(&job_spec(launch, config.timeout_secs), &config.kube)
}

/// The outcome of a terminal Job state; `None` while it is still going.
fn finished(state: &ExecState) -> Option<AttemptOutcome> {
    let verdict = match state {
        ExecState::Pending | ExecState::Running => return None,
        ExecState::Succeeded => Verdict::Succeeded,
        ExecState::Failed { system, reason } => Verdict::Failed {
            system: *system,
            reason: reason.clone(),
        },
    };
    Some(AttemptOutcome {
        verdict,
        stdout_tail: None,
        stderr_tail: None,
    })
}

impl Runner for K8sRunner {
    fn name(&self) -> &'static str {
        "k8s"
    }

    fn outlives_controller(&self) -> bool {
        true
    }

    async fn launch(
        &self,
        spec: LaunchSpec,
        updates: mpsc::UnboundedSender<Ending>,
    ) -> Result<Value, String> {
        // Registered first: a fast Job's completion must find its waiter.
        self.wait_for(&spec.key, updates);
        let key = spec.key.clone();
        let launch = job_spec(spec, self.timeout_secs);
        match self.kube.launch(&launch).await {
            Ok(()) => Ok(json!({
                "job": kube::job_name(&key.rollout_id, key.attempt),
            })),
            Err(e) => {
                self.forget(&key);
                Err(e.to_string())
            }
        }
    }

    async fn cancel(&self, key: &ExecKey) {
        if let Err(e) = self.kube.cancel(key).await {
            tracing::warn!(rollout = %key.rollout_id, attempt = key.attempt, error = %e, "deleting Job");
        }
        // A deleted Job reports nothing more: answer for it here.
        if let Some(tx) = self.forget(key) {
            let stopped = AttemptOutcome {
                verdict: Verdict::Stopped,
                stdout_tail: None,
                stderr_tail: None,
            };
            let _ = tx.send((key.clone(), stopped));
        }
    }

    async fn recover(
        &self,
        key: &ExecKey,
        _recorded: &Value,
        updates: mpsc::UnboundedSender<Ending>,
    ) -> Recovered {
        // Registered before the list, so an end seen by the watch in between
        // is not lost; removed again if the list already shows the end.
        self.wait_for(key, updates);
        let jobs = match self.kube.list().await {
            Ok(jobs) => jobs,
            Err(e) => {
                tracing::warn!(error = %e, "listing Jobs to adopt");
                self.forget(key);
                return Recovered::Lost;
            }
        };
        match jobs.into_iter().find(|(k, _)| k == key) {
            Some((_, state)) => match finished(&state) {
                None => Recovered::Adopted,
                Some(outcome) => match self.forget(key) {
                    Some(_) => Recovered::Finished(outcome),
                    // The watch already reported it.
                    None => Recovered::Adopted,
                },
            },
            None => {
                self.forget(key);
                Recovered::Lost
            }
        }
    }
}
