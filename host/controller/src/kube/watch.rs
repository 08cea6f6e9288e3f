//! List + watch of the runner's Jobs and pods, as a stream of state changes.
//!
//! Each cycle lists Jobs and pods by label, reports what changed since the
//! last report, then watches both from the list's resource versions until
//! `relist_secs` pass or a watch ends, errs or answers `410 Gone`; then the
//! next cycle relists. A completion that happened while no watch was open
//! therefore still shows up, from the list.

use std::collections::{BTreeMap, HashMap};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use ::kube::ResourceExt;
use ::kube::api::{ObjectList, WatchEvent, WatchParams};
use futures_util::{Stream, StreamExt};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::render::{ANNOTATION_ROLLOUT, LABEL_ATTEMPT, MANAGED_SELECTOR};
use super::state::{exec_state, is_image_pull_failure, is_unexplained_failure};
use super::{ExecKey, ExecState, Inner};

/// Pause before relisting after a watch broke early, so an API server that
/// keeps closing watches is not hammered.
const BROKEN_WATCH_PAUSE: Duration = Duration::from_secs(1);

/// Jobs and pods by execution, as of one list or the watch events after it.
pub struct Snapshot {
    jobs: BTreeMap<ExecKey, Job>,
    pods: BTreeMap<String, (ExecKey, Pod)>,
    jobs_version: String,
    pods_version: String,
}

impl Snapshot {
    pub fn new(jobs: ObjectList<Job>, pods: ObjectList<Pod>) -> Self {
        let mut snapshot = Snapshot {
            jobs: BTreeMap::new(),
            pods: BTreeMap::new(),
            jobs_version: jobs.metadata.resource_version.unwrap_or_default(),
            pods_version: pods.metadata.resource_version.unwrap_or_default(),
        };
        for job in jobs.items {
            snapshot.put_job(job);
        }
        for pod in pods.items {
            snapshot.put_pod(pod);
        }
        snapshot
    }

    pub fn states(&self) -> Vec<(ExecKey, ExecState)> {
        self.jobs
            .keys()
            .filter_map(|k| Some((k.clone(), self.state(k)?)))
            .collect()
    }

    fn state(&self, key: &ExecKey) -> Option<ExecState> {
        let job = self.jobs.get(key)?;
        let pods: Vec<&Pod> = self
            .pods
            .values()
            .filter(|(k, _)| k == key)
            .map(|(_, p)| p)
            .collect();
        Some(exec_state(job, &pods))
    }

    fn put_job(&mut self, job: Job) -> Option<ExecKey> {
        let key = exec_key(&job)?;
        self.jobs.insert(key.clone(), job);
        Some(key)
    }

    fn put_pod(&mut self, pod: Pod) -> Option<ExecKey> {
        let key = exec_key(&pod)?;
        self.pods.insert(pod.name_any(), (key.clone(), pod));
        Some(key)
    }
}

/// The execution an object belongs to, from the runner's annotation and label.
fn exec_key(object: &impl ResourceExt) -> Option<ExecKey> {
    let rollout_id = object.annotations().get(ANNOTATION_ROLLOUT)?.clone();
    let attempt = object.labels().get(LABEL_ATTEMPT)?.parse().ok()?;
    Some(ExecKey {
        rollout_id,
        attempt,
    })
}

/// The stream [`super::KubeRunner::watch`] returns; dropping it stops the
/// background list/watch task.
pub struct StateStream {
    rx: mpsc::Receiver<(ExecKey, ExecState)>,
    task: JoinHandle<()>,
}

impl Stream for StateStream {
    type Item = (ExecKey, ExecState);

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.rx.poll_recv(cx)
    }
}

impl Drop for StateStream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub fn spawn(inner: Arc<Inner>) -> StateStream {
    let (tx, rx) = mpsc::channel(256);
    let task = tokio::spawn(async move {
        Reporter {
            inner,
            tx,
            reported: HashMap::new(),
        }
        .run()
        .await
    });
    StateStream { rx, task }
}

struct Reporter {
    inner: Arc<Inner>,
    tx: mpsc::Sender<(ExecKey, ExecState)>,
    /// Last state sent per execution: only changes are sent.
    reported: HashMap<ExecKey, ExecState>,
}

/// Why a watch cycle ended.
enum CycleEnd {
    /// `relist_secs` passed: relist at once.
    Due,
    /// The watch ended or failed: relist after a short pause.
    Broken,
    /// Nobody listens any more.
    Closed,
}

