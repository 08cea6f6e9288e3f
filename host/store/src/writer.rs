//! The write queue and its group commit.
//!
//! Every write is a job in one queue. Whoever holds the write connection
//! takes the jobs waiting, runs each inside its own SAVEPOINT of one
//! transaction, commits once (one fsync for the batch with
//! `Durability::Power`), and only then answers each caller: the writer
//! thread, or (without an fsync per commit) a caller that found the
//! connection free. A job that fails is rolled back to its savepoint alone;
//! its neighbours still commit.
//!
//! An event append (with the event log, see `eventlog.rs`) is written to
//! the log under the queue's lock, given its seqs there, and answered at
//! once; its ingestion into SQLite is a job in the same queue, so it is
//! committed before any write queued after it. Reads wait until what was
//! logged before they began is ingested ([`Writer::caught_up`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Instant;

use agl_wire::rollout::JsonText;
use rusqlite::Connection;
use tokio::sync::{oneshot, watch};

use super::StoreError;
use super::checkpoint;
use super::eventlog::{Entry, EventLog};
use super::rows::now_ms;
use super::schema::Durability;
use super::writes;

/// Most jobs folded into one transaction; bounds the latency one commit adds
/// for a write that is waited on (a full batch of call records, ~4 MiB,
/// is ~12 ms of the writer's time on the bench host).
const MAX_BATCH: usize = 4096;

/// Most logged bytes folded into one transaction: a transaction is copied
/// into the database only once it has committed, so this bounds how far
/// the WAL grows past its limit (`[store] wal_limit_mib`, 64 MiB unless
/// set) while a backlog is ingested.
const MAX_BATCH_BYTES: usize = 4 << 20;

/// A job that comes this long after the one before is sparse: committed on
/// its caller's thread if it finds the writer idle. Denser jobs are group
/// committed by the writer thread, which costs less per job under load.
const SPARSE_NS: u64 = 250_000;

/// The writer thread's name.
const WRITER_THREAD: &str = "agl-store-writer";

/// `last_submit` before the first job.
const NEVER: u64 = u64::MAX;

/// The event log is emptied once everything in it is ingested and it has
/// grown past this (reusing the first MiB of its space keeps it in cache).
const CLEAR_AT: u64 = 1 << 20;

/// How long ingestion alone waits for more entries to share its commit
/// (one commit per call under load costs more than the calls' own work).
/// Nobody waits on it (a read hurries it), and a longer wait spreads each
/// index page a commit writes (one per rollout with new events) over more
/// calls: at 64 connections 2 ms -> 10 ms took the writer's CPU per call
/// from ~21 to ~15 µs on one host, 10 -> 30 ms from 8.4-10.7 to 7.4-8.5 µs
/// on another, and 30 -> 120 ms (with batches of 4 MiB, not 1) from
/// 7.8-8.2 to 5.8-6.3 µs on it (benches/gateway.rs, ~17k calls/s). Past
/// that a batch is cut at [`MAX_BATCH_BYTES`] or [`MAX_BATCH`] first.
const LINGER: std::time::Duration = std::time::Duration::from_millis(120);

/// How long the writer waits before it retries logged events whose
/// ingestion failed to commit.
const RETRY_PAUSE: std::time::Duration = std::time::Duration::from_millis(100);

/// Past this, the writer ingests what is queued while appends wait, so the
/// log can be emptied even under appends that never pause.
const DRAIN_AT: u64 = 64 << 20;

/// A queued write, type-erased so one queue carries every kind of request.
pub trait Job: Send {
    /// Runs the write; `false` = it failed and must be rolled back.
    fn run(&mut self, conn: &Connection) -> bool;
    /// Answers the caller once the batch's fate is known.
    fn finish(self: Box<Self>, commit: Result<(), String>);
    /// The bytes it writes, where known (see [`MAX_BATCH_BYTES`]).
    fn bytes(&self) -> usize {
        0
    }
    /// Whether a caller waits for it (else its commit may wait for others).
    fn awaited(&self) -> bool {
        true
    }
    /// Whether a failed run leaves nothing behind by itself (its one
    /// changing statement is undone by SQLite), so it needs no savepoint.
    fn atomic(&self) -> bool {
        false
    }
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
    thread: Option<JoinHandle<()>>,
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
    /// Event log entries written so far (set under the queue's lock).
    logged: AtomicU64,
    /// Entries ingested (committed, or given up on) so far.
    ingested: Arc<Ingested>,
}

