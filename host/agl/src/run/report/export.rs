//! `[report]` exports: TensorBoard event files and a W&B run, written from
//! the same step records as `metrics.jsonl` by a Python sidecar
//! (`host/agl/python/report_sink.py`, embedded, written to the run folder)
//! with the projects' own packages. The sidecar gets JSON lines on stdin:
//! the run's config and plugins, then one line per step record with its
//! [`scalars`]; its stdout answers with `{"level", "message"}` lines that
//! are logged here, its stderr goes to `<run folder>/report_sink.log`.
//!
//! An export is never the run's failure: a sidecar that cannot start, or
//! dies, is a warning (terminal and `agl.log`), and the run goes on.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use agl_wire::api::LoadedPlugin;
use serde::{Deserialize, Serialize};

use super::{StepRecord, scalars};
use crate::config::{ReportConfig, WandbConfig};

/// The sidecar, written to the run folder at each start.
const SINK: &str = include_str!("../../../python/report_sink.py");
const SINK_FILE: &str = "report_sink.py";
const SINK_LOG: &str = "report_sink.log";
/// How long the end of a run waits for the sidecar to flush and exit (an
/// online W&B run uploads what is left first).
const CLOSE_WAIT: Duration = Duration::from_secs(120);

#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("writing the report sink {}: {source}", path.display())]
    Script {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("starting the report sink with {}: {source} (set [report] python)", python.display())]
    Spawn {
        python: PathBuf,
        source: std::io::Error,
    },
    #[error("the report sink exited with {status}; see {}{tail}", log.display())]
    /// `tail`: the log's last lines, unless already in the warning that
    /// the sink ended early.
    Exited {
        status: std::process::ExitStatus,
        log: PathBuf,
        tail: String,
    },
    #[error("the report sink is still finishing after {}s; left running (see {})", CLOSE_WAIT.as_secs(), log.display())]
    Timeout { log: PathBuf },
    #[error("waiting for the report sink: {0}")]
    Wait(std::io::Error),
}

/// What the sidecar is started with.
pub struct ExportStart<'a> {
    pub report: &'a ReportConfig,
    pub out_dir: &'a Path,
    /// `--resume`: the checkpoint's step (later steps are logged again).
    pub resume_after: Option<u64>,
    /// The run's config ([`crate::config::Config::export_json`]).
    pub config: serde_json::Value,
    /// The plugins loaded at the start.
    pub plugins: Vec<LoadedPlugin>,
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Message<'a> {
    Start {
        agl_version: &'static str,
        run_dir: &'a Path,
        tensorboard: Option<PathBuf>,
        wandb: Option<WandbConfig>,
        resume_after: Option<u64>,
        config: &'a serde_json::Value,
        plugins: &'a [LoadedPlugin],
    },
    Step {
        step: u64,
        wall_time: f64,
        scalars: BTreeMap<String, f64>,
        plugins: &'a [LoadedPlugin],
    },
}

/// One line of the sidecar's stdout.
#[derive(Deserialize)]
struct Said {
    level: String,
    message: String,
}

/// The running sidecar.
pub struct Export {
    lines: Option<mpsc::Sender<String>>,
    child: Child,
    writer: Option<JoinHandle<()>>,
    reader: Option<JoinHandle<()>>,
    closing: Arc<AtomicBool>,
    /// Set once the reader warned that the sink ended before the run.
    ended_early: Arc<AtomicBool>,
    log: PathBuf,
    outputs: Vec<String>,
}

impl Export {
    /// Starts the sidecar when `[report]` asks for an export; `None` when
    /// it does not, or when the sidecar cannot start (a warning).
    pub fn start(start: ExportStart<'_>) -> Option<Export> {
        if !start.report.any() {
            return None;
        }
        match Export::spawn(start) {
            Ok(export) => Some(export),
            Err(e) => {
                tracing::warn!("{e}; no TensorBoard / W&B export for this run");
                None
            }
        }
    }