impl Reporter {
    async fn run(mut self) {
        let relist = Duration::from_secs(self.inner.config.relist_secs);
        loop {
            let end = match self.inner.snapshot().await {
                Ok(snapshot) => self.cycle(snapshot, relist).await,
                Err(e) => {
                    tracing::warn!(error = %e, "listing Jobs failed; retrying");
                    CycleEnd::Broken
                }
            };
            match end {
                CycleEnd::Due => {}
                CycleEnd::Broken => tokio::time::sleep(BROKEN_WATCH_PAUSE).await,
                CycleEnd::Closed => return,
            }
        }
    }

    async fn cycle(&mut self, mut snapshot: Snapshot, relist: Duration) -> CycleEnd {
        self.reported
            .retain(|key, _| snapshot.jobs.contains_key(key));
        let keys: Vec<ExecKey> = snapshot.jobs.keys().cloned().collect();
        for key in keys {
            if !self.report(&snapshot, key, true).await {
                return CycleEnd::Closed;
            }
        }
        let params = WatchParams::default().labels(MANAGED_SELECTOR);
        let jobs = self.inner.jobs.watch(&params, &snapshot.jobs_version).await;
        let pods = self.inner.pods.watch(&params, &snapshot.pods_version).await;
        let (mut jobs, mut pods) = match (jobs, pods) {
            (Ok(jobs), Ok(pods)) => (jobs.boxed(), pods.boxed()),
            (Err(e), _) | (_, Err(e)) => {
                tracing::warn!(error = %e, "cannot watch Jobs; relisting");
                return CycleEnd::Broken;
            }
        };
        let due = tokio::time::sleep(relist);
        tokio::pin!(due);
        loop {
            // Pods first: a pod's failure precedes its Job's Failed condition,
            // and the Job's state is read with the pod's cause (exit code, OOM).
            let key = tokio::select! {
                biased;
                event = pods.next() => match event {
                    Some(Ok(WatchEvent::Added(pod) | WatchEvent::Modified(pod))) => snapshot.put_pod(pod),
                    Some(Ok(WatchEvent::Deleted(pod))) => {
                        snapshot.pods.remove(&pod.name_any());
                        None
                    }
                    Some(Ok(WatchEvent::Bookmark(_))) => None,
                    other => return broken("pod", other),
                },
                event = jobs.next() => match event {
                    Some(Ok(WatchEvent::Added(job) | WatchEvent::Modified(job))) => snapshot.put_job(job),
                    Some(Ok(WatchEvent::Deleted(job))) => {
                        if let Some(key) = exec_key(&job) {
                            snapshot.jobs.remove(&key);
                            self.reported.remove(&key);
                        }
                        None
                    }
                    Some(Ok(WatchEvent::Bookmark(_))) => None,
                    other => return broken("Job", other),
                },
                () = &mut due => return CycleEnd::Due,
            };
            if let Some(key) = key
                && !self.report(&snapshot, key, false).await
            {
                return CycleEnd::Closed;
            }
        }
    }

    /// Sends the execution's state if it changed; false once the receiver
    /// is gone. A Job stuck on its image is deleted when that is reported.
    /// Between lists, an unexplained failure waits for its pod's event.
    async fn report(&mut self, snapshot: &Snapshot, key: ExecKey, listed: bool) -> bool {
        let Some(state) = snapshot.state(&key) else {
            return true;
        };
        if !listed && is_unexplained_failure(&state) {
            return true;
        }
        if self.reported.get(&key) == Some(&state) {
            return true;
        }
        self.reported.insert(key.clone(), state.clone());
        if is_image_pull_failure(&state) {
            self.inner.reap(&key).await;
        }
        self.tx.send((key, state)).await.is_ok()
    }
}

/// Logs why a watch stopped (end of stream, error event such as `410 Gone`,
/// or a transport error).
fn broken<T>(what: &str, event: Option<Result<WatchEvent<T>, ::kube::Error>>) -> CycleEnd {
    match event {
        None => tracing::debug!("{what} watch ended; relisting"),
        Some(Ok(WatchEvent::Error(status))) => {
            tracing::debug!(code = status.code, reason = %status.reason, "{what} watch expired; relisting")
        }
        Some(Err(e)) => tracing::warn!(error = %e, "{what} watch failed; relisting"),
        Some(Ok(_)) => {}
    }
    CycleEnd::Broken
}
