//! Connection settings and schema migrations (tracked in `PRAGMA user_version`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};

use super::StoreError;

/// Migration `i` takes the schema from version `i` to `i + 1`. Append only:
/// a released step is never edited.
const MIGRATIONS: &[&str] = &[
    r#"
CREATE TABLE rollouts (
    id          TEXT PRIMARY KEY,
    group_id    TEXT NOT NULL,
    mode        TEXT NOT NULL CHECK (mode IN ('train', 'val')),
    input       TEXT NOT NULL,
    config      TEXT NOT NULL,
    status      TEXT NOT NULL,
    attempt     INTEGER NOT NULL,
    reason      TEXT,
    created_ms  INTEGER NOT NULL,
    updated_ms  INTEGER NOT NULL
);
CREATE INDEX rollouts_by_order ON rollouts (created_ms, id);
CREATE INDEX rollouts_by_status ON rollouts (status, created_ms, id);
CREATE TABLE attempts (
    rollout_id  TEXT NOT NULL REFERENCES rollouts (id),
    attempt     INTEGER NOT NULL,
    status      TEXT NOT NULL,
    started_ms  INTEGER,
    ended_ms    INTEGER,
    reason      TEXT,
    PRIMARY KEY (rollout_id, attempt)
);
CREATE TABLE events (
    seq           INTEGER PRIMARY KEY AUTOINCREMENT,
    rollout_id    TEXT NOT NULL,
    attempt       INTEGER NOT NULL,
    kind          TEXT NOT NULL,
    payload       TEXT NOT NULL,
    created_ms    INTEGER NOT NULL,
    superseded_by INTEGER REFERENCES events (seq),
    FOREIGN KEY (rollout_id, attempt) REFERENCES attempts (rollout_id, attempt)
);
CREATE INDEX events_by_rollout ON events (rollout_id, seq);
CREATE TABLE engines (
    name        TEXT PRIMARY KEY,
    base_url    TEXT NOT NULL,
    model       TEXT NOT NULL,
    created_ms  INTEGER NOT NULL
);
CREATE TABLE weight_versions (
    version     INTEGER PRIMARY KEY,
    created_ms  INTEGER NOT NULL,
    meta        TEXT NOT NULL
);
"#,
    // 2: a failure's kind is a column, not a `system: ` prefix of its reason.
    r#"
ALTER TABLE rollouts ADD COLUMN failure TEXT CHECK (failure IN ('system', 'agent'));
ALTER TABLE attempts ADD COLUMN failure TEXT CHECK (failure IN ('system', 'agent'));
UPDATE rollouts SET failure = CASE WHEN reason LIKE 'system: %' THEN 'system' ELSE 'agent' END
    WHERE status = 'failed';
UPDATE attempts SET failure = CASE WHEN reason LIKE 'system: %' THEN 'system' ELSE 'agent' END
    WHERE status = 'failed';
UPDATE rollouts SET reason = substr(reason, 9) WHERE failure = 'system' AND reason LIKE 'system: %';
UPDATE attempts SET reason = substr(reason, 9) WHERE failure = 'system' AND reason LIKE 'system: %';
"#,
    // 3: who renders an engine's chat prompts (`agl_wire::api::Render`).
    r#"
ALTER TABLE engines ADD COLUMN render TEXT NOT NULL DEFAULT 'engine'
    CHECK (render IN ('engine', 'gateway'));
"#,
    // 4: the token-in API of a gateway-rendering engine (`agl_wire::api::EngineApi`).
    r#"
ALTER TABLE engines ADD COLUMN api TEXT NOT NULL DEFAULT 'openai'
    CHECK (api IN ('openai', 'sglang'));
"#,
    // 5: the policy folder a gateway-rendering engine renders with, and the
    // engine's context length (`agl_wire::api::Engine`).
    r#"
ALTER TABLE engines ADD COLUMN policy TEXT;
ALTER TABLE engines ADD COLUMN context_len INTEGER CHECK (context_len > 0);
"#,
    // `events.seq` without AUTOINCREMENT: that kept the last seq in
    // `sqlite_sequence`, one more page written to the log by every commit
    // (a quarter of a proxied call's log writes). Events are never deleted,
    // so the rowid SQLite picks (the largest + 1) already never repeats.
    r#"
CREATE TABLE events_next (
    seq           INTEGER PRIMARY KEY,
    rollout_id    TEXT NOT NULL,
    attempt       INTEGER NOT NULL,
    kind          TEXT NOT NULL,
    payload       TEXT NOT NULL,
    created_ms    INTEGER NOT NULL,
    superseded_by INTEGER REFERENCES events (seq),
    FOREIGN KEY (rollout_id, attempt) REFERENCES attempts (rollout_id, attempt)
);
INSERT INTO events_next (seq, rollout_id, attempt, kind, payload, created_ms, superseded_by)
    SELECT seq, rollout_id, attempt, kind, payload, created_ms, superseded_by FROM events;
DROP TABLE events;
ALTER TABLE events_next RENAME TO events;
CREATE INDEX events_by_rollout ON events (rollout_id, seq);
"#,
];

pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

fn open_err(path: &Path) -> impl FnOnce(rusqlite::Error) -> StoreError + '_ {
    move |source| StoreError::Open {
        path: path.display().to_string(),
        source,
    }
}

