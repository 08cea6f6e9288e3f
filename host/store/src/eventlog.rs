//! The event log: where an appended event becomes durable before its caller
//! is answered (`[store] durability = "process"`, the default).
//!
//! A proxied call's record is one append to this file (one `write`, no
//! SQLite transaction, no lock of SQLite's), so the call is answered
//! without waiting for a commit; the writer thread then ingests what was
//! logged into SQLite in its next batch, in log order, and empties the file
//! once everything in it is ingested. A write that returned is in the
//! kernel's page cache and survives `kill -9`, as a WAL commit without an
//! fsync does. Seqs are given out when an entry is logged (see `writer.rs`),
//! so the caller gets its seq at once and the events table gets the same
//! one.
//!
//! The file sits beside the database (`agl.db-events`) and is locked by the
//! process that writes the store: a second process opening the store finds
//! it held and may not append events (its seqs would collide with ones
//! logged but not yet ingested). On open, the owner ingests what the file
//! holds (a crash left it there) before serving: an entry whose seqs are in
//! the table already was ingested before the file was emptied, and is
//! skipped. Each entry is framed by its length and a CRC32; a torn last
//! entry (a crash mid-write, never acknowledged) ends the log and is cut off.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use agl_wire::rollout::JsonText;
use serde_json::value::RawValue;

use super::StoreError;

/// The log's file name: the database's with this appended.
const SUFFIX: &str = "-events";

/// Frame header: body length, CRC32 of the body (both u32 LE).
const HEADER: usize = 8;

/// The largest body a frame may claim; a larger one is a torn length.
const MAX_BODY: usize = 1 << 30;

/// One append: events of one rollout attempt, with the seqs they were
/// given, and the earlier calls they supersede (a client's retry).
#[derive(Debug, PartialEq)]
pub struct Entry {
    pub rollout_id: String,
    pub attempt: u32,
    pub kind: String,
    pub created_ms: i64,
    pub events: Vec<(u64, JsonText)>,
    pub supersede: Vec<(u64, u64)>,
}

/// The log file of this process, locked.
pub struct EventLog {
    file: File,
    path: PathBuf,
    /// Bytes in the file (every frame written whole).
    len: u64,
}

/// What opening the log found.
pub enum Opened {
    /// This process owns the log; these entries were left in it.
    Owned(EventLog, Vec<Entry>),
    /// Another process writes this store.
    Held(PathBuf),
}

/// The log's path for the database at `db`.
pub fn path_for(db: &Path) -> PathBuf {
    let mut name = db.as_os_str().to_owned();
    name.push(SUFFIX);
    PathBuf::from(name)
}

/// Opens and locks the log of the database at `db` (creating it owner-only),
/// reads the entries it holds and cuts off a torn tail.
pub fn open(db: &Path) -> Result<Opened, StoreError> {
    let path = path_for(db);
    let io = |source| StoreError::Log {
        path: path.display().to_string(),
        source,
    };
    let mut options = OpenOptions::new();
    options.read(true).append(true).create(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options.open(&path).map_err(io)?;
    match file.try_lock() {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => return Ok(Opened::Held(path)),
        Err(TryLockError::Error(e)) => return Err(io(e)),
    }
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes).map_err(io)?;
    let (entries, whole) = read_frames(&bytes);
    if whole < bytes.len() {
        tracing::warn!(
            log = %path.display(),
            dropped = bytes.len() - whole,
            "the event log ends in a torn entry (a crash mid-write); cutting it off"
        );
        file.set_len(whole as u64).map_err(io)?;
    }
    let len = whole as u64;
    Ok(Opened::Owned(EventLog { file, path, len }, entries))
}

impl EventLog {
    /// Appends `entry` as one frame (one `write`). On failure the file is
    /// cut back to its last whole frame, so a torn frame never sits before
    /// a later one.
    pub fn append(&mut self, entry: &Entry) -> Result<(), StoreError> {
        let mut frame = Vec::with_capacity(HEADER + entry.encoded_len());
        frame.extend_from_slice(&[0; HEADER]);
        entry.encode(&mut frame);
        let body_len = u32::try_from(frame.len() - HEADER)
            .ok()
            .filter(|&n| n as usize <= MAX_BODY)
            .ok_or_else(|| StoreError::OutOfRange("event log entry over 1 GiB".into()))?;
        let crc = crc32fast::hash(&frame[HEADER..]);
        frame[..4].copy_from_slice(&body_len.to_le_bytes());
        frame[4..HEADER].copy_from_slice(&crc.to_le_bytes());
        if let Err(e) = self.file.write_all(&frame) {
            // Whatever part reached the file goes; if even that fails the
            // next open cuts it off, and entries after it are refused.
            self.file.set_len(self.len).map_err(|e| self.error(e))?;
            return Err(self.error(e));
        }
        self.len += frame.len() as u64;
        Ok(())
    }

