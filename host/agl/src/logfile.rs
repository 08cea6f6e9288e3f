//! The run's log file: `agl run` writes its library logs to
//! `<run folder>/agl.log` so the terminal keeps to the step lines and the
//! progress bar. The folder is known only once the run starts, so lines
//! logged before [`open`] are kept in memory and written first.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::Path;
use std::sync::{Mutex, MutexGuard};

use tracing_subscriber::fmt::MakeWriter;

/// Lines kept before the file is open are capped (a run that never opens
/// its file must not grow without bound).
const EARLY_CAP: usize = 1 << 20;

struct Sink {
    file: Option<File>,
    early: Vec<u8>,
}

static SINK: Mutex<Sink> = Mutex::new(Sink {
    file: None,
    early: Vec::new(),
});

fn sink() -> MutexGuard<'static, Sink> {
    // A panic while writing a log line leaves nothing half-done worth refusing.
    SINK.lock().unwrap_or_else(|e| e.into_inner())
}

/// Appends from now on to `path` (created 0600: it may quote prompts),
/// after the lines logged so far.
pub fn open(path: &Path) -> io::Result<()> {
    let mut options = OpenOptions::new();
    options.create(true).append(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options.open(path)?;
    let mut s = sink();
    file.write_all(&s.early)?;
    s.early = Vec::new();
    s.file = Some(file);
    Ok(())
}

/// The `tracing_subscriber` writer of the log file.
#[derive(Clone, Copy, Default)]
pub struct LogFile;

impl Write for LogFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut guard = sink();
        let s = &mut *guard;
        match &mut s.file {
            Some(f) => f.write_all(buf)?,
            None if s.early.len() + buf.len() <= EARLY_CAP => s.early.extend_from_slice(buf),
            None => {}
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        match &mut sink().file {
            Some(f) => f.flush(),
            None => Ok(()),
        }
    }
}

impl<'a> MakeWriter<'a> for LogFile {
    type Writer = LogFile;

    fn make_writer(&'a self) -> LogFile {
        LogFile
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn early_lines_come_first_then_later_ones_append() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agl.log");
        LogFile.write_all(b"before\n").unwrap();
        open(&path).unwrap();
        LogFile.write_all(b"after\n").unwrap();
        LogFile.flush().unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "before\nafter\n");
    }
}
