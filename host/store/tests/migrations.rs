//! Stores written by earlier versions of agl open, migrate and read back.

use agl_store::{Mode, NewRollout, PAGE_SIZE, SCHEMA_VERSION, Store, StoreError};
use agl_wire::api::StatusPatch;
use agl_wire::rollout::{FailureKind, JsonText, RolloutStatus};
use serde_json::json;

async fn one(store: &Store, id: &str) {
    let rollout = NewRollout {
        id: Some(id.to_string()),
        group_id: "g1".into(),
        mode: Mode::Train,
        input: json!({"question": "2+2?"}).into(),
        config: json!({}).into(),
    };
    store.create_rollouts(vec![rollout]).await.expect("create");
}

fn text(v: serde_json::Value) -> JsonText {
    v.into()
}

/// The one integer `sql` selects.
fn number(conn: &rusqlite::Connection, sql: &str) -> i64 {
    conn.query_row(sql, [], |r| r.get(0)).expect(sql)
}

#[tokio::test]
async fn migrates_empty_file_reopens_and_rejects_newer_schema() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("agl.db");
    std::fs::write(&path, b"").expect("empty file");
    {
        let store = Store::open(&path).expect("migrate empty file");
        one(&store, "kept").await;
    }
    let store = Store::open(&path).expect("reopen");
    assert_eq!(store.get_rollout("kept").await.expect("get").id, "kept");
    drop(store);

    let conn = rusqlite::Connection::open(&path).expect("raw open");
    let version: i64 = conn
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .expect("version");
    assert_eq!(version, SCHEMA_VERSION);
    conn.pragma_update(None, "user_version", SCHEMA_VERSION + 1)
        .expect("bump");
    drop(conn);
    assert!(matches!(
        Store::open(&path),
        Err(StoreError::SchemaTooNew { .. })
    ));
}

/// A store written before failure kinds were a column (schema 1, kind as a
/// `system: ` reason prefix) reads back with the kind in the column.
#[tokio::test]
async fn schema_1_failures_migrate_to_a_failure_kind() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("agl.db");
    {
        let store = Store::open(&path).expect("open");
        for id in ["sys", "agent"] {
            one(&store, id).await;
            store
                .set_status(id, &StatusPatch::to(1, RolloutStatus::Running))
                .await
                .expect("running");
            store
                .set_status(id, &StatusPatch::failed(1, FailureKind::Agent, "x"))
                .await
                .expect("failed");
        }
    }
    let conn = rusqlite::Connection::open(&path).expect("raw open");
    conn.execute_batch(
        "UPDATE rollouts SET reason = 'system: timed out after 1s' WHERE id = 'sys';
         UPDATE attempts SET reason = 'system: timed out after 1s' WHERE rollout_id = 'sys';
         UPDATE rollouts SET reason = 'exit code 1' WHERE id = 'agent';
         ALTER TABLE rollouts DROP COLUMN failure;
         ALTER TABLE attempts DROP COLUMN failure;
         ALTER TABLE engines DROP COLUMN render;
         ALTER TABLE engines DROP COLUMN api;
         ALTER TABLE engines DROP COLUMN policy;
         ALTER TABLE engines DROP COLUMN context_len;
         PRAGMA user_version = 1;",
    )
    .expect("rewind to schema 1");
    drop(conn);
    let store = Store::open(&path).expect("migrate");
    let sys = store.get_rollout("sys").await.expect("get");
    assert_eq!(sys.failure, Some(FailureKind::System));
    assert_eq!(sys.reason.as_deref(), Some("timed out after 1s"));
    let agent = store.get_rollout("agent").await.expect("get");
    assert_eq!(agent.failure, Some(FailureKind::Agent));
    assert_eq!(agent.reason.as_deref(), Some("exit code 1"));
}

/// The `events` table of schemas 1-5 (`seq` AUTOINCREMENT), restored over
/// the current one, with `user_version` set back to 5.
const REWIND_TO_SCHEMA_5: &str = "
PRAGMA foreign_keys = OFF;
CREATE TABLE events_old (
    seq           INTEGER PRIMARY KEY AUTOINCREMENT,
    rollout_id    TEXT NOT NULL,
    attempt       INTEGER NOT NULL,
    kind          TEXT NOT NULL,
    payload       TEXT NOT NULL,
    created_ms    INTEGER NOT NULL,
    superseded_by INTEGER REFERENCES events (seq),
    FOREIGN KEY (rollout_id, attempt) REFERENCES attempts (rollout_id, attempt)
);
INSERT INTO events_old SELECT * FROM events;
DROP TABLE events;
ALTER TABLE events_old RENAME TO events;
CREATE INDEX events_by_rollout ON events (rollout_id, seq);
PRAGMA user_version = 5;
";

