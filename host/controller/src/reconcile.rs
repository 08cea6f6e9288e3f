//! The reconcile loop: claims queued rollouts up to the concurrency cap,
//! stops executions whose rollout moved on (cancelled), and records how
//! executions end. The store is the truth; every step can be repeated.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use super::ControllerConfig;
use super::env::agent_env;
use super::finish::finish;
use super::recover::EXECUTION;
use super::runner::{AttemptOutcome, Ending, ExecKey, LaunchSpec, Runner};
use agl_client::{ClientError, GatewayClient};
use agl_wire::api::{RolloutView, StatusPatch};
use agl_wire::rollout::RolloutStatus;

/// Stopped agents are re-checked against the store this often at most.
const CANCEL_CHECK: Duration = Duration::from_secs(1);

/// How recording an ending went: on error, the ending to retry.
pub type Recorded = Result<(), Box<(Ending, ClientError)>>;

pub struct Reconciler<R: Runner> {
    pub client: GatewayClient,
    pub runner: Arc<R>,
    pub config: ControllerConfig,
    pub updates: mpsc::UnboundedSender<Ending>,
    /// Executions running now.
    pub live: HashSet<ExecKey>,
    /// Endings being recorded; an error puts one back in `pending`.
    pub finishing: JoinSet<Recorded>,
    pub pending: Vec<Ending>,
    /// Claims whose answer was lost: resolved before anything new is claimed.
    pub doubtful: Vec<ExecKey>,
}

impl<R: Runner> Reconciler<R> {
    /// An execution ended: record it in the background.
    pub fn ended(&mut self, update: Ending) {
        self.live.remove(&update.0);
        self.record(update);
    }

    fn record(&mut self, update: Ending) {
        let client = self.client.clone();
        self.finishing.spawn(async move {
            match finish(&client, &update.0, &update.1).await {
                Ok(()) => Ok(()),
                Err(e) => Err(Box::new((update, e))),
            }
        });
    }

    /// A finished recording: an error is retried on a later tick.
    pub fn recorded(&mut self, result: Recorded) {
        if let Err(failed) = result {
            let (update, e) = *failed;
            tracing::warn!(rollout = %update.0.rollout_id, error = %e, "cannot record the end of an execution; will retry");
            self.pending.push(update);
        }
    }

    /// One pass: retry pending records, then launch up to the free slots.
    pub async fn tick(&mut self) -> Result<(), ClientError> {
        for update in std::mem::take(&mut self.pending) {
            self.record(update);
        }
        // A lost claim answer may hide a landed claim: fail that attempt as
        // a system failure (a no-op while it is still queued) before the
        // same rollout can be claimed again.
        while let Some(key) = self.doubtful.last() {
            let outcome = AttemptOutcome::system("claim interrupted");
            finish(&self.client, key, &outcome).await?;
            self.doubtful.pop();
        }
        let free = self.config.concurrency.saturating_sub(self.live.len());
        if free == 0 {
            return Ok(());
        }
        let limit = u32::try_from(free).unwrap_or(u32::MAX);
        for rollout in self.client.list(RolloutStatus::Queued, limit).await? {
            self.claim_and_launch(rollout).await?;
        }
        Ok(())
    }

    async fn claim_and_launch(&mut self, r: RolloutView) -> Result<(), ClientError> {
        let key = ExecKey {
            rollout_id: r.id.clone(),
            attempt: r.attempt,
        };
        // The attempt-checked queued -> running patch is the claim: only one
        // caller can win it, so an attempt never starts twice.
        match self
            .client
            .set_status(&r.id, &StatusPatch::to(r.attempt, RolloutStatus::Running))
            .await
        {
            Ok(_) => {}
            Err(ClientError::Conflict(_)) => return Ok(()),
            Err(e) => {
                self.doubtful.push(key);
                return Err(e);
            }
        }
        let spec = launch_spec(&r, &self.config.env_map);
        match self.runner.launch(spec, self.updates.clone()).await {
            Ok(recorded) => {
                self.live.insert(key.clone());
                tracing::debug!(rollout = %key.rollout_id, attempt = key.attempt, "launched");
                let mut payload = recorded;
                if let Some(obj) = payload.as_object_mut() {
                    obj.entry("runner").or_insert(json!(self.runner.name()));
                }
                if let Err(e) = self
                    .client
                    .append_event(&key.rollout_id, key.attempt, EXECUTION, payload)
                    .await
                {
                    tracing::warn!(rollout = %key.rollout_id, error = %e, "cannot record the execution event");
                }
            }
            Err(reason) => self.record((key, AttemptOutcome::system(reason))),
        }
        Ok(())
    }

    /// Stops executions whose rollout is no longer this running attempt.
    pub async fn stop_moved_on(&mut self) -> Result<(), ClientError> {
        let keys: Vec<ExecKey> = self.live.iter().cloned().collect();
        for key in keys {
            let r = self.client.get(&key.rollout_id).await?;
            if r.status != RolloutStatus::Running || r.attempt != key.attempt {
                tracing::info!(rollout = %key.rollout_id, attempt = key.attempt, status = ?r.status, "stopping an execution whose rollout moved on");
                self.runner.cancel(&key).await;
            }
        }
        Ok(())
    }
}

pub fn cancel_check_every(poll: Duration) -> Duration {
    poll.max(CANCEL_CHECK)
}

/// What the runner is asked to start for rollout `r`'s current attempt:
/// its input and the agent's environment.
pub(crate) fn launch_spec(r: &RolloutView, env_map: &BTreeMap<String, String>) -> LaunchSpec {
    // A stored input always parses; `null` keeps a bad one from stopping
    // the loop.
    let input = r.input.parse().unwrap_or(Value::Null);
    LaunchSpec {
        key: ExecKey {
            rollout_id: r.id.clone(),
            attempt: r.attempt,
        },
        mode: r.mode,
        group_id: r.group_id.clone(),
        env: agent_env(r, &input, env_map),
        input,
    }
}
