//! `previous_response_id`: a Responses request that continues an earlier
//! response sends only what is new; its history is the earlier request's
//! (itself expanded) followed by that response's output items. Served from
//! the store, the source of truth, so it survives a gateway restart; only
//! the same rollout attempt's successful calls count.

use std::collections::HashMap;

use agl_wire::record::{CallStatus, ModelRequest};
use agl_wire::rollout::ApiKind;
use axum::http::StatusCode;
use serde_json::{Value, json};

use crate::ApiError;

/// A chain of responses longer than this is refused (it would be a loop).
const MAX_DEPTH: usize = 10_000;

/// An attempt's recorded Responses calls by response id: the request as
/// sent and the response's output items.
#[derive(Default)]
pub struct ResponsesIndex {
    by_id: HashMap<String, (Value, Value)>,
}

impl ResponsesIndex {
    /// The index of an attempt's calls (see `rendered::attempt_calls`).
    pub fn from_calls(calls: &[(u64, ModelRequest)]) -> Self {
        let mut index = ResponsesIndex::default();
        for (_, call) in calls {
            if call.api != ApiKind::Responses || call.status != CallStatus::Ok {
                continue;
            }
            let (Ok(request), Ok(response)) = (call.request.parse(), call.response.parse()) else {
                continue;
            };
            if let Some(id) = response.get("id").and_then(Value::as_str) {
                let output = response.get("output").cloned().unwrap_or(json!([]));
                index.by_id.insert(id.to_string(), (request, output));
            }
        }
        index
    }

    /// `request` with its `previous_response_id` chain written out into
    /// `input` (and the id removed); as it is when it names none.
    pub fn expand(&self, mut request: Value) -> Result<Value, ApiError> {
        let Some(first) = previous(&request) else {
            return Ok(request);
        };
        let mut history: Vec<Value> = Vec::new();
        let mut next = Some(first);
        let mut depth = 0;
        while let Some(id) = next {
            depth += 1;
            if depth > MAX_DEPTH {
                return Err(ApiError::bad_request(format!(
                    "`previous_response_id` chains more than {MAX_DEPTH} responses"
                )));
            }
            let (earlier, output) = self.by_id.get(&id).ok_or_else(|| not_found(&id))?;
            let mut part = input_items(earlier.get("input"));
            part.extend(output.as_array().into_iter().flatten().cloned());
            part.append(&mut history);
            history = part;
            next = previous(earlier);
        }
        history.extend(input_items(request.get("input")));
        if let Some(body) = request.as_object_mut() {
            body.insert("input".into(), Value::Array(history));
            body.remove("previous_response_id");
        }
        Ok(request)
    }
}

fn previous(request: &Value) -> Option<String> {
    request
        .get("previous_response_id")
        .and_then(Value::as_str)
        .map(str::to_string)
}

/// `input` as items: a string is one user message.
fn input_items(input: Option<&Value>) -> Vec<Value> {
    match input {
        Some(Value::String(s)) => vec![json!({"role": "user", "content": s})],
        Some(Value::Array(items)) => items.clone(),
        _ => Vec::new(),
    }
}

/// OpenAI's answer for an id it does not hold.
fn not_found(id: &str) -> ApiError {
    let mut e = ApiError::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        format!("Previous response with id '{id}' not found."),
    );
    e.code = Some("previous_response_not_found");
    e
}

#[cfg(test)]
mod tests {
    use super::*;

    fn index() -> ResponsesIndex {
        let mut index = ResponsesIndex::default();
        let call =
            json!({"type": "function_call", "call_id": "c1", "name": "sh", "arguments": "{}"});
        index.by_id.insert(
            "resp_1".into(),
            (json!({"input": "list files"}), json!([call])),
        );
        let said = json!({"type": "message", "role": "assistant",
                          "content": [{"type": "output_text", "text": "3 files"}]});
        index.by_id.insert(
            "resp_2".into(),
            (
                json!({"previous_response_id": "resp_1",
                       "input": [{"type": "function_call_output", "call_id": "c1", "output": "a b c"}]}),
                json!([said]),
            ),
        );
        index
    }

    #[test]
    fn a_chain_of_responses_is_written_out_in_order() {
        let body =
            json!({"previous_response_id": "resp_2", "input": "thanks", "instructions": "x"});
        let got = index().expand(body).unwrap();
        assert!(got.get("previous_response_id").is_none());
        assert_eq!(got["instructions"], "x");
        let kinds: Vec<&str> = got["input"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["type"].as_str().unwrap_or("message"))
            .collect();
        assert_eq!(
            kinds,
            [
                "message",
                "function_call",
                "function_call_output",
                "message",
                "message"
            ]
        );
        assert_eq!(got["input"][0]["content"], "list files");
        assert_eq!(got["input"][4]["content"], "thanks");
    }

    #[test]
    fn an_unknown_id_is_a_404_that_names_it() {
        let e = index()
            .expand(json!({"previous_response_id": "resp_9", "input": "x"}))
            .unwrap_err();
        assert_eq!(e.status, StatusCode::NOT_FOUND);
        assert_eq!(e.code, Some("previous_response_not_found"));
        assert!(e.message.contains("resp_9"));
    }
}
