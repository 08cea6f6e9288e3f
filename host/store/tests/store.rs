//! The durable store against real SQLite files.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

use agl_store::{Mode, NewRollout, RolloutFilter, Store, StoreError};
use agl_wire::api::StatusPatch;
use agl_wire::rollout::FailureKind;
use agl_wire::rollout::{JsonText, Rollout, RolloutStatus};
use serde_json::json;

fn open() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path().join("agl.db")).expect("open store");
    (dir, store)
}

fn new(id: Option<&str>) -> NewRollout {
    NewRollout {
        id: id.map(str::to_string),
        group_id: "g1".into(),
        mode: Mode::Train,
        input: json!({"question": "2+2?", "answer": "4"}).into(),
        config: json!({"timeout_s": 60}).into(),
    }
}

fn text(v: serde_json::Value) -> JsonText {
    v.into()
}

async fn one(store: &Store, id: &str) -> agl_store::RolloutRecord {
    let mut v = store
        .create_rollouts(vec![new(Some(id))])
        .await
        .expect("create");
    v.remove(0)
}

#[tokio::test]
async fn create_is_idempotent_on_caller_id() {
    let (_d, store) = open();
    let first = store
        .create_rollouts(vec![new(Some("a")), new(None), new(Some("a"))])
        .await
        .expect("create");
    assert_eq!(first.len(), 3);
    assert_eq!(first[0], first[2], "same id in one batch is one rollout");
    assert_ne!(first[1].id, "a");
    assert_eq!(first[0].status, RolloutStatus::Queued);
    assert_eq!(first[0].attempt, 1);
    let mut changed = new(Some("a"));
    changed.group_id = "other".into();
    let again = store
        .create_rollouts(vec![changed])
        .await
        .expect("re-create");
    assert_eq!(again[0], first[0], "existing rollout returned unchanged");
    let page = store
        .list_rollouts(RolloutFilter::default(), None, 100)
        .await
        .expect("list");
    assert_eq!(page.rollouts.len(), 2);
}

#[tokio::test]
async fn status_changes_follow_the_state_machine() {
    let (_d, store) = open();
    one(&store, "r").await;
    let err = store
        .set_status("r", &StatusPatch::to(1, RolloutStatus::Succeeded))
        .await
        .expect_err("queued -> succeeded");
    assert!(
        err.to_string().contains("queued -> succeeded"),
        "error names from/to: {err}"
    );
    store
        .set_status("r", &StatusPatch::to(1, RolloutStatus::Running))
        .await
        .expect("running");
    let failed = store
        .set_status(
            "r",
            &StatusPatch::failed(1, FailureKind::Agent, "agent crashed"),
        )
        .await
        .expect("failed");
    assert_eq!(failed.reason.as_deref(), Some("agent crashed"));
    assert!(matches!(
        store
            .set_status("r", &StatusPatch::to(1, RolloutStatus::Queued))
            .await,
        Err(StoreError::IllegalTransition { .. })
    ));
    let retried = store.retry("r").await.expect("retry");
    assert_eq!(
        (retried.attempt, retried.status),
        (2, RolloutStatus::Queued)
    );
    // A controller still holding attempt 1 cannot move attempt 2.
    assert!(matches!(
        store
            .set_status("r", &StatusPatch::to(1, RolloutStatus::Running))
            .await,
        Err(StoreError::StaleAttempt {
            given: 1,
            current: 2,
            ..
        })
    ));
    assert!(matches!(
        store.retry("r").await,
        Err(StoreError::IllegalTransition { .. })
    ));
    let cancelled = store.cancel("r").await.expect("cancel queued");
    assert_eq!(cancelled.status, RolloutStatus::Cancelled);
    assert!(store.cancel("r").await.is_err(), "cancel twice");
    assert!(matches!(
        store.cancel("missing").await,
        Err(StoreError::RolloutNotFound(_))
    ));
}

