//! What a Job and its pods say about one execution.
//!
//! | Observed (first match wins)                                   | State                                   |
//! |---------------------------------------------------------------|-----------------------------------------|
//! | Job condition `Complete` or `SuccessCriteriaMet` = True       | `Succeeded`                             |
//! | Job `Failed`/`FailureTarget` = True, reason `DeadlineExceeded`| `Failed{system, "deadline"}`            |
//! | a pod with status reason `Evicted`                            | `Failed{system, "evicted"}`             |
//! | a container terminated with reason `OOMKilled`                | `Failed{system, "OOMKilled"}`           |
//! | a container waiting in `ErrImagePull`, `ImagePullBackOff`, `InvalidImageName` | `Failed{system, "image pull: REASON: MESSAGE"}` (the runner deletes the Job) |
//! | Job failed, a container terminated with exit code N != 0      | `Failed{user, "exit code N"}`           |
//! | Job failed otherwise                                          | `Failed{system, "job failed: REASON: MESSAGE"}` |
//! | a pod in phase `Running`, or Job `status.ready` > 0           | `Running`                               |
//! | anything else                                                 | `Pending`                               |
//!
//! Only a non-zero exit of the agent itself is the agent's (user) failure;
//! everything the cluster did to the pod is a system failure, which the
//! controller records as such instead of a zero reward.

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};

use super::ExecState;

/// Container waiting reasons that mean the image will never start.
const IMAGE_PULL_REASONS: [&str; 3] = ["ErrImagePull", "ImagePullBackOff", "InvalidImageName"];

