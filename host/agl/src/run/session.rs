//! What `agl run` and `agl train` set up alike: the run folder, the
//! plugins, the policy engine, the trainer, and where a checkpoint says the
//! loop resumes; then the loop itself and the report at its end.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;

use agl_gateway::Gateway;
use agl_rl::checkpoint;
use agl_tokenizer::Tokenizer;

use super::data::Dataset;
use super::driver::{Driver, HostState, Parts, Start};
use super::report::{self, Export, ExportStart, MetricsLog, Progress, TrainerGauges};
use super::{RunFinished, RunOptions};
use crate::assembly;
use crate::config::Config;
use crate::link::Link;
use crate::plugins::Plugins;
use crate::policy::Policy;
use agl_rl::Trainer;

/// The run folder (`run.out_dir`), absolute: an external engine loads new
/// weights from paths under it.
pub struct RunFolder {
    pub out_dir: PathBuf,
}

/// `[run] in_flight = "continue"` needs an engine that keeps its requests
/// across an update under the same model name.
fn check_in_flight(config: &Config) -> anyhow::Result<()> {
    use crate::config::{EngineKind, InFlightMode, PauseMode};
    let engine = &config.engine;
    let external = matches!(engine.kind, EngineKind::Vllm | EngineKind::Sglang);
    if config.run.in_flight != InFlightMode::Continue || !external {
        return Ok(());
    }
    anyhow::ensure!(
        engine.pause_mode == PauseMode::Keep,
        "[run] in_flight = \"continue\" keeps calls running across an update, but \
         engine.pause_mode = \"abort\" ends them: set pause_mode = \"keep\" or in_flight = \"drain\""
    );
    anyhow::ensure!(
        config.train.lora.is_none(),
        "[run] in_flight = \"continue\" with [train.lora] on {:?}: calls in flight use the \
         previous adapter, which the update unloads; use in_flight = \"drain\"",
        engine.kind
    );
    Ok(())
}

impl RunFolder {
    /// Checks the config, creates the folder (0700: it holds prompts,
    /// responses and weights) and opens the run's log in it. A folder that
    /// holds a run needs `resume`; `resume` needs one. `with_store`: the
    /// run's store lives here too (`agl run`).
    pub fn open(config: &Config, resume: bool, with_store: bool) -> anyhow::Result<RunFolder> {
        config
            .run
            .validate()
            .map_err(|e| anyhow::anyhow!("[run]: {e}"))?;
        config
            .train
            .check()
            .map_err(|e| anyhow::anyhow!("[train]: {e}"))?;
        check_in_flight(config)?;
        if let Some(lora) = &config.train.lora {
            lora.check()
                .map_err(|e| anyhow::anyhow!("[train.lora]: {e}"))?;
        }
        let out_dir = config.run.out_dir();
        // What marks a run: its store (`agl run`) or its metrics (`agl train`).
        let marker = match with_store {
            true => out_dir.join("agl.db"),
            false => out_dir.join("metrics.jsonl"),
        };
        if resume {
            anyhow::ensure!(
                marker.exists(),
                "nothing to resume in {}: no {}",
                out_dir.display(),
                marker
                    .file_name()
                    .map_or_else(String::new, |n| n.to_string_lossy().into())
            );
        } else {
            anyhow::ensure!(
                !marker.exists(),
                "{} already holds a run: pass --resume to continue it, or choose another \
                 run.out_dir",
                out_dir.display()
            );
        }
        checkpoint::create_private_dir_all(&out_dir)
            .with_context(|| format!("creating {}", out_dir.display()))?;
        let out_dir = out_dir
            .canonicalize()
            .with_context(|| format!("resolving {}", out_dir.display()))?;
        let folder = RunFolder { out_dir };
        crate::logfile::open(&folder.log())
            .with_context(|| format!("opening the run's log {}", folder.log().display()))?;
        Ok(folder)
    }