#[tokio::test]
async fn pagination_covers_every_rollout_once() {
    let (_d, store) = open();
    let batch: Vec<_> = (0..57)
        .map(|i| NewRollout {
            group_id: format!("g{}", i % 3),
            mode: if i % 2 == 0 { Mode::Train } else { Mode::Val },
            ..new(Some(&format!("r{i:03}")))
        })
        .collect();
    store.create_rollouts(batch).await.expect("create");
    for i in 0..10 {
        store
            .set_status(
                &format!("r{i:03}"),
                &StatusPatch::to(1, RolloutStatus::Running),
            )
            .await
            .expect("running");
    }
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let page = store
            .list_rollouts(RolloutFilter::default(), cursor.as_deref(), 7)
            .await
            .expect("page");
        assert!(page.rollouts.len() <= 7);
        seen.extend(page.rollouts.into_iter().map(|r| r.id));
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    let mut sorted = seen.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), 57, "every rollout exactly once");
    assert_eq!(seen.len(), 57);

    let running = store
        .list_rollouts(
            RolloutFilter::status(Some(RolloutStatus::Running)),
            None,
            100,
        )
        .await
        .expect("running");
    assert_eq!(running.rollouts.len(), 10);
    assert!(running.next_cursor.is_none());
    // Group and mode filter too, with the status: r000, r006 are running,
    // in g0 and train.
    let filter = RolloutFilter {
        status: Some(RolloutStatus::Running),
        group_id: Some("g0".into()),
        mode: Some(Mode::Train),
    };
    let ids: Vec<String> = store
        .list_rollouts(filter, None, 100)
        .await
        .expect("filtered")
        .rollouts
        .into_iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(ids, ["r000", "r006"]);
    let val_g1 = RolloutFilter {
        group_id: Some("g1".into()),
        mode: Some(Mode::Val),
        ..RolloutFilter::default()
    };
    let page = store
        .list_rollouts(val_g1, None, 100)
        .await
        .expect("g1 val");
    assert_eq!(page.rollouts.len(), 10, "i = 1, 7, ..., 55");
    assert!(matches!(
        store
            .list_rollouts(RolloutFilter::default(), Some("garbage"), 5)
            .await,
        Err(StoreError::BadCursor(_))
    ));
}

