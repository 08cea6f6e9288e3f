//! `[controller]` in `agl.toml`: which runner executes agents, and how.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;

/// The agent command: an argv list (no shell) or one shell string run with
/// `sh -c`. Each element is a minijinja template over the rollout
/// (`{{ rollout_id }}`, `{{ attempt }}`, `{{ mode }}`, `{{ group_id }}`,
/// `{{ input.question }}`). Prefer passing inputs by environment
/// (`env_map`) in the shell form: rendered text is not shell-quoted.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum CommandSpec {
    Argv(Vec<String>),
    Shell(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum RunnerKind {
    Local,
    /// One Kubernetes Job per attempt (`[controller.kube]`).
    K8s,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ControllerConfig {
    pub runner: RunnerKind,
    /// Required to launch anything with the local runner.
    pub command: Option<CommandSpec>,
    /// The agent's working directory; unset = the controller's.
    pub workdir: Option<PathBuf>,
    /// Most agents running at once.
    pub concurrency: usize,
    /// Wall-clock limit per attempt; then SIGTERM to its process group.
    pub timeout_secs: u64,
    /// Time between SIGTERM and SIGKILL.
    pub kill_grace_secs: u64,
    /// Extra environment variables from the input: `QUESTION = "input.question"`.
    pub env_map: BTreeMap<String, String>,
    /// stdout/stderr go to `<logs_dir>/<rollout>/<attempt>/`; unset = `agl-logs`.
    pub logs_dir: Option<PathBuf>,
    /// How often the store is polled for queued and cancelled rollouts.
    pub poll_interval_ms: u64,
    /// On shutdown, how long running agents may finish before they are killed.
    pub shutdown_wait_secs: u64,
    /// The Kubernetes runner's settings (`runner = "k8s"`).
    pub kube: super::kube::KubeConfig,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        ControllerConfig {
            runner: RunnerKind::Local,
            command: None,
            workdir: None,
            concurrency: 8,
            timeout_secs: 1800,
            kill_grace_secs: 10,
            env_map: BTreeMap::new(),
            logs_dir: None,
            poll_interval_ms: 200,
            shutdown_wait_secs: 30,
            kube: Default::default(),
        }
    }
}
