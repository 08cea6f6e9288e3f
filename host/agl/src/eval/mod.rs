//! `agl eval`: a policy (the base model, or a run's checkpoint) on the val
//! rows or a named data file, through the same harness, controller,
//! gateway and engine as training, with no training: `k` samples per task,
//! pass@1 and pass@k, a per-task table, JSON, and two or more policies side
//! by side. In one process (the run's gateway, store and controller, a
//! store of its own) or against a gateway that runs elsewhere (`agl serve`
//! with `agl controller`), as `agl run` and `agl train` are.

pub mod score;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use serde_json::Value;

use agl_client::GatewayClient;
use agl_engine::InFlight;
use agl_plugin_host::{Plugin, World};
use agl_rl::checkpoint;
use agl_wire::api::NewRollout;
use agl_wire::rollout::{JsonText, Mode};

use crate::assembly::{self, GatewayParts};
use crate::config::{Config, EngineKind};
use crate::link::{Link, Local};
use crate::policy::Policy;
use crate::rollout_set::RolloutSet;
use crate::run::LocalServing;
use crate::run::collect::scored;
use crate::run::data::read_rows;
use agl_rl::Trainer;
pub use score::{EvalReport, PolicyResult, TaskResult};

/// A policy to evaluate.
#[derive(Debug, Clone, PartialEq)]
pub enum PolicySpec {
    /// `model.path` as it is.
    Base,
    /// A checkpoint folder (`checkpoints/step-N`).
    Checkpoint(PathBuf),
}

impl PolicySpec {
    /// `base`, a checkpoint folder, or a run folder (its newest checkpoint).
    pub fn parse(arg: &str) -> anyhow::Result<PolicySpec> {
        if arg == "base" {
            return Ok(PolicySpec::Base);
        }
        let path = PathBuf::from(arg);
        if path.join("meta.json").is_file() {
            return Ok(PolicySpec::Checkpoint(path.canonicalize()?));
        }
        let newest = checkpoint::latest_checkpoint(&path.join("checkpoints"))?;
        match newest {
            Some(step) => Ok(PolicySpec::Checkpoint(step.canonicalize()?)),
            None => anyhow::bail!(
                "{arg}: not `base`, a checkpoint folder (with meta.json) or a run folder with \
                 checkpoints/"
            ),
        }
    }

    fn name(&self) -> String {
        match self {
            PolicySpec::Base => "base".into(),
            PolicySpec::Checkpoint(p) => p.display().to_string(),
        }
    }
}

/// Which rows of the data file are tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Split {
    Val,
    Train,
    All,
}

impl Split {
    fn keeps(self, row: &Value) -> bool {
        let val = row.get("split").and_then(Value::as_str) == Some("val");
        match self {
            Split::Val => val,
            Split::Train => !val,
            Split::All => true,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Split::Val => "val",
            Split::Train => "train",
            Split::All => "all",
        }
    }
}

/// What the command line asks for.
#[derive(Debug, Clone)]
pub struct EvalOptions {
    /// The data file (default: run.data).
    pub data: Option<PathBuf>,
    /// Default: `val` of run.data, `all` of a named file.
    pub split: Option<Split>,
    /// At most this many tasks (the first ones).
    pub limit: Option<usize>,
    /// Samples per task.
    pub k: usize,
    /// Evaluated in this order (`base` first whatever the order, so the
    /// engine never has to go back to it).
    pub policies: Vec<PolicySpec>,
    /// The reward plugin (default: plugins.reward, else the harness's own
    /// `reward` event).
    pub reward: Option<PathBuf>,
    /// A sample passes when its reward is at least this.
    pub pass_threshold: f64,
    /// The sampling temperature (sets gateway.val_temperature; with a
    /// remote gateway its own setting holds).
    pub temperature: Option<f64>,
    /// Where the store, the log and `eval.json` go (default
    /// `<run.out_dir>/eval-<unix time>`).
    pub out_dir: Option<PathBuf>,
}

/// The tasks: the selected rows, each with its name.
struct Tasks {
    data: PathBuf,
    split: Split,
    rows: Vec<(String, Value)>,
}