/// Maps a Job and the pods it created (any order) to the execution state.
pub fn exec_state(job: &Job, pods: &[&Pod]) -> ExecState {
    let status = job.status.as_ref();
    let condition = |types: &[&str]| {
        status
            .and_then(|s| s.conditions.as_ref())
            .into_iter()
            .flatten()
            .find(|c| types.contains(&c.type_.as_str()) && c.status == "True")
    };
    if condition(&["Complete", "SuccessCriteriaMet"]).is_some() {
        return ExecState::Succeeded;
    }
    let failed = condition(&["Failed", "FailureTarget"]);
    if failed.is_some_and(|c| c.reason.as_deref() == Some("DeadlineExceeded")) {
        return system("deadline");
    }
    if let Some(state) = pod_failure(pods) {
        return state;
    }
    if let Some(failed) = failed {
        if let Some(code) = containers(pods).find_map(nonzero_exit) {
            return ExecState::Failed {
                system: false,
                reason: format!("exit code {code}"),
            };
        }
        return system(&format!(
            "job failed: {}: {}",
            failed.reason.as_deref().unwrap_or("unknown"),
            failed.message.as_deref().unwrap_or("")
        ));
    }
    let pod_running = pods
        .iter()
        .any(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"));
    if pod_running || status.and_then(|s| s.ready).unwrap_or(0) > 0 {
        ExecState::Running
    } else {
        ExecState::Pending
    }
}

/// A failed Job whose pods have not (yet) said why. The watch waits for the
/// pod's event or the next relist before reporting it, so a pod status that
/// arrives after its Job's condition still yields the exit code.
pub fn is_unexplained_failure(state: &ExecState) -> bool {
    matches!(state, ExecState::Failed { system: true, reason } if reason.starts_with("job failed:"))
}

/// Whether the runner should delete the Job: a pod stuck on its image would
/// otherwise hold its slot until the active deadline.
pub fn is_image_pull_failure(state: &ExecState) -> bool {
    matches!(state, ExecState::Failed { system: true, reason } if reason.starts_with("image pull:"))
}

/// Failures the cluster inflicted on a pod, visible before (or without) the
/// Job's own failure condition.
fn pod_failure(pods: &[&Pod]) -> Option<ExecState> {
    let evicted = pods
        .iter()
        .any(|p| p.status.as_ref().and_then(|s| s.reason.as_deref()) == Some("Evicted"));
    if evicted {
        return Some(system("evicted"));
    }
    let oom = containers(pods).any(|c| {
        let terminated = c.state.as_ref().and_then(|s| s.terminated.as_ref());
        terminated.and_then(|t| t.reason.as_deref()) == Some("OOMKilled")
    });
    if oom {
        return Some(system("OOMKilled"));
    }
    containers(pods).find_map(|c| {
        let waiting = c.state.as_ref()?.waiting.as_ref()?;
        let reason = waiting.reason.as_deref()?;
        IMAGE_PULL_REASONS.contains(&reason).then(|| {
            let message = waiting.message.as_deref().unwrap_or("");
            system(&format!("image pull: {reason}: {message}"))
        })
    })
}

fn containers<'a>(pods: &'a [&'a Pod]) -> impl Iterator<Item = &'a ContainerStatus> {
    pods.iter()
        .filter_map(|p| p.status.as_ref()?.container_statuses.as_ref())
        .flatten()
}

fn nonzero_exit(c: &ContainerStatus) -> Option<i32> {
    let code = c.state.as_ref()?.terminated.as_ref()?.exit_code;
    (code != 0).then_some(code)
}

fn system(reason: &str) -> ExecState {
    ExecState::Failed {
        system: true,
        reason: reason.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn job(status: serde_json::Value) -> Job {
        serde_json::from_value(json!({"metadata": {"name": "j"}, "status": status})).unwrap()
    }

    fn pod(status: serde_json::Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "p"}, "status": status})).unwrap()
    }

    fn failed_job(reason: &str) -> Job {
        job(
            json!({"conditions": [{"type": "Failed", "status": "True", "reason": reason, "message": "m"}]}),
        )
    }

    fn terminated(reason: &str, code: i32) -> Pod {
        pod(json!({"phase": "Failed", "containerStatuses": [{
            "name": "agent", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"terminated": {"exitCode": code, "reason": reason}}}]}))
    }

    fn failed(system: bool, reason: &str) -> ExecState {
        ExecState::Failed {
            system,
            reason: reason.into(),
        }
    }

    #[test]
    fn job_conditions_decide_terminal_states() {
        let done = job(json!({"conditions": [{"type": "Complete", "status": "True"}]}));
        assert_eq!(exec_state(&done, &[]), ExecState::Succeeded);
        let not_yet = job(json!({"conditions": [{"type": "Complete", "status": "False"}]}));
        assert_eq!(exec_state(&not_yet, &[]), ExecState::Pending);
        let late = terminated("Error", 3);
        assert_eq!(
            exec_state(&failed_job("DeadlineExceeded"), &[&late]),
            failed(true, "deadline")
        );
        assert_eq!(
            exec_state(&failed_job("BackoffLimitExceeded"), &[&late]),
            failed(false, "exit code 3")
        );
        assert_eq!(
            exec_state(&failed_job("PodFailurePolicy"), &[]),
            failed(true, "job failed: PodFailurePolicy: m")
        );
    }

    #[test]
    fn pod_troubles_are_system_failures() {
        let oom = terminated("OOMKilled", 137);
        assert_eq!(
            exec_state(&failed_job("BackoffLimitExceeded"), &[&oom]),
            failed(true, "OOMKilled")
        );
        assert_eq!(
            exec_state(&job(json!({"active": 1})), &[&oom]),
            failed(true, "OOMKilled")
        );
        let evicted =
            pod(json!({"phase": "Failed", "reason": "Evicted", "message": "low on memory"}));
        assert_eq!(
            exec_state(&job(json!({"active": 1})), &[&evicted]),
            failed(true, "evicted")
        );
        let pulling = pod(json!({"phase": "Pending", "containerStatuses": [{
            "name": "agent", "image": "nope", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image \"nope\""}}}]}));
        let state = exec_state(&job(json!({"active": 1})), &[&pulling]);
        assert_eq!(
            state,
            failed(
                true,
                "image pull: ImagePullBackOff: Back-off pulling image \"nope\""
            )
        );
        assert!(is_image_pull_failure(&state));
        assert!(!is_image_pull_failure(&failed(true, "OOMKilled")));
        assert!(is_unexplained_failure(&exec_state(
            &failed_job("BackoffLimitExceeded"),
            &[]
        )));
        assert!(!is_unexplained_failure(&failed(false, "exit code 1")));
    }

    #[test]
    fn live_jobs_are_pending_until_a_pod_runs() {
        let active = job(json!({"active": 1}));
        let creating = pod(json!({"phase": "Pending", "containerStatuses": [{
            "name": "agent", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"waiting": {"reason": "ContainerCreating"}}}]}));
        assert_eq!(exec_state(&active, &[&creating]), ExecState::Pending);
        let running = pod(json!({"phase": "Running"}));
        assert_eq!(
            exec_state(&active, &[&creating, &running]),
            ExecState::Running
        );
        assert_eq!(
            exec_state(&job(json!({"ready": 1})), &[]),
            ExecState::Running
        );
        // A clean exit is not success until the Job says so.
        assert_eq!(
            exec_state(&active, &[&terminated("Completed", 0)]),
            ExecState::Pending
        );
    }
}
