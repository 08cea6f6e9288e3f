//! `agl serve`: the gateway over the store, until ctrl-c or SIGTERM.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;

use agl::assembly::{self, GatewayParts};
use agl::config::Config;
use agl_store::DEFAULT_FILE;

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
    let store = assembly::store(&config, &args.db)?;
    // The run folder the store is in: its metrics.jsonl and, with
    // plugins.adapter set, its samples are what /ui shows.
    let run_dir = args
        .db
        .parent()
        .map(std::path::Path::to_path_buf)
        .unwrap_or_default();
    let viewer = assembly::standalone_viewer(&config, &run_dir).await?;
    let bound = assembly::gateway(
        &config,
        store,
        GatewayParts {
            listen: args.listen,
            run_dir,
            viewer,
            ..GatewayParts::default()
        },
    )
    .await?;
    let base = &bound.base;
    tracing::info!(url = %base, db = %args.db.display(), "agl gateway listening");
    tracing::info!(url = %format!("{base}/ui"), "rollout viewer");
    bound
        .gateway
        .serve(bound.listener, shutdown_signal())
        .await
        .context("gateway stopped")?;
    tracing::info!("agl gateway stopped");
    Ok(())
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
