//! `agl plugin build DIR`: a plugin folder into a component.
//!
//! A Python plugin (`plugin.toml` + `app.py`) is built by the embedded
//! Python SDK's builder (`plugins/python/agl_build.py`, run with the venv's
//! Python: bindings from `wit/`, the plugin's tests, componentize-py); a
//! Rust plugin crate (`Cargo.toml`) by cargo for `wasm32-wasip2`. Either
//! way the component is written to `DIR/NAME.wasm` unless `out` says where.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

pub struct BuildOptions {
    pub dir: PathBuf,
    pub out: Option<PathBuf>,
    /// The Python that has componentize-py (default: `$AGL_VENV/bin/python`
    /// when it exists, else `python3`).
    pub python: Option<PathBuf>,
    /// Run a Python plugin's `test_*.py` first.
    pub test: bool,
}

/// Builds the plugin and returns the component's path.
pub fn build(opts: &BuildOptions) -> anyhow::Result<PathBuf> {
    let dir = &opts.dir;
    if dir.join("plugin.toml").is_file() {
        build_python(opts)
    } else if dir.join("Cargo.toml").is_file() {
        build_rust(dir, opts.out.as_deref())
    } else {
        bail!(
            "{} is not a plugin folder: no plugin.toml (Python) or Cargo.toml (Rust)",
            dir.display()
        )
    }
}

fn default_python() -> PathBuf {
    std::env::var_os("AGL_VENV")
        .map(|venv| PathBuf::from(venv).join("bin/python"))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from("python3"))
}

fn build_python(opts: &BuildOptions) -> anyhow::Result<PathBuf> {
    // The SDK tree written out of this binary: plugins/sdk, plugins/python, wit.
    let sdk = crate::scaffold::installed_sdk(None)?;
    let root = sdk.join("../..");
    let python = opts.python.clone().unwrap_or_else(default_python);
    let mut cmd = Command::new(&python);
    cmd.arg("-m")
        .arg("agl_build")
        .arg(&opts.dir)
        .arg("--wit")
        .arg(root.join("wit"))
        .env("PYTHONPATH", root.join("plugins/python"));
    // The plugin's native tests merge by this agl's rules
    // (`agl_plugin.testing`, `agl plugin rules`).
    if let Ok(agl) = std::env::current_exe() {
        cmd.env("AGL_BIN", agl);
    }
    if let Some(out) = &opts.out {
        cmd.arg("--out").arg(out);
    }
    if !opts.test {
        cmd.arg("--no-test");
    }
    let output = cmd
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("cannot run {} (pass --python)", python.display()))?;
    if !output.status.success() {
        bail!("building {} failed (see above)", opts.dir.display());
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let built = stdout
        .lines()
        .last()
        .context("the builder named no component")?;
    Ok(PathBuf::from(built.trim()))
}

fn build_rust(dir: &Path, out: Option<&Path>) -> anyhow::Result<PathBuf> {
    let dir = &dir
        .canonicalize()
        .with_context(|| format!("cannot read {}", dir.display()))?;
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let metadata = Command::new(&cargo)
        .args(["metadata", "--format-version", "1", "--no-deps"])
        .current_dir(dir)
        .output()
        .context("cannot run cargo")?;
    if !metadata.status.success() {
        bail!(
            "cargo metadata in {}: {}",
            dir.display(),
            String::from_utf8_lossy(&metadata.stderr).trim()
        );
    }
    let metadata: serde_json::Value = serde_json::from_slice(&metadata.stdout)?;
    let manifest = dir.join("Cargo.toml");
    let package = metadata["packages"]
        .as_array()
        .and_then(|ps| {
            ps.iter()
                .find(|p| p["manifest_path"].as_str() == Some(&*manifest.to_string_lossy()))
        })
        .context("cargo metadata lists no package for this Cargo.toml")?;
    let name = package["name"].as_str().context("package without a name")?;
    let target = metadata["target_directory"]
        .as_str()
        .context("cargo metadata has no target_directory")?;
    let status = Command::new(&cargo)
        .args(["build", "--release", "--target", "wasm32-wasip2"])
        .current_dir(dir)
        .status()
        .context("cannot run cargo")?;
    if !status.success() {
        bail!("cargo build in {} failed", dir.display());
    }
    let built = Path::new(target)
        .join("wasm32-wasip2/release")
        .join(format!("{}.wasm", name.replace('-', "_")));
    let out = out.map_or_else(|| dir.join(format!("{name}.wasm")), Path::to_path_buf);
    std::fs::copy(&built, &out)
        .with_context(|| format!("copying {} to {}", built.display(), out.display()))?;
    Ok(out)
}
