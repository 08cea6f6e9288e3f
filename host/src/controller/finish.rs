//! Recording how an execution ended: output tails, the failure kind, the
//! terminal status, and the retry of a system failure.

use serde_json::json;

use super::client::{ClientError, GatewayClient};
use super::runner::{ExecKey, Outcome, Verdict};
use crate::rollout::RolloutStatus;

/// Reasons of system failures start with this, so a listing alone tells
/// them apart (`failed` + `system: ...` = retry, never score).
pub const SYSTEM_PREFIX: &str = "system: ";

/// Whether a failed rollout's reason marks a system failure.
pub fn is_system_reason(reason: Option<&str>) -> bool {
    reason.is_some_and(|r| r.starts_with(SYSTEM_PREFIX))
}

/// Records `outcome` for `key`. Safe to repeat after an error: a rollout
/// that has moved on (cancelled, finished, re-queued) is left alone.
pub async fn finish(
    client: &GatewayClient,
    key: &ExecKey,
    outcome: &Outcome,
    max_system_retries: u32,
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
    let (status, reason, system) = match &outcome.verdict {
        Verdict::Succeeded => (RolloutStatus::Succeeded, None, false),
        Verdict::Failed { system, reason } => {
            (RolloutStatus::Failed, Some(reason.clone()), *system)
        }
        // Stopped while still running here: the controller is shutting down.
        Verdict::Stopped => (
            RolloutStatus::Failed,
            Some("controller stopped".to_string()),
            true,
        ),
    };
    if let Some(reason) = &reason {
        let kind = if system { "system" } else { "agent" };
        let payload = json!({"kind": kind, "reason": reason});
        ignore_conflict(client.append_event(id, attempt, "failure", payload).await)?;
    }
    let reason = reason.map(|r| {
        if system {
            format!("{SYSTEM_PREFIX}{r}")
        } else {
            r
        }
    });
    let moved = client
        .set_status(id, attempt, status, reason.as_deref())
        .await;
    if ignore_conflict(moved.map(drop))?.is_none() {
        return Ok(());
    }
    tracing::info!(
        rollout = id,
        attempt,
        ?status,
        reason = reason.as_deref().unwrap_or(""),
        "rollout finished"
    );
    if system && attempt <= max_system_retries {
        ignore_conflict(client.retry(id).await.map(drop))?;
    }
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
