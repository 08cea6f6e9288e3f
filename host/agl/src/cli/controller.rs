//! `agl controller`: runs agents for the rollouts queued in a gateway's
//! store until ctrl-c or SIGTERM; `--dry-run` prints the Kubernetes Job it
//! would create for one rollout instead.

use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use serde_json::Value;

use agl::config::Config;
use agl_controller::{GatewayClient, RunnerKind, dry_run_job, run_controller};
use agl_wire::api::RolloutView;
use agl_wire::rollout::{JsonText, Mode, RolloutStatus};
use agl_wire::urls;

#[derive(Args)]
pub struct ControllerArgs {
    /// The gateway's base URL (`agl serve`), e.g. http://127.0.0.1:8400.
    #[arg(long, required_unless_present = "dry_run")]
    gateway: Option<String>,
    /// Management API key (default: gateway.admin_key, then $AGL_ADMIN_KEY).
    #[arg(long)]
    admin_key: Option<String>,
    /// Where agents run (default: controller.runner from the config, local).
    #[arg(long, value_enum)]
    runner: Option<RunnerKind>,
    /// Print the Job `--runner k8s` would create for a rollout (JSON, which
    /// kubectl and kubernetes-validate read as YAML) and exit: rollout
    /// `--rollout` as the gateway serves it, or, without `--gateway`, a
    /// sample rollout of `--input` (default: run.data's first row).
    #[arg(long)]
    dry_run: bool,
    /// The rollout of `--dry-run` (with `--gateway`: one in its store).
    #[arg(long, requires = "dry_run")]
    rollout: Option<String>,
    /// The sample rollout's input (JSON) for `--dry-run` without `--gateway`.
    #[arg(long, requires = "dry_run", conflicts_with = "gateway")]
    input: Option<String>,
}

pub fn run(args: ControllerArgs, mut config: Config) -> anyhow::Result<ExitCode> {
    if let Some(runner) = args.runner {
        config.controller.runner = runner;
    }
    let admin_key = args
        .admin_key
        .or_else(|| config.gateway.clone().with_env().admin_key);
    let client = match &args.gateway {
        Some(url) => Some(GatewayClient::new(url, admin_key).context("building the HTTP client")?),
        None => None,
    };
    if args.dry_run {
        anyhow::ensure!(
            config.controller.runner == RunnerKind::K8s,
            "--dry-run shows a Kubernetes Job: pass --runner k8s (or set controller.runner = \"k8s\")"
        );
        let rollout = match client {
            Some(client) => {
                let id = args
                    .rollout
                    .context("--dry-run with --gateway needs --rollout ID")?;
                super::runtime()?.block_on(client.get(&id))?
            }
            None => sample_rollout(&config, args.rollout, args.input)?,
        };
        let job = dry_run_job(&rollout, &config.controller)?;
        println!("{}", serde_json::to_string_pretty(&job)?);
        return Ok(ExitCode::SUCCESS);
    }
    let Some(client) = client else {
        anyhow::bail!("--gateway is required");
    };
    let shutdown = super::serve::shutdown_signal();
    super::runtime()?.block_on(run_controller(client, config.controller, shutdown))?;
    Ok(ExitCode::SUCCESS)
}

/// A queued first attempt of rollout `id` (default `dry-run`) with `input`
/// (default: the first row of run.data), its URLs on the gateway the config
/// describes (`gateway.public_base_url`, else `http://<gateway.listen>`)
/// and a placeholder where its token would be.
fn sample_rollout(
    config: &Config,
    id: Option<String>,
    input: Option<String>,
) -> anyhow::Result<RolloutView> {
    let input: Value = match input {
        Some(text) => serde_json::from_str(&text).context("--input is not JSON")?,
        None => {
            let data = config
                .run
                .data
                .clone()
                .context("no sample input: pass --input JSON or set run.data")?;
            agl::run::data::read_rows(&data)?
                .into_iter()
                .next()
                .with_context(|| format!("{} has no rows", data.display()))?
        }
    };
    let id = id.unwrap_or_else(|| "dry-run".into());
    urls::check_rollout_id(&id).map_err(anyhow::Error::msg)?;
    let base = config
        .gateway
        .public_base_url
        .clone()
        .unwrap_or_else(|| format!("http://{}", config.gateway.listen));
    Ok(RolloutView {
        group_id: id.clone(),
        mode: Mode::Train,
        status: RolloutStatus::Queued,
        attempt: 1,
        reason: None,
        failure: None,
        input: JsonText::from(&input),
        config: JsonText::default(),
        created_ms: 0,
        updated_ms: 0,
        proxy_base_url: urls::proxy_base_url(&base, &id, 1, Mode::Train),
        anthropic_base_url: urls::anthropic_base_url(&base, &id, 1, Mode::Train),
        events_url: urls::events_url(&base, &id),
        token: "<the attempt's rollout token>".into(),
        calls: None,
        id,
    })
}
