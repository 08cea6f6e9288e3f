//! The rollout controller: turns queued rollouts into agent executions and
//! records how they end. It talks to the gateway's management API over
//! HTTP (`client.rs`), so `agl controller` against a remote `agl serve` and
//! an embedded one run the same code.
//!
//! Per execution it records, as events of the attempt: `execution` (the
//! runner's handle: `runner`, `pid`/`pgid`, `start_ticks`, `started_at_ms`,
//! `log_dir`), `stdout`/`stderr` (`{"tail": last 4 KiB}`) and, when it
//! failed, `failure` (`{"kind": "system" | "agent", "reason"}`). The patch
//! that fails an attempt carries the same kind (the rollout's `failure`
//! field); the store re-queues a system failure as the next attempt
//! (`[store] max_system_retries`), and it is never scored.

mod config;
mod env;
mod finish;
mod k8s;
pub mod kube;
mod local;
mod pgroup;
mod reconcile;
mod recover;
mod runner;
mod start;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinSet;

pub use agl_client::{ClientError, GatewayClient};
pub use config::{CommandSpec, ControllerConfig, RunnerKind};
pub use env::{SYSTEM_FAILURE_EXIT_CODE, agent_env};
pub use k8s::{K8sRunner, dry_run_job};
pub use local::{LocalRunner, NoCommand, TAIL_BYTES};
pub use recover::EXECUTION;
pub use runner::{AttemptOutcome, Ending, ExecKey, LaunchSpec, Recovered, Runner, Verdict};
pub use start::run_controller;

use reconcile::{Reconciler, Recorded, cancel_check_every};

/// Wait between attempts to reach an unreachable gateway.
const BACKOFF: Duration = Duration::from_secs(1);

pub struct Controller<R: Runner> {
    client: GatewayClient,
    runner: Arc<R>,
    config: ControllerConfig,
}

impl<R: Runner> Controller<R> {
    pub fn new(client: GatewayClient, runner: R, config: ControllerConfig) -> Self {
        Controller {
            client,
            runner: Arc::new(runner),
            config,
        }
    }

    /// Runs until `shutdown` resolves: then launches nothing more, lets
    /// running agents finish for `shutdown_wait_secs`, stops the rest
    /// (recorded as system failures, so they are retried later) and returns
    /// once every ending is recorded or the gateway stays unreachable.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut shutdown = std::pin::pin!(shutdown);
        let live = loop {
            tokio::select! {
                _ = &mut shutdown => return,
                found = recover::recover(&self.client, &*self.runner, &tx) => match found {
                    Ok(live) => break live,
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot recover the controller's state; retrying");
                        tokio::time::sleep(BACKOFF).await;
                    }
                },
            }
        };
        tracing::info!(
            adopted = live.len(),
            runner = self.runner.name(),
            "controller started"
        );
        let poll = Duration::from_millis(self.config.poll_interval_ms.max(10));
        let mut rec = Reconciler {
            client: self.client,
            runner: self.runner,
            config: self.config,
            updates: tx,
            live,
            finishing: JoinSet::new(),
            pending: Vec::new(),
            doubtful: Vec::new(),
        };
        let mut tick = tokio::time::interval(poll);
        let mut cancel_check = tokio::time::interval(cancel_check_every(poll));
        loop {
            tokio::select! {
                _ = &mut shutdown => break,
                Some(update) = rx.recv() => rec.ended(update),
                Some(done) = rec.finishing.join_next() => rec.recorded(flatten(done)),
                _ = tick.tick() => if let Err(e) = rec.tick().await {
                    tracing::warn!(error = %e, "reconcile pass failed; retrying");
                },
                _ = cancel_check.tick() => if let Err(e) = rec.stop_moved_on().await {
                    tracing::warn!(error = %e, "cannot check running rollouts; retrying");
                },
            }
        }
        drain(&mut rec, &mut rx).await;
    }
}

/// Shutdown: wait, then stop what still runs, and record every ending.
async fn drain<R: Runner>(rec: &mut Reconciler<R>, rx: &mut mpsc::UnboundedReceiver<Ending>) {
    tracing::info!(running = rec.live.len(), "controller stopping");
    // Jobs in a cluster keep running without us; the next controller adopts
    // them, so a restart neither kills them nor spends a retry.
    if rec.runner.outlives_controller() {
        rec.live.clear();
    }
    let wait = tokio::time::sleep(Duration::from_secs(rec.config.shutdown_wait_secs));
    let mut wait = std::pin::pin!(wait);
    let mut stopping = false;
    let mut failures = 0;
    while !rec.live.is_empty() || !rec.finishing.is_empty() || !rec.pending.is_empty() {
        tokio::select! {
            _ = &mut wait, if !stopping => {
                stopping = true;
                for key in rec.live.clone() {
                    rec.runner.cancel(&key).await;
                }
            }
            Some(update) = rx.recv(), if !rec.live.is_empty() => rec.ended(update),
            Some(done) = rec.finishing.join_next() => rec.recorded(flatten(done)),
            _ = tokio::time::sleep(BACKOFF), if !rec.pending.is_empty() => {
                failures += 1;
                if failures > 30 {
                    tracing::error!(unrecorded = rec.pending.len(), "gateway unreachable: leaving endings unrecorded (the next controller fails them)");
                    return;
                }
                for update in std::mem::take(&mut rec.pending) {
                    rec.ended(update);
                }
            }
        }
    }
    tracing::info!("controller stopped");
}

fn flatten(done: Result<Recorded, tokio::task::JoinError>) -> Recorded {
    done.unwrap_or_else(|e| {
        tracing::error!(error = %e, "recording task failed");
        Ok(())
    })
}
