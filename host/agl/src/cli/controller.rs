//! `agl controller`: runs agents for the rollouts queued in a gateway's
//! store until ctrl-c or SIGTERM.

use std::process::ExitCode;

use anyhow::Context;
use clap::Args;

use agl::config::Config;
use agl_controller::{GatewayClient, RunnerKind, run_controller};

#[derive(Args)]
pub struct ControllerArgs {
    /// The gateway's base URL (`agl serve`), e.g. http://127.0.0.1:8400.
    #[arg(long)]
    gateway: String,
    /// Management API key (default: gateway.admin_key, then $AGL_ADMIN_KEY).
    #[arg(long)]
    admin_key: Option<String>,
    /// Where agents run (default: controller.runner from the config, local).
    #[arg(long, value_enum)]
    runner: Option<RunnerKind>,
}

pub fn run(args: ControllerArgs, mut config: Config) -> anyhow::Result<ExitCode> {
    if let Some(runner) = args.runner {
        config.controller.runner = runner;
    }
    let admin_key = args
        .admin_key
        .or_else(|| config.gateway.clone().with_env().admin_key);
    let client =
        GatewayClient::new(&args.gateway, admin_key).context("building the HTTP client")?;
    let shutdown = super::serve::shutdown_signal();
    super::runtime()?.block_on(run_controller(client, config.controller, shutdown))?;
    Ok(ExitCode::SUCCESS)
}
