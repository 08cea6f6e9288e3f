//! Write operations. Each runs on the writer's connection inside its own
//! savepoint of the current batch transaction (see `writer.rs`).

use std::sync::atomic::{AtomicU64, Ordering};

use rusqlite::{Connection, OptionalExtension, params};

use super::StoreError;
use super::eventlog::Entry;
use super::rows::{self, now_ms, to_i64};
use super::state::{Step, transition};
use super::types::{RolloutRecord, WeightVersion};
use agl_wire::api::{Engine, NewRollout, RegisterEngine, StatusPatch};
use agl_wire::rollout::{FailureKind, JsonText, RolloutStatus};

/// A fresh id that no other process or restart will produce (time, pid, and a
/// counter, hashed).
fn fresh_id() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = blake3::Hasher::new();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    h.update(&nanos.to_le_bytes());
    h.update(&std::process::id().to_le_bytes());
    h.update(&COUNTER.fetch_add(1, Ordering::Relaxed).to_le_bytes());
    format!("r-{}", &h.finalize().to_hex()[..20])
}

pub fn create_rollouts(
    conn: &Connection,
    batch: Vec<NewRollout>,
) -> Result<Vec<RolloutRecord>, StoreError> {
    let now = now_ms();
    let mut out = Vec::with_capacity(batch.len());
    for new in batch {
        let id = new.id.unwrap_or_else(fresh_id);
        // Idempotent on id: an existing rollout is returned as it is.
        let inserted = conn
            .prepare_cached(
                "INSERT INTO rollouts (id, group_id, mode, input, config, status, attempt,
                     created_ms, updated_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, 'queued', 1, ?6, ?6)
                 ON CONFLICT (id) DO NOTHING",
            )?
            .execute(params![
                id,
                new.group_id,
                new.mode.as_str(),
                new.input.as_str(),
                new.config.as_str(),
                now
            ])?;
        if inserted == 1 {
            conn.prepare_cached(
                "INSERT INTO attempts (rollout_id, attempt, status) VALUES (?1, 1, 'queued')",
            )?
            .execute(params![id])?;
        }
        out.push(rows::get_rollout(conn, &id)?);
    }
    Ok(out)
}

fn illegal(id: &str, from: RolloutStatus, to: RolloutStatus) -> StoreError {
    StoreError::IllegalTransition {
        id: id.to_string(),
        from: from.as_str(),
        to: to.as_str(),
    }
}

/// Moves the named attempt, which must be the current one, to `to`.
/// Moves the current attempt to `patch.status`. A system failure of an
/// attempt within the retry `budget` is re-queued as the next attempt in
/// the same transaction: a rollout never rests in `failed` while it has
/// retries left.
pub fn set_status(
    conn: &Connection,
    id: &str,
    patch: &StatusPatch,
    budget: u32,
) -> Result<RolloutRecord, StoreError> {
    let (attempt, to, reason) = (patch.attempt, patch.status, patch.reason.as_deref());
    let failure = patch.failure.map(FailureKind::as_str);
    let cur = rows::get_rollout(conn, id)?;
    if cur.attempt != attempt {
        return Err(StoreError::StaleAttempt {
            id: id.to_string(),
            given: attempt,
            current: cur.attempt,
        });
    }
    if transition(cur.status, to) != Some(Step::SameAttempt) {
        return Err(illegal(id, cur.status, to));
    }
    let now = now_ms();
    conn.prepare_cached(
        "UPDATE rollouts SET status = ?2, reason = ?3, failure = ?4, updated_ms = ?5
         WHERE id = ?1",
    )?
    .execute(params![id, to.as_str(), reason, failure, now])?;
    let started = (to == RolloutStatus::Running).then_some(now);
    let ended = to.is_terminal().then_some(now);
    conn.prepare_cached(
        "UPDATE attempts SET status = ?3, reason = ?4, failure = ?5,
             started_ms = COALESCE(?6, started_ms), ended_ms = COALESCE(?7, ended_ms)
         WHERE rollout_id = ?1 AND attempt = ?2",
    )?
    .execute(params![
        id,
        attempt,
        to.as_str(),
        reason,
        failure,
        started,
        ended
    ])?;
    if patch.failure == Some(FailureKind::System) && attempt <= budget {
        return retry(conn, id);
    }
    rows::get_rollout(conn, id)
}