    pub fn db(&self) -> PathBuf {
        self.out_dir.join("agl.db")
    }

    /// The run's name as a rollout-id prefix (`<folder name>-`, only the
    /// characters ids may hold): what tells its rollouts apart in a
    /// gateway that serves more than one run.
    pub fn id_prefix(&self) -> String {
        let name = self
            .out_dir
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        let name: String = name
            .chars()
            .map(|c| match c {
                'A'..='Z' | 'a'..='z' | '0'..='9' | '.' | '_' | '-' => c,
                _ => '_',
            })
            .take(64)
            .collect();
        format!("{name}-")
    }

    pub fn log(&self) -> PathBuf {
        self.out_dir.join("agl.log")
    }

    fn metrics(&self) -> PathBuf {
        self.out_dir.join("metrics.jsonl")
    }

    fn checkpoints(&self) -> PathBuf {
        self.out_dir.join("checkpoints")
    }
}

/// The run's plugins (the command line's, else the config's) and the
/// policy's tokenizer they decode with.
pub async fn plugins(
    config: &Config,
    opts: &RunOptions,
    folder: &RunFolder,
) -> anyhow::Result<(Arc<Plugins>, Option<Arc<Tokenizer>>)> {
    let adapter = opts
        .adapter
        .clone()
        .or_else(|| config.plugins.adapter.clone())
        .context("no sample-adapter plugin: pass --plugin or set plugins.adapter")?;
    let reward = opts
        .reward
        .clone()
        .or_else(|| config.plugins.reward.clone());
    let tokenizer = assembly::tokenizer(config)?;
    let plugins = assembly::plugins(
        config,
        &adapter,
        reward.as_deref(),
        tokenizer.clone(),
        folder.out_dir.join("plugins"),
    )
    .await?;
    Ok((Arc::new(plugins), tokenizer))
}

/// What the loop is built from.
pub struct Session<'a> {
    pub config: &'a Config,
    pub folder: &'a RunFolder,
    pub resume: bool,
    pub plugins: Arc<Plugins>,
    pub gauges: Arc<TrainerGauges>,
    pub link: Arc<dyn Link>,
    /// Before every rollout id (see `driver::Parts::id_prefix`).
    pub id_prefix: String,
}

impl Session<'_> {
    /// Starts the policy engine (inside `gateway` when it is this
    /// process's) and the trainer, restores the newest checkpoint when
    /// resuming, records the weight version the engine now serves, and
    /// builds the loop.
    pub async fn start(self, gateway: Option<&Gateway>) -> anyhow::Result<Driver> {
        let config = self.config;
        let cfg = &config.run;
        let model_dir = assembly::model_dir(config)?;
        let data = Dataset::load(&cfg.data.clone().context("run.data is required")?)?;
        let policy = Policy::start(
            &config.engine,
            (&model_dir, config.model.kind()),
            &self.folder.out_dir,
            (gateway, &self.link),
            config.train.lora.is_some(),
        )
        .await?;
        let trainer = Trainer::start(assembly::trainer_spec(config, &model_dir, true)).await?;

        let latest = checkpoint::latest_checkpoint(&self.folder.checkpoints())?;
        let recorded = self.link.latest_version().await?;
        let start = match (&latest, self.resume) {
            (Some(path), true) => {
                let meta = trainer.restore(path).await?;
                let state: HostState = serde_json::from_value(meta.host_state.clone())
                    .context("the checkpoint's host state")?;
                // Versions published after the checkpoint named weights
                // that are gone: the restored weights get a fresh number.
                let version = match recorded {
                    Some(v) if v > meta.weight_version => v + 1,
                    _ => meta.weight_version,
                };
                // Nothing of this run is in flight yet.
                policy
                    .update(&trainer, version, agl_engine::InFlight::Abort)
                    .await?;
                tracing::info!(step = meta.step, version, path = %path.display(), "resumed");
                Start {
                    step: meta.step,
                    version,
                    state,
                }
            }
            _ => Start::default(),
        };
        if recorded != Some(start.version) {
            let meta = serde_json::json!({"step": start.step, "resumed": self.resume});
            self.link.record_version(start.version, &meta).await?;
        }
        let resume_after = self.resume.then_some(start.step);
        let mut metrics = MetricsLog::open(&self.folder.metrics(), resume_after)?;
        let export = Export::start(ExportStart {
            report: &config.report,
            out_dir: &self.folder.out_dir,
            resume_after,
            config: config.export_json(),
            plugins: self.plugins.loaded(),
        });
        if let Some(export) = export {
            metrics.export_to(export);
        }
        let progress = Progress::new(cfg.steps, !cfg.progress);
        progress.resume_at(start.step);
        Driver::new(
            Parts {
                cfg: cfg.clone(),
                train: config.train.clone(),
                temperature: config.gateway.train_temperature,
                link: self.link,
                id_prefix: self.id_prefix,
                policy,
                trainer,
                plugins: self.plugins,
                data,
                metrics,
                gauges: self.gauges,
                progress,
            },
            start,
        )
    }
}

