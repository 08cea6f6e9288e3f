//! What the user of `agl run` sees: one [`StepRecord`] per update, appended
//! to `metrics.jsonl` ([`MetricsLog`]), printed as at most two lines
//! ([`summary_lines`]) above the progress bar ([`Progress`]), exported as
//! Prometheus gauges on the gateway's `/metrics` ([`TrainerGauges`]),
//! drawn as a PNG of [`panels`] ([`plot()`]) and summed up at the end ([`summary_table`]);
//! with `[report]`, also written as TensorBoard event files and a W&B run
//! ([`Export`], the record's [`scalars`]) as each line is appended.
//!
//! The baseline validation (before any update) is a record with `step: 0`
//! and `weight_version: 0`: only its `val_reward`, `val_rollouts`,
//! `elapsed_s` and `total_steps` mean anything. Every view treats step 0 as
//! the baseline and skips it for training statistics.

mod export;
mod gauges;
mod log;
mod plot;
mod progress;
mod record;
mod scalars;
mod table;
mod text;

pub use export::{Export, ExportError, ExportStart};
pub use gauges::TrainerGauges;
pub use log::{MetricsLog, read_records};
pub use plot::{Labels, Panel, panels, plot};
pub use progress::Progress;
pub use record::{BREAK_OTHER, BREAK_RETOKENIZE, BREAK_TEMPLATE, StepRecord, TrainerStats};
pub use scalars::scalars;
pub use text::{per_rollout, summary_lines, summary_table};

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}:{line}: not a step record: {source}", path.display())]
    Parse {
        path: PathBuf,
        line: usize,
        source: serde_json::Error,
    },
    #[error("encode a step record: {0}")]
    Encode(#[from] serde_json::Error),
    #[error("plot {}: {message}", path.display())]
    Plot { path: PathBuf, message: String },
}

impl ReportError {
    fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> ReportError {
        let path = path.into();
        move |source| ReportError::Io { path, source }
    }
}
