//! Training: [`run`] (`agl run`: gateway, engine, controller, plugin host
//! and trainer in one process) and [`train`] (`agl train`: the trainer
//! alone, against a gateway that runs elsewhere). Both set up the same
//! parts (`session.rs`: the run folder, plugins, policy engine, trainer and
//! what a checkpoint restores) and hand them to the same loop
//! ([`driver::Driver`]); they differ only in how the loop reaches the
//! gateway side ([`crate::link::Link`]) (ARCHITECTURE.md, Training).

pub mod collect;
pub mod data;
mod driver;
pub mod report;
mod session;

use std::path::PathBuf;
use std::sync::Arc;

use agl_client::GatewayClient;
use agl_controller::run_controller;

use crate::assembly::{self, GatewayParts};
use crate::config::Config;
use crate::link::{Link, Local};
use crate::viewer::Viewer;
use session::{RunFolder, Session};

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

/// `agl run`: the whole system in this process, its store in the run
/// folder.
pub async fn run(
    config: Config,
    opts: RunOptions,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<RunFinished> {
    let folder = RunFolder::open(&config, opts.resume, true)?;
    let store = assembly::store(&config, &folder.db())?;
    let (plugins, tokenizer) = session::plugins(&config, &opts, &folder).await?;
    let gauges = Arc::new(report::TrainerGauges::new());
    let bound = assembly::gateway(
        &config,
        store.clone(),
        GatewayParts {
            listen: None,
            run_dir: folder.out_dir.clone(),
            viewer: Some(Viewer {
                plugins: plugins.clone(),
                tokenizer,
            }),
            plugin_admin: Some(plugins.clone()),
            metrics: Some(gauges.clone()),
        },
    )
    .await?;
    let link: Arc<dyn Link> = Arc::new(Local {
        store,
        control: bound.gateway.control(),
    });
    let session = Session {
        config: &config,
        folder: &folder,
        resume: opts.resume,
        plugins,
        gauges,
        link,
        // The store is the run's own.
        id_prefix: String::new(),
    };
    let driver = session.start(Some(&bound.gateway)).await?;

    let serving = LocalServing::start(bound, &config, shutdown)?;
    println!(
        "agl run: gateway {} · viewer {}/ui · log {}",
        serving.base,
        serving.base,
        folder.log().display()
    );
    let finished = session::drive(driver, &folder, &serving.stop).await;
    serving.stop().await;
    finished
}

/// The gateway serving and the controller running agents, in this process
/// (`agl run`, `agl eval`): `stop` is set on shutdown, and [`Self::stop`]
/// ends both.
pub struct LocalServing {
    /// `http://ADDR` of the gateway.
    pub base: String,
    /// Set when the process is asked to stop.
    pub stop: tokio::sync::watch::Receiver<bool>,
    stop_tx: tokio::sync::watch::Sender<bool>,
    gateway_stop: tokio::sync::watch::Sender<bool>,
    serving: tokio::task::JoinHandle<std::io::Result<()>>,
    controller: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl LocalServing {
    pub fn start(
        bound: assembly::BoundGateway,
        config: &Config,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<LocalServing> {
        let (stop_tx, stop) = tokio::sync::watch::channel(false);
        let wait = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|s| *s).await;
        };
        let (gateway_stop, gw_stop_rx) = tokio::sync::watch::channel(false);
        let base = bound.base.clone();
        let serving = tokio::spawn(bound.gateway.serve(bound.listener, wait(gw_stop_rx)));
        tracing::info!(url = %base, "gateway listening");
        let client = GatewayClient::new(&base, bound.admin_key)?;
        let controller = tokio::spawn(run_controller(
            client,
            config.controller.clone(),
            wait(stop.clone()),
        ));
        on_shutdown(shutdown, stop_tx.clone());
        Ok(LocalServing {
            base,
            stop,
            stop_tx,
            gateway_stop,
            serving,
            controller,
        })
    }

    /// Stops the controller (its agents are stopped), then the gateway.
    pub async fn stop(self) {
        let _ = self.stop_tx.send(true);
        match self.controller.await {
            Ok(Err(e)) => tracing::warn!(error = %e, "controller stopped with an error"),
            Err(e) => tracing::warn!(error = %e, "controller task failed"),
            Ok(Ok(())) => {}
        }
        let _ = self.gateway_stop.send(true);
        if let Ok(Err(e)) = self.serving.await {
            tracing::warn!(error = %e, "gateway stopped with an error");
        }
    }
}

/// `agl train`: the trainer against the gateway `gateway` reaches (`agl
/// serve`, with `agl controller` running the agents): it launches groups
/// and validation rollouts through the management API, exports and scores
/// them here, trains, and publishes each update to the engine behind the
/// gateway's pause and drain.
pub async fn train(
    config: Config,
    opts: RunOptions,
    gateway: GatewayClient,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<RunFinished> {
    let folder = RunFolder::open(&config, opts.resume, false)?;
    let (plugins, _) = session::plugins(&config, &opts, &folder).await?;
    let url = gateway.base().to_owned();
    let session = Session {
        config: &config,
        folder: &folder,
        resume: opts.resume,
        plugins,
        gauges: Arc::new(report::TrainerGauges::new()),
        link: Arc::new(gateway),
        id_prefix: folder.id_prefix(),
    };
    let driver = session.start(None).await?;
    println!("agl train: gateway {url} · log {}", folder.log().display());
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    on_shutdown(shutdown, stop_tx);
    session::drive(driver, &folder, &stop_rx).await
}

/// Sets `stop` when `shutdown` resolves: no new rollouts, in-flight agents
/// are stopped.
fn on_shutdown(
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    stop: tokio::sync::watch::Sender<bool>,
) {
    tokio::spawn(async move {
        shutdown.await;
        tracing::info!("stopping: no new rollouts, in-flight agents are stopped");
        let _ = stop.send(true);
    });
}
