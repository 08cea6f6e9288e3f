//! `agl run`: train the policy on a harness, end to end, in one process.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use agl::config::Config;
use agl::run::RunOptions;

#[derive(Args)]
pub struct RunArgs {
    /// The sample-adapter plugin (.wasm; default: plugins.adapter).
    #[arg(long)]
    plugin: Option<PathBuf>,
    /// The reward plugin (.wasm; default: plugins.reward, else the harness's
    /// own `reward` event).
    #[arg(long)]
    reward: Option<PathBuf>,
    /// Continue the run in run.out_dir from its newest checkpoint.
    #[arg(long)]
    resume: bool,
}

impl RunArgs {
    pub fn options(self) -> RunOptions {
        RunOptions {
            adapter: self.plugin,
            reward: self.reward,
            resume: self.resume,
        }
    }
}

pub fn run(args: RunArgs, config: Config) -> anyhow::Result<ExitCode> {
    let finished = super::runtime()?.block_on(agl::run::run(
        config,
        args.options(),
        super::serve::shutdown_signal(),
    ))?;
    println!(
        "run finished after {} steps: {}",
        finished.steps,
        finished.out_dir.display()
    );
    Ok(ExitCode::SUCCESS)
}
