//! `agl controller`: runs agents for the rollouts queued in a gateway's
//! store until ctrl-c or SIGTERM.

use std::process::ExitCode;

use anyhow::Context;
use clap::Args;

use agl::config::Config;
use agl::controller::{Controller, GatewayClient, LocalRunner, RunnerKind};

#[derive(Args)]
pub struct ControllerArgs {
    /// The gateway's base URL (`agl serve`), e.g. http://127.0.0.1:8400.
    #[arg(long)]
    gateway: String,
    /// Management API key (default: gateway.admin_key, then $AGL_ADMIN_KEY).
    #[arg(long)]
    admin_key: Option<String>,
}

pub fn run(args: ControllerArgs, config: Config) -> anyhow::Result<ExitCode> {
    let admin_key = args
        .admin_key
        .or_else(|| config.gateway.clone().with_env().admin_key);
    let client =
        GatewayClient::new(&args.gateway, admin_key).context("building the HTTP client")?;
    let controller = match config.controller.runner {
        RunnerKind::Local => {
            let runner = LocalRunner::new(&config.controller)?;
            Controller::new(client, runner, config.controller)
        }
    };
    super::runtime()?.block_on(controller.run(super::serve::shutdown_signal()));
    Ok(ExitCode::SUCCESS)
}
