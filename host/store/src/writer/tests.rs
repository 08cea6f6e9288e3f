use super::*;
use crate::schema::open_writer;

/// A writer on a fresh store file; the checkpointer's end of the
/// channel is kept so commits can notify it.
fn writer(durability: Durability) -> (Writer, tempfile::TempDir, std::sync::mpsc::Receiver<()>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let conn = open_writer(&dir.path().join("agl.db"), durability).expect("open");
    let (tx, rx) = std::sync::mpsc::channel();
    (spawn(conn, durability, tx, None).expect("spawn"), dir, rx)
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

/// Rollout `r`, running its first attempt.
fn running_rollout(conn: &Connection) {
    conn.execute_batch(
        "INSERT INTO rollouts (id, group_id, mode, input, config, status, attempt,
             created_ms, updated_ms) VALUES ('r', 'g', 'train', '{}', '{}', 'running', 1, 0, 0);
         INSERT INTO attempts (rollout_id, attempt, status) VALUES ('r', 1, 'running');",
    )
    .expect("rollout");
}

/// The ingestion of one `log` event of attempt 1 of `rollout`.
fn ingest_one(
    ingested: &Arc<Ingested>,
    rollout: &str,
    seq: u64,
    payload: JsonText,
) -> Box<dyn Job> {
    Box::new(Ingest {
        entry: Entry {
            rollout_id: rollout.into(),
            attempt: 1,
            kind: "log".into(),
            created_ms: 0,
            events: vec![(seq, payload)],
            supersede: Vec::new(),
        },
        ordinal: seq,
        ingested: ingested.clone(),
    })
}

/// The seqs of the events table, in order.
fn event_seqs(conn: &Connection) -> Vec<i64> {
    conn.prepare("SELECT seq FROM events ORDER BY seq")
        .expect("prepare")
        .query_map([], |r| r.get(0))
        .expect("query")
        .collect::<rusqlite::Result<_>>()
        .expect("rows")
}

/// Ingestions of one event run without savepoints: one that fails
/// (an unknown rollout) leaves nothing, its neighbours commit.
#[test]
fn a_failed_ingestion_leaves_its_neighbours_committed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let conn = open_writer(&dir.path().join("agl.db"), Default::default()).expect("open");
    running_rollout(&conn);
    let ingested = Arc::new(Ingested::default());
    let ingest = |rollout: &str, seq: u64| {
        let null = JsonText::from_raw(serde_json::value::RawValue::NULL.to_owned());
        ingest_one(&ingested, rollout, seq, null)
    };
    let batch = vec![ingest("r", 1), ingest("nope", 2), ingest("r", 3)];
    assert!(batch.iter().all(|j| j.atomic()));
    commit(&conn, batch);
    let seqs = event_seqs(&conn);
    assert_eq!(seqs, vec![1, 3]);
    assert!(ingested.failed.load(Ordering::Relaxed));
}

/// An ingestion whose failure takes the transaction with it (the file
/// full) fails its batch whole: nothing after it is left committed outside
/// the batch.
#[test]
fn an_ingestion_that_rolls_the_transaction_back_fails_its_batch() {
    let dir = tempfile::tempdir().expect("tempdir");
    let conn = open_writer(&dir.path().join("agl.db"), Default::default()).expect("open");
    running_rollout(&conn);
    let pages: i64 = conn
        .query_row("PRAGMA page_count", [], |r| r.get(0))
        .expect("pages");
    conn.execute_batch(&format!("PRAGMA max_page_count = {}", pages + 4))
        .expect("cap");
    let ingested = Arc::new(Ingested::default());
    let ingest = |seq: u64, len: usize| {
        let text = serde_json::to_string(&"x".repeat(len)).expect("json");
        let raw = serde_json::value::RawValue::from_string(text).expect("raw");
        ingest_one(&ingested, "r", seq, JsonText::from_raw(raw))
    };
    let mut batch = vec![ingest(1, 10), ingest(2, 1 << 20), ingest(3, 10)];
    let result = run_batch(&conn, &mut batch);
    let seqs = event_seqs(&conn);
    match result {
        Ok(()) => assert_eq!(seqs, vec![1, 3]),
        Err(e) => assert!(seqs.is_empty(), "{e}: {seqs:?} committed outside the batch"),
    }
    assert!(conn.is_autocommit(), "no transaction left open");
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

/// A logged event was acknowledged: a batch that cannot commit (the
/// file locked by another process past the busy timeout) leaves it
/// queued, and a later commit ingests it; reads wait for it.
#[tokio::test]
async fn a_logged_event_whose_ingestion_fails_is_retried() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("agl.db");
    let conn = open_writer(&db, Durability::Process).expect("open");
    conn.execute_batch(
        "INSERT INTO rollouts (id, group_id, mode, input, config, status, attempt, created_ms, updated_ms)
             VALUES ('r', 'g', 'train', '{}', '{}', 'running', 1, 0, 0);
         INSERT INTO attempts (rollout_id, attempt, status) VALUES ('r', 1, 'running');",
    )
    .expect("rollout");
    conn.busy_timeout(std::time::Duration::from_millis(1))
        .expect("timeout");
    let file = match crate::eventlog::open(&db).expect("log") {
        crate::eventlog::Opened::Owned(file, _) => file,
        crate::eventlog::Opened::Held(_) => panic!("held"),
    };
    let (tx, _ckpt) = std::sync::mpsc::channel();
    let log = Log { file, next_seq: 1 };
    let w = spawn(conn, Durability::Process, tx, Some(log)).expect("spawn");
    let other = Connection::open(&db).expect("other");
    other.execute_batch("BEGIN IMMEDIATE").expect("lock");
    let key = ("r".to_string(), 1, "log".to_string());
    let seqs = w
        .log_append(key, vec![JsonText::from(serde_json::json!(7))], |_| vec![])
        .expect("logged");
    assert_eq!(seqs, vec![1]);
    // Commits fail while the other transaction holds the lock.
    std::thread::sleep(std::time::Duration::from_millis(300));
    let count = |c: &Connection| -> i64 {
        c.query_row("SELECT count(*) FROM events", [], |r| r.get(0))
            .expect("count")
    };
    assert_eq!(count(&other), 0);
    other.execute_batch("ROLLBACK").expect("unlock");
    w.caught_up().await;
    assert_eq!(count(&other), 1);
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
