//! `agl run`: gateway, engine, controller, plugin host and trainer in one
//! process, training the policy on a harness (ARCHITECTURE.md, Training).
//!
//! [`run`] sets the parts up (or restores them from the newest checkpoint
//! with `resume`), hands them to the [`driver::Driver`] loop, and at the end
//! stops agents still running, writes the plot and prints the summary.

pub mod collect;
pub mod config;
pub mod data;
mod driver;
pub mod plugins;
pub mod policy;
mod reload;
pub mod report;
pub mod viewer;
mod worker;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;

use agl_trainer::checkpoint;

use crate::config::Config;
use agl_controller::{GatewayClient, run_controller};
use agl_gateway::Gateway;
use agl_store::Store;
use agl_tokenizer::Tokenizer;
use data::Dataset;
use driver::{Driver, HostState};
use plugins::Plugins;
use policy::Policy;
use report::{MetricsLog, Progress, TrainerGauges};
use worker::{Trainer, TrainerSpec};

pub use config::{LoopMode, PolicyEngineConfig, RunConfig, TrainConfig};

/// What the command line adds to the config.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// The sample-adapter plugin (default: plugins.adapter).
    pub adapter: Option<PathBuf>,
    /// The reward plugin (default: plugins.reward; none = the harness's own
    /// `reward` event).
    pub reward: Option<PathBuf>,
    /// Continue from the newest checkpoint in the run folder.
    pub resume: bool,
}

/// Where a finished run left its outputs.
pub struct RunFinished {
    pub out_dir: PathBuf,
    pub steps: u64,
}

