//! Starting a controller from `[controller]`: the runner it names, then the
//! reconcile loop until `shutdown`. Used by `agl controller` and `agl run`.

use std::future::Future;

use anyhow::Context;

use super::kube::KubeRunner;
use super::{Controller, ControllerConfig, GatewayClient, K8sRunner, LocalRunner, RunnerKind};

pub async fn run_controller(
    client: GatewayClient,
    config: ControllerConfig,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    match config.runner {
        RunnerKind::Local => {
            let runner = LocalRunner::new(&config)?;
            Controller::new(client, runner, config).run(shutdown).await;
        }
        RunnerKind::K8s => {
            // kubeconfig, or the pod's service account in a cluster.
            let kube = kube::Client::try_default()
                .await
                .context("connecting to the Kubernetes API")?;
            let jobs = KubeRunner::new(kube, config.kube.clone()).await?;
            let runner = K8sRunner::new(jobs, config.timeout_secs);
            Controller::new(client, runner, config).run(shutdown).await;
        }
    }
    Ok(())
}