#[tokio::test]
async fn events_get_increasing_seqs_and_list_in_order() {
    let (_d, store) = open();
    one(&store, "a").await;
    one(&store, "b").await;
    let mut a_seqs = Vec::new();
    for i in 0..10 {
        a_seqs.push(
            store
                .append_event("a", 1, "log", text(json!({"i": i})))
                .await
                .expect("append a"),
        );
        store
            .append_event("b", 1, "log", text(json!({"i": i})))
            .await
            .expect("append b");
    }
    assert!(a_seqs.windows(2).all(|w| w[0] < w[1]));
    let listed = store.list_events("a", 0, 100).await.expect("list");
    assert_eq!(listed.iter().map(|e| e.seq).collect::<Vec<_>>(), a_seqs);
    assert_eq!(listed[3].payload.as_str(), r#"{"i":3}"#);
    let tail = store.list_events("a", a_seqs[4], 3).await.expect("tail");
    assert_eq!(
        tail.iter().map(|e| e.seq).collect::<Vec<_>>(),
        a_seqs[5..8].to_vec()
    );
    assert!(matches!(
        store.append_event("a", 2, "log", text(json!(null))).await,
        Err(StoreError::StaleAttempt { .. })
    ));
    assert!(matches!(
        store.append_event("zz", 1, "log", text(json!(null))).await,
        Err(StoreError::RolloutNotFound(_))
    ));
}

fn call(prompt: &[u32], response: &[u32]) -> JsonText {
    text(json!({
        "api": "chat_completions",
        "request": {"messages": [{"role": "user", "content": "hi"}]},
        "response": {"choices": [{"message": {"content": "yo"}}]},
        "prompt_ids": prompt,
        "response_ids": response,
        "response_logprobs": response.iter().map(|_| -0.5).collect::<Vec<_>>(),
        "weight_version": 3,
        "finish_reason": "stop",
        "engine": "e1",
        "latency_ms": 12,
    }))
}

#[tokio::test]
async fn export_skips_superseded_calls_and_round_trips() {
    let (_d, store) = open();
    one(&store, "r").await;
    store
        .set_status("r", &StatusPatch::to(1, RolloutStatus::Running))
        .await
        .expect("running");
    let first = store
        .append_calls("r", 1, vec![call(&[1, 2], &[9])], |_| vec![])
        .await
        .expect("call 0")[0];
    store
        .append_calls("r", 1, vec![call(&[1, 2], &[8])], move |s| {
            vec![(first, s[0])]
        })
        .await
        .expect("retry of call 0");
    store
        .append_event("r", 1, "reward", text(json!({"value": 1.0})))
        .await
        .expect("reward");
    store
        .append_calls("r", 1, vec![call(&[1, 2, 8, 3], &[4, 5])], |_| vec![])
        .await
        .expect("call 1");
    store
        .set_status("r", &StatusPatch::to(1, RolloutStatus::Succeeded))
        .await
        .expect("done");

    let exported = store.export_rollout("r").await.expect("export");
    assert_eq!(exported.calls.len(), 2);
    assert_eq!(exported.calls[0].index, 0);
    assert_eq!(
        exported.calls[0].response_ids,
        vec![8],
        "the retry, not the first"
    );
    assert_eq!(exported.calls[1].index, 1);
    assert_eq!(exported.calls[1].prompt_ids, vec![1, 2, 8, 3]);
    assert_eq!(exported.calls[1].weight_version, 3);
    assert_eq!(exported.events.len(), 1);
    assert_eq!(exported.events[0].kind, "reward");
    assert_eq!(exported.status, RolloutStatus::Succeeded);

    // What `agl rollouts export` writes is what `read_jsonl` reads.
    let line = serde_json::to_string(&exported).expect("serialize");
    assert!(!line.contains('\n'));
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("r.jsonl");
    std::fs::write(&path, format!("{line}\n")).expect("write");
    let back: Vec<Rollout> = agl_wire::rollout::read_jsonl(&path).expect("read_jsonl");
    assert_eq!(back, vec![exported]);
}

/// The proxy's path: a client retry supersedes the call it repeats in the
/// transaction that records it; a supersede that cannot apply does not cost
/// the call its record.
#[tokio::test]
async fn append_call_supersedes_a_retried_call_in_the_same_commit() {
    let (_d, store) = open();
    one(&store, "r").await;
    let first = store
        .append_calls("r", 1, vec![call(&[1, 2], &[9])], |_| vec![])
        .await
        .expect("call")[0];
    let retry = store
        .append_calls("r", 1, vec![call(&[1, 2], &[8])], move |s| {
            vec![(first, s[0])]
        })
        .await
        .expect("retry")[0];
    // Superseded once only: a second claim on the same call is refused.
    store
        .append_calls("r", 1, vec![call(&[1, 2], &[7])], move |s| {
            vec![(first, s[0])]
        })
        .await
        .expect("a third copy");
    let events = store.list_events("r", 0, 10).await.expect("list");
    assert_eq!(events[0].superseded_by, Some(retry));
    let reward = store
        .append_event("r", 1, "reward", text(json!({"value": 1.0})))
        .await
        .expect("reward");
    let last = store
        .append_calls("r", 1, vec![call(&[1, 2, 8], &[4])], move |s| {
            vec![(reward, s[0])]
        })
        .await
        .expect("a failed supersede keeps the call")[0];
    let exported = store.export_rollout("r").await.expect("export");
    let ids: Vec<_> = exported
        .calls
        .iter()
        .map(|c| c.response_ids.clone())
        .collect();
    assert_eq!(ids, vec![vec![8], vec![7], vec![4]]);
    assert_eq!(exported.events.len(), 1, "the reward is still an event");
    assert!(last > reward);
}

/// The choices of one `n` = 3 request: one transaction, consecutive seqs,
/// exported as three calls that name their choice; a retry of the request
/// supersedes each earlier choice by the new one.
#[tokio::test]
async fn a_requests_choices_commit_together_and_export_in_order() {
    let (_d, store) = open();
    one(&store, "r").await;
    let choices = |responses: [u32; 3]| -> Vec<JsonText> {
        responses
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let mut v: serde_json::Value =
                    serde_json::from_str(call(&[1, 2], &[*r]).as_str()).unwrap();
                v["choice"] = json!({"index": i, "count": 3});
                text(v)
            })
            .collect()
    };
    let first = store
        .append_calls("r", 1, choices([7, 8, 9]), |_| vec![])
        .await
        .expect("choices");
    assert_eq!(first, [first[0], first[0] + 1, first[0] + 2]);
    let retried = store
        .append_calls("r", 1, choices([4, 5, 6]), move |s| {
            first.iter().zip(s).map(|(old, new)| (*old, *new)).collect()
        })
        .await
        .expect("retried choices");
    let events = store.list_events("r", 0, 10).await.expect("list");
    let superseded: Vec<_> = events.iter().map(|e| e.superseded_by).collect();
    assert_eq!(
        superseded[..3],
        retried.iter().map(|s| Some(*s)).collect::<Vec<_>>()[..]
    );
    let exported = store.export_rollout("r").await.expect("export");
    let got: Vec<_> = exported
        .calls
        .iter()
        .map(|c| {
            (
                c.index,
                c.response_ids[0],
                c.choice.map(|c| (c.index, c.count)),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            (0, 4, Some((0, 3))),
            (1, 5, Some((1, 3))),
            (2, 6, Some((2, 3)))
        ]
    );
}