/// Runs the loop until its steps are done or `stop` is set, cancels what
/// is still in flight, ends the exports, and writes the plot and the
/// summary.
pub async fn drive(
    mut driver: Driver,
    folder: &RunFolder,
    stop: &tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<RunFinished> {
    let outcome = driver.run(stop).await;
    driver.cancel_in_flight().await;
    driver.finish_progress();
    if let Some(export) = driver.take_export() {
        close_export(export).await;
    }
    outcome?;
    finish_report(&folder.metrics(), &folder.out_dir)?;
    Ok(RunFinished {
        out_dir: folder.out_dir.clone(),
        steps: driver.step(),
    })
}

/// Waits (off the async workers) for the exports to be written; a
/// failure is a warning.
async fn close_export(export: Export) {
    match tokio::task::spawn_blocking(move || export.close()).await {
        Ok(Ok(outputs)) => outputs.iter().for_each(|line| println!("{line}")),
        Ok(Err(e)) => tracing::warn!("{e}"),
        Err(e) => tracing::warn!(error = %e, "closing the report sink"),
    }
}

/// The plot and the summary table from the metrics file.
fn finish_report(metrics_path: &Path, out_dir: &Path) -> anyhow::Result<()> {
    let records = report::read_records(metrics_path)?;
    let png = out_dir.join("training.png");
    match report::plot(&records, &png) {
        Ok(_) => println!("plot: {}", png.display()),
        Err(e) => tracing::warn!(error = %e, "cannot draw the plot"),
    }
    println!("{}", report::summary_table(&records));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn continuing_calls_across_an_update_needs_an_engine_that_keeps_them() {
        let load = |extra: &[&str]| {
            let mut set: Vec<String> = vec!["run.in_flight=continue".into()];
            set.extend(extra.iter().map(|s| s.to_string()));
            Config::load(None, &set).unwrap()
        };
        // The embedded engine and agl's keep them whatever the rest says.
        check_in_flight(&load(&[])).unwrap();
        check_in_flight(&load(&["engine.kind=vllm"])).unwrap();
        let e =
            check_in_flight(&load(&["engine.kind=vllm", "engine.pause_mode=abort"])).unwrap_err();
        assert!(e.to_string().contains("pause_mode = \"keep\""), "{e}");
        let e = check_in_flight(&load(&["engine.kind=sglang", "train.lora.rank=8"])).unwrap_err();
        assert!(e.to_string().contains("previous adapter"), "{e}");
        // Draining is always possible.
        let drain = Config::load(
            None,
            &["engine.kind=vllm".into(), "engine.pause_mode=abort".into()],
        )
        .unwrap();
        check_in_flight(&drain).unwrap();
    }
}
