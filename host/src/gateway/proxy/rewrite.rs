//! What the proxy changes in a harness's request before it goes upstream:
//! the model name, the train/val temperature, and the vLLM (>= 0.10.2) flags
//! that make the engine return token ids and logprobs.

use serde_json::{Value, json};

use crate::rollout::ApiKind;

/// Rewrites `body` (a JSON object) in place for `model` and `temperature`.
pub fn rewrite(body: &mut Value, api: ApiKind, model: &str, temperature: f64) {
    let Some(map) = body.as_object_mut() else {
        return;
    };
    map.insert("model".into(), json!(model));
    map.insert("temperature".into(), json!(temperature));
    map.insert("return_token_ids".into(), json!(true));
    match api {
        // Chat: `logprobs` is a flag; `top_logprobs` stays as the client set it.
        ApiKind::ChatCompletions => {
            map.insert("logprobs".into(), json!(true));
        }
        // Completions: `logprobs` is the number of alternatives; keep a
        // larger one the client asked for.
        _ => {
            let asked = map.get("logprobs").and_then(Value::as_u64).unwrap_or(0);
            map.insert("logprobs".into(), json!(asked.max(1)));
        }
    }
}

/// True when the client asked for a streamed (SSE) response.
pub fn is_stream(body: &Value) -> bool {
    body.get("stream").and_then(Value::as_bool).unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forces_model_temperature_and_token_flags() {
        let mut chat =
            json!({"model": "x", "temperature": 0.2, "logprobs": false, "top_logprobs": 3});
        rewrite(&mut chat, ApiKind::ChatCompletions, "m", 1.0);
        assert_eq!(
            chat,
            json!({"model": "m", "temperature": 1.0, "logprobs": true, "top_logprobs": 3,
                   "return_token_ids": true})
        );
        let mut comp = json!({"prompt": "p", "logprobs": 5});
        rewrite(&mut comp, ApiKind::Completions, "m", 0.0);
        assert_eq!(comp["logprobs"], 5);
        let mut comp = json!({"prompt": "p"});
        rewrite(&mut comp, ApiKind::Completions, "m", 0.0);
        assert_eq!(comp["logprobs"], 1);
        assert_eq!(comp["return_token_ids"], true);
    }
}
