//! The event log: where an appended event becomes durable before its caller
//! is answered (`[store] durability = "process"`, the default).
//!
//! A proxied call's record is one append to this file (a copy into a
//! shared memory map of it: no system call, no SQLite transaction, no lock
//! of SQLite's), so the call is answered without waiting for a commit; the
//! writer thread then ingests what was logged into SQLite in its next batch,
//! in log order, and empties the log once everything in it is ingested. A
//! shared map's pages are the file's page cache: what was copied survives
//! `kill -9`, as a WAL commit without an fsync does. (A `write` per append
//! cost a runtime worker ~7 µs of ext4's buffered-write path and ~10% of the
//! gateway's throughput at 64 connections, benches/gateway.rs.) Seqs are
//! given out when an entry is logged (see `writer.rs`), so the caller gets
//! its seq at once and the events table gets the same one.
//!
//! The file sits beside the database (`agl.db-events`) and is locked by the
//! process that writes the store: a second process opening the store finds
//! it held and may not append events (its seqs would collide with ones
//! logged but not yet ingested). On open, the owner ingests what the file
//! holds (a crash left it there) before serving: an entry whose seqs are in
//! the table already was ingested before the log was emptied, and is
//! skipped.
//!
//! Layout: a header (magic, then the epoch, u64 LE), then frames, each its
//! body length, a CRC32 of the rest, the epoch it was written in, and the
//! body. Space is allocated ahead (`posix_fallocate`, so a full disk fails
//! an append instead of faulting the map) and reused: emptying the log
//! bumps the header's epoch, and the frames of older epochs behind the new
//! tail end the log when read. A torn last frame (a crash mid-copy, never
//! acknowledged) fails its CRC and ends the log too.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::Read;
use std::path::{Path, PathBuf};

use agl_wire::rollout::JsonText;
use memmap2::MmapMut;
use serde_json::value::RawValue;

use super::StoreError;

/// The log's file name: the database's with this appended.
const SUFFIX: &str = "-events";

/// The file's first bytes; then the epoch of its live frames (u64 LE).
const MAGIC: &[u8; 8] = b"agl-evl2";
const FILE_HEADER: usize = 16;

/// Frame header: body length (u32 LE), CRC32 of epoch and body (u32 LE),
/// epoch (u64 LE).
const HEADER: usize = 16;

/// The largest body a frame may claim; a larger one is a torn length.
const MAX_BODY: usize = 1 << 30;

/// Space allocated at first, and the unit it grows by (doubling).
const MIN_CAPACITY: usize = 4 << 20;

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
    /// The file, mapped; `None` until the first append needs room (a log
    /// only held for its lock, `durability = "power"`, stays empty), and
    /// for a file of the first format (read, then emptied).
    map: Option<MmapMut>,
    /// The epoch of the live frames.
    epoch: u64,
    /// Where the next frame goes.
    tail: usize,
    /// The frame being built (kept to spare an allocation per append).
    frame: Vec<u8>,
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

/// Opens and locks the log of the database at `db` (creating it owner-only)
/// and reads the entries it holds; appends go after them. The caller
/// ingests those entries before it appends: a file of the first format
/// (frames without epochs, the whole file) is emptied by the first append.
pub fn open(db: &Path) -> Result<Opened, StoreError> {
    let path = path_for(db);
    let io = |source| StoreError::Log {
        path: path.display().to_string(),
        source,
    };
    let mut options = OpenOptions::new();
    options.read(true).write(true).create(true).truncate(false);
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
    let mut log = EventLog {
        file,
        path,
        map: None,
        epoch: 0,
        tail: FILE_HEADER,
        frame: Vec::new(),
    };
    let entries = match bytes.strip_prefix(MAGIC) {
        Some(rest) if bytes.len() >= FILE_HEADER => {
            log.epoch = u64_at(rest, 0);
            let (entries, end) = read_frames(&bytes, FILE_HEADER, Some(log.epoch));
            if bytes
                .get(end..end + HEADER)
                .is_some_and(|h| u64_at(h, 8) == log.epoch && h[..4] != [0; 4])
            {
                tracing::warn!(
                    log = %log.path.display(),
                    "the event log ends in a torn entry (a crash mid-write); cutting it off"
                );
            }
            log.map = Some(log.map_file()?);
            log.tail = end;
            entries
        }
        _ => read_frames(&bytes, 0, None).0,
    };
    Ok(Opened::Owned(log, entries))
}