struct Queue {
    jobs: Vec<Box<dyn Job>>,
    /// The [`Writer`] is gone: the thread commits what is left and ends.
    closed: bool,
    /// The writer thread waits on `wake` for work (only then does an
    /// append notify it).
    waiting: bool,
    /// A read waits for ingestion: commit without lingering.
    hurry: bool,
    /// The event log, when appends go through it.
    log: Option<Log>,
}

/// The event log and the seqs it gives out.
pub struct Log {
    pub file: EventLog,
    /// The seq the next logged event gets.
    pub next_seq: u64,
}

/// How far ingestion has got, and whether an entry failed to ingest (then
/// the log is kept until the next open ingests it again).
#[derive(Default)]
struct Ingested {
    count: watch::Sender<u64>,
    failed: std::sync::atomic::AtomicBool,
}

/// Ingests one event log entry; marks it ingested when dropped (committed,
/// failed, or dropped with a batch), so no read waits on it forever.
struct Ingest {
    entry: Entry,
    ordinal: u64,
    ingested: Arc<Ingested>,
}

impl Job for Ingest {
    fn run(&mut self, conn: &Connection) -> bool {
        match writes::ingest(conn, &self.entry) {
            Ok(()) => true,
            Err(e) => {
                // Seqs were checked when logged; this is the store failing.
                tracing::error!(
                    rollout = %self.entry.rollout_id,
                    error = %e,
                    "cannot ingest a logged event; it stays in the event log for the next open"
                );
                self.ingested.failed.store(true, Ordering::Relaxed);
                false
            }
        }
    }

    fn bytes(&self) -> usize {
        self.entry
            .events
            .iter()
            .map(|(_, p)| p.as_str().len())
            .sum()
    }

    fn awaited(&self) -> bool {
        false
    }

    /// One event is one INSERT (a retry's supersedes after it never fail
    /// the job): two statements fewer per ingested call than a savepoint.
    fn atomic(&self) -> bool {
        self.entry.events.len() == 1
    }

    /// Reached with a failed commit only as the writer closes (otherwise
    /// the entry is retried).
    fn finish(self: Box<Self>, commit: Result<(), String>) {
        if let Err(e) = commit {
            tracing::error!(error = %e, "cannot ingest logged events; they stay in the event log for the next open");
            self.ingested.failed.store(true, Ordering::Relaxed);
        }
    }
}

impl Drop for Ingest {
    fn drop(&mut self) {
        let ordinal = self.ordinal;
        self.ingested.count.send_if_modified(|n| {
            let later = ordinal > *n;
            if later {
                *n = ordinal;
            }
            later
        });
    }
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

    /// Writes `payloads` (events of `kind` of one rollout attempt) to the
    /// event log under fresh consecutive seqs, with the supersedes
    /// `retry_of(seqs)` names, and queues their ingestion. Once this returns
    /// they are durable (as a commit is) and the seqs are theirs.
    pub fn log_append(
        &self,
        (rollout_id, attempt, kind): (String, u32, String),
        payloads: Vec<JsonText>,
        retry_of: impl FnOnce(&[u64]) -> Vec<(u64, u64)>,
    ) -> Result<Vec<u64>, StoreError> {
        let shared = &self.shared;
        let mut queue = shared.lock_queue();
        if queue.closed {
            return Err(StoreError::Closed);
        }
        let Some(log) = queue.log.as_mut() else {
            return Err(StoreError::Commit("this store has no event log".into()));
        };
        let first = log.next_seq;
        let seqs: Vec<u64> = (first..).take(payloads.len()).collect();
        let entry = Entry {
            rollout_id,
            attempt,
            kind,
            created_ms: now_ms(),
            supersede: retry_of(&seqs),
            events: seqs.iter().copied().zip(payloads).collect(),
        };
        log.file.append(&entry)?;
        log.next_seq = first + seqs.len() as u64;
        // Under the queue's lock, so ordinals follow the log's order.
        let ordinal = shared.logged.load(Ordering::Relaxed) + 1;
        shared.logged.store(ordinal, Ordering::Release);
        queue.jobs.push(Box::new(Ingest {
            entry,
            ordinal,
            ingested: shared.ingested.clone(),
        }));
        let wake = queue.waiting;
        drop(queue);
        if wake {
            shared.wake.notify_one();
        }
        Ok(seqs)
    }