#[tokio::test]
async fn a_failing_request_does_not_fail_its_batch_neighbours() {
    let (_d, store) = open();
    one(&store, "r").await;
    // Fired together so the writer folds them into one batch.
    let ok1 = store.append_event("r", 1, "log", text(json!(1)));
    let succeeded = StatusPatch::to(1, RolloutStatus::Succeeded);
    let bad = store.set_status("r", &succeeded);
    let missing = store.append_event("nope", 1, "log", text(json!(2)));
    let ok2 = store.append_event("r", 1, "log", text(json!(3)));
    let (ok1, bad, missing, ok2) = tokio::join!(ok1, bad, missing, ok2);
    assert!(bad.is_err() && missing.is_err());
    // Appends fired together are numbered in the order they are written.
    let (s1, s2) = (ok1.expect("ok1"), ok2.expect("ok2"));
    let events = store.list_events("r", 0, 10).await.expect("list");
    assert_eq!(
        events.iter().map(|e| e.seq).collect::<Vec<_>>(),
        vec![s1.min(s2), s1.max(s2)]
    );
    assert_eq!(
        store.get_rollout("r").await.expect("get").status,
        RolloutStatus::Queued
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_appends_are_all_acknowledged_and_present() {
    let (_d, store) = open();
    one(&store, "r").await;
    let mut tasks = Vec::new();
    for t in 0..32 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let mut seqs = Vec::new();
            for n in 0..50 {
                let p = text(json!({"t": t, "n": n}));
                seqs.push(store.append_event("r", 1, "log", p).await.expect("append"));
            }
            seqs
        }));
    }
    let mut acked = Vec::new();
    for t in tasks {
        acked.extend(t.await.expect("task"));
    }
    acked.sort();
    acked.dedup();
    assert_eq!(acked.len(), 32 * 50, "distinct seqs");
    let mut stored = Vec::new();
    let mut after = 0;
    loop {
        let page = store.list_events("r", after, 500).await.expect("list");
        let Some(last) = page.last() else { break };
        after = last.seq;
        stored.extend(page.into_iter().map(|e| e.seq));
    }
    assert_eq!(stored, acked);
}