fn task_name(row: &Value, index: usize) -> String {
    ["instance_id", "id", "task_id"]
        .iter()
        .find_map(|k| match row.get(*k) {
            Some(Value::String(s)) => Some(s.clone()),
            Some(Value::Number(n)) => Some(n.to_string()),
            _ => None,
        })
        .unwrap_or_else(|| format!("#{index}"))
}

fn tasks(config: &Config, opts: &EvalOptions) -> anyhow::Result<Tasks> {
    let (data, split) = match &opts.data {
        Some(path) => (path.clone(), opts.split.unwrap_or(Split::All)),
        None => (
            config
                .run
                .data
                .clone()
                .context("no data: pass --data or set run.data")?,
            opts.split.unwrap_or(Split::Val),
        ),
    };
    let rows: Vec<(String, Value)> = read_rows(&data)?
        .into_iter()
        .enumerate()
        .filter(|(_, row)| split.keeps(row))
        .map(|(i, row)| (task_name(&row, i), row))
        .take(opts.limit.unwrap_or(usize::MAX))
        .collect();
    anyhow::ensure!(
        !rows.is_empty(),
        "{}: no {} rows to evaluate",
        data.display(),
        split.name()
    );
    Ok(Tasks { data, split, rows })
}

fn check(config: &Config, opts: &EvalOptions) -> anyhow::Result<()> {
    anyhow::ensure!(opts.k >= 1, "--k must be at least 1");
    anyhow::ensure!(!opts.policies.is_empty(), "no policy to evaluate");
    let checkpoints = opts
        .policies
        .iter()
        .any(|p| matches!(p, PolicySpec::Checkpoint(_)));
    anyhow::ensure!(
        !(checkpoints && config.engine.kind == EngineKind::External),
        "engine.kind = \"external\" keeps its weights: agl cannot load a checkpoint into it \
         (use vllm, sglang, agl or the embedded engine)"
    );
    Ok(())
}

/// The folder of this evaluation, created 0700 (it holds prompts and
/// answers) with the log opened in it.
fn folder(config: &Config, opts: &EvalOptions) -> anyhow::Result<PathBuf> {
    let dir = match &opts.out_dir {
        Some(d) => d.clone(),
        None => {
            let secs = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            config.run.out_dir().join(format!("eval-{secs}"))
        }
    };
    anyhow::ensure!(
        !dir.join("eval.json").exists() && !dir.join("agl.db").exists(),
        "{} already holds an evaluation: choose another --out",
        dir.display()
    );
    checkpoint::create_private_dir_all(&dir)
        .with_context(|| format!("creating {}", dir.display()))?;
    let dir = dir.canonicalize()?;
    crate::logfile::open(&dir.join("agl.log"))?;
    Ok(dir)
}

async fn reward_plugin(config: &Config, opts: &EvalOptions) -> anyhow::Result<Option<Plugin>> {
    let Some(path) = opts
        .reward
        .clone()
        .or_else(|| config.plugins.reward.clone())
    else {
        return Ok(None);
    };
    let tokenizer = assembly::tokenizer(config)?;
    Ok(Some(
        assembly::plugin(config, &path, World::Reward, tokenizer).await?,
    ))
}

/// What both entry points set up first: the checks, the tasks, the
/// evaluation's folder and the reward plugin.
async fn prepare(
    config: &Config,
    opts: &EvalOptions,
) -> anyhow::Result<(Tasks, PathBuf, Option<Plugin>)> {
    check(config, opts)?;
    let tasks = tasks(config, opts)?;
    let dir = folder(config, opts)?;
    let reward = reward_plugin(config, opts).await?;
    Ok((tasks, dir, reward))
}

