//! On-disk cache of compiled components.
//!
//! A cache file is named by the blake3 hash of the `.wasm` bytes and of the
//! engine's compatibility hash, so a changed plugin or engine configuration
//! never picks up a stale artifact. Beside it, a `.blake3` file holds the
//! hash of the artifact itself: the artifact is native code that is mapped
//! and run as is, so it is only used if it is intact. Any cache problem
//! (missing, corrupt, unwritable) falls back to compiling; none is fatal.

use std::hash::{Hash, Hasher};
use std::io::Write;
use std::path::{Path, PathBuf};

use wasmtime::Engine;
use wasmtime::component::Component;

/// How a component came to be compiled; reported by loads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CacheOutcome {
    /// Loaded from this cache file.
    Hit(PathBuf),
    /// Compiled, and stored in this cache file (if it could be written).
    Compiled(Option<PathBuf>),
    /// Compiled with the disk cache disabled.
    Disabled,
}

pub(crate) struct ComponentCache {
    dir: Option<PathBuf>,
    /// Hex blake3 of the engine's compatibility hash.
    engine_key: String,
}

impl ComponentCache {
    pub(crate) fn new(engine: &Engine, dir: Option<PathBuf>) -> Self {
        let mut hasher = Blake3Hasher(blake3::Hasher::new());
        engine.precompile_compatibility_hash().hash(&mut hasher);
        Self {
            dir,
            engine_key: hasher.0.finalize().to_hex()[..16].to_string(),
        }
    }

    /// The compiled form of `wasm`, from the cache when it has a good copy.
    pub(crate) fn load_or_compile(
        &self,
        engine: &Engine,
        wasm: &[u8],
    ) -> wasmtime::Result<(Component, CacheOutcome)> {
        let Some(dir) = &self.dir else {
            return Ok((Component::new(engine, wasm)?, CacheOutcome::Disabled));
        };
        let path = dir.join(format!(
            "{}-{}.cwasm",
            blake3::hash(wasm).to_hex(),
            self.engine_key
        ));
        match load_cached(engine, &path) {
            Ok(Some(component)) => return Ok((component, CacheOutcome::Hit(path))),
            Ok(None) => {}
            Err(reason) => {
                tracing::warn!(path = %path.display(), "discarding cached component: {reason}")
            }
        }
        let component = Component::new(engine, wasm)?;
        let stored = match store(&component, dir, &path) {
            Ok(()) => Some(path),
            Err(e) => {
                tracing::warn!(path = %path.display(), "cannot cache compiled component: {e}");
                None
            }
        };
        Ok((component, CacheOutcome::Compiled(stored)))
    }
}

fn checksum_path(path: &Path) -> PathBuf {
    path.with_extension("cwasm.blake3")
}

/// `Ok(None)`: not cached. `Err`: cached but unusable (corrupt, stale).
fn load_cached(engine: &Engine, path: &Path) -> Result<Option<Component>, String> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    let expected =
        std::fs::read_to_string(checksum_path(path)).map_err(|e| format!("checksum: {e}"))?;
    if blake3::hash(&bytes).to_hex().as_str() != expected.trim() {
        return Err("checksum mismatch".to_string());
    }
    // SAFETY: the file is an artifact this cache wrote from
    // `Component::serialize` with this engine configuration (its name holds
    // the compatibility hash) and its checksum matches, so it is intact.
    let component = unsafe { Component::deserialize_file(engine, path) };
    component.map(Some).map_err(|e| format!("{e:#}"))
}

/// Writes the artifact and its checksum via temporary files and renames, so
/// a reader never sees a half-written file under the final name.
fn store(component: &Component, dir: &Path, path: &Path) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    let bytes = component.serialize().map_err(|e| format!("{e:#}"))?;
    let checksum = blake3::hash(&bytes).to_hex().to_string();
    write_atomic(&checksum_path(path), checksum.as_bytes())?;
    write_atomic(path, &bytes)
}

fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), String> {
    let tmp = path.with_extension(format!("tmp.{}.{}", std::process::id(), unique()));
    let result = std::fs::File::create(&tmp)
        .and_then(|mut file| file.write_all(bytes).and_then(|()| file.sync_all()))
        .and_then(|()| std::fs::rename(&tmp, path));
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.map_err(|e| format!("write {}: {e}", path.display()))
}

/// Distinguishes temporary files of concurrent writers in one process.
fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Feeds `Hash` output into blake3, which (unlike std's hasher) is stable
/// across processes and Rust versions.
struct Blake3Hasher(blake3::Hasher);

impl Hasher for Blake3Hasher {
    fn finish(&self) -> u64 {
        let hash = self.0.finalize();
        let mut first = [0u8; 8];
        first.copy_from_slice(&hash.as_bytes()[..8]);
        u64::from_le_bytes(first)
    }

    fn write(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }
}