    /// Bytes in the log.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Empties the log: everything in it is ingested.
    pub fn clear(&mut self) -> Result<(), StoreError> {
        self.file.set_len(0).map_err(|e| self.error(e))?;
        self.len = 0;
        Ok(())
    }

    fn error(&self, source: std::io::Error) -> StoreError {
        StoreError::Log {
            path: self.path.display().to_string(),
            source,
        }
    }
}

/// The whole frames at the start of `bytes`, and where they end.
fn read_frames(bytes: &[u8]) -> (Vec<Entry>, usize) {
    let mut entries = Vec::new();
    let mut at = 0;
    while let Some(header) = bytes.get(at..at + HEADER) {
        let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize;
        let crc = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
        let Some(body) = bytes.get(at + HEADER..at + HEADER + len) else {
            break;
        };
        if crc32fast::hash(body) != crc {
            break;
        }
        let Some(entry) = Entry::decode(body) else {
            break;
        };
        entries.push(entry);
        at += HEADER + len;
    }
    (entries, at)
}

impl Entry {
    fn encoded_len(&self) -> usize {
        let events: usize = self.events.iter().map(|(_, p)| 12 + p.as_str().len()).sum();
        4 + 8
            + 4
            + self.rollout_id.len()
            + 4
            + self.kind.len()
            + 4
            + events
            + 4
            + 16 * self.supersede.len()
    }

