//! The `agl` command line.

mod cli;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "agl",
    version,
    about = "Train unmodified agent harnesses with RL"
)]
struct Args {
    /// Config file (agl.toml); every key has a default.
    #[arg(long, short, global = true, env = "AGL_CONFIG")]
    config: Option<PathBuf>,
    /// Override a config key by its dotted path, e.g. -o plugins.limits.deadline_ms=500.
    #[arg(short = 'o', long = "set", value_name = "KEY=VALUE", global = true)]
    overrides: Vec<String>,
    /// Log filter (tracing env-filter syntax), e.g. `debug` or `agl=trace`
    /// (default `info`). `agl run` and `agl train` write their log to
    /// `agl.log` in the run folder and show only warnings in the terminal,
    /// unless this or `-v` is given.
    #[arg(long, global = true, env = "AGL_LOG")]
    log: Option<String>,
    /// Show the log in the terminal (`agl run` keeps it to its run folder's
    /// `agl.log` otherwise).
    #[arg(long, short, global = true)]
    verbose: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Write, inspect and test Wasm plugins offline; swap them in a running `agl run`.
    #[command(subcommand, alias = "plugins")]
    Plugin(cli::plugin::PluginCommand),
    /// Run agents for queued rollouts against a gateway (`agl serve`).
    Controller(cli::controller::ControllerArgs),
    /// Serve a model with agl's own inference engine (OpenAI-compatible).
    #[command(subcommand)]
    Engine(cli::engine::EngineCommand),
    /// Run the gateway (management API) over the store.
    Serve(cli::serve::ServeArgs),
    /// List, show and export rollouts from the store.
    #[command(subcommand)]
    Rollouts(cli::rollouts::RolloutsCommand),
    /// Train the policy on a harness: gateway, engine, controller, plugins
    /// and trainer in one process.
    Run(cli::run::RunArgs),
    /// Measure policies (base, checkpoints) on the val rows or a data file
    /// with the same harness and engine, no training: pass@1, pass@k.
    Eval(cli::eval::EvalArgs),
    /// Train against a running gateway (`agl serve`): the trainer alone,
    /// with the agents run by `agl controller`.
    Train(cli::train::TrainArgs),
    /// Fetch known models and import GGUF files as Hugging Face folders.
    #[command(subcommand)]
    Model(cli::model::ModelCommand),
    /// A data-parallel trainer rank > 0 (`[train] world_size`), joined
    /// through torchrun's variables: `agl run` starts these itself; a
    /// launcher starts them on other machines.
    TrainerRank,
}

/// torchrun's `RANK` > 0: this process is a trainer rank, whatever the
/// command (a launcher starts the same `agl run` / `agl train` everywhere).
fn launched_as_worker_rank() -> bool {
    std::env::var("RANK")
        .ok()
        .and_then(|r| r.parse::<usize>().ok())
        .is_some_and(|r| r > 0)
        && std::env::var_os("WORLD_SIZE").is_some()
}

fn main() -> ExitCode {
    let args = Args::parse();
    init_logging(&args);
    let result = agl::config::Config::load(args.config.as_deref(), &args.overrides)
        .map_err(anyhow::Error::from)
        .and_then(|config| match args.command {
            Command::Run(_) | Command::Train(_) | Command::TrainerRank
                if launched_as_worker_rank() =>
            {
                trainer_rank()
            }
            Command::TrainerRank => trainer_rank(),
            Command::Plugin(cmd) => cli::plugin::run(cmd, config),
            Command::Engine(cmd) => cli::engine::run(cmd),
            Command::Serve(args) => cli::serve::run(args, config),
            Command::Controller(args) => cli::controller::run(args, config),
            Command::Rollouts(cmd) => cli::rollouts::run(cmd),
            Command::Model(cmd) => cli::model::run(cmd),
            Command::Run(args) => cli::run::run(args, config),
            Command::Train(args) => cli::train::run(args, config),
            Command::Eval(args) => cli::eval::run(args, config),
        });
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The log goes to stderr at `--log` (default `info`). `agl run` also
/// writes it to its run folder's `agl.log` and, unless `--log`, `AGL_LOG`
/// or `-v` asks for more, shows only warnings in the terminal, where its
/// step lines and progress bar are.
fn init_logging(args: &Args) {
    use tracing_subscriber::EnvFilter;
    use tracing_subscriber::prelude::*;

    let asked = args.log.clone().unwrap_or_else(|| "info".into());
    let filter = || EnvFilter::try_new(&asked).unwrap_or_else(|_| EnvFilter::new("info"));
    let run = matches!(
        args.command,
        Command::Run(_) | Command::Train(_) | Command::Eval(_)
    );
    let terminal = if run && args.log.is_none() && !args.verbose {
        EnvFilter::new("warn")
    } else {
        filter()
    };
    let file = run.then(|| {
        tracing_subscriber::fmt::layer()
            .with_ansi(false)
            .with_writer(agl::logfile::LogFile)
            .with_filter(filter())
    });
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                // Colours for a terminal only: a log file or pipe (a
                // trainer rank's output inside `agl run`'s) stays plain.
                .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
                .with_filter(terminal),
        )
        .with(file)
        .init();
}

/// `agl trainer-rank`: one data-parallel trainer rank above 0.
fn trainer_rank() -> anyhow::Result<ExitCode> {
    agl_rl::ranks::run_rank()?;
    Ok(ExitCode::SUCCESS)
}
