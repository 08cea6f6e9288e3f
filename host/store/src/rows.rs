//! Column <-> Rust conversions shared by reads and writes.

use std::time::{SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, OptionalExtension, Row, params};

use super::StoreError;
use super::types::{RolloutRecord, WeightVersion};
use agl_wire::api::{Engine, EngineApi, EventRecord, Render};
use agl_wire::rollout::JsonText;
use agl_wire::rollout::{FailureKind, Mode, RolloutStatus};

pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

pub fn to_i64(v: u64, what: &str) -> Result<i64, StoreError> {
    i64::try_from(v).map_err(|_| StoreError::OutOfRange(format!("{what} {v}")))
}

fn bad(what: &str) -> rusqlite::Error {
    rusqlite::Error::FromSqlConversionFailure(
        0,
        rusqlite::types::Type::Text,
        format!("bad {what}").into(),
    )
}

/// A JSON column. Text that no longer passes the checks (written by an
/// older agl, or damaged) is served as an error value for this row, so one
/// bad row never breaks a read of many.
fn json(row: &Row, col: &str) -> rusqlite::Result<JsonText> {
    let text: String = row.get(col)?;
    Ok(serde_json::from_str(&text).unwrap_or_else(|e| unreadable(col, &e.to_string())))
}

/// The value a stored document that cannot be served is replaced with.
pub fn unreadable(col: &str, reason: &str) -> JsonText {
    tracing::warn!(
        column = col,
        reason,
        "stored JSON cannot be served as it is"
    );
    JsonText::from(serde_json::json!({
        "agl_error": format!("stored {col} cannot be served: {reason}")
    }))
}

fn u64_col(row: &Row, col: &str) -> rusqlite::Result<u64> {
    let v: i64 = row.get(col)?;
    u64::try_from(v).map_err(|_| bad(col))
}

pub const ROLLOUT_COLS: &str =
    "id, group_id, mode, input, config, status, attempt, reason, failure, created_ms, updated_ms";

pub fn rollout(row: &Row) -> rusqlite::Result<RolloutRecord> {
    let mode: String = row.get("mode")?;
    let status: String = row.get("status")?;
    Ok(RolloutRecord {
        id: row.get("id")?,
        group_id: row.get("group_id")?,
        mode: Mode::parse(&mode).ok_or_else(|| bad("mode"))?,
        input: json(row, "input")?,
        config: json(row, "config")?,
        status: RolloutStatus::parse(&status).ok_or_else(|| bad("status"))?,
        attempt: row.get("attempt")?,
        reason: row.get("reason")?,
        failure: match row.get::<_, Option<String>>("failure")? {
            None => None,
            Some(f) => Some(FailureKind::parse(&f).ok_or_else(|| bad("failure"))?),
        },
        created_ms: u64_col(row, "created_ms")?,
        updated_ms: u64_col(row, "updated_ms")?,
    })
}

pub fn get_rollout(conn: &Connection, id: &str) -> Result<RolloutRecord, StoreError> {
    conn.prepare_cached(&format!(
        "SELECT {ROLLOUT_COLS} FROM rollouts WHERE id = ?1"
    ))?
    .query_row(params![id], rollout)
    .optional()?
    .ok_or_else(|| StoreError::RolloutNotFound(id.to_string()))
}

pub const EVENT_COLS: &str = "seq, rollout_id, attempt, kind, payload, created_ms, superseded_by";

pub fn event(row: &Row) -> rusqlite::Result<EventRecord> {
    let superseded_by: Option<i64> = row.get("superseded_by")?;
    Ok(EventRecord {
        seq: u64_col(row, "seq")?,
        rollout_id: row.get("rollout_id")?,
        attempt: row.get("attempt")?,
        kind: row.get("kind")?,
        payload: json(row, "payload")?,
        created_ms: u64_col(row, "created_ms")?,
        superseded_by: superseded_by.map(|s| s as u64),
    })
}

pub fn engine(row: &Row) -> rusqlite::Result<Engine> {
    Ok(Engine {
        name: row.get("name")?,
        base_url: row.get("base_url")?,
        model: row.get("model")?,
        created_ms: u64_col(row, "created_ms")?,
        render: Render::parse(&row.get::<_, String>("render")?).ok_or_else(|| bad("render"))?,
        api: EngineApi::parse(&row.get::<_, String>("api")?).ok_or_else(|| bad("api"))?,
        policy: row.get("policy")?,
        context_len: row
            .get::<_, Option<i64>>("context_len")?
            .map(|n| u64::try_from(n).map_err(|_| bad("context_len")))
            .transpose()?,
    })
}

pub fn weight_version(row: &Row) -> rusqlite::Result<WeightVersion> {
    Ok(WeightVersion {
        version: u64_col(row, "version")?,
        created_ms: u64_col(row, "created_ms")?,
        meta: json(row, "meta")?,
    })
}
