//! The single writer thread and its group commit.
//!
//! Every write is a job sent to one thread that owns the write connection.
//! The thread takes all jobs waiting in its queue, runs each inside its own
//! SAVEPOINT of one transaction, commits once (one fsync for the batch with
//! `Durability::Power`), and only then answers each caller. A job that fails
//! is rolled back to its savepoint alone; its neighbours still commit.

use rusqlite::Connection;
use tokio::sync::{mpsc, oneshot};

use super::StoreError;
use super::checkpoint;

/// Most jobs folded into one transaction; bounds the latency one commit adds.
const MAX_BATCH: usize = 1024;

/// A queued write, type-erased so one queue carries every kind of request.
pub trait Job: Send {
    /// Runs the write; `false` = it failed and must be rolled back.
    fn run(&mut self, conn: &Connection) -> bool;
    /// Answers the caller once the batch's fate is known.
    fn finish(self: Box<Self>, commit: Result<(), String>);
}

struct Typed<T, F> {
    work: Option<F>,
    out: Option<Result<T, StoreError>>,
    reply: oneshot::Sender<Result<T, StoreError>>,
}

impl<T, F> Job for Typed<T, F>
where
    T: Send,
    F: FnOnce(&Connection) -> Result<T, StoreError> + Send,
{
    fn run(&mut self, conn: &Connection) -> bool {
        let out = self.work.take().map(|f| f(conn));
        let ok = matches!(out, Some(Ok(_)));
        self.out = out;
        ok
    }

    fn finish(self: Box<Self>, commit: Result<(), String>) {
        let answer = match (commit, self.out) {
            (Err(e), _) => Err(StoreError::Commit(e)),
            (Ok(()), Some(out)) => out,
            (Ok(()), None) => Err(StoreError::Commit("request was not run".into())),
        };
        // The caller may have gone away; its write still stands.
        let _ = self.reply.send(answer);
    }
}

pub type Queue = mpsc::UnboundedSender<Box<dyn Job>>;

/// Wraps `work` as a job and the receiver its answer arrives on.
pub fn job<T, F>(work: F) -> (Box<dyn Job>, oneshot::Receiver<Result<T, StoreError>>)
where
    T: Send + 'static,
    F: FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
{
    let (reply, rx) = oneshot::channel();
    let job = Typed {
        work: Some(work),
        out: None,
        reply,
    };
    (Box::new(job), rx)
}

/// Starts the writer thread; it exits when every sender is dropped.
pub fn spawn(conn: Connection, checkpoints: checkpoint::Notify) -> std::io::Result<Queue> {
    let (tx, rx) = mpsc::unbounded_channel();
    std::thread::Builder::new()
        .name("agl-store-writer".into())
        .spawn(move || run(conn, rx, checkpoints))?;
    Ok(tx)
}

fn run(
    conn: Connection,
    mut rx: mpsc::UnboundedReceiver<Box<dyn Job>>,
    checkpoints: checkpoint::Notify,
) {
    let mut batch: Vec<Box<dyn Job>> = Vec::new();
    while let Some(first) = rx.blocking_recv() {
        batch.push(first);
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        let commit = run_batch(&conn, &mut batch).map_err(|e| e.to_string());
        for job in batch.drain(..) {
            job.finish(commit.clone());
        }
        if commit.is_ok() {
            // A checkpointer that has exited only leaves the log growing.
            let _ = checkpoints.send(());
        }
    }
}

fn run_batch(conn: &Connection, batch: &mut [Box<dyn Job>]) -> rusqlite::Result<()> {
    // IMMEDIATE takes the write lock up front, so another process holding it
    // is waited out by the busy timeout rather than failing mid-batch.
    // Prepared once and reused: parsing these per job showed in profiles.
    let exec = |sql: &str| conn.prepare_cached(sql)?.execute([]).map(|_| ());
    exec("BEGIN IMMEDIATE")?;
    let result = (|| {
        for job in batch.iter_mut() {
            exec("SAVEPOINT req")?;
            if !job.run(conn) {
                exec("ROLLBACK TO req")?;
            }
            exec("RELEASE req")?;
        }
        exec("COMMIT")
    })();
    if result.is_err() {
        // Nothing of this batch was committed; leave no transaction open.
        let _ = conn.execute_batch("ROLLBACK");
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::open_writer;

    fn engine_names(conn: &Connection) -> Vec<String> {
        let mut stmt = conn
            .prepare("SELECT name FROM engines ORDER BY name")
            .expect("prepare");
        stmt.query_map([], |r| r.get(0))
            .expect("query")
            .collect::<rusqlite::Result<_>>()
            .expect("rows")
    }

    #[test]
    fn a_failed_job_rolls_back_alone_within_its_batch() {
        let dir = tempfile::tempdir().expect("tempdir");
        let conn = open_writer(&dir.path().join("agl.db"), Default::default()).expect("open");
        let insert = |name: &'static str, fail: bool| {
            job(move |c: &Connection| {
                c.execute(
                    "INSERT INTO engines (name, base_url, model, created_ms) VALUES (?1, 'http://x', 'm', 0)",
                    [name],
                )?;
                // Fails after writing, so only the savepoint can undo it.
                if fail {
                    return Err(StoreError::EngineNotFound(name.into()));
                }
                Ok(name)
            })
        };
        let (a, mut ra) = insert("a", false);
        let (b, mut rb) = insert("b", true);
        let (c, mut rc) = insert("c", false);
        let mut batch = vec![a, b, c];
        let commit = run_batch(&conn, &mut batch).map_err(|e| e.to_string());
        assert!(commit.is_ok());
        for j in batch {
            j.finish(commit.clone());
        }
        assert_eq!(ra.try_recv().expect("answered").expect("a ok"), "a");
        assert!(matches!(
            rb.try_recv().expect("answered"),
            Err(StoreError::EngineNotFound(_))
        ));
        assert_eq!(rc.try_recv().expect("answered").expect("c ok"), "c");
        assert_eq!(engine_names(&conn), vec!["a", "c"]);
        let in_tx: bool = !conn.is_autocommit();
        assert!(!in_tx, "batch transaction closed");
    }

    #[test]
    fn a_failed_commit_fails_every_job() {
        let (j, mut rx) = job(|_c: &Connection| Ok(1));
        j.finish(Err("disk full".into()));
        assert!(matches!(
            rx.try_recv().expect("answered"),
            Err(StoreError::Commit(m)) if m == "disk full"
        ));
    }
}
