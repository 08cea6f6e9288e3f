//! Assembles a stored rollout into the rollout JSONL record.

use agl_wire::record::{CallStatus, MODEL_REQUEST, ModelRequest};
use rusqlite::Connection;

use super::StoreError;
use super::reads::attempt_events;
use super::rows::get_rollout;
use agl_wire::rollout::{Event, Rollout};

/// The rollout's current attempt as a `Rollout`. Must run inside one read
/// transaction so the rollout row and its events agree.
pub fn export_rollout(conn: &Connection, id: &str) -> Result<Rollout, StoreError> {
    let rec = get_rollout(conn, id)?;
    let mut calls = Vec::new();
    let mut events = Vec::new();
    // seq -> export index, for the continuation links.
    let mut index_of = std::collections::HashMap::new();
    for ev in attempt_events(conn, id, rec.attempt)? {
        if ev.kind != MODEL_REQUEST {
            events.push(Event {
                kind: ev.kind,
                payload: ev.payload,
                timestamp_ms: ev.created_ms,
            });
            continue;
        }
        // A call the client retried is replaced by its retry.
        if ev.superseded_by.is_some() {
            continue;
        }
        // A record that cannot be read is left out, not allowed to fail the
        // whole rollout's export; the events list shows it as an error.
        let call: ModelRequest = match serde_json::from_str(ev.payload.as_str()) {
            Ok(call) => call,
            Err(e) => {
                tracing::warn!(rollout = id, seq = ev.seq, error = %e, "unreadable model_request left out");
                continue;
            }
        };
        // The client left before this answer reached it: not part of the
        // conversation the harness saw.
        if call.status == CallStatus::Cancelled {
            continue;
        }
        let index = calls.len() as u32;
        let continues = call.continues.and_then(|seq| index_of.get(&seq).copied());
        index_of.insert(ev.seq, index);
        calls.push(call.into_call(index, continues));
    }
    Ok(Rollout {
        id: rec.id,
        group_id: rec.group_id,
        attempt: rec.attempt,
        input: rec.input,
        status: rec.status,
        failure: rec.failure,
        calls,
        events,
    })
}
