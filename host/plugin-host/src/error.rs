//! Errors of plugin loads and calls. Every error names the plugin and says
//! what kind of failure it was; none of them affects other plugins.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use super::validate::InvalidSample;
use super::world::World;

/// A failed load or call of one plugin.
#[derive(Debug, thiserror::Error)]
#[error("plugin `{name}` ({}): {kind}{}", .path.display(), StderrTail(.stderr))]
pub struct PluginError {
    /// The name the plugin was loaded under.
    pub name: String,
    pub path: PathBuf,
    pub kind: PluginErrorKind,
    /// The tail of what the guest wrote to stderr during the failed call.
    pub stderr: String,
}

#[derive(Debug, thiserror::Error)]
pub enum PluginErrorKind {
    /// Unreadable file, not a component, compile error, missing or
    /// mistyped export, unsatisfiable import, or a limit the host cannot grant.
    #[error("cannot load: {0}")]
    Load(String),
    /// The plugin exports the other world than the caller needs.
    #[error("is a {actual} plugin, not a {expected} plugin")]
    WrongWorld { expected: World, actual: World },
    /// The guest trapped (panic, stack overflow, bad memory access, ...).
    #[error("trapped: {0}")]
    Trap(String),
    #[error("timed out: no result within {} ms", .0.as_millis())]
    Timeout(Duration),
    /// The guest tried to grow its memory past `memory_bytes`.
    #[error("out of memory: exceeded its {0}-byte memory cap")]
    OutOfMemory(usize),
    /// The guest returned `Err(message)`.
    #[error("returned an error: {0}")]
    GuestError(String),
    #[error("returned an invalid sample: {0}")]
    InvalidSample(#[from] InvalidSample),
    #[error("returned a non-finite reward {0}")]
    InvalidReward(f64),
    /// The host could not start an instance (e.g. the instance pool is full).
    #[error("cannot start an instance: {0}")]
    Instantiate(String),
}

impl PluginError {
    pub fn kind(&self) -> &PluginErrorKind {
        &self.kind
    }
}

/// Renders a non-empty stderr tail after the error, indented.
struct StderrTail<'a>(&'a str);

impl fmt::Display for StderrTail<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let tail = self.0.trim_start_matches(['\r', '\n']).trim_end();
        if tail.is_empty() {
            return Ok(());
        }
        f.write_str("\nguest stderr:")?;
        for line in tail.lines() {
            write!(f, "\n  {line}")?;
        }
        Ok(())
    }
}