/// The writer never checkpoints inside a commit (that would stall every
/// queued write); a background checkpointer copies the log into the
/// database, so the log is reused instead of growing with every write.
#[tokio::test]
async fn a_background_checkpointer_keeps_the_log_bounded() {
    let (dir, store) = open();
    one(&store, "r").await;
    let wal = dir.path().join("agl.db-wal");
    let db = dir.path().join("agl.db");
    let size = |p: &std::path::Path| std::fs::metadata(p).map_or(0, |m| m.len());
    let blob = "x".repeat(20_000);
    // 4 bursts of 2 MB of events (~3 MB of log each: a commit also rewrites
    // the table's last leaf and its index), pausing longer than the
    // checkpoint interval in between; unchecked, the log would reach ~13 MB.
    let mut wal_max = 0;
    for burst in 0..4 {
        for n in 0..100 {
            let p = text(json!({"burst": burst, "n": n, "blob": blob}));
            store.append_event("r", 1, "log", p).await.expect("append");
        }
        wal_max = wal_max.max(size(&wal));
        tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    }
    wal_max = wal_max.max(size(&wal));
    assert!(
        wal_max < 6_000_000,
        "the log grew to {wal_max} bytes for 8 MB of events"
    );
    assert!(
        size(&db) > 6_000_000,
        "events were copied into the database"
    );
    let n = store.list_events("r", 0, 1000).await.expect("list").len();
    assert_eq!(n, 400);
}

#[tokio::test]
async fn engines_and_weight_versions() {
    let (_d, store) = open();
    store
        .register_engine(
            &agl_store::RegisterEngine::new("b", "http://b:8000/v1", "m")
                .with_render(agl_store::Render::Engine),
        )
        .await
        .expect("register b");
    store
        .register_engine(
            &agl_store::RegisterEngine::new("a", "http://a:8000/v1", "m")
                .with_render(agl_store::Render::Engine),
        )
        .await
        .expect("register a");
    let moved = store
        .register_engine(
            &agl_store::RegisterEngine::new("a", "http://a2:8000/v1", "m2")
                .with_render(agl_store::Render::Gateway)
                .with_api(agl_store::EngineApi::Sglang)
                .with_policy("/models/p")
                .with_context_len(8192),
        )
        .await
        .expect("re-register a");
    assert_eq!(moved.base_url, "http://a2:8000/v1");
    // How the gateway reaches it is stored and read back too.
    let listed = store.list_engines().await.expect("list");
    assert_eq!(
        (listed[0].render, listed[0].api),
        (agl_store::Render::Gateway, agl_store::EngineApi::Sglang)
    );
    assert_eq!(
        (listed[0].policy.as_deref(), listed[0].context_len),
        (Some("/models/p"), Some(8192))
    );
    assert_eq!(listed[1].api, agl_store::EngineApi::Openai);
    assert_eq!(
        (listed[1].policy.as_deref(), listed[1].context_len),
        (None, None)
    );
    let names: Vec<_> = store
        .list_engines()
        .await
        .expect("list")
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(names, vec!["a", "b"]);
    store.remove_engine("a").await.expect("remove");
    assert!(matches!(
        store.remove_engine("a").await,
        Err(StoreError::EngineNotFound(_))
    ));
    assert_eq!(store.list_engines().await.expect("list").len(), 1);

    assert!(store.latest_weight_version().await.expect("none").is_none());
    store
        .record_weight_version(1, text(json!({"step": 10})))
        .await
        .expect("v1");
    store
        .record_weight_version(2, text(json!({"step": 20})))
        .await
        .expect("v2");
    assert!(matches!(
        store.record_weight_version(2, text(json!({}))).await,
        Err(StoreError::WeightVersionExists(2))
    ));
    let latest = store.latest_weight_version().await.expect("latest");
    assert_eq!(latest.map(|w| w.version), Some(2));
}

