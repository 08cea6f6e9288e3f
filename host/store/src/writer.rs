//! The write queue and its group commit.
//!
//! Every write is a job in one queue. Whoever holds the write connection
//! takes the jobs waiting, runs each inside its own SAVEPOINT of one
//! transaction, commits once (one fsync for the batch with
//! `Durability::Power`), and only then answers each caller: the writer
//! thread, or (without an fsync per commit) a caller that found the
//! connection free. A job that fails is rolled back to its savepoint alone;
//! its neighbours still commit.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

use rusqlite::Connection;
use tokio::sync::oneshot;

use super::StoreError;
use super::checkpoint;
use super::schema::Durability;

/// Most jobs folded into one transaction; bounds the latency one commit adds.
const MAX_BATCH: usize = 1024;

/// A job that comes this long after the one before is sparse: committed on
/// its caller's thread if it finds the writer idle. Denser jobs are group
/// committed by the writer thread, which costs less per job under load.
const SPARSE_NS: u64 = 250_000;

/// The writer thread's name.
const WRITER_THREAD: &str = "agl-store-writer";

/// `last_submit` before the first job.
const NEVER: u64 = u64::MAX;

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

/// The write side of the store: a queue of jobs and the write connection.
/// Whoever holds the connection commits what is queued, as one
/// transaction: the writer thread, or a caller that finds it idle.
pub struct Writer {
    shared: Arc<Shared>,
}

/// What the writer thread and its callers share.
struct Shared {
    conn: Mutex<Connection>,
    queue: Mutex<Queue>,
    /// Wakes the writer thread (with `queue`).
    wake: Condvar,
    checkpoints: checkpoint::Notify,
    /// Whether a caller may commit on its own thread (no fsync per commit,
    /// so it holds its thread for tens of microseconds, not milliseconds).
    inline: bool,
    /// When the last job was submitted, in ns after `epoch`.
    last_submit: AtomicU64,
    epoch: Instant,
}

#[derive(Default)]
struct Queue {
    jobs: Vec<Box<dyn Job>>,
    /// The [`Writer`] is gone: the thread commits what is left and ends.
    closed: bool,
}

impl Writer {
    /// Queues `job`; then, when the connection is free, commits the queue
    /// (one batch) on the caller's thread: a call alone skips two thread
    /// hand-offs (the writer's wake-up, then the caller's), and calls that
    /// queued meanwhile join its batch. Otherwise, and always with
    /// [`Durability::Power`], the writer thread commits it with its next
    /// batch (group commit under load).
    pub fn submit(&self, job: Box<dyn Job>) -> Result<(), StoreError> {
        let shared = &self.shared;
        let now = shared.epoch.elapsed().as_nanos() as u64;
        let prev = shared.last_submit.swap(now, Ordering::Relaxed);
        let sparse = prev == NEVER || now.saturating_sub(prev) > SPARSE_NS;
        let alone = {
            let mut queue = shared.lock_queue();
            if queue.closed {
                return Err(StoreError::Closed);
            }
            queue.jobs.push(job);
            queue.jobs.len() == 1
        };
        if shared.inline
            && sparse
            && alone
            && let Ok(conn) = shared.conn.try_lock()
        {
            shared.commit_batch(&conn);
            if shared.lock_queue().jobs.is_empty() {
                return Ok(());
            }
        }
        shared.wake.notify_one();
        Ok(())
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.shared.lock_queue().closed = true;
        self.shared.wake.notify_one();
    }
}