/// A schema-5 store (`seq` AUTOINCREMENT) migrates to a table without it:
/// every event keeps its seq and its supersede link, the foreign keys
/// hold, and the next event takes the next seq.
#[tokio::test]
async fn schema_5_events_keep_their_seqs_without_autoincrement() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("agl.db");
    let before = {
        let store = Store::open(&path).expect("open");
        one(&store, "r").await;
        let call = || text(json!({"api": "chat_completions", "response_ids": [9]}));
        let first = store
            .append_calls("r", 1, vec![call()], |_| vec![])
            .await
            .expect("call")[0];
        store
            .append_calls("r", 1, vec![call()], move |s| vec![(first, s[0])])
            .await
            .expect("its retry");
        store
            .append_event("r", 1, "reward", text(json!({"value": 1.0})))
            .await
            .expect("reward");
        store.list_events("r", 0, 10).await.expect("list")
    };
    assert_eq!(before.len(), 3);
    assert_eq!(before[0].superseded_by, Some(before[1].seq));

    let conn = rusqlite::Connection::open(&path).expect("raw open");
    conn.execute_batch(REWIND_TO_SCHEMA_5).expect("rewind");
    let kept = number(
        &conn,
        "SELECT seq FROM sqlite_sequence WHERE name = 'events'",
    );
    assert_eq!(kept as u64, before[2].seq);
    drop(conn);

    let store = Store::open(&path).expect("migrate");
    assert_eq!(store.list_events("r", 0, 10).await.expect("list"), before);
    let next = store
        .append_event("r", 1, "log", text(json!({"n": 1})))
        .await
        .expect("append after the migration");
    assert_eq!(next, before[2].seq + 1);
    drop(store);

    let conn = rusqlite::Connection::open(&path).expect("raw open");
    let sql: String = conn
        .query_row(
            "SELECT sql FROM sqlite_master WHERE name = 'events'",
            [],
            |r| r.get(0),
        )
        .expect("events table");
    assert!(!sql.to_uppercase().contains("AUTOINCREMENT"), "{sql}");
    assert_eq!(
        number(
            &conn,
            "SELECT count(*) FROM sqlite_sequence WHERE name = 'events'"
        ),
        0
    );
    assert_eq!(
        number(&conn, "SELECT count(*) FROM pragma_foreign_key_check"),
        0
    );
    assert_eq!(
        number(
            &conn,
            "SELECT count(*) FROM sqlite_master WHERE name = 'events_by_rollout'"
        ),
        1
    );
}

/// A new store has large pages; one made with SQLite's default page size
/// keeps its own, and takes and reads back events as a new one does.
#[tokio::test]
async fn a_new_store_has_large_pages_and_an_older_one_keeps_its_own() {
    let dir = tempfile::tempdir().expect("tempdir");
    let page_size = |path: &std::path::Path| {
        let conn = rusqlite::Connection::open(path).expect("raw open");
        number(&conn, "PRAGMA page_size")
    };
    let new = dir.path().join("new.db");
    drop(Store::open(&new).expect("new store"));
    assert_eq!(page_size(&new), PAGE_SIZE);
    let old = dir.path().join("old.db");
    {
        let conn = rusqlite::Connection::open(&old).expect("raw open");
        conn.execute_batch("PRAGMA page_size = 4096; CREATE TABLE t (x); DROP TABLE t;")
            .expect("a file of 4 KiB pages");
    }
    {
        let store = Store::open(&old).expect("old store");
        one(&store, "r1").await;
        store
            .set_status("r1", &StatusPatch::to(1, RolloutStatus::Running))
            .await
            .expect("running");
        let big = text(json!({"text": "x".repeat(40_000)}));
        store
            .append_event("r1", 1, "log", big.clone())
            .await
            .expect("append");
        let events = store.list_events("r1", 0, 10).await.expect("events");
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].payload.as_str(), big.as_str());
    }
    assert_eq!(page_size(&old), 4096);
}