#[tokio::test]
async fn a_failure_names_its_kind() {
    let (_d, store) = open();
    one(&store, "r").await;
    store
        .set_status("r", &StatusPatch::to(1, RolloutStatus::Running))
        .await
        .expect("running");
    let untyped = StatusPatch {
        failure: None,
        ..StatusPatch::failed(1, FailureKind::Agent, "x")
    };
    assert!(matches!(
        store.set_status("r", &untyped).await,
        Err(StoreError::BadPatch(_))
    ));
    let typed_success = StatusPatch {
        failure: Some(FailureKind::System),
        ..StatusPatch::to(1, RolloutStatus::Succeeded)
    };
    assert!(matches!(
        store.set_status("r", &typed_success).await,
        Err(StoreError::BadPatch(_))
    ));
    // A system failure within the retry budget (2 by default) is the next
    // attempt, queued, in the same write; the failed attempt keeps its kind.
    let requeued = store
        .set_status(
            "r",
            &StatusPatch::failed(1, FailureKind::System, "timed out"),
        )
        .await
        .expect("failed");
    assert_eq!(
        (requeued.status, requeued.attempt, requeued.failure),
        (RolloutStatus::Queued, 2, None),
        "a new attempt has no failure yet"
    );
    let conn = rusqlite::Connection::open(store.path()).expect("raw open");
    let (kind, reason): (String, String) = conn
        .query_row(
            "SELECT failure, reason FROM attempts WHERE rollout_id = 'r' AND attempt = 1",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .expect("attempt 1");
    assert_eq!((kind.as_str(), reason.as_str()), ("system", "timed out"));
}

/// The retry budget is the store's: with none left (here: none at all) a
/// system failure rests in `failed`, and a retry is an explicit act.
#[tokio::test]
async fn without_a_retry_budget_a_system_failure_stays_failed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = agl_store::StoreConfig {
        max_system_retries: 0,
        ..Default::default()
    };
    let store = Store::open_config(dir.path().join("agl.db"), &config).expect("open");
    one(&store, "r").await;
    store
        .set_status("r", &StatusPatch::to(1, RolloutStatus::Running))
        .await
        .expect("running");
    let failed = store
        .set_status(
            "r",
            &StatusPatch::failed(1, FailureKind::System, "pod lost"),
        )
        .await
        .expect("failed");
    assert_eq!(
        (failed.status, failed.attempt, failed.failure),
        (RolloutStatus::Failed, 1, Some(FailureKind::System))
    );
    let retried = store.retry("r").await.expect("retry");
    assert_eq!(
        (retried.status, retried.attempt),
        (RolloutStatus::Queued, 2)
    );
}

/// Every change of a rollout's state wakes who watches the store.
#[tokio::test]
async fn rollout_changes_wake_watchers() {
    let (_d, store) = open();
    let mut changes = store.changes();
    let before = *changes.borrow_and_update();
    one(&store, "w").await;
    assert!(changes.has_changed().expect("open"), "a create wakes");
    let after_create = *changes.borrow_and_update();
    assert!(after_create > before);
    store
        .set_status("w", &StatusPatch::to(1, RolloutStatus::Running))
        .await
        .expect("running");
    assert!(changes.has_changed().expect("open"), "a patch wakes");
    changes.borrow_and_update();
    store.cancel("w").await.expect("cancel");
    assert!(changes.has_changed().expect("open"), "a cancel wakes");
}

