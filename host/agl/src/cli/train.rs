//! `agl train`: the trainer as its own process, against a running gateway
//! (`agl serve`, agents run by `agl controller`, the policy served by `agl
//! engine serve` or vLLM / SGLang).

use std::process::ExitCode;

use anyhow::Context;
use clap::Args;

use agl::config::Config;
use agl_client::GatewayClient;

#[derive(Args)]
pub struct TrainArgs {
    /// The gateway's base URL (`agl serve`), e.g. http://127.0.0.1:8400.
    #[arg(long)]
    gateway: String,
    /// Management API key (default: gateway.admin_key, then $AGL_ADMIN_KEY).
    #[arg(long)]
    admin_key: Option<String>,
    /// The plugins and `--resume`, as `agl run` takes them.
    #[command(flatten)]
    run: super::run::RunArgs,
}

pub fn run(args: TrainArgs, config: Config) -> anyhow::Result<ExitCode> {
    let admin_key = args
        .admin_key
        .or_else(|| config.gateway.clone().with_env().admin_key);
    let client =
        GatewayClient::new(&args.gateway, admin_key).context("building the HTTP client")?;
    let finished = super::runtime()?.block_on(agl::run::train(
        config,
        args.run.options(),
        client,
        super::serve::shutdown_signal(),
    ))?;
    println!(
        "run finished after {} steps: {}",
        finished.steps,
        finished.out_dir.display()
    );
    Ok(ExitCode::SUCCESS)
}