/// What an acknowledged write survives.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Durability {
    /// A crash of the process (kill -9): commits reach the WAL file before
    /// they are acknowledged, the OS writes them out later (SQLite
    /// `synchronous=NORMAL`); an appended event reaches the event log
    /// before it is acknowledged (`eventlog.rs`). Costs no fsync.
    #[default]
    Process,
    /// Power loss or an OS crash too: every commit (batch) is fsynced
    /// (`synchronous=FULL`), a few milliseconds on a typical disk.
    Power,
}

/// The single write connection, with the schema brought up to date.
/// Creates the store file owner-only (0600) before SQLite opens it; SQLite
/// gives the `-wal` and `-shm` files it creates the same mode (and the
/// event log, `-events`, is created so). Files left more open by an older
/// agl are tightened.
fn private_files(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(path)?;
    for suffix in ["", "-wal", "-shm", "-events"] {
        let file = PathBuf::from(format!("{}{suffix}", path.display()));
        if let Ok(meta) = std::fs::metadata(&file)
            && meta.permissions().mode() & 0o077 != 0
        {
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600))?;
        }
    }
    Ok(())
}

/// The page size of a new store. Its rows are model calls of 2 KiB (a
/// short call) to hundreds (a long agent prompt and its ids), and each page
/// costs the writer a WAL frame and the checkpointer a read and a write
/// (a syscall each): with SQLite's default of 4 KiB, the gateway bench at
/// 64 connections spent 13.3-14.0 µs of CPU per call in those two threads,
/// with 16 KiB 10.3-11.5, and a 40 KiB row is 3 pages instead of 10.
pub const PAGE_SIZE: i64 = 16384;

pub fn open_writer(path: &Path, durability: Durability) -> Result<Connection, StoreError> {
    private_files(path).map_err(|source| StoreError::Private {
        path: path.display().to_string(),
        source,
    })?;
    let mut conn = Connection::open(path).map_err(open_err(path))?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    // Only a new file takes it (an existing store keeps its own).
    conn.pragma_update(None, "page_size", PAGE_SIZE)?;
    // WAL: readers never block the writer. In WAL mode a commit is written
    // to the log before it returns, so NORMAL already survives kill -9;
    // FULL adds an fsync per commit for power loss.
    let mode: String = conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(StoreError::NoWal {
            path: path.display().to_string(),
            mode,
        });
    }
    let synchronous = match durability {
        Durability::Process => "NORMAL",
        Durability::Power => "FULL",
    };
    conn.pragma_update(None, "synchronous", synchronous)?;
    // Room for every write statement plus the batch's transaction control.
    conn.set_prepared_statement_cache_capacity(64);
    // Also turns foreign keys on, once the schema is current.
    migrate(&mut conn)?;
    Ok(conn)
}

/// The checkpointer's connection (see `checkpoint.rs`).
pub fn open_checkpointer(path: &Path) -> Result<Connection, StoreError> {
    let conn = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_WRITE)
        .map_err(open_err(path))?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    Ok(conn)
}

pub fn open_reader(path: &Path) -> Result<Connection, StoreError> {
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags).map_err(open_err(path))?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    Ok(conn)
}

fn migrate(conn: &mut Connection) -> Result<(), StoreError> {
    // A table rebuild (SQLite's twelve steps for what ALTER TABLE cannot
    // do) needs foreign keys off while the old table is dropped, and a
    // transaction cannot turn them off: off around it, checked before the
    // commit, on again after.
    conn.pragma_update(None, "foreign_keys", "OFF")?;
    let migrated = migrate_steps(conn);
    conn.pragma_update(None, "foreign_keys", "ON")?;
    migrated
}

fn migrate_steps(conn: &mut Connection) -> Result<(), StoreError> {
    // IMMEDIATE: two processes opening the same old file cannot both migrate.
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    let found: i64 = tx.pragma_query_value(None, "user_version", |r| r.get(0))?;
    if found > SCHEMA_VERSION {
        return Err(StoreError::SchemaTooNew {
            found,
            supported: SCHEMA_VERSION,
        });
    }
    if found == SCHEMA_VERSION {
        return Ok(());
    }
    for step in &MIGRATIONS[found.max(0) as usize..] {
        tx.execute_batch(step)?;
    }
    let violations: i64 =
        tx.query_row("SELECT count(*) FROM pragma_foreign_key_check", [], |r| {
            r.get(0)
        })?;
    if violations > 0 {
        return Err(StoreError::MigrationBroke {
            version: SCHEMA_VERSION,
            violations,
        });
    }
    tx.pragma_update(None, "user_version", SCHEMA_VERSION)?;
    tx.commit()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Migrating turns foreign keys off around its transaction; the writer
    /// it hands back enforces them, whether it migrated or not.
    #[test]
    fn the_writer_enforces_foreign_keys_after_migrating() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("agl.db");
        for _fresh_then_current in 0..2 {
            let conn = open_writer(&path, Durability::Process).expect("open");
            let on: i64 = conn
                .pragma_query_value(None, "foreign_keys", |r| r.get(0))
                .expect("pragma");
            assert_eq!(on, 1);
            let orphan = conn.execute(
                "INSERT INTO events (rollout_id, attempt, kind, payload, created_ms)
                 VALUES ('nobody', 1, 'log', '{}', 0)",
                [],
            );
            assert!(orphan.is_err(), "an event of no attempt is refused");
        }
    }
}