/// Seqs are given out when an event is logged, so only the process that
/// holds the event log may append; another opener of the same file reads
/// (everything ingested so far) and is told who appends.
#[tokio::test]
async fn a_second_opener_reads_but_does_not_append() {
    let (dir, store) = open();
    one(&store, "r").await;
    let seq = store
        .append_event("r", 1, "log", text(json!(1)))
        .await
        .expect("append");
    // A read through the first waits for the event's ingestion.
    assert_eq!(store.list_events("r", 0, 10).await.expect("list").len(), 1);
    let second = Store::open(dir.path().join("agl.db")).expect("second open");
    let refused = second.append_event("r", 1, "log", text(json!(2))).await;
    assert!(
        matches!(&refused, Err(StoreError::LogHeld(log)) if log.ends_with("agl.db-events")),
        "{refused:?}"
    );
    let seen: Vec<u64> = second
        .list_events("r", 0, 10)
        .await
        .expect("list")
        .iter()
        .map(|e| e.seq)
        .collect();
    assert_eq!(seen, vec![seq]);
    // Once the first is closed, a new opener owns the log.
    drop((store, second));
    let third = Store::open(dir.path().join("agl.db")).expect("third open");
    let next = third
        .append_event("r", 1, "log", text(json!(3)))
        .await
        .expect("append");
    assert!(next > seq);
}

const KILL_DB_ENV: &str = "AGL_STORE_KILL_TEST_DB";
const CHILD_TEST: &str = "durability_child";
const ACKS_BEFORE_KILL: usize = 300;

/// Run by `durability_under_kill_9` in a child process: appends from several
/// tasks until killed, printing each acknowledged seq.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "child process of durability_under_kill_9"]
async fn durability_child() {
    let Ok(path) = std::env::var(KILL_DB_ENV) else {
        return;
    };
    let store = Store::open(&path).expect("open");
    one(&store, "r").await;
    let mut tasks = Vec::new();
    for t in 0..4 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            // Bounded so a child whose parent died still ends.
            for n in 0..100_000 {
                let p = text(json!({"t": t, "n": n}));
                let seq = store.append_event("r", 1, "log", p).await.expect("append");
                let mut out = std::io::stdout().lock();
                writeln!(out, "ack {seq} {t} {n}").expect("stdout");
                out.flush().expect("flush");
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
}

#[test]
fn durability_under_kill_9() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("agl.db");
    let exe = std::env::current_exe().expect("current_exe");
    let mut child = Command::new(exe)
        .args(["--exact", CHILD_TEST, "--nocapture", "--include-ignored"])
        .env(KILL_DB_ENV, &path)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn child");
    let stdout = child.stdout.take().expect("piped stdout");
    let mut acked = Vec::new();
    for line in BufReader::new(stdout).lines() {
        let line = line.expect("read child stdout");
        let mut words = line.split_whitespace();
        if words.next() != Some("ack") {
            continue;
        }
        let nums: Vec<u64> = words.map(|w| w.parse().expect("number")).collect();
        acked.push((nums[0], nums[1], nums[2]));
        if acked.len() == ACKS_BEFORE_KILL {
            child.kill().expect("SIGKILL");
            break;
        }
    }
    let status = child.wait().expect("wait");
    assert_eq!(
        acked.len(),
        ACKS_BEFORE_KILL,
        "child stopped early: {status}"
    );
    assert!(!status.success(), "child was killed, not finished");

    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let stored = rt.block_on(async {
        let store = Store::open(&path).expect("reopen after kill");
        let mut all = std::collections::HashMap::new();
        let mut after = 0;
        loop {
            let page = store.list_events("r", after, 1000).await.expect("list");
            let Some(last) = page.last() else { break };
            after = last.seq;
            all.extend(page.into_iter().map(|e| (e.seq, e.payload)));
        }
        all
    });
    for (seq, t, n) in acked {
        let payload = stored
            .get(&seq)
            .unwrap_or_else(|| panic!("acknowledged seq {seq} lost"));
        assert_eq!(payload, &text(json!({"t": t, "n": n})), "seq {seq}");
    }
}

