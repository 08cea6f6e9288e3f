//! Read queries; they run on read-only connections.

use rusqlite::{Connection, OptionalExtension, params};

use super::StoreError;
use super::rows::{self, EVENT_COLS, ROLLOUT_COLS, to_i64};
use super::types::{RolloutFilter, RolloutPage, WeightVersion};
use agl_wire::api::{Engine, EventRecord};
use agl_wire::rollout::RolloutStatus;

/// Largest page a list call returns, whatever the caller asks for.
pub const MAX_PAGE: u32 = 1000;

// A cursor names the last row returned: `<created_ms>.<id>`. Rows are ordered
// by (created_ms, id), which never changes, so paging is stable under inserts.
fn encode_cursor(created_ms: u64, id: &str) -> String {
    format!("{created_ms}.{id}")
}

fn decode_cursor(cursor: &str) -> Result<(i64, String), StoreError> {
    let bad = || StoreError::BadCursor(cursor.to_string());
    let (ms, id) = cursor.split_once('.').ok_or_else(bad)?;
    Ok((ms.parse().map_err(|_| bad())?, id.to_string()))
}

pub fn list_rollouts(
    conn: &Connection,
    filter: &RolloutFilter,
    cursor: Option<&str>,
    limit: u32,
) -> Result<RolloutPage, StoreError> {
    let limit = limit.clamp(1, MAX_PAGE);
    let (after_ms, after_id) = match cursor {
        Some(c) => decode_cursor(c)?,
        None => (i64::MIN, String::new()),
    };
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {ROLLOUT_COLS} FROM rollouts
         WHERE (?1 IS NULL OR status = ?1)
           AND (?5 IS NULL OR group_id = ?5)
           AND (?6 IS NULL OR mode = ?6)
           AND (created_ms > ?2 OR (created_ms = ?2 AND id > ?3))
         ORDER BY created_ms, id LIMIT ?4"
    ))?;
    let mut rollouts = stmt
        .query_map(
            params![
                filter.status.map(RolloutStatus::as_str),
                after_ms,
                after_id,
                limit + 1,
                filter.group_id,
                filter.mode.map(|m| m.as_str()),
            ],
            rows::rollout,
        )?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    // One extra row fetched tells whether another page exists.
    let next_cursor = if rollouts.len() > limit as usize {
        rollouts.truncate(limit as usize);
        rollouts.last().map(|r| encode_cursor(r.created_ms, &r.id))
    } else {
        None
    };
    Ok(RolloutPage {
        rollouts,
        next_cursor,
    })
}

/// Events of one rollout (all attempts) with `seq > after_seq`, in order.
pub fn list_events(
    conn: &Connection,
    rollout_id: &str,
    after_seq: u64,
    limit: u32,
) -> Result<Vec<EventRecord>, StoreError> {
    rows::get_rollout(conn, rollout_id)?;
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {EVENT_COLS} FROM events WHERE rollout_id = ?1 AND seq > ?2
         ORDER BY seq LIMIT ?3"
    ))?;
    let events = stmt
        .query_map(
            params![
                rollout_id,
                to_i64(after_seq, "seq")?,
                limit.clamp(1, MAX_PAGE)
            ],
            rows::event,
        )?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(events)
}

/// Every event of one attempt, in order (for export).
pub fn attempt_events(
    conn: &Connection,
    rollout_id: &str,
    attempt: u32,
) -> Result<Vec<EventRecord>, StoreError> {
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {EVENT_COLS} FROM events WHERE rollout_id = ?1 AND attempt = ?2 ORDER BY seq"
    ))?;
    let events = stmt
        .query_map(params![rollout_id, attempt], rows::event)?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(events)
}

pub fn list_engines(conn: &Connection) -> Result<Vec<Engine>, StoreError> {
    let mut stmt = conn.prepare_cached("SELECT * FROM engines ORDER BY name")?;
    let engines = stmt
        .query_map([], rows::engine)?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(engines)
}

pub fn latest_weight_version(conn: &Connection) -> Result<Option<WeightVersion>, StoreError> {
    Ok(conn
        .prepare_cached("SELECT * FROM weight_versions ORDER BY version DESC LIMIT 1")?
        .query_row([], rows::weight_version)
        .optional()?)
}
