//! Recording how an execution ended: output tails, the failure kind and the
//! terminal status. A system failure's retry is the store's (it re-queues
//! the rollout in the same transaction while its budget lasts).

use serde_json::json;

use super::runner::{AttemptOutcome, ExecKey, Verdict};
use agl_client::{ClientError, GatewayClient};
use agl_wire::api::StatusPatch;
use agl_wire::rollout::{FailureKind, RolloutStatus};

/// Records `outcome` for `key`. Safe to repeat after an error: a rollout
/// that has moved on (cancelled, finished, re-queued) is left alone.
pub async fn finish(
    client: &GatewayClient,
    key: &ExecKey,
    outcome: &AttemptOutcome,
) -> Result<(), ClientError> {
    let current = client.get(&key.rollout_id).await?;
    if current.status != RolloutStatus::Running || current.attempt != key.attempt {
        return Ok(());
    }
    let (id, attempt) = (key.rollout_id.as_str(), key.attempt);
    for (kind, tail) in [
        ("stdout", &outcome.stdout_tail),
        ("stderr", &outcome.stderr_tail),
    ] {
        if let Some(tail) = tail {
            ignore_conflict(
                client
                    .append_event(id, attempt, kind, json!({"tail": tail}))
                    .await,
            )?;
        }
    }
    let patch = match &outcome.verdict {
        Verdict::Succeeded => StatusPatch::to(attempt, RolloutStatus::Succeeded),
        Verdict::Failed { system, reason } => {
            let kind = if *system {
                FailureKind::System
            } else {
                FailureKind::Agent
            };
            StatusPatch::failed(attempt, kind, reason.clone())
        }
        // Stopped while still running here: the controller is shutting down.
        Verdict::Stopped => StatusPatch::failed(attempt, FailureKind::System, "controller stopped"),
    };
    if let (Some(kind), Some(reason)) = (patch.failure, &patch.reason) {
        let payload = json!({"kind": kind, "reason": reason});
        ignore_conflict(client.append_event(id, attempt, "failure", payload).await)?;
    }
    let moved = client.set_status(id, &patch).await;
    let Some(now) = ignore_conflict(moved)? else {
        return Ok(());
    };
    tracing::info!(
        rollout = id,
        attempt,
        status = ?patch.status,
        failure = ?patch.failure,
        reason = patch.reason.as_deref().unwrap_or(""),
        requeued_as = (now.attempt > attempt).then_some(now.attempt),
        "rollout finished"
    );
    Ok(())
}

/// A 409 means the rollout moved on under us: not an error, nothing to do.
fn ignore_conflict<T>(r: Result<T, ClientError>) -> Result<Option<T>, ClientError> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(ClientError::Conflict(_)) => Ok(None),
        Err(e) => Err(e),
    }
}