#[tokio::test]
async fn a_bad_row_left_by_an_older_agl_is_served_as_an_error_value() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("agl.db");
    {
        let store = Store::open(&path).expect("open");
        one(&store, "r1").await;
        one(&store, "r2").await;
        store
            .append_event("r1", 1, "log", JsonText::from(json!({"ok": 1})))
            .await
            .expect("log");
        let call = json!({"api": "chat_completions", "request": {}, "response_ids": [1]});
        store
            .append_event("r1", 1, "model_request", JsonText::from(call))
            .await
            .expect("call");
    }
    // What an older agl accepted and stored: numbers out of range and
    // nesting no tree parser takes.
    let conn = rusqlite::Connection::open(&path).expect("raw open");
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    conn.execute("UPDATE rollouts SET input = '[1e999]' WHERE id = 'r1'", [])
        .expect("input");
    conn.execute("UPDATE events SET payload = ?1 WHERE kind = 'log'", [&deep])
        .expect("log");
    conn.execute(
        "UPDATE events SET payload = '{\"api\": \"chat_completions\", \"x\": 1e999}' WHERE kind = 'model_request'",
        [],
    )
    .expect("call");
    drop(conn);
    let store = Store::open(&path).expect("reopen");
    let page = store
        .list_rollouts(RolloutFilter::default(), None, 10)
        .await
        .expect("list");
    assert_eq!(page.rollouts.len(), 2);
    let r1 = store.get_rollout("r1").await.expect("get");
    let input = r1.input.parse().expect("an error value is JSON");
    assert!(
        input["agl_error"]
            .as_str()
            .expect("error")
            .contains("input"),
        "{input}"
    );
    let r2 = store.get_rollout("r2").await.expect("r2").input.parse();
    assert_eq!(
        r2.expect("r2 input"),
        json!({"question": "2+2?", "answer": "4"})
    );
    let events = store.list_events("r1", 0, 10).await.expect("events");
    assert_eq!(events.len(), 2);
    for e in &events {
        let payload = e.payload.parse().expect("JSON");
        assert!(payload["agl_error"].is_string(), "{payload}");
    }
    // The unreadable call is left out; the rest of the rollout exports.
    let exported = store.export_rollout("r1").await.expect("export");
    assert!(exported.calls.is_empty());
    assert_eq!(exported.events.len(), 1);
}

#[tokio::test]
async fn store_files_are_owner_only() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("agl.db");
    let mode = |suffix: &str| {
        let file = format!("{}{suffix}", path.display());
        std::fs::metadata(file).expect("file").permissions().mode() & 0o777
    };
    {
        let store = Store::open(&path).expect("open");
        one(&store, "r").await;
        for suffix in ["", "-wal", "-shm", "-events"] {
            assert_eq!(mode(suffix), 0o600, "agl.db{suffix}");
        }
    }
    // A file an older agl left world-readable is tightened on open.
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let _store = Store::open(&path).expect("reopen");
    assert_eq!(mode(""), 0o600);
}

/// Writes that never pause keep the checkpoint thread from ever copying
/// the whole log, so the log alone never starts over; past
/// `[store] wal_limit_mib` the writer checkpoints it itself and the log
/// file stays near the limit (it was as large as everything written).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_write_ahead_log_stays_near_its_limit_under_unbroken_writes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("agl.db");
    let config = agl_store::StoreConfig {
        wal_limit_mib: std::num::NonZeroU32::MIN,
        ..Default::default()
    };
    let store = Store::open_config(&path, &config).expect("open store");
    one(&store, "r").await;
    // 48 writers, 16 KiB events, 64 MiB in all.
    let payload = text(json!({"text": "x".repeat(16 * 1024)}));
    let writers: Vec<_> = (0..48)
        .map(|_| {
            let (store, payload) = (store.clone(), payload.clone());
            tokio::spawn(async move {
                for _ in 0..85 {
                    store
                        .append_event("r", 1, "log", payload.clone())
                        .await
                        .expect("append");
                }
            })
        })
        .collect();
    for w in writers {
        w.await.expect("writer");
    }
    let wal = std::fs::metadata(dir.path().join("agl.db-wal")).map_or(0, |m| m.len());
    assert!(
        wal < 16 * 1024 * 1024,
        "the log grew to {} MiB for 64 MiB written",
        wal / (1024 * 1024)
    );
    let events = store.list_events("r", 0, 10).await.expect("read back");
    assert_eq!(events.len(), 10);
}
