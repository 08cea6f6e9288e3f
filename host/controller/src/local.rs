//! The local runner: one process per attempt, in its own process group,
//! with a wall-clock limit, output kept under `logs_dir/<rollout>/<attempt>/`.

use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};

use super::config::{CommandSpec, ControllerConfig};
use super::env::SYSTEM_FAILURE_EXIT_CODE;
use super::pgroup::{group_alive, signal_group, start_ticks, terminate_group};
use super::runner::{AttemptOutcome, Ending, ExecKey, LaunchSpec, Recovered, Runner, Verdict};

/// How much of each output stream is reported as an event.
pub const TAIL_BYTES: u64 = 4096;

/// Secrets of the controller's own environment agents must not inherit.
const WITHHELD_ENV: &[&str] = &["AGL_ADMIN_KEY", "AGL_TOKEN_SECRET"];

pub struct LocalRunner {
    command: CommandSpec,
    workdir: Option<PathBuf>,
    logs_dir: PathBuf,
    timeout: Duration,
    grace: Duration,
    /// Live executions: a send stops one.
    live: Arc<Mutex<HashMap<ExecKey, oneshot::Sender<()>>>>,
}

#[derive(Debug, thiserror::Error)]
#[error("controller.command is not set: the local runner needs an agent command")]
pub struct NoCommand;

impl LocalRunner {
    pub fn new(config: &ControllerConfig) -> Result<Self, NoCommand> {
        Ok(LocalRunner {
            command: config.command.clone().ok_or(NoCommand)?,
            workdir: config.workdir.clone(),
            logs_dir: config
                .logs_dir
                .clone()
                .unwrap_or_else(|| PathBuf::from("agl-logs")),
            timeout: Duration::from_secs(config.timeout_secs),
            grace: Duration::from_secs(config.kill_grace_secs),
            live: Arc::default(),
        })
    }

    /// The argv for `spec`, each element rendered as a template.
    fn argv(&self, spec: &LaunchSpec) -> Result<Vec<String>, String> {
        let ctx = json!({
            "rollout_id": spec.key.rollout_id,
            "attempt": spec.key.attempt,
            "mode": spec.mode,
            "group_id": spec.group_id,
            "input": spec.input,
        });
        let ctx = minijinja::Value::from(minijinja::value::Serde(&ctx));
        let env = minijinja::Environment::new();
        let render = |t: &str| {
            env.render_str(t, ctx.clone())
                .map_err(|e| format!("cannot render command template: {e}"))
        };
        match &self.command {
            CommandSpec::Argv(parts) if parts.is_empty() => {
                Err("controller.command is empty".into())
            }
            CommandSpec::Argv(parts) => parts.iter().map(|p| render(p)).collect(),
            CommandSpec::Shell(s) => Ok(vec!["sh".into(), "-c".into(), render(s)?]),
        }
    }

    fn log_dir(&self, key: &ExecKey) -> PathBuf {
        // Ids never hold `/`; `..` alone is replaced so a path stays inside.
        let id = match key.rollout_id.as_str() {
            "." | ".." => "_",
            id => id,
        };
        self.logs_dir.join(id).join(key.attempt.to_string())
    }

    fn spawn(&self, spec: &LaunchSpec) -> Result<(tokio::process::Child, PathBuf), String> {
        let argv = self.argv(spec)?;
        let dir = self.log_dir(&spec.key);
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot create log dir {}: {e}", dir.display()))?;
        let open = |name: &str| {
            std::fs::File::create(dir.join(name))
                .map_err(|e| format!("cannot create {}: {e}", dir.join(name).display()))
        };
        let mut cmd = tokio::process::Command::new(&argv[0]);
        cmd.args(&argv[1..])
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(open("stdout")?)
            .stderr(open("stderr")?)
            // Its own group: one signal reaches the agent and its children.
            .process_group(0);
        for name in WITHHELD_ENV {
            cmd.env_remove(name);
        }
        if let Some(wd) = &self.workdir {
            cmd.current_dir(wd);
        }
        let child = cmd
            .spawn()
            .map_err(|e| format!("cannot start `{}`: {e}", argv[0]))?;
        Ok((child, dir))
    }
}