/// `agl eval` in one process: its own store, gateway, controller and (as
/// `[engine]` says) embedded engine.
pub async fn eval(
    mut config: Config,
    opts: EvalOptions,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<(PathBuf, EvalReport)> {
    if let Some(t) = opts.temperature {
        config.gateway.val_temperature = t;
    }
    let (tasks, dir, reward) = prepare(&config, &opts).await?;
    let store = assembly::store(&config, &dir.join("agl.db"))?;
    let bound = assembly::gateway(
        &config,
        store.clone(),
        GatewayParts {
            run_dir: dir.clone(),
            ..GatewayParts::default()
        },
    )
    .await?;
    let link: Arc<dyn Link> = Arc::new(Local {
        store,
        control: bound.gateway.control(),
    });
    let policy = start_policy(&config, &dir, Some(&bound.gateway), &link).await?;
    let serving = LocalServing::start(bound, &config, shutdown)?;
    println!(
        "agl eval: gateway {} · log {}",
        serving.base,
        dir.join("agl.log").display()
    );
    let evaluation = Evaluation {
        config: &config,
        opts: &opts,
        link: &link,
        policy: &policy,
        reward: reward.as_ref(),
        id_prefix: "",
        temperature: Some(config.gateway.val_temperature),
    };
    let report = evaluation.run(&tasks, &serving.stop).await;
    serving.stop().await;
    finish(&dir, report?).map(|r| (dir, r))
}

/// `agl eval --gateway URL`: the rollouts through a gateway that runs
/// elsewhere (`agl serve`, agents by `agl controller`), the policy's
/// weights loaded into the engine behind it.
pub async fn eval_remote(
    config: Config,
    opts: EvalOptions,
    gateway: GatewayClient,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<(PathBuf, EvalReport)> {
    if opts.temperature.is_some() {
        tracing::warn!(
            "--temperature: a remote gateway samples at its own gateway.val_temperature"
        );
    }
    let (tasks, dir, reward) = prepare(&config, &opts).await?;
    let link: Arc<dyn Link> = Arc::new(gateway);
    let policy = start_policy(&config, &dir, None, &link).await?;
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    let prefix = format!(
        "{}-",
        dir.file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned())
    );
    let evaluation = Evaluation {
        config: &config,
        opts: &opts,
        link: &link,
        policy: &policy,
        reward: reward.as_ref(),
        id_prefix: &prefix,
        temperature: None,
    };
    let report = evaluation.run(&tasks, &stop).await?;
    finish(&dir, report).map(|r| (dir, r))
}

async fn start_policy(
    config: &Config,
    dir: &Path,
    gateway: Option<&agl_gateway::Gateway>,
    link: &Arc<dyn Link>,
) -> anyhow::Result<Policy> {
    let model_dir = assembly::model_dir(config)?;
    Policy::start(
        &config.engine,
        (&model_dir, config.model.kind()),
        dir,
        (gateway, link),
        config.train.lora.is_some(),
    )
    .await
}

/// Writes `eval.json` into the folder.
fn finish(dir: &Path, report: EvalReport) -> anyhow::Result<EvalReport> {
    let path = dir.join("eval.json");
    std::fs::write(&path, serde_json::to_string_pretty(&report)? + "\n")
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(report)
}

struct Evaluation<'a> {
    config: &'a Config,
    opts: &'a EvalOptions,
    link: &'a Arc<dyn Link>,
    policy: &'a Policy,
    reward: Option<&'a Plugin>,
    /// Before every rollout id: a gateway that serves other runs never
    /// mixes theirs in.
    id_prefix: &'a str,
    temperature: Option<f64>,
}

