//! Startup: converge what an earlier controller left behind. Assumes one
//! controller per store: a `running` rollout is either ours to adopt or
//! an orphan.

use std::collections::HashSet;

use serde_json::Value;
use tokio::sync::mpsc;

use super::finish::finish;
use super::runner::{AttemptOutcome, Ending, ExecKey, Recovered, Runner};
use agl_client::{ClientError, GatewayClient};
use agl_wire::rollout::RolloutStatus;

/// The `execution` event kind: what a runner recorded at launch.
pub const EXECUTION: &str = "execution";

/// Adopts, or stops and fails, every `running` rollout (a system failure:
/// the store re-queues it while its budget lasts). Returns the adopted
/// executions. A
/// rollout that cannot be recovered is logged and skipped: one bad row must
/// not keep the controller from running the rest.
pub async fn recover<R: Runner>(
    client: &GatewayClient,
    runner: &R,
    updates: &mpsc::UnboundedSender<Ending>,
) -> Result<HashSet<ExecKey>, ClientError> {
    let mut adopted = HashSet::new();
    for r in client.list_all(RolloutStatus::Running).await? {
        let key = ExecKey {
            rollout_id: r.id.clone(),
            attempt: r.attempt,
        };
        match recover_one(client, runner, updates, &key).await {
            Ok(true) => {
                adopted.insert(key);
            }
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(rollout = %key.rollout_id, error = %e, "cannot recover this rollout; skipped");
            }
        }
    }
    Ok(adopted)
}

/// Converges one `running` rollout; `true` when its execution was adopted.
async fn recover_one<R: Runner>(
    client: &GatewayClient,
    runner: &R,
    updates: &mpsc::UnboundedSender<Ending>,
    key: &ExecKey,
) -> Result<bool, ClientError> {
    let events = client.events(&key.rollout_id).await?;
    let recorded: Option<Value> = events
        .iter()
        .rev()
        .find(|e| e.kind == EXECUTION && e.attempt == key.attempt)
        .map(|e| e.payload.parse().unwrap_or(Value::Null));
    let runner_name = recorded
        .as_ref()
        .and_then(|p| p.get("runner"))
        .and_then(Value::as_str);
    if runner_name.is_some_and(|n| n != runner.name()) {
        return Ok(false); // another runner's execution
    }
    // Without an `execution` event (a crash between launch and its
    // record) the runner is still asked: a Kubernetes Job has a
    // deterministic name and may be running; a local runner answers Lost.
    let found = runner
        .recover(
            key,
            recorded.as_ref().unwrap_or(&Value::Null),
            updates.clone(),
        )
        .await;
    match found {
        Recovered::Adopted => return Ok(true),
        Recovered::Finished(outcome) => finish(client, key, &outcome).await?,
        Recovered::Lost => {
            let outcome = AttemptOutcome::system("controller restarted");
            finish(client, key, &outcome).await?;
        }
    }
    Ok(false)
}