impl Runner for LocalRunner {
    fn name(&self) -> &'static str {
        "local"
    }

    async fn launch(
        &self,
        spec: LaunchSpec,
        updates: mpsc::UnboundedSender<Ending>,
    ) -> Result<Value, String> {
        let (mut child, dir) = self.spawn(&spec)?;
        let pid = child.id().ok_or("the agent exited before it was tracked")?;
        let (stop_tx, stop_rx) = oneshot::channel();
        if let Ok(mut live) = self.live.lock() {
            live.insert(spec.key.clone(), stop_tx);
        }
        let recorded = json!({
            "runner": "local",
            "pid": pid,
            "pgid": pid,
            "start_ticks": start_ticks(pid),
            "started_at_ms": now_ms(),
            "log_dir": dir.display().to_string(),
        });
        let (timeout, grace, live) = (self.timeout, self.grace, self.live.clone());
        tokio::spawn(async move {
            let verdict = supervise(&mut child, pid, timeout, grace, stop_rx).await;
            // Whatever the agent left behind in its group goes with it.
            signal_group(pid, libc::SIGKILL);
            if let Ok(mut live) = live.lock() {
                live.remove(&spec.key);
            }
            let outcome = AttemptOutcome {
                verdict,
                stdout_tail: tail(&dir.join("stdout")),
                stderr_tail: tail(&dir.join("stderr")),
            };
            let _ = updates.send((spec.key, outcome));
        });
        Ok(recorded)
    }

    async fn cancel(&self, key: &ExecKey) {
        let stop = self.live.lock().ok().and_then(|mut l| l.remove(key));
        if let Some(stop) = stop {
            let _ = stop.send(());
        }
    }

    async fn recover(
        &self,
        key: &ExecKey,
        recorded: &Value,
        _updates: mpsc::UnboundedSender<Ending>,
    ) -> Recovered {
        // A process that is not our child cannot report its exit status:
        // whatever is left of it is stopped and the attempt counts as lost.
        let pgid = recorded.get("pgid").and_then(Value::as_u64);
        let Some(pgid) = pgid.and_then(|p| u32::try_from(p).ok()) else {
            return Recovered::Lost;
        };
        let leader_is_ours = match (start_ticks(pgid), recorded.get("start_ticks")) {
            (Some(now), Some(then)) => then.as_u64() == Some(now),
            // Leader gone: a live group with its id can only be the agent's
            // leftovers, as Linux does not reuse a pid still naming a group.
            (None, _) => true,
            (Some(_), None) => false,
        };
        if leader_is_ours && group_alive(pgid) {
            tracing::warn!(rollout = %key.rollout_id, attempt = key.attempt, pgid, "killing an agent left by an earlier controller");
            terminate_group(pgid, self.grace).await;
        }
        Recovered::Lost
    }
}

/// Waits for the agent, its timeout or a stop request; returns the verdict.
async fn supervise(
    child: &mut tokio::process::Child,
    pgid: u32,
    timeout: Duration,
    grace: Duration,
    stop: oneshot::Receiver<()>,
) -> Verdict {
    let stopped = tokio::select! {
        status = child.wait() => return exit_verdict(status),
        _ = tokio::time::sleep(timeout) => false,
        _ = stop => true,
    };
    tokio::join!(terminate_group(pgid, grace), async {
        let _ = child.wait().await;
    });
    if stopped {
        Verdict::Stopped
    } else {
        Verdict::Failed {
            system: true,
            reason: format!("timed out after {}s", timeout.as_secs()),
        }
    }
}

fn exit_verdict(status: std::io::Result<ExitStatus>) -> Verdict {
    let fail = |system, reason| Verdict::Failed { system, reason };
    match status {
        Err(e) => fail(true, format!("cannot wait for the agent: {e}")),
        Ok(s) if s.success() => Verdict::Succeeded,
        Ok(s) => match (s.code(), s.signal()) {
            (Some(SYSTEM_FAILURE_EXIT_CODE), _) => fail(
                true,
                format!("agent reported a system failure (exit code {SYSTEM_FAILURE_EXIT_CODE})"),
            ),
            (Some(code), _) => fail(false, format!("exit code {code}")),
            (None, Some(sig)) => fail(true, format!("killed by signal {sig}")),
            (None, None) => fail(true, format!("ended abnormally: {s}")),
        },
    }
}

/// The last [`TAIL_BYTES`] of a file, lossily decoded; `None` if empty.
fn tail(path: &Path) -> Option<String> {
    let mut f = std::fs::File::open(path).ok()?;
    let len = f.metadata().ok()?.len();
    if len == 0 {
        return None;
    }
    f.seek(SeekFrom::Start(len.saturating_sub(TAIL_BYTES)))
        .ok()?;
    let mut buf = Vec::new();
    f.read_to_end(&mut buf).ok()?;
    Some(String::from_utf8_lossy(&buf).into_owned())
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
