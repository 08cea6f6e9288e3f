//! What the reconcile loop needs from an execution backend. The local
//! runner (`local.rs`) runs processes; a Kubernetes runner fits the same
//! shape: `launch` creates a Job, `cancel` deletes it, `recover` adopts a
//! Job found after a restart, and its watch stream feeds [`Ending`]s.

use std::future::Future;

use serde_json::Value;
use tokio::sync::mpsc;

/// One execution: a rollout's attempt.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ExecKey {
    pub rollout_id: String,
    pub attempt: u32,
}

/// Everything a runner needs to start an agent.
#[derive(Debug, Clone)]
pub struct LaunchSpec {
    pub key: ExecKey,
    pub mode: agl_wire::rollout::Mode,
    pub group_id: String,
    pub input: Value,
    /// The agent's environment (see `env.rs`).
    pub env: Vec<(String, String)>,
}

/// How an execution ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    Succeeded,
    /// `system`: the infrastructure failed (crash, timeout, engine down),
    /// not the agent; such a rollout is retried, never scored.
    Failed {
        system: bool,
        reason: String,
    },
    /// Stopped on request (rollout cancelled, or controller shutdown).
    Stopped,
}

#[derive(Debug, Clone, PartialEq)]
pub struct AttemptOutcome {
    pub verdict: Verdict,
    /// Last bytes of the agent's output, when the runner kept it.
    pub stdout_tail: Option<String>,
    pub stderr_tail: Option<String>,
}

impl AttemptOutcome {
    pub fn system(reason: impl Into<String>) -> Self {
        AttemptOutcome {
            verdict: Verdict::Failed {
                system: true,
                reason: reason.into(),
            },
            stdout_tail: None,
            stderr_tail: None,
        }
    }
}

/// A finished execution, sent on the runner's update channel.
pub type Ending = (ExecKey, AttemptOutcome);

/// What `recover` found of an execution recorded by an earlier controller.
#[derive(Debug, Clone, PartialEq)]
pub enum Recovered {
    /// Still running and now tracked again: its end arrives as an [`Ending`].
    Adopted,
    /// It had finished; this is how.
    Finished(AttemptOutcome),
    /// Nothing can report on it any more (killed if it was still alive).
    Lost,
}

pub trait Runner: Send + Sync + 'static {
    /// Recorded in the `execution` event (`"local"`, `"k8s"`).
    fn name(&self) -> &'static str;

    /// True when executions keep running after the controller stops (Jobs
    /// in a cluster): shutdown then leaves them for the next controller to
    /// adopt instead of stopping them.
    fn outlives_controller(&self) -> bool {
        false
    }

    /// Starts an execution; its end is sent on `updates`. Returns what to
    /// record in the `execution` event so a later controller can find it
    /// (pid/pgid, job name). An error is a system failure of the attempt.
    fn launch(
        &self,
        spec: LaunchSpec,
        updates: mpsc::UnboundedSender<Ending>,
    ) -> impl Future<Output = Result<Value, String>> + Send;

    /// Stops an execution; its end still arrives as an update.
    fn cancel(&self, key: &ExecKey) -> impl Future<Output = ()> + Send;

    /// After a restart: an execution this runner recorded (`recorded` is the
    /// `execution` event payload).
    fn recover(
        &self,
        key: &ExecKey,
        recorded: &Value,
        updates: mpsc::UnboundedSender<Ending>,
    ) -> impl Future<Output = Recovered> + Send;
}
