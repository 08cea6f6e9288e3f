//! `metrics.jsonl`: one JSON line per [`StepRecord`], appended as it happens
//! (and handed to the run's [`Export`], when it has one).

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use super::{Export, ReportError, StepRecord};

/// Appends step records to a JSONL file, one `write` per line so a crash
/// tears at most the last line.
pub struct MetricsLog {
    path: PathBuf,
    file: File,
    export: Option<Export>,
}

impl MetricsLog {
    /// Opens the log at `path`. `None` starts a new run: an existing file is
    /// replaced. `Some(step)` resumes from the checkpoint of `step`: records
    /// past it (logged by a run that crashed before its next checkpoint) and
    /// a torn last line are dropped, by writing the kept records to a
    /// temporary file and renaming it over `path`.
    pub fn open(path: &Path, resume_after_step: Option<u64>) -> Result<MetricsLog, ReportError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            fs::create_dir_all(dir).map_err(ReportError::io(dir))?;
        }
        let file = match resume_after_step {
            None => File::create(path).map_err(ReportError::io(path))?,
            Some(step) => {
                let kept: Vec<StepRecord> = match read_records(path) {
                    Ok(records) => records.into_iter().filter(|r| r.step <= step).collect(),
                    Err(ReportError::Io { source, .. })
                        if source.kind() == std::io::ErrorKind::NotFound =>
                    {
                        Vec::new()
                    }
                    Err(e) => return Err(e),
                };
                rewrite(path, &kept)?;
                OpenOptions::new()
                    .append(true)
                    .open(path)
                    .map_err(ReportError::io(path))?
            }
        };
        Ok(MetricsLog {
            path: path.to_path_buf(),
            file,
            export: None,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// From now on every appended record goes to `export` too.
    pub fn export_to(&mut self, export: Export) {
        self.export = Some(export);
    }

    /// The export, to close it at the run's end.
    pub fn take_export(&mut self) -> Option<Export> {
        self.export.take()
    }

    /// Writes `record` as one line and flushes it to the OS; then hands it
    /// to the export.
    pub fn append(&mut self, record: &StepRecord) -> Result<(), ReportError> {
        let mut line = serde_json::to_string(record)?;
        line.push('\n');
        self.file
            .write_all(line.as_bytes())
            .and_then(|()| self.file.flush())
            .map_err(ReportError::io(&self.path))?;
        if let Some(export) = &mut self.export {
            export.step(record);
        }
        Ok(())
    }
}

/// Writes `records` to `path` atomically (temporary file, fsync, rename).
fn rewrite(path: &Path, records: &[StepRecord]) -> Result<(), ReportError> {
    let mut tmp_name = path.as_os_str().to_owned();
    tmp_name.push(".tmp");
    let tmp = PathBuf::from(tmp_name);
    let mut text = String::new();
    for r in records {
        text.push_str(&serde_json::to_string(r)?);
        text.push('\n');
    }
    let mut file = File::create(&tmp).map_err(ReportError::io(&tmp))?;
    file.write_all(text.as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(ReportError::io(&tmp))?;
    fs::rename(&tmp, path).map_err(ReportError::io(path))
}

/// Reads every record of a `metrics.jsonl`. An unreadable last line is a
/// write torn by a crash and is skipped; a bad line before it is an error.
pub fn read_records(path: &Path) -> Result<Vec<StepRecord>, ReportError> {
    let text = fs::read(path).map_err(ReportError::io(path))?;
    // A torn write may cut a multi-byte character; only the last line can.
    let text = String::from_utf8_lossy(&text);
    let (records, torn) =
        agl_wire::metrics::parse_records(&text).map_err(|e| ReportError::Parse {
            path: path.to_path_buf(),
            line: e.line,
            source: e.source,
        })?;
    if let Some(line) = torn {
        tracing::warn!(path = %path.display(), line, "skipping a torn last line");
    }
    Ok(records)
}
