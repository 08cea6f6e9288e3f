//! `agl serve`: the gateway over the store, until ctrl-c or SIGTERM.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;

use agl::config::Config;
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
    let mut gw = config.gateway.with_env();
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
    Gateway::new(store, gw)
        .serve(listener, shutdown_signal())
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