impl EventLog {
    /// Appends `entry` as one frame: a copy into the map (the file grows
    /// first when it has no room).
    pub fn append(&mut self, entry: &Entry) -> Result<(), StoreError> {
        let body_len = entry.encoded_len();
        let len = u32::try_from(body_len)
            .ok()
            .filter(|&n| n as usize <= MAX_BODY)
            .ok_or_else(|| StoreError::OutOfRange("event log entry over 1 GiB".into()))?;
        let mut frame = std::mem::take(&mut self.frame);
        frame.clear();
        frame.extend_from_slice(&len.to_le_bytes());
        frame.extend_from_slice(&[0; 4]);
        frame.extend_from_slice(&[0; 8]);
        entry.encode(&mut frame);
        let at = self.tail;
        let end = at + frame.len();
        let copied = self.room(end).map(|(map, epoch)| {
            frame[8..HEADER].copy_from_slice(&epoch.to_le_bytes());
            let crc = crc32fast::hash(&frame[8..]);
            frame[4..8].copy_from_slice(&crc.to_le_bytes());
            map[at..end].copy_from_slice(&frame);
        });
        if frame.capacity() <= MIN_CAPACITY {
            self.frame = frame;
        }
        copied?;
        self.tail = end;
        Ok(())
    }

    /// Bytes of live frames in the log.
    pub fn len(&self) -> u64 {
        match self.map {
            Some(_) => (self.tail - FILE_HEADER) as u64,
            None => 0,
        }
    }

    /// Empties the log: everything in it is ingested. Its space is kept
    /// for the frames to come.
    pub fn clear(&mut self) -> Result<(), StoreError> {
        match self.map.as_mut() {
            Some(map) => {
                self.epoch += 1;
                map[8..FILE_HEADER].copy_from_slice(&self.epoch.to_le_bytes());
            }
            None => self.file.set_len(0).map_err(|e| self.error(e))?,
        }
        self.tail = FILE_HEADER;
        Ok(())
    }

    /// The map, with the file at least `end` bytes long (allocated and
    /// mapped again when it is not; a new file gets its header), and the
    /// epoch frames are written in.
    fn room(&mut self, end: usize) -> Result<(&mut MmapMut, u64), StoreError> {
        let capacity = self.map.as_ref().map_or(0, |m| m.len());
        if end > capacity {
            if self.map.is_none() {
                // Empty, or of the first format and ingested.
                self.file.set_len(0).map_err(|e| self.error(e))?;
            }
            let size = end.max(capacity * 2).next_multiple_of(MIN_CAPACITY);
            allocate(&self.file, size as u64).map_err(|e| self.error(e))?;
            let mut map = self.map_file()?;
            if capacity == 0 {
                self.epoch += 1;
                map[..8].copy_from_slice(MAGIC);
                map[8..FILE_HEADER].copy_from_slice(&self.epoch.to_le_bytes());
            }
            self.map = Some(map);
        }
        let epoch = self.epoch;
        let map = self.map.as_mut();
        map.map(|m| (m, epoch))
            .ok_or_else(|| StoreError::Commit("the event log is not mapped".into()))
    }

    fn map_file(&self) -> Result<MmapMut, StoreError> {
        // SAFETY: the map is of a file this process holds the lock of; no
        // agl process writes or truncates a log it does not hold, and this
        // one only grows it (allocated, so a page never faults for want of
        // disk space) and truncates it unmapped (`Drop`, `room`).
        unsafe { MmapMut::map_mut(&self.file) }.map_err(|e| self.error(e))
    }

    fn error(&self, source: std::io::Error) -> StoreError {
        StoreError::Log {
            path: self.path.display().to_string(),
            source,
        }
    }
}

impl Drop for EventLog {
    /// An empty log gives its space back (a clean shutdown ingests all).
    fn drop(&mut self) {
        if self.map.is_some() && self.tail == FILE_HEADER {
            self.map = None;
            if let Err(e) = self.file.set_len(0) {
                tracing::warn!(log = %self.path.display(), error = %e, "cannot truncate the empty event log");
            }
        }
    }
}

/// Allocates the file's first `len` bytes on disk (growing it to `len`).
#[cfg(unix)]
fn allocate(file: &File, len: u64) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let len = libc::off_t::try_from(len).map_err(std::io::Error::other)?;
    // SAFETY: a plain system call on a descriptor `file` keeps open.
    match unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len) } {
        0 => Ok(()),
        errno => Err(std::io::Error::from_raw_os_error(errno)),
    }
}

#[cfg(not(unix))]
fn allocate(file: &File, len: u64) -> std::io::Result<()> {
    file.set_len(len)
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    let mut n = [0; 8];
    n.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(n)
}

