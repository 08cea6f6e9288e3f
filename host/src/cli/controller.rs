//! `agl controller`: runs agents for the rollouts queued in a gateway's
//! store until ctrl-c or SIGTERM.

use std::process::ExitCode;

use anyhow::Context;
use clap::Args;

use agl::config::Config;
use agl::controller::kube::KubeRunner;
use agl::controller::{Controller, GatewayClient, K8sRunner, LocalRunner, RunnerKind};

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
    super::runtime()?.block_on(async move {
        match config.controller.runner {
            RunnerKind::Local => {
                let runner = LocalRunner::new(&config.controller)?;
                Controller::new(client, runner, config.controller)
                    .run(shutdown)
                    .await;
            }
            RunnerKind::K8s => {
                // kubeconfig, or the pod's service account in a cluster.
                let kube = kube::Client::try_default()
                    .await
                    .context("connecting to the Kubernetes API")?;
                let jobs = KubeRunner::new(kube, config.controller.kube.clone()).await?;
                let runner = K8sRunner::new(jobs, config.controller.timeout_secs);
                Controller::new(client, runner, config.controller)
                    .run(shutdown)
                    .await;
            }
        }
        anyhow::Ok(())
    })?;
    Ok(ExitCode::SUCCESS)
}
