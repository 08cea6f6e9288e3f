//! Reading a rollout's input and reported events.

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::Rollout;

/// The event kind a harness posts to report its own reward.
pub const REWARD_EVENT: &str = "reward";

/// The dataset row the harness was started with, deserialised into `T`
/// (use `serde_json::Value` to take it as is).
pub fn input<T: DeserializeOwned>(rollout: &Rollout) -> Result<T, String> {
    serde_json::from_str(&rollout.input_json)
        .map_err(|e| format!("rollout {}: unexpected input: {e}", rollout.id))
}

/// The value of the last `reward` event the harness posted: payload
/// `{"value": <number>}` or a bare number. `Ok(None)` when it posted none;
/// an error when the last one carries no number (a harness bug worth
/// seeing, not a silent zero).
pub fn last_reward(rollout: &Rollout) -> Result<Option<f64>, String> {
    let Some(event) = rollout.events.iter().rev().find(|e| e.kind == REWARD_EVENT) else {
        return Ok(None);
    };
    let payload: Value = serde_json::from_str(&event.payload_json)
        .map_err(|e| format!("reward event payload is not JSON: {e}"))?;
    let value = match &payload {
        Value::Object(fields) => fields.get("value"),
        number @ Value::Number(_) => Some(number),
        _ => None,
    };
    value
        .and_then(Value::as_f64)
        .map(Some)
        .ok_or_else(|| format!("reward event payload has no numeric value: {payload}"))
}