    fn spawn(start: ExportStart<'_>) -> Result<Export, ExportError> {
        let out_dir = start.out_dir;
        let script = out_dir.join(SINK_FILE);
        std::fs::write(&script, SINK).map_err(|source| ExportError::Script {
            path: script.clone(),
            source,
        })?;
        let log = out_dir.join(SINK_LOG);
        let stderr = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(|source| ExportError::Script {
                path: log.clone(),
                source,
            })?;
        let python = python(start.report);
        let mut child = Command::new(&python)
            .arg(&script)
            .current_dir(out_dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .map_err(|source| ExportError::Spawn {
                python: python.clone(),
                source,
            })?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            // Both were asked for as pipes.
            return Err(ExportError::Spawn {
                python,
                source: std::io::Error::other("no pipe to the report sink"),
            });
        };

        let tensorboard = start
            .report
            .tensorboard
            .then(|| out_dir.join("tensorboard"));
        let wandb = start.report.wandb.clone().map(|mut w| {
            w.name = w.name.or_else(|| {
                out_dir
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
            });
            w
        });
        let mut outputs = Vec::new();
        if let Some(dir) = &tensorboard {
            outputs.push(format!(
                "tensorboard: tensorboard --logdir {}",
                dir.display()
            ));
        }
        if let Some(w) = &wandb {
            outputs.push(match w.mode {
                crate::config::WandbMode::Offline => format!(
                    "wandb: {} (upload: wandb sync {}/offline-run-*)",
                    out_dir.join("wandb").display(),
                    out_dir.join("wandb").display()
                ),
                crate::config::WandbMode::Online => format!("wandb: project {}", w.project),
            });
        }
        let first = serde_json::to_string(&Message::Start {
            agl_version: env!("CARGO_PKG_VERSION"),
            run_dir: out_dir,
            tensorboard,
            wandb,
            resume_after: start.resume_after,
            config: &start.config,
            plugins: &start.plugins,
        });

        let closing = Arc::new(AtomicBool::new(false));
        let ended_early = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::channel();
        let writer = std::thread::Builder::new()
            .name("report-sink-in".into())
            .spawn(move || write_lines(stdin, rx));
        let reader = {
            let (closing, ended_early) = (closing.clone(), ended_early.clone());
            let log = log.clone();
            std::thread::Builder::new()
                .name("report-sink-out".into())
                .spawn(move || read_lines(stdout, &closing, &ended_early, &log))
        };
        let mut export = Export {
            lines: Some(tx),
            child,
            writer: writer.ok(),
            reader: reader.ok(),
            closing,
            ended_early,
            log,
            outputs,
        };
        match first {
            Ok(line) => export.send(line),
            // Plain data: it always encodes.
            Err(e) => tracing::warn!(error = %e, "encoding the report sink's start"),
        }
        tracing::info!(python = %python.display(), log = %export.log.display(), "report sink started");
        Ok(export)
    }

    fn send(&mut self, line: String) {
        if let Some(tx) = &self.lines {
            // The writer ends only when the sink is gone, which the reader
            // reports.
            let _ = tx.send(line);
        }
    }

    /// Hands `record` to the sidecar (never blocks).
    pub fn step(&mut self, record: &StepRecord) {
        let wall_time = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let line = serde_json::to_string(&Message::Step {
            step: record.step,
            wall_time,
            scalars: scalars(record),
            plugins: &record.plugins,
        });
        match line {
            Ok(line) => self.send(line),
            Err(e) => {
                tracing::warn!(step = record.step, error = %e, "encoding a step for the report sink")
            }
        }
    }

    /// Ends the export: closes the sidecar's input and waits (up to
    /// [`CLOSE_WAIT`]) for it to flush and exit. Blocks. `Ok` holds a line
    /// per export saying where it is.
    pub fn close(mut self) -> Result<Vec<String>, ExportError> {
        self.closing.store(true, Ordering::SeqCst);
        drop(self.lines.take());
        if let Some(writer) = self.writer.take() {
            let _ = writer.join();
        }
        let deadline = Instant::now() + CLOSE_WAIT;
        let status = loop {
            match self.child.try_wait().map_err(ExportError::Wait)? {
                Some(status) => break status,
                None if Instant::now() >= deadline => {
                    return Err(ExportError::Timeout {
                        log: self.log.clone(),
                    });
                }
                None => std::thread::sleep(Duration::from_millis(50)),
            }
        };
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        if !status.success() {
            let told = self.ended_early.load(Ordering::SeqCst);
            return Err(ExportError::Exited {
                status,
                log: self.log.clone(),
                tail: if told { String::new() } else { tail(&self.log) },
            });
        }
        Ok(std::mem::take(&mut self.outputs))
    }
}

