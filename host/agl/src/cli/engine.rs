//! `agl engine serve`: a Hugging Face model folder behind agl's
//! inference server (`agl_inference`): token-in completions and the weight
//! routes; the gateway renders chat for it.

use std::path::PathBuf;
use std::process::ExitCode;

use agl_engine::EngineConfig;
use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};

#[derive(Subcommand)]
pub enum EngineCommand {
    /// Serve /v1/completions (token ids or text in), /v1/models, /load_weights
    /// and /weight_info; chat is rendered by the gateway (render = "gateway").
    Serve(EngineServeArgs),
}

#[derive(Clone, Copy, ValueEnum)]
enum Dtype {
    F32,
    Bf16,
}

#[derive(Args)]
pub struct EngineServeArgs {
    /// Model folder: config.json, *.safetensors, tokenizer.json, tokenizer_config.json.
    #[arg(long)]
    model: PathBuf,
    #[arg(long, default_value = "127.0.0.1:8000")]
    listen: String,
    #[arg(long, value_enum, default_value = "f32")]
    dtype: Dtype,
    /// Concurrent sequences.
    #[arg(long, default_value_t = EngineConfig::default().max_seqs)]
    max_seqs: usize,
    /// The most choices (`n`) one request may ask for.
    #[arg(long, default_value_t = agl_inference::DEFAULT_MAX_N as u64,
          value_parser = clap::value_parser!(u64).range(1..))]
    max_n: u64,
    /// Longest sequence (prompt + response), in tokens.
    #[arg(long, default_value_t = EngineConfig::default().max_len)]
    max_len: usize,
    /// The model name clients send (default: the folder's name).
    #[arg(long)]
    served_model_name: Option<String>,
}

pub fn run(cmd: EngineCommand) -> anyhow::Result<ExitCode> {
    let EngineCommand::Serve(args) = cmd;
    super::runtime()?.block_on(serve(args))?;
    Ok(ExitCode::SUCCESS)
}

async fn serve(args: EngineServeArgs) -> anyhow::Result<()> {
    let name = args.served_model_name.clone().unwrap_or_else(|| {
        args.model
            .file_name()
            .map_or("model".into(), |n| n.to_string_lossy().into_owned())
    });
    let kind = match args.dtype {
        Dtype::F32 => tch::Kind::Float,
        Dtype::Bf16 => tch::Kind::BFloat16,
    };
    let config = EngineConfig {
        max_seqs: args.max_seqs,
        max_len: args.max_len,
        weight_version: 0,
    };
    let server = agl::assembly::engine_server(&args.model, &name, kind, config)
        .await?
        .with_max_n(args.max_n as usize);
    let listener = tokio::net::TcpListener::bind(&args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    tracing::info!(url = %format!("http://{}/v1", listener.local_addr()?), model = %name, "agl engine listening");
    axum::serve(listener, server.router())
        .with_graceful_shutdown(super::serve::shutdown_signal())
        .await
        .context("engine server stopped")?;
    Ok(())
}