    /// attempt u32, created_ms i64, rollout id, kind, events (seq u64,
    /// payload), supersede pairs (u64, u64); strings as u32 length + UTF-8;
    /// all little-endian.
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.attempt.to_le_bytes());
        out.extend_from_slice(&self.created_ms.to_le_bytes());
        put_str(out, &self.rollout_id);
        put_str(out, &self.kind);
        out.extend_from_slice(&(self.events.len() as u32).to_le_bytes());
        for (seq, payload) in &self.events {
            out.extend_from_slice(&seq.to_le_bytes());
            put_str(out, payload.as_str());
        }
        out.extend_from_slice(&(self.supersede.len() as u32).to_le_bytes());
        for (old, new) in &self.supersede {
            out.extend_from_slice(&old.to_le_bytes());
            out.extend_from_slice(&new.to_le_bytes());
        }
    }

    fn decode(body: &[u8]) -> Option<Entry> {
        let mut r = Reader(body);
        let attempt = r.u32()?;
        let created_ms = i64::from_le_bytes(r.take(8)?.try_into().ok()?);
        let rollout_id = r.str()?.to_string();
        let kind = r.str()?.to_string();
        let mut events = Vec::new();
        for _ in 0..r.u32()? {
            let seq = r.u64()?;
            let raw = RawValue::from_string(r.str()?.to_string()).ok()?;
            events.push((seq, JsonText::from_raw(raw)));
        }
        let mut supersede = Vec::new();
        for _ in 0..r.u32()? {
            supersede.push((r.u64()?, r.u64()?));
        }
        r.0.is_empty().then_some(Entry {
            rollout_id,
            attempt,
            kind,
            created_ms,
            events,
            supersede,
        })
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u32).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// Reads a body front to back; `None` = it ends early or is not UTF-8.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (head, rest) = self.0.split_at_checked(n)?;
        self.0 = rest;
        Some(head)
    }

    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }

    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }

    fn str(&mut self) -> Option<&'a str> {
        let n = self.u32()? as usize;
        std::str::from_utf8(self.take(n)?).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn entry(seq: u64, pairs: Vec<(u64, u64)>) -> Entry {
        Entry {
            rollout_id: "r-1".into(),
            attempt: 2,
            kind: "model_request".into(),
            created_ms: 1_700_000_000_123,
            events: vec![(seq, JsonText::from(json!({"n": seq, "s": "é\"\\"})))],
            supersede: pairs,
        }
    }

    fn owned(db: &Path) -> (EventLog, Vec<Entry>) {
        match open(db).expect("open") {
            Opened::Owned(log, entries) => (log, entries),
            Opened::Held(p) => panic!("{} held", p.display()),
        }
    }

    #[test]
    fn entries_read_back_as_written() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = dir.path().join("agl.db");
        let written = vec![entry(7, vec![]), entry(9, vec![(7, 9)])];
        {
            let (mut log, found) = owned(&db);
            assert!(found.is_empty());
            for e in &written {
                log.append(e).expect("append");
            }
        }
        let (log, found) = owned(&db);
        assert_eq!(found, written);
        assert_eq!(
            log.len(),
            std::fs::metadata(path_for(&db)).expect("meta").len()
        );
    }

    /// A store folder whose event log holds entries 1 and 2.
    fn two_entries() -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = dir.path().join("agl.db");
        let (mut log, _) = owned(&db);
        log.append(&entry(1, vec![])).expect("append");
        log.append(&entry(2, vec![])).expect("append");
        (dir, db)
    }

    #[test]
    fn a_torn_last_entry_is_cut_off_and_the_rest_kept() {
        let (_dir, db) = two_entries();
        let file = path_for(&db);
        let full = std::fs::metadata(&file).expect("meta").len();
        // The second frame loses its last byte, as a crash mid-write would.
        OpenOptions::new()
            .write(true)
            .open(&file)
            .and_then(|f| f.set_len(full - 1))
            .expect("tear");
        let (mut log, found) = owned(&db);
        assert_eq!(found, vec![entry(1, vec![])]);
        // Appends go after the last whole entry.
        log.append(&entry(3, vec![])).expect("append");
        drop(log);
        let (_, found) = owned(&db);
        assert_eq!(found, vec![entry(1, vec![]), entry(3, vec![])]);
    }

    #[test]
    fn a_corrupted_entry_ends_the_log() {
        let (_dir, db) = two_entries();
        let file = path_for(&db);
        let mut bytes = std::fs::read(&file).expect("read");
        let last = bytes.len() - 3;
        bytes[last] ^= 0x40;
        std::fs::write(&file, &bytes).expect("write");
        let (_, found) = owned(&db);
        assert_eq!(found, vec![entry(1, vec![])]);
    }

    #[test]
    fn a_second_opener_finds_the_log_held() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = dir.path().join("agl.db");
        let (first, _) = owned(&db);
        assert!(matches!(open(&db).expect("open"), Opened::Held(_)));
        drop(first);
        owned(&db);
    }

    /// A crash after the append and before its ingestion: the next open
    /// ingests the entry (its seqs and supersedes as logged), skips one
    /// ingested before, and numbers later appends after both.
    #[tokio::test]
    async fn the_next_open_ingests_what_the_log_holds() {
        use crate::{NewRollout, Store};
        let dir = tempfile::tempdir().expect("tempdir");
        let db = dir.path().join("agl.db");
        let first = {
            let store = Store::open(&db).expect("open");
            let rollout = NewRollout {
                id: Some("r-1".into()),
                group_id: "g".into(),
                mode: crate::Mode::Train,
                input: json!({}).into(),
                config: json!({}).into(),
            };
            store.create_rollouts(vec![rollout]).await.expect("create");
            let first = store
                .append_calls("r-1", 1, vec![json!({"call": 1}).into()], |_| vec![])
                .await
                .expect("append");
            first[0]
        };
        let call = |n: u64| JsonText::from(json!({"call": n}));
        let left = [
            // Ingested before the crash (same seq): left as it is.
            Entry {
                attempt: 1,
                events: vec![(first, call(99))],
                ..entry(first, vec![])
            },
            // Logged, not ingested: a retry of the first call.
            Entry {
                attempt: 1,
                events: vec![(first + 5, call(2))],
                supersede: vec![(first, first + 5)],
                ..entry(first + 5, vec![])
            },
        ];
        {
            let (mut log, _) = owned(&db);
            for e in &left {
                log.append(e).expect("append");
            }
        }
        let store = Store::open(&db).expect("reopen");
        let events = store.list_events("r-1", 0, 10).await.expect("list");
        let got: Vec<_> = events
            .iter()
            .map(|e| (e.seq, e.payload.clone(), e.superseded_by))
            .collect();
        assert_eq!(
            got,
            vec![
                (first, call(1), Some(first + 5)),
                (first + 5, call(2), None)
            ]
        );
        let next = store
            .append_event("r-1", 1, "log", call(3))
            .await
            .expect("append");
        assert_eq!(next, first + 6);
    }

    #[test]
    fn clearing_empties_the_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = dir.path().join("agl.db");
        let (mut log, _) = owned(&db);
        log.append(&entry(1, vec![])).expect("append");
        log.clear().expect("clear");
        log.append(&entry(2, vec![])).expect("append");
        drop(log);
        let (_, found) = owned(&db);
        assert_eq!(found, vec![entry(2, vec![])]);
    }
}