impl Drop for Export {
    /// Without [`Export::close`] (a run that failed to start): the sidecar
    /// gets the end of its input and finishes on its own.
    fn drop(&mut self) {
        self.closing.store(true, Ordering::SeqCst);
        drop(self.lines.take());
    }
}

/// `[report] python`, else `$AGL_VENV/bin/python` where it exists, else
/// `python3` on PATH.
fn python(report: &ReportConfig) -> PathBuf {
    if let Some(p) = &report.python {
        return p.clone();
    }
    std::env::var_os("AGL_VENV")
        .map(|v| PathBuf::from(v).join("bin/python"))
        .filter(|p| p.exists())
        .unwrap_or_else(|| PathBuf::from("python3"))
}

fn write_lines(mut stdin: ChildStdin, rx: mpsc::Receiver<String>) {
    for line in rx {
        let written = stdin
            .write_all(line.as_bytes())
            .and_then(|()| stdin.write_all(b"\n"))
            .and_then(|()| stdin.flush());
        if let Err(e) = written {
            // A sink that is gone: its end is reported by the reader.
            tracing::debug!(error = %e, "the report sink takes no more input");
            return;
        }
    }
}

fn read_lines(stdout: ChildStdout, closing: &AtomicBool, ended_early: &AtomicBool, log: &Path) {
    for line in BufReader::new(stdout).lines() {
        let Ok(line) = line else { break };
        match serde_json::from_str::<Said>(&line) {
            Ok(said) if said.level == "warning" => {
                tracing::warn!("report sink: {}", said.message)
            }
            Ok(said) => tracing::info!("report sink: {}", said.message),
            Err(_) => tracing::info!("report sink: {line}"),
        }
    }
    if !closing.load(Ordering::SeqCst) {
        ended_early.store(true, Ordering::SeqCst);
        tracing::warn!(
            "the report sink exited before the run ended: no more TensorBoard / W&B export \
             (metrics.jsonl goes on); see {}{}",
            log.display(),
            tail(log)
        );
    }
}

/// The last lines of the sidecar's log, for a warning.
fn tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let last = &lines[lines.len().saturating_sub(5)..];
    if last.is_empty() {
        String::new()
    } else {
        format!(":\n  {}", last.join("\n  "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn start_with(dir: &Path, python: &str) -> Option<Export> {
        let report = ReportConfig {
            tensorboard: true,
            python: Some(PathBuf::from(python)),
            ..ReportConfig::default()
        };
        Export::start(ExportStart {
            report: &report,
            out_dir: dir,
            resume_after: None,
            config: serde_json::json!({}),
            plugins: Vec::new(),
        })
    }

    #[test]
    fn nothing_asked_nothing_started() {
        let dir = tempfile::tempdir().unwrap();
        let report = ReportConfig::default();
        let export = Export::start(ExportStart {
            report: &report,
            out_dir: dir.path(),
            resume_after: None,
            config: serde_json::json!({}),
            plugins: Vec::new(),
        });
        assert!(export.is_none());
        assert!(!dir.path().join(SINK_FILE).exists());
    }

    #[test]
    fn a_sink_that_cannot_start_or_dies_is_an_error_value_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        assert!(start_with(dir.path(), "/nonexistent/python").is_none());

        // A "python" that exits at once with a failure, before reading.
        let mut export = start_with(dir.path(), "false").expect("spawned");
        for step in 0..3 {
            export.step(&StepRecord {
                step,
                ..StepRecord::default()
            });
        }
        let e = export.close().unwrap_err();
        assert!(matches!(e, ExportError::Exited { .. }), "{e}");
        assert!(e.to_string().contains(SINK_LOG), "{e}");
    }

    #[test]
    fn the_log_tail_is_the_last_lines() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("log");
        std::fs::write(&log, "a\nb\n\nc\nd\ne\nf\ng\n").unwrap();
        assert_eq!(tail(&log), ":\n  c\n  d\n  e\n  f\n  g");
        assert_eq!(tail(&dir.path().join("none")), "");
    }
}