pub async fn run(
    config: Config,
    opts: RunOptions,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<RunFinished> {
    let cfg = config.run.clone();
    cfg.validate().map_err(|e| anyhow::anyhow!("[run]: {e}"))?;
    if let Some(lora) = &config.train.lora {
        lora.check()
            .map_err(|e| anyhow::anyhow!("[train.lora]: {e}"))?;
    }
    let out_dir = cfg.out_dir();
    let db = out_dir.join("agl.db");
    let root = out_dir.join("checkpoints");
    let latest = checkpoint::latest_checkpoint(&root)?;
    if opts.resume {
        anyhow::ensure!(
            db.exists(),
            "nothing to resume in {}: no agl.db",
            out_dir.display()
        );
    } else {
        anyhow::ensure!(
            !db.exists(),
            "{} already holds a run: pass --resume to continue it, or choose another run.out_dir",
            out_dir.display()
        );
    }
    // 0700: the run folder holds the store (prompts, responses) and weights.
    checkpoint::create_private_dir_all(&out_dir)
        .with_context(|| format!("creating {}", out_dir.display()))?;
    // Absolute: an external engine loads new weights from paths under it.
    let out_dir = out_dir
        .canonicalize()
        .with_context(|| format!("resolving {}", out_dir.display()))?;
    let log_path = out_dir.join("agl.log");
    crate::logfile::open(&log_path)
        .with_context(|| format!("opening the run's log {}", log_path.display()))?;
    let model_dir = config
        .model
        .path
        .clone()
        .context("model.path (a Hugging Face model folder) is required")?;
    let data_path = cfg.data.clone().context("run.data is required")?;
    let data = Dataset::load(&data_path)?;
    let adapter = opts
        .adapter
        .clone()
        .or_else(|| config.plugins.adapter.clone())
        .context("no sample-adapter plugin: pass --plugin or set plugins.adapter")?;
    let reward = opts
        .reward
        .clone()
        .or_else(|| config.plugins.reward.clone());
    let tokenizer = tokenizer_for(&config, &model_dir)?;
    let plugins = Arc::new(
        Plugins::load(
            &config,
            &adapter,
            reward.as_deref(),
            tokenizer.clone(),
            out_dir.join("plugins"),
        )
        .await?,
    );

    let store = Store::open_with(&db, config.store.durability)
        .with_context(|| format!("opening {}", db.display()))?;
    let mut gw = config.gateway.clone().with_env();
    let listener = tokio::net::TcpListener::bind(&gw.listen)
        .await
        .with_context(|| format!("cannot listen on {}", gw.listen))?;
    gw.listen = listener.local_addr()?.to_string();
    let base = format!("http://{}", gw.listen);
    let admin_key = gw.admin_key.clone();
    let temperature = gw.train_temperature;
    let gauges = Arc::new(TrainerGauges::new());
    let mut gateway = Gateway::new(store.clone(), gw)
        .with_metrics_source(gauges.clone())
        .with_plugin_admin(plugins.clone())
        .with_metrics_file(out_dir.join("metrics.jsonl"))
        .with_sample_viewer(Arc::new(viewer::Viewer {
            plugins: plugins.clone(),
            tokenizer,
        }));
    if config.engine.render == agl_wire::api::Render::Gateway {
        gateway = gateway.with_renderer(policy::configured_renderer(&model_dir, &config.engine)?);
    }
    // The embedded engine's context is its max_len (an external engine
    // answers for its own).
    if config.engine.kind == config::EngineKind::Embedded {
        gateway = gateway.with_context_len(config.engine.max_len);
    }
    let control = gateway.control();

    let kind = config.model.kind();
    let lora = config.train.lora.is_some();
    let device = tch::Device::cuda_if_available();
    let policy = Policy::start(
        &config.engine,
        &model_dir,
        kind,
        &out_dir,
        &gateway,
        &store,
        lora,
    )
    .await?;
    let trainer = Trainer::start(TrainerSpec {
        model_dir: model_dir.clone(),
        kind: tch::Kind::Float,
        device,
        adamw: config.train.adamw(),
        schedule: config.train.schedule(cfg.steps),
        lora: config.train.lora.clone(),
    })
    .await?;

    let recorded = store.latest_weight_version().await?.map(|w| w.version);
    let (step, version, state) = match (&latest, opts.resume) {
        (Some(path), true) => {
            let meta = trainer.restore(path).await?;
            let state: HostState = serde_json::from_value(meta.host_state.clone())
                .context("the checkpoint's host state")?;
            // Versions published after the checkpoint named weights that are
            // gone: the restored weights get a fresh number after them.
            let version = match recorded {
                Some(v) if v > meta.weight_version => v + 1,
                _ => meta.weight_version,
            };
            policy.update(&trainer, version).await?;
            tracing::info!(step = meta.step, version, path = %path.display(), "resumed");
            (meta.step, version, state)
        }
        _ => (0, 0, HostState::default()),
    };
    if recorded != Some(version) {
        let meta = serde_json::json!({"step": step, "resumed": opts.resume});
        store
            .record_weight_version(version, agl_wire::rollout::JsonText::from(meta))
            .await?;
    }

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let wait = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let (gw_stop_tx, gw_stop_rx) = tokio::sync::watch::channel(false);
    let serving = tokio::spawn(gateway.serve(listener, wait(gw_stop_rx)));
    tracing::info!(url = %base, out = %out_dir.display(), "agl run: gateway listening");
    tracing::info!(url = %format!("{base}/ui"), "rollout viewer");
    println!(
        "agl run: gateway {base} · viewer {base}/ui · log {}",
        log_path.display()
    );
    let client = GatewayClient::new(&base, admin_key)?;
    let controller = tokio::spawn(run_controller(
        client,
        config.controller.clone(),
        wait(stop_rx.clone()),
    ));
    {
        let stop_tx = stop_tx.clone();
        tokio::spawn(async move {
            shutdown.await;
            tracing::info!("stopping: no new rollouts, in-flight agents are stopped");
            let _ = stop_tx.send(true);
        });
    }

    let metrics_path = out_dir.join("metrics.jsonl");
    let metrics = MetricsLog::open(&metrics_path, opts.resume.then_some(step))?;
    let progress = Progress::new(cfg.steps, !cfg.progress);
    progress.resume_at(step);
    let mut driver = Driver::new(
        cfg.clone(),
        config.train.clone(),
        temperature,
        config.controller.max_system_retries,
        store.clone(),
        control,
        policy,
        trainer,
        plugins,
        data,
        metrics,
        gauges,
        progress,
        step,
        version,
        state,
    )?;
    let outcome = driver.run(&stop_rx).await;
    driver.cancel_in_flight().await;
    driver.progress.finish();
    let _ = stop_tx.send(true);
    match controller.await {
        Ok(Err(e)) => tracing::warn!(error = %e, "controller stopped with an error"),
        Err(e) => tracing::warn!(error = %e, "controller task failed"),
        Ok(Ok(())) => {}
    }
    let _ = gw_stop_tx.send(true);
    if let Ok(Err(e)) = serving.await {
        tracing::warn!(error = %e, "gateway stopped with an error");
    }
    outcome?;
    finish_report(&metrics_path, &out_dir)?;
    Ok(RunFinished {
        out_dir,
        steps: driver.step,
    })
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

pub fn tokenizer_for(config: &Config, model_dir: &Path) -> anyhow::Result<Option<Arc<Tokenizer>>> {
    let path = config
        .model
        .tokenizer
        .clone()
        .unwrap_or_else(|| model_dir.join("tokenizer.json"));
    if !path.exists() {
        return Ok(None);
    }
    Ok(Some(Arc::new(Tokenizer::from_file(&path)?)))
}
