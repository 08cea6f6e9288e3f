//! WAL checkpoints off the write path.
//!
//! SQLite's automatic checkpoint runs inside the commit that crosses its
//! threshold, on the writer thread: copying the log into the database and
//! two fsyncs stall every queued write for milliseconds (tens on a slow
//! disk), and under load every in-flight proxied call waits behind it. So
//! the writer leaves it to this thread, which checkpoints from its own
//! connection shortly after commits happen. PASSIVE never blocks the writer
//! or readers; once a pass has copied the whole log, the writer's next
//! transaction starts the log over. Under writes that never pause no pass
//! copies the whole log, so past `[store] wal_limit_mib` the writer's own
//! commit checkpoints what this thread left (SQLite's autocheckpoint, set
//! to that limit), and the file stays bounded.

use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

use rusqlite::Connection;

use super::StoreError;
use super::schema;

/// How long commits accumulate before a pass; bounds the log to what the
/// writer commits in this time.
const INTERVAL: Duration = Duration::from_millis(100);

/// Tells the checkpointer that a commit happened. When every sender is
/// dropped (the writer thread ended), the thread exits.
pub type Notify = mpsc::Sender<()>;

/// Starts the checkpointer for the store at `path`.
pub fn spawn(path: &Path) -> Result<Notify, StoreError> {
    let conn = schema::open_checkpointer(path)?;
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name("agl-store-ckpt".into())
        .spawn(move || run(conn, rx))
        .map_err(|e| StoreError::Commit(e.to_string()))?;
    Ok(tx)
}

fn run(conn: Connection, rx: mpsc::Receiver<()>) {
    while rx.recv().is_ok() {
        std::thread::sleep(INTERVAL);
        while rx.try_recv().is_ok() {}
        if let Err(e) = checkpoint(&conn) {
            tracing::warn!("WAL checkpoint: {e}");
        }
    }
}

/// One PASSIVE pass: copies what no reader still needs; never waits.
fn checkpoint(conn: &Connection) -> rusqlite::Result<()> {
    conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))
}
