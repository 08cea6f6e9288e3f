//! `agl eval`: measure a policy (base, or checkpoints side by side) on the
//! val rows or a data file, with no training.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;

use agl::config::Config;
use agl::eval::{EvalOptions, PolicySpec, Split};
use agl_client::GatewayClient;

#[derive(Args)]
pub struct EvalArgs {
    /// A policy to evaluate: `base` (model.path), a checkpoint folder
    /// (`checkpoints/step-N`) or a run folder (its newest checkpoint).
    /// Repeat to compare them side by side (default: base).
    #[arg(long = "policy", value_name = "base|DIR")]
    policies: Vec<String>,
    /// The data file (default: run.data).
    #[arg(long)]
    data: Option<PathBuf>,
    /// Which rows are tasks (default: val of run.data, all of --data).
    #[arg(long, value_enum)]
    split: Option<Split>,
    /// Evaluate only the first N tasks.
    #[arg(long, value_name = "N")]
    limit: Option<usize>,
    /// Samples per task: pass@1 and pass@k up to k (unbiased estimator).
    #[arg(long, default_value_t = 1)]
    k: usize,
    /// A sample passes when its reward is at least this.
    #[arg(long, default_value_t = 1.0)]
    pass_threshold: f64,
    /// Sampling temperature (gateway.val_temperature, default 0: greedy;
    /// set it above 0 for k > 1).
    #[arg(long)]
    temperature: Option<f64>,
    /// The reward plugin (.wasm; default: plugins.reward, else the
    /// harness's own `reward` event).
    #[arg(long)]
    reward: Option<PathBuf>,
    /// Folder for the store, the log and eval.json (default:
    /// <run.out_dir>/eval-<unix time>).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Also write the report (JSON) here.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Run against this gateway (`agl serve`, agents by `agl controller`)
    /// instead of in this process.
    #[arg(long)]
    gateway: Option<String>,
    /// Management API key for --gateway (default: gateway.admin_key, then
    /// $AGL_ADMIN_KEY).
    #[arg(long)]
    admin_key: Option<String>,
}

pub fn run(args: EvalArgs, config: Config) -> anyhow::Result<ExitCode> {
    let policies = match args.policies.is_empty() {
        true => vec![PolicySpec::Base],
        false => args
            .policies
            .iter()
            .map(|p| PolicySpec::parse(p))
            .collect::<anyhow::Result<_>>()?,
    };
    let opts = EvalOptions {
        data: args.data,
        split: args.split,
        limit: args.limit,
        k: args.k,
        policies,
        reward: args.reward,
        pass_threshold: args.pass_threshold,
        temperature: args.temperature,
        out_dir: args.out,
    };
    if opts.k > 1 && args.temperature.unwrap_or(config.gateway.val_temperature) == 0.0 {
        eprintln!(
            "warning: --k {} at temperature 0: the samples of a task are alike",
            opts.k
        );
    }
    let runtime = super::runtime()?;
    let shutdown = super::serve::shutdown_signal();
    let (dir, report) = match args.gateway {
        Some(url) => {
            let key = args
                .admin_key
                .or_else(|| config.gateway.clone().with_env().admin_key);
            let client = GatewayClient::new(&url, key).context("building the HTTP client")?;
            runtime.block_on(agl::eval::eval_remote(config, opts, client, shutdown))?
        }
        None => runtime.block_on(agl::eval::eval(config, opts, shutdown))?,
    };
    print!("{}", report.table());
    if let Some(path) = args.json {
        std::fs::write(&path, serde_json::to_string_pretty(&report)? + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
    }
    println!("report: {}", dir.join("eval.json").display());
    Ok(ExitCode::SUCCESS)
}