pub fn cancel(conn: &Connection, id: &str) -> Result<RolloutRecord, StoreError> {
    let cur = rows::get_rollout(conn, id)?;
    set_status(
        conn,
        id,
        &StatusPatch::to(cur.attempt, RolloutStatus::Cancelled),
        0,
    )
}

/// Re-queues a failed rollout as a new attempt.
pub fn retry(conn: &Connection, id: &str) -> Result<RolloutRecord, StoreError> {
    let cur = rows::get_rollout(conn, id)?;
    if transition(cur.status, RolloutStatus::Queued) != Some(Step::NewAttempt) {
        return Err(illegal(id, cur.status, RolloutStatus::Queued));
    }
    let next = cur.attempt + 1;
    conn.prepare_cached(
        "UPDATE rollouts SET status = 'queued', attempt = ?2, reason = NULL, failure = NULL,
             updated_ms = ?3
         WHERE id = ?1",
    )?
    .execute(params![id, next, now_ms()])?;
    conn.prepare_cached(
        "INSERT INTO attempts (rollout_id, attempt, status) VALUES (?1, ?2, 'queued')",
    )?
    .execute(params![id, next])?;
    rows::get_rollout(conn, id)
}

pub fn append_event(
    conn: &Connection,
    rollout_id: &str,
    attempt: u32,
    kind: &str,
    payload: &JsonText,
) -> Result<u64, StoreError> {
    let inserted = insert_event(conn, None, (rollout_id, attempt, kind), payload, now_ms())?;
    inserted.ok_or_else(|| StoreError::Commit("an event without a seq was not inserted".into()))
}

/// Inserts an event under `seq` (`None`: the next one SQLite picks);
/// returns its seq, or `None` when `seq` is taken (an event log entry that
/// was ingested before, see `eventlog.rs`).
pub fn insert_event(
    conn: &Connection,
    seq: Option<u64>,
    (rollout_id, attempt, kind): (&str, u32, &str),
    payload: &JsonText,
    created_ms: i64,
) -> Result<Option<u64>, StoreError> {
    let seq = seq.map(|s| to_i64(s, "seq")).transpose()?;
    // The attempt's row is the foreign key's parent, and a rollout has one
    // for each attempt it has had: a violation is an unknown rollout or an
    // attempt it never had, told apart only then (the proxy appends on
    // every call, and the check costs a lookup).
    let inserted = conn
        .prepare_cached(
            "INSERT INTO events (seq, rollout_id, attempt, kind, payload, created_ms)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT (seq) DO NOTHING",
        )?
        .execute(params![
            seq,
            rollout_id,
            attempt,
            kind,
            payload.as_str(),
            created_ms
        ]);
    match inserted {
        Ok(0) => Ok(None),
        Ok(_) => Ok(Some(conn.last_insert_rowid() as u64)),
        Err(e) if is_foreign_key_violation(&e) => Err(unknown_attempt(conn, rollout_id, attempt)?),
        Err(e) => Err(e.into()),
    }
}

/// The seq after the largest one in the table.
pub fn next_seq(conn: &Connection) -> Result<u64, StoreError> {
    let last: i64 = conn.query_row("SELECT coalesce(max(seq), 0) FROM events", [], |r| r.get(0))?;
    Ok(last as u64 + 1)
}

/// Ingests an event log entry: its events under their seqs, then the calls
/// they supersede (a supersede that fails is logged; the events stand).
/// An entry ingested before is left as it is.
pub fn ingest(conn: &Connection, entry: &Entry) -> Result<(), StoreError> {
    let key = (
        entry.rollout_id.as_str(),
        entry.attempt,
        entry.kind.as_str(),
    );
    let mut fresh = false;
    for (seq, payload) in &entry.events {
        fresh |= insert_event(conn, Some(*seq), key, payload, entry.created_ms)?.is_some();
    }
    if fresh {
        supersede_all(conn, &entry.supersede);
    }
    Ok(())
}

/// Supersedes each `(old, new)`; one that fails is logged, the rest go on.
pub fn supersede_all(conn: &Connection, pairs: &[(u64, u64)]) {
    for &(old, new) in pairs {
        if let Err(e) = supersede(conn, old, new) {
            tracing::warn!("superseding retried call {old} by {new}: {e}");
        }
    }
}

