//! `agl serve`: the gateway over the store, until ctrl-c or SIGTERM.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::Args;

use agl::config::Config;
use agl::run::plugins::Plugins;
use agl::run::tokenizer_for;
use agl::run::viewer::Viewer;
use agl_gateway::Gateway;
use agl_store::{DEFAULT_FILE, Store};

#[derive(Args)]
pub struct ServeArgs {
    /// Address to bind (default: gateway.listen from the config, 127.0.0.1:8400).
    #[arg(long)]
    listen: Option<String>,
    /// The store file.
    #[arg(long, default_value = DEFAULT_FILE)]
    db: PathBuf,
}

pub fn run(args: ServeArgs, config: Config) -> anyhow::Result<ExitCode> {
    let rt = super::runtime()?;
    rt.block_on(serve(args, config))?;
    Ok(ExitCode::SUCCESS)
}

async fn serve(args: ServeArgs, config: Config) -> anyhow::Result<()> {
    let mut gw = config.gateway.clone().with_env();
    if let Some(listen) = args.listen {
        gw.listen = listen;
    }
    let store = Store::open_with(&args.db, config.store.durability)
        .with_context(|| format!("opening {}", args.db.display()))?;
    let listener = tokio::net::TcpListener::bind(&gw.listen)
        .await
        .with_context(|| format!("cannot listen on {}", gw.listen))?;
    let addr = listener.local_addr()?;
    // Port 0 binds a free port: proxy URLs must name the real one.
    gw.listen = addr.to_string();
    tracing::info!(url = %format!("http://{addr}"), db = %args.db.display(), "agl gateway listening");
    // The run folder the store is in: its metrics.jsonl and, with
    // plugins.adapter set, its samples are what /ui shows.
    let run_dir = args
        .db
        .parent()
        .map(std::path::Path::to_path_buf)
        .unwrap_or_default();
    let mut gateway = Gateway::new(store, gw).with_metrics_file(run_dir.join("metrics.jsonl"));
    if let Some(viewer) = viewer(&config, &run_dir).await? {
        gateway = gateway.with_sample_viewer(Arc::new(viewer));
    }
    tracing::info!(url = %format!("http://{addr}/ui"), "rollout viewer");
    gateway
        .serve(listener, shutdown_signal())
        .await
        .context("gateway stopped")?;
    tracing::info!("agl gateway stopped");
    Ok(())
}

/// The sample viewer of `plugins.adapter` (and `plugins.reward`), decoding
/// with the tokenizer of `model.path` (or `model.tokenizer`), when set.
async fn viewer(config: &Config, run_dir: &Path) -> anyhow::Result<Option<Viewer>> {
    let Some(adapter) = &config.plugins.adapter else {
        return Ok(None);
    };
    let tokenizer = match &config.model.path {
        Some(dir) => tokenizer_for(config, dir)?,
        None => None,
    };
    let plugins = Plugins::load(
        config,
        adapter,
        config.plugins.reward.as_deref(),
        tokenizer.clone(),
        run_dir.join("plugins"),
    )
    .await
    .context("loading the viewer's plugins")?;
    Ok(Some(Viewer {
        plugins: Arc::new(plugins),
        tokenizer,
    }))
}

pub(super) async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::warn!(error = %e, "cannot listen for ctrl-c");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
    tracing::info!("shutting down");
}