/// The whole frames from `at` on (of `epoch`; any, in the first format,
/// which had no epochs), and where they end.
fn read_frames(bytes: &[u8], mut at: usize, epoch: Option<u64>) -> (Vec<Entry>, usize) {
    let header = if epoch.is_some() { HEADER } else { 8 };
    let mut entries = Vec::new();
    while let Some(head) = bytes.get(at..at + header) {
        let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
        let crc = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
        if len == 0 || len > MAX_BODY || epoch.is_some_and(|e| u64_at(head, 8) != e) {
            break;
        }
        // The CRC covers the epoch too.
        let Some(checked) = bytes.get(at + 8..at + header + len) else {
            break;
        };
        if crc32fast::hash(checked) != crc {
            break;
        }
        let Some(entry) = Entry::decode(&checked[header - 8..]) else {
            break;
        };
        entries.push(entry);
        at += header + len;
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
        let len = {
            let (mut log, found) = owned(&db);
            assert!(found.is_empty());
            for e in &written {
                log.append(e).expect("append");
            }
            log.len()
        };
        let (log, found) = owned(&db);
        assert_eq!(found, written);
        assert_eq!(log.len(), len);
        let file = std::fs::metadata(path_for(&db)).expect("meta").len();
        assert_eq!(file, MIN_CAPACITY as u64, "space is allocated ahead");
    }

    /// A store folder whose event log holds entries 1 and 2, and where the
    /// second ends in the file.
    fn two_entries() -> (tempfile::TempDir, PathBuf, usize) {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = dir.path().join("agl.db");
        let (mut log, _) = owned(&db);
        log.append(&entry(1, vec![])).expect("append");
        log.append(&entry(2, vec![])).expect("append");
        let end = FILE_HEADER + log.len() as usize;
        (dir, db, end)
    }

    /// Rewrites the log's bytes `at` with `f`.
    fn damage(db: &Path, at: std::ops::Range<usize>, f: impl Fn(&mut u8)) {
        let file = path_for(db);
        let mut bytes = std::fs::read(&file).expect("read");
        bytes[at].iter_mut().for_each(f);
        std::fs::write(&file, &bytes).expect("write");
    }

    #[test]
    fn a_torn_last_entry_is_cut_off_and_the_rest_kept() {
        let (_dir, db, end) = two_entries();
        // The second frame lacks its last bytes, as a crash mid-copy leaves it.
        damage(&db, end - 12..end, |b| *b = 0);
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
        let (_dir, db, end) = two_entries();
        damage(&db, end - 3..end - 2, |b| *b ^= 0x40);
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

    /// Emptying reuses the space: the frames behind the new tail are of an
    /// older epoch and end the log, though their CRCs still hold.
    #[test]
    fn clearing_empties_the_log_and_reuses_its_space() {
        let (_dir, db, _) = two_entries();
        let (mut log, found) = owned(&db);
        assert_eq!(found.len(), 2);
        log.clear().expect("clear");
        assert_eq!(log.len(), 0);
        drop(log);
        let (mut log, found) = owned(&db);
        assert_eq!(found, vec![]);
        // A shorter entry: the old second frame now starts mid-file, whole.
        let short = Entry {
            rollout_id: "r".into(),
            ..entry(3, vec![])
        };
        log.append(&short).expect("append");
        drop(log);
        let (log, found) = owned(&db);
        assert_eq!(found, vec![short]);
        drop(log);
        let file = std::fs::metadata(path_for(&db)).expect("meta").len();
        assert_eq!(file, MIN_CAPACITY as u64);
    }

    /// A clean shutdown leaves an empty file; an entry larger than the
    /// space allocated grows it.
    #[test]
    fn an_empty_log_gives_its_space_back_and_a_large_entry_grows_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = dir.path().join("agl.db");
        let (mut log, _) = owned(&db);
        log.append(&entry(1, vec![])).expect("append");
        log.clear().expect("clear");
        drop(log);
        assert_eq!(std::fs::metadata(path_for(&db)).expect("meta").len(), 0);
        let big = Entry {
            events: vec![(2, JsonText::from(json!("x".repeat(MIN_CAPACITY))))],
            ..entry(2, vec![])
        };
        let (mut log, _) = owned(&db);
        log.append(&entry(1, vec![])).expect("append");
        log.append(&big).expect("append");
        log.append(&entry(3, vec![])).expect("append");
        drop(log);
        let (_, found) = owned(&db);
        assert_eq!(found, vec![entry(1, vec![]), big, entry(3, vec![])]);
        let file = std::fs::metadata(path_for(&db)).expect("meta").len();
        assert_eq!(file, 2 * MIN_CAPACITY as u64);
    }

    /// A log of the first format (frames without epochs, left by a crash
    /// of an older agl) is read whole, and emptied by the first append.
    #[test]
    fn a_log_of_the_first_format_is_read() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = dir.path().join("agl.db");
        let mut bytes = Vec::new();
        for e in [entry(1, vec![]), entry(2, vec![(1, 2)])] {
            let mut body = Vec::new();
            e.encode(&mut body);
            bytes.extend_from_slice(&(body.len() as u32).to_le_bytes());
            bytes.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
            bytes.extend_from_slice(&body);
        }
        std::fs::write(path_for(&db), &bytes).expect("write");
        let (mut log, found) = owned(&db);
        assert_eq!(found, vec![entry(1, vec![]), entry(2, vec![(1, 2)])]);
        log.append(&entry(3, vec![])).expect("append");
        drop(log);
        let (_, found) = owned(&db);
        assert_eq!(found, vec![entry(3, vec![])]);
    }
}