fn is_foreign_key_violation(e: &rusqlite::Error) -> bool {
    matches!(
        e,
        rusqlite::Error::SqliteFailure(f, _)
            if f.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_FOREIGNKEY
    )
}

/// Why `attempt` of `rollout_id` has no row: the rollout is unknown, or
/// the attempt is not one it has had.
fn unknown_attempt(
    conn: &Connection,
    rollout_id: &str,
    attempt: u32,
) -> Result<StoreError, StoreError> {
    let current: Option<u32> = conn
        .prepare_cached("SELECT attempt FROM rollouts WHERE id = ?1")?
        .query_row(params![rollout_id], |r| r.get(0))
        .optional()?;
    Ok(match current {
        None => StoreError::RolloutNotFound(rollout_id.to_string()),
        Some(current) => StoreError::StaleAttempt {
            id: rollout_id.to_string(),
            given: attempt,
            current,
        },
    })
}

/// Marks model_request event `old` as replaced by the client's retry `new`.
pub fn supersede(conn: &Connection, old: u64, new: u64) -> Result<(), StoreError> {
    let why = |why: &str| StoreError::Supersede {
        old,
        new,
        why: why.to_string(),
    };
    let load = |seq: u64| -> Result<(String, u32, String, Option<i64>), StoreError> {
        conn.prepare_cached(
            "SELECT rollout_id, attempt, kind, superseded_by FROM events WHERE seq = ?1",
        )?
        .query_row(params![to_i64(seq, "seq")?], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
        })
        .optional()?
        .ok_or(StoreError::EventNotFound(seq))
    };
    let (old_rollout, old_attempt, old_kind, old_by) = load(old)?;
    let (new_rollout, new_attempt, _, _) = load(new)?;
    if old >= new {
        return Err(why("the replacement must come later"));
    }
    if (old_rollout, old_attempt) != (new_rollout, new_attempt) {
        return Err(why("events belong to different rollout attempts"));
    }
    if old_kind != "model_request" {
        return Err(why("only model_request events can be superseded"));
    }
    if old_by.is_some() {
        return Err(why("already superseded"));
    }
    conn.prepare_cached("UPDATE events SET superseded_by = ?2 WHERE seq = ?1")?
        .execute(params![to_i64(old, "seq")?, to_i64(new, "seq")?])?;
    Ok(())
}

/// Registers an engine, replacing the address and model of one with that name.
/// Registers (or replaces) `e`; its `base_url` as it is to be stored.
pub fn register_engine(conn: &Connection, e: &RegisterEngine) -> Result<Engine, StoreError> {
    let context_len = e.context_len.map(|n| i64::try_from(n).unwrap_or(i64::MAX));
    conn.prepare_cached(
        "INSERT INTO engines (name, base_url, model, created_ms, render, api, policy, context_len)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
         ON CONFLICT (name) DO UPDATE SET base_url = excluded.base_url, model = excluded.model,
             render = excluded.render, api = excluded.api, policy = excluded.policy,
             context_len = excluded.context_len",
    )?
    .execute(params![
        e.name,
        e.base_url,
        e.model,
        now_ms(),
        e.render.as_str(),
        e.api.as_str(),
        e.policy,
        context_len
    ])?;
    Ok(conn
        .prepare_cached("SELECT * FROM engines WHERE name = ?1")?
        .query_row(params![e.name], rows::engine)?)
}

pub fn remove_engine(conn: &Connection, name: &str) -> Result<(), StoreError> {
    let n = conn
        .prepare_cached("DELETE FROM engines WHERE name = ?1")?
        .execute(params![name])?;
    if n == 0 {
        return Err(StoreError::EngineNotFound(name.to_string()));
    }
    Ok(())
}

pub fn record_weight_version(
    conn: &Connection,
    version: u64,
    meta: &JsonText,
) -> Result<WeightVersion, StoreError> {
    let v = to_i64(version, "weight version")?;
    let n = conn
        .prepare_cached(
            "INSERT INTO weight_versions (version, created_ms, meta) VALUES (?1, ?2, ?3)
             ON CONFLICT (version) DO NOTHING",
        )?
        .execute(params![v, now_ms(), meta.as_str()])?;
    if n == 0 {
        return Err(StoreError::WeightVersionExists(version));
    }
    Ok(conn
        .prepare_cached("SELECT * FROM weight_versions WHERE version = ?1")?
        .query_row(params![v], rows::weight_version)?)
}