    /// Resolves once every event logged before this call is ingested, so a
    /// read that follows sees it.
    pub async fn caught_up(&self) {
        let target = self.shared.logged.load(Ordering::Acquire);
        let count = &self.shared.ingested.count;
        if *count.borrow() >= target {
            return;
        }
        let mut seen = count.subscribe();
        self.shared.lock_queue().hurry = true;
        self.shared.wake.notify_one();
        // The sender lives as long as `self`: this cannot fail.
        let _ = seen.wait_for(|n| *n >= target).await;
    }
}

impl Drop for Writer {
    /// Commits what is queued and waits for the thread, so the event log's
    /// lock is released when the store is.
    fn drop(&mut self) {
        self.shared.lock_queue().closed = true;
        self.shared.wake.notify_one();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Queue {
    /// Whether the writer may wait for more before committing: nothing
    /// queued is waited on, and a batch's worth has not queued up.
    fn lingers(&self) -> bool {
        !self.closed
            && !self.hurry
            && self.jobs.len() < MAX_BATCH
            && self.jobs.iter().all(|j| !j.awaited())
            && self.jobs.iter().map(|j| j.bytes()).sum::<usize>() < MAX_BATCH_BYTES
    }

    /// The jobs at the head of the queue that one transaction takes.
    fn take_batch(&mut self) -> Vec<Box<dyn Job>> {
        let (mut n, mut bytes) = (0, 0);
        for job in self.jobs.iter().take(MAX_BATCH) {
            if n > 0 && bytes >= MAX_BATCH_BYTES {
                break;
            }
            bytes += job.bytes();
            n += 1;
        }
        self.jobs.drain(..n).collect()
    }
}

impl Shared {
    // A poisoned lock only means a job panicked while it was held; the
    // queue and the connection are still whole (SQLite rolled back what a
    // failed transaction had).
    fn lock_queue(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Commits the jobs at the head of the queue as one transaction and
    /// answers each; false when there were none.
    fn commit_batch(&self, conn: &Connection) -> bool {
        let mut queue = self.lock_queue();
        if queue.log.as_ref().is_some_and(|l| l.file.len() >= DRAIN_AT) {
            // Appends wait while everything logged is ingested.
            let any = !queue.jobs.is_empty();
            while !queue.jobs.is_empty() {
                let batch = queue.take_batch();
                let closed = queue.closed;
                if let Some(retry) = self.commit(conn, batch, closed) {
                    queue.jobs.splice(0..0, retry);
                    break;
                }
            }
            self.clear_log(&mut queue);
            return any;
        }
        let batch = queue.take_batch();
        let closed = queue.closed;
        drop(queue);
        if batch.is_empty() {
            return false;
        }
        let retry = self.commit(conn, batch, closed);
        let mut queue = self.lock_queue();
        if let Some(retry) = retry {
            queue.jobs.splice(0..0, retry);
        } else if queue.log.as_ref().is_some_and(|l| l.file.len() >= CLEAR_AT) {
            self.clear_log(&mut queue);
        }
        true
    }

    /// Empties the event log if everything logged is ingested (appends are
    /// held off by `queue`'s lock).
    fn clear_log(&self, queue: &mut Queue) {
        let Some(log) = queue.log.as_mut() else {
            return;
        };
        let logged = self.logged.load(Ordering::Relaxed);
        if *self.ingested.count.borrow() < logged
            || self.ingested.failed.load(Ordering::Relaxed)
            || log.file.len() == 0
        {
            return;
        }
        if let Err(e) = log.file.clear() {
            tracing::warn!(error = %e, "cannot empty the event log");
        }
    }

    /// Commits `batch` as one transaction and answers each job. If the
    /// commit fails, the logged events in it are returned, to go back to
    /// the head of the queue (they were acknowledged; a later commit
    /// ingests them), unless the writer is `closing`: then they stay in
    /// the event log for the next open.
    fn commit(
        &self,
        conn: &Connection,
        mut batch: Vec<Box<dyn Job>>,
        closing: bool,
    ) -> Option<Vec<Box<dyn Job>>> {
        if batch.is_empty() {
            return None;
        }
        if !conn.is_autocommit() {
            // A transaction a panicking job left open (its batch was never
            // answered): nothing of it is committed.
            let _ = conn.execute_batch("ROLLBACK");
        }
        let result = run_batch(conn, &mut batch).map_err(|e| e.to_string());
        if let Err(e) = &result
            && !closing
            && batch.iter().any(|j| !j.awaited())
        {
            tracing::error!(error = %e, "cannot ingest logged events; retrying");
            let (retry, answer): (Vec<_>, Vec<_>) = batch.into_iter().partition(|j| !j.awaited());
            for job in answer {
                job.finish(result.clone());
            }
            // Not a busy loop while the disk is full or the file locked.
            std::thread::sleep(RETRY_PAUSE);
            return Some(retry);
        }
        for job in batch {
            job.finish(result.clone());
        }
        if result.is_ok() {
            // A checkpointer that has exited only leaves the log growing.
            let _ = self.checkpoints.send(());
        }
        None
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

/// Starts the writer thread for `conn`; event appends go through `log`
/// when there is one. The thread ends once the [`Writer`] is dropped and
/// the queue is committed.
pub fn spawn(
    conn: Connection,
    durability: Durability,
    checkpoints: checkpoint::Notify,
    log: Option<Log>,
) -> std::io::Result<Writer> {
    let shared = Arc::new(Shared {
        conn: Mutex::new(conn),
        queue: Mutex::new(Queue {
            jobs: Vec::new(),
            closed: false,
            waiting: false,
            hurry: false,
            log,
        }),
        wake: Condvar::new(),
        checkpoints,
        inline: durability == Durability::Process,
        last_submit: AtomicU64::new(NEVER),
        epoch: Instant::now(),
        logged: AtomicU64::new(0),
        ingested: Arc::default(),
    });
    let thread = shared.clone();
    let thread = std::thread::Builder::new()
        .name(WRITER_THREAD.into())
        .spawn(move || run(&thread))?;
    Ok(Writer {
        shared,
        thread: Some(thread),
    })
}

fn run(shared: &Shared) {
    loop {
        {
            let mut queue = shared.lock_queue();
            while queue.jobs.is_empty() && !queue.closed {
                queue.waiting = true;
                queue = shared.wake.wait(queue).unwrap_or_else(|e| e.into_inner());
                queue.waiting = false;
            }
            if queue.jobs.is_empty() {
                // Closed, and nothing left: a log wholly ingested is emptied.
                shared.clear_log(&mut queue);
                return;
            }
            // Nobody waits on ingestion alone: give more entries a moment
            // to join its commit. A write someone waits on, or a read
            // waiting to see what was logged, ends the wait (`submit` and
            // `caught_up` notify; appends do not, `waiting` being false).
            let until = Instant::now() + LINGER;
            while queue.lingers() {
                let left = until.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                queue = shared
                    .wake
                    .wait_timeout(queue, left)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
            queue.hurry = false;
        }
        let conn = shared.conn.lock().unwrap_or_else(|e| e.into_inner());
        shared.commit_batch(&conn);
    }
}

pub fn run_batch(conn: &Connection, batch: &mut [Box<dyn Job>]) -> rusqlite::Result<()> {
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
            if job.atomic() {
                // Failed, it changed nothing and its neighbours commit;
                // unless its error rolled the whole transaction back
                // (SQLite's SQLITE_FULL, IOERR...): then nothing stands.
                if !job.run(conn) && conn.is_autocommit() {
                    return Err(rusqlite::Error::SqliteFailure(
                        rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_ABORT),
                        Some("a failed write rolled its batch back".into()),
                    ));
                }
                continue;
            }
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
mod tests;