impl Evaluation<'_> {
    async fn run(
        &self,
        tasks: &Tasks,
        stop: &tokio::sync::watch::Receiver<bool>,
    ) -> anyhow::Result<EvalReport> {
        let model_dir = assembly::model_dir(self.config)?;
        // The engine serves the base at first (embedded) or whatever it
        // was last given (a server): base goes first, and a server gets
        // the base loaded like any checkpoint.
        let mut order: Vec<usize> = (0..self.opts.policies.len()).collect();
        order.sort_by_key(|&i| self.opts.policies[i] != PolicySpec::Base);
        let embedded = self.config.engine.kind == EngineKind::Embedded;
        let needs_trainer = self
            .opts
            .policies
            .iter()
            .any(|p| *p != PolicySpec::Base || !embedded)
            && self.config.engine.kind != EngineKind::External;
        let trainer = match needs_trainer {
            true => {
                Some(Trainer::start(assembly::trainer_spec(self.config, &model_dir, false)).await?)
            }
            false => None,
        };
        let mut version = self.link.latest_version().await?;
        let mut results: Vec<Option<PolicyResult>> = vec![None; order.len()];
        for (n, &i) in order.iter().enumerate() {
            let spec = &self.opts.policies[i];
            let v = match (version, &trainer) {
                // The embedded engine starts on the base as version 0.
                (None, _) if *spec == PolicySpec::Base && embedded => 0,
                (None, None) => 0,
                (last, Some(trainer)) => {
                    let v = last.map_or(0, |v| v + 1);
                    if let PolicySpec::Checkpoint(path) = spec {
                        trainer.restore(path).await?;
                    }
                    self.policy.update(trainer, v, InFlight::Abort).await?;
                    v
                }
                (Some(v), None) => v,
            };
            if version != Some(v) {
                let meta = serde_json::json!({"eval": spec.name()});
                self.link.record_version(v, &meta).await?;
                version = Some(v);
            }
            let result = self.one_policy(n, spec, v, tasks, stop).await?;
            results[i] = Some(result);
        }
        Ok(EvalReport {
            data: tasks.data.display().to_string(),
            split: tasks.split.name().into(),
            k: self.opts.k,
            pass_threshold: self.opts.pass_threshold,
            temperature: self.temperature,
            policies: results.into_iter().flatten().collect(),
        })
    }

    /// Every task `k` times under the weights the engine serves now.
    async fn one_policy(
        &self,
        n: usize,
        spec: &PolicySpec,
        version: u64,
        tasks: &Tasks,
        stop: &tokio::sync::watch::Receiver<bool>,
    ) -> anyhow::Result<PolicyResult> {
        let mut batch = Vec::new();
        for (t, (_, row)) in tasks.rows.iter().enumerate() {
            let group = format!("{}eval{n}-t{t:05}", self.id_prefix);
            for s in 0..self.opts.k {
                batch.push(NewRollout {
                    id: Some(format!("{group}-s{s}")),
                    group_id: group.clone(),
                    mode: Mode::Val,
                    input: JsonText::from(row),
                    config: JsonText::default(),
                });
            }
        }
        let link = self.link.as_ref();
        let set = RolloutSet::launch(link, batch).await?;
        let ids = set.ids();
        let bar = progress(ids.len() as u64, &spec.name());
        let mut seen = 0;
        let ended = set.wait(link, &mut seen, stop, |n| bar.set_position(n as u64));
        if !ended.await? {
            bar.abandon();
            set.cancel(link).await;
            anyhow::bail!("stopped before every rollout ended");
        }
        bar.finish_and_clear();
        let mut results = Vec::with_capacity(tasks.rows.len());
        for (t, (name, _)) in tasks.rows.iter().enumerate() {
            let ids = &ids[t * self.opts.k..(t + 1) * self.opts.k];
            results.push(self.task(name, ids).await?);
        }
        let result = PolicyResult::new(spec.name(), version, self.opts.k, results);
        tracing::info!(policy = %spec.name(), version, pass_at = ?result.pass_at, "evaluated");
        Ok(result)
    }

    async fn task(&self, name: &str, ids: &[String]) -> anyhow::Result<TaskResult> {
        let (mut rewards, mut excluded) = (Vec::new(), 0);
        for id in ids {
            match scored(self.link.as_ref(), self.reward, id).await? {
                Some((r, _)) => rewards.push(r),
                None => excluded += 1,
            }
        }
        let samples = rewards.len();
        Ok(TaskResult {
            task: name.to_owned(),
            samples,
            passed: rewards
                .iter()
                .filter(|r| **r >= self.opts.pass_threshold)
                .count(),
            excluded,
            mean_reward: (samples > 0).then(|| rewards.iter().sum::<f64>() / samples as f64),
            rollouts: ids.to_vec(),
        })
    }
}

fn progress(len: u64, policy: &str) -> indicatif::ProgressBar {
    if !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(len);
    if let Ok(style) =
        indicatif::ProgressStyle::with_template("{msg} {bar:30} {pos}/{len} rollouts {elapsed}")
    {
        bar.set_style(style);
    }
    bar.set_message(format!("eval {policy}"));
    bar
}
