//! Assembles a stored rollout into the rollout JSONL record.

use std::collections::BTreeMap;

use rusqlite::Connection;
use serde::Deserialize;

use super::StoreError;
use super::reads::attempt_events;
use super::rows::get_rollout;
use crate::rollout::{ApiKind, Event, JsonText, ModelCall, Rollout};

/// The event kind the gateway records each proxied call as.
pub const MODEL_REQUEST: &str = "model_request";

/// A `model_request` payload: `ModelCall` without `index`. Fields the record
/// does not carry (engine, latency, status, error, ...) are allowed and
/// ignored; an errored call may leave the token fields out.
#[derive(Deserialize)]
struct CallPayload {
    api: ApiKind,
    #[serde(default)]
    request: JsonText,
    #[serde(default)]
    response: JsonText,
    #[serde(default)]
    prompt_ids: Vec<u32>,
    #[serde(default)]
    response_ids: Vec<u32>,
    #[serde(default)]
    response_logprobs: Vec<f32>,
    #[serde(default)]
    weight_version: u64,
    #[serde(default)]
    finish_reason: Option<String>,
    #[serde(default)]
    started_at_ms: u64,
    #[serde(default)]
    finished_at_ms: u64,
    #[serde(default)]
    tags: BTreeMap<String, String>,
}

/// The rollout's current attempt as a `Rollout`. Must run inside one read
/// transaction so the rollout row and its events agree.
pub fn export_rollout(conn: &Connection, id: &str) -> Result<Rollout, StoreError> {
    let rec = get_rollout(conn, id)?;
    let mut calls = Vec::new();
    let mut events = Vec::new();
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
        let p: CallPayload =
            serde_json::from_str(ev.payload.as_str()).map_err(|source| StoreError::BadPayload {
                seq: ev.seq,
                source,
            })?;
        calls.push(ModelCall {
            index: calls.len() as u32,
            api: p.api,
            request: p.request,
            response: p.response,
            prompt_ids: p.prompt_ids,
            response_ids: p.response_ids,
            response_logprobs: p.response_logprobs,
            weight_version: p.weight_version,
            finish_reason: p.finish_reason,
            started_at_ms: p.started_at_ms,
            finished_at_ms: p.finished_at_ms,
            tags: p.tags,
        });
    }
    Ok(Rollout {
        id: rec.id,
        group_id: rec.group_id,
        attempt: rec.attempt,
        input: rec.input,
        status: rec.status,
        calls,
        events,
    })
}