impl Shared {
    // A poisoned lock only means a job panicked while it was held; the
    // queue and the connection are still whole (SQLite rolled back what a
    // failed transaction had).
    fn lock_queue(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Commits up to [`MAX_BATCH`] queued jobs as one transaction and
    /// answers each; false when there were none.
    fn commit_batch(&self, conn: &Connection) -> bool {
        let mut batch = {
            let mut queue = self.lock_queue();
            let n = queue.jobs.len().min(MAX_BATCH);
            queue.jobs.drain(..n).collect::<Vec<_>>()
        };
        if batch.is_empty() {
            return false;
        }
        if !conn.is_autocommit() {
            // A transaction a panicking job left open (its batch was never
            // answered): nothing of it is committed.
            let _ = conn.execute_batch("ROLLBACK");
        }
        let result = run_batch(conn, &mut batch).map_err(|e| e.to_string());
        for job in batch {
            job.finish(result.clone());
        }
        if result.is_ok() {
            // A checkpointer that has exited only leaves the log growing.
            let _ = self.checkpoints.send(());
        }
        true
    }
}

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

/// Starts the writer thread for `conn`; it ends once the [`Writer`] is
/// dropped and the queue is committed.
pub fn spawn(
    conn: Connection,
    durability: Durability,
    checkpoints: checkpoint::Notify,
) -> std::io::Result<Writer> {
    let shared = Arc::new(Shared {
        conn: Mutex::new(conn),
        queue: Mutex::default(),
        wake: Condvar::new(),
        checkpoints,
        inline: durability == Durability::Process,
        last_submit: AtomicU64::new(NEVER),
        epoch: Instant::now(),
    });
    let thread = shared.clone();
    std::thread::Builder::new()
        .name(WRITER_THREAD.into())
        .spawn(move || run(&thread))?;
    Ok(Writer { shared })
}

fn run(shared: &Shared) {
    loop {
        {
            let mut queue = shared.lock_queue();
            while queue.jobs.is_empty() && !queue.closed {
                queue = shared.wake.wait(queue).unwrap_or_else(|e| e.into_inner());
            }
            if queue.jobs.is_empty() {
                return; // closed, and nothing left
            }
        }
        let conn = shared.conn.lock().unwrap_or_else(|e| e.into_inner());
        while shared.commit_batch(&conn) {}
    }
}

fn run_batch(conn: &Connection, batch: &mut [Box<dyn Job>]) -> rusqlite::Result<()> {
    // IMMEDIATE takes the write lock up front, so another process holding it
    // is waited out by the busy timeout rather than failing mid-batch.
    // Prepared once and reused: parsing these per job showed in profiles.
    let exec = |sql: &str| conn.prepare_cached(sql)?.execute([]).map(|_| ());
    exec("BEGIN IMMEDIATE")?;
    let result = (|| {
        if let [job] = batch {
            // Alone in its transaction, which is then its savepoint (two
            // statements fewer for a call committed on its own thread).
            return exec(if job.run(conn) { "COMMIT" } else { "ROLLBACK" });
        }
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

    /// A writer on a fresh store file; the checkpointer's end of the
    /// channel is kept so commits can notify it.
    fn writer(
        durability: Durability,
    ) -> (Writer, tempfile::TempDir, std::sync::mpsc::Receiver<()>) {
        let dir = tempfile::tempdir().expect("tempdir");
        let conn = open_writer(&dir.path().join("agl.db"), durability).expect("open");
        let (tx, rx) = std::sync::mpsc::channel();
        (spawn(conn, durability, tx).expect("spawn"), dir, rx)
    }

    /// A job that answers with the name of the thread that ran it.
    fn where_run() -> (Box<dyn Job>, oneshot::Receiver<Result<String, StoreError>>) {
        job(|_c: &Connection| {
            Ok(std::thread::current()
                .name()
                .unwrap_or_default()
                .to_string())
        })
    }

    #[test]
    fn a_job_alone_commits_on_its_callers_thread() {
        let (w, _dir, _ckpt) = writer(Durability::Process);
        let (j, mut rx) = where_run();
        w.submit(j).expect("submit");
        // Answered before `submit` returned, here.
        let ran_on = rx.try_recv().expect("answered").expect("ok");
        assert_ne!(ran_on, WRITER_THREAD);
    }

    #[test]
    fn with_an_fsync_per_commit_the_writer_thread_commits() {
        let (w, _dir, _ckpt) = writer(Durability::Power);
        let (j, rx) = where_run();
        w.submit(j).expect("submit");
        let ran_on = rx.blocking_recv().expect("answered").expect("ok");
        assert_eq!(ran_on, WRITER_THREAD);
    }

    #[test]
    fn jobs_that_find_the_connection_held_are_committed_by_the_writer() {
        let (w, _dir, _ckpt) = writer(Durability::Process);
        let held = w.shared.conn.lock().expect("lock");
        let jobs: Vec<_> = (0..3).map(|_| where_run()).collect();
        let mut answers = Vec::new();
        for (j, rx) in jobs {
            w.submit(j).expect("submit");
            answers.push(rx);
        }
        drop(held);
        for rx in answers {
            let ran_on = rx.blocking_recv().expect("answered").expect("ok");
            assert_eq!(ran_on, WRITER_THREAD);
        }
    }

    #[test]
    fn a_job_that_panics_leaves_the_writer_working() {
        let (w, _dir, _ckpt) = writer(Durability::Process);
        let w = std::sync::Arc::new(w);
        let panicking = w.clone();
        // Committed on the submitting thread, which the panic unwinds.
        let outcome = std::thread::spawn(move || {
            let (j, _rx) =
                job(|_c: &Connection| -> Result<(), StoreError> { panic!("a job that panics") });
            panicking.submit(j)
        })
        .join();
        assert!(outcome.is_err());
        let (j, rx) = where_run();
        w.submit(j).expect("submit");
        rx.blocking_recv().expect("answered").expect("ok");
    }

    #[test]
    fn dropping_the_writer_commits_what_is_queued() {
        let (w, dir, _ckpt) = writer(Durability::Power);
        let mut answers = Vec::new();
        for name in ["a", "b", "c"] {
            let (j, rx) = job(move |c: &Connection| {
                c.execute(
                    "INSERT INTO engines (name, base_url, model, created_ms) VALUES (?1, 'http://x', 'm', 0)",
                    [name],
                )?;
                Ok(())
            });
            w.submit(j).expect("submit");
            answers.push(rx);
        }
        drop(w);
        for rx in answers {
            rx.blocking_recv().expect("answered").expect("ok");
        }
        let conn = open_writer(&dir.path().join("agl.db"), Durability::Power).expect("reopen");
        assert_eq!(engine_names(&conn), vec!["a", "b", "c"]);
    }

    fn engine_names(conn: &Connection) -> Vec<String> {
        let mut stmt = conn
            .prepare("SELECT name FROM engines ORDER BY name")
            .expect("prepare");
        stmt.query_map([], |r| r.get(0))
            .expect("query")
            .collect::<rusqlite::Result<_>>()
            .expect("rows")
    }

    /// A job that inserts engine `name`, then fails if `fail`, so only a
    /// rollback can undo its insert.
    fn insert_engine(
        name: &'static str,
        fail: bool,
    ) -> (
        Box<dyn Job>,
        oneshot::Receiver<Result<&'static str, StoreError>>,
    ) {
        job(move |c: &Connection| {
            c.execute(
                "INSERT INTO engines (name, base_url, model, created_ms) VALUES (?1, 'http://x', 'm', 0)",
                [name],
            )?;
            if fail {
                return Err(StoreError::EngineNotFound(name.into()));
            }
            Ok(name)
        })
    }

    /// Runs `batch` as the writer does and answers each job.
    fn commit(conn: &Connection, mut batch: Vec<Box<dyn Job>>) {
        let commit = run_batch(conn, &mut batch).map_err(|e| e.to_string());
        assert!(commit.is_ok(), "{commit:?}");
        for j in batch {
            j.finish(commit.clone());
        }
        assert!(conn.is_autocommit(), "batch transaction closed");
    }

    #[test]
    fn a_failed_job_rolls_back_alone_within_its_batch() {
        let dir = tempfile::tempdir().expect("tempdir");
        let conn = open_writer(&dir.path().join("agl.db"), Default::default()).expect("open");
        let (a, mut ra) = insert_engine("a", false);
        let (b, mut rb) = insert_engine("b", true);
        let (c, mut rc) = insert_engine("c", false);
        commit(&conn, vec![a, b, c]);
        assert_eq!(ra.try_recv().expect("answered").expect("a ok"), "a");
        assert!(matches!(
            rb.try_recv().expect("answered"),
            Err(StoreError::EngineNotFound(_))
        ));
        assert_eq!(rc.try_recv().expect("answered").expect("c ok"), "c");
        assert_eq!(engine_names(&conn), vec!["a", "c"]);
    }

    #[test]
    fn a_failed_job_alone_in_its_batch_leaves_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let conn = open_writer(&dir.path().join("agl.db"), Default::default()).expect("open");
        let (a, mut ra) = insert_engine("a", true);
        commit(&conn, vec![a]);
        assert!(matches!(
            ra.try_recv().expect("answered"),
            Err(StoreError::EngineNotFound(_))
        ));
        assert!(engine_names(&conn).is_empty());
        let (b, mut rb) = insert_engine("b", false);
        commit(&conn, vec![b]);
        assert_eq!(rb.try_recv().expect("answered").expect("b ok"), "b");
        assert_eq!(engine_names(&conn), vec!["b"]);
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
