//! What OpenAI-compatible clients ask of agl's engine beyond one greedy
//! answer, with the real OpenAI Python SDK through the gateway (which
//! renders chat for it): `n` choices (whole and streamed, each its own
//! sample of the request), `top_logprobs` alternatives on chat, Responses
//! and passed-through completions, constrained output, the model list,
//! and `n` choices each recorded as its own call, the next call following
//! the choice the harness kept.

use std::path::Path;
use std::process::Command;

use agl_conversation::Renderer;
use agl_inference::InferenceServer;
use serde_json::{Value, json};

use crate::engine_server::{Env, start_serving};
use crate::engine_server::{client, model_dir, server, start, start_configured, start_on};
use crate::process::python;

/// Each entry's alternatives: `k` of them, most likely first, the first
/// being the greedy token itself with its logprob.
fn assert_top(entries: &Value, k: usize) {
    let entries = entries.as_array().unwrap();
    assert!(!entries.is_empty());
    for e in entries {
        let top = e["top"].as_array().unwrap();
        assert_eq!(top.len(), k, "{e}");
        assert_eq!(top[0][0], e["token"], "{e}");
        assert!((top[0][1].as_f64().unwrap() - e["logprob"].as_f64().unwrap()).abs() < 1e-6);
        let lps: Vec<f64> = top.iter().map(|t| t[1].as_f64().unwrap()).collect();
        assert!(lps.windows(2).all(|w| w[0] >= w[1]), "{e}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_engine_serves_n_choices_and_top_logprobs_to_the_sdk() {
    let dir = model_dir(11);
    let load = || {
        let policy = agl::assembly::renderer(dir.path()).unwrap();
        (server(dir.path()), policy)
    };
    check_engine(dir.path(), load, "tiny").await;
}

/// The same on SmolLM2-135M-Instruct, whose byte-level vocabulary is the
/// one llguidance reads its token bytes from (its template writes no tool
/// calls: Hermes blocks, as `[engine] tool_parser = "hermes"` says).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smollm2_serves_choices_alternatives_and_valid_constrained_output() {
    let dir = crate::engine_server::smollm2_dir();
    let load = || {
        let config = agl_engine::EngineConfig {
            max_seqs: 4,
            max_len: 1024,
            weight_version: 0,
        };
        let policy = agl::assembly::renderer(&dir).unwrap();
        let hermes = agl_conversation::Family {
            tools: agl_conversation::ToolFormat::Hermes,
            ..policy.family()
        };
        let server = InferenceServer::load(&dir, "smollm2", tch::Kind::Float, config).unwrap();
        (server, policy.with_family(hermes))
    };
    check_engine(&dir, load, "smollm2").await;
}

/// n = 3 whole and streamed, 20 seeds of valid constrained output, the
/// model list and the 400s (sampled: val mode at temperature 1); 5
/// alternatives per token (greedy), through the SDK.
async fn check_engine(dir: &Path, load: impl Fn() -> (InferenceServer, Renderer), model: &str) {
    let sampled: Env = start_serving(dir, load(), |c| c.val_temperature = 1.0).await;
    let got = client(&sampled, "r1", &["choices", "3", "tell me a story"]).await;
    assert_eq!(got["indices"], json!([0, 1, 2]), "{got}");
    let texts = got["texts"].as_array().unwrap();
    assert!(
        texts[0] != texts[1] || texts[1] != texts[2],
        "choices are sampled apart: {got}"
    );
    // Seed + index per choice: streamed, the same three answers.
    assert_eq!(got["streamed"], got["texts"], "{got}");
    assert_eq!(got["stream_finishes"], 3);
    assert_eq!(
        got["usage"],
        3 * 16,
        "ignore_eos runs each choice to max_tokens"
    );

    // Constrained decoding: 20 seeds of a json_schema answer and of a
    // forced tool call, each valid against its schema.
    let got = client(&sampled, "r2", &["constrained", "20"]).await;
    assert_eq!(
        (got["answers"].clone(), got["calls"].clone()),
        (json!(20), json!(20)),
        "{got}"
    );

    assert_eq!(
        client(&sampled, "r3", &["models"]).await["ids"],
        json!([model])
    );
    for (extra, field) in [
        (json!({"n": 17}), "above this gateway's maximum of 16"),
        (
            json!({"logprobs": true, "top_logprobs": 21}),
            "`top_logprobs` must be at most 20",
        ),
    ] {
        let got = client(&sampled, "r4", &["refused", &extra.to_string()]).await;
        assert_eq!(got["status"], 400, "{extra}: {got}");
        assert!(got["message"].as_str().unwrap().contains(field), "{got}");
    }

    let greedy = start_serving(dir, load(), |_| {}).await;
    let got = client(&greedy, "r1", &["top", "5", "hello there"]).await;
    assert_top(&got["chat"], 5);
    assert_eq!(
        got["streamed"], got["chat"],
        "streamed alternatives are the same"
    );
    let completion = &got["completion"];
    for (i, map) in completion["top"].as_array().unwrap().iter().enumerate() {
        let map = map.as_object().unwrap();
        assert!((1..=5).contains(&map.len()), "{map:?}");
        let best = map
            .values()
            .map(|v| v.as_f64().unwrap())
            .fold(f64::MIN, f64::max);
        assert_eq!(
            best,
            completion["logprobs"][i].as_f64().unwrap(),
            "greedy: the best"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_the_gateway_alternatives_come_back_and_models_list() {
    let env = start().await;
    let got = client(&env, "r1", &["top", "3", "hello there"]).await;
    assert_top(&got["chat"], 3);
    assert_eq!(got["streamed"], got["chat"]);
    // The record keeps each sampled token's logprob, as answered.
    let rollout = env.store.export_rollout("r1").await.unwrap();
    let answered: Vec<f64> = got["chat"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["logprob"].as_f64().unwrap())
        .collect();
    let recorded: Vec<f64> = rollout.calls[0]
        .response_logprobs
        .iter()
        .map(|&x| x as f64)
        .collect();
    assert_eq!(answered.len(), recorded.len());
    for (a, r) in answered.iter().zip(&recorded) {
        assert!((a - r).abs() < 1e-6);
    }
    assert!(
        !client(&env, "r2", &["models"]).await["ids"]
            .as_array()
            .unwrap()
            .is_empty()
    );

    let dir = model_dir(5);
    let env = start_on(dir.path()).await;
    let got = client(&env, "r1", &["top", "4", "hello there"]).await;
    assert_top(&got["chat"], 4);
    assert_eq!(got["streamed"], got["chat"]);
    // Responses: the output text's logprobs, asked for by `include`.
    let got = client(&env, "r4", &["responses-top", "3", "hello there"]).await;
    assert_eq!(got["streamed"], got["whole"]);
    let part = &got["whole"];
    assert_top(&part["entries"], 3);
    let spelled: String = part["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["token"].as_str().unwrap())
        .collect();
    let text = part["text"].as_str().unwrap();
    assert!(
        !text.is_empty() && spelled.contains(text),
        "{text:?} in {spelled:?}"
    );
    let got = client(
        &env,
        "r3",
        &["refused", r#"{"logprobs": true, "top_logprobs": 30}"#],
    )
    .await;
    assert!(
        got["message"]
            .as_str()
            .unwrap()
            .contains("`top_logprobs` must be at most 20"),
        "{got}"
    );
}

/// A harness asks for `n` = 3 choices (whole on r1, streamed on r2), keeps
/// choice 2 and goes on: each choice is its own recorded call (same prompt,
/// its own response ids and logprobs, `choice` i of 3), and the trajectory
/// adapter (Rust and Python) makes each choice a sample, the next call
/// joining the kept one's; the next call's record continues choice 2
/// token-exactly. Above `gateway.max_n`: a 400.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_the_gateway_each_choice_is_a_recorded_sequence() {
    let host = agl_plugin_host::PluginHost::new(agl_plugin_host::HostConfig {
        cache_dir: Some(std::env::temp_dir().join("agl-cli-test-cache")),
        ..Default::default()
    })
    .unwrap();
    let mut adapters = Vec::new();
    for name in ["trajectory", "trajectory-py"] {
        let spec = agl_plugin_host::PluginSpec::new(name, crate::support::built_plugin(name));
        adapters.push(host.load(spec).await.unwrap());
    }
    let dir = model_dir(5);
    {
        // Sampled (val mode at temperature 1), so the choices differ.
        let env = start_configured(dir.path(), |c| {
            c.val_temperature = 1.0;
            c.max_n = 4;
        })
        .await;
        for (rollout, stream) in [("r1", false), ("r2", true)] {
            let why = format!("stream {stream}");
            let mut args = vec!["kept", "3", "2", "tell me a story"];
            if stream {
                args.push("stream");
            }
            let got = client(&env, rollout, &args).await;
            assert_eq!(got["indices"], json!([0, 1, 2]), "{why}");
            let calls = env.store.export_rollout(rollout).await.unwrap().calls;
            assert_eq!(calls.len(), 4, "{why}");
            assert!(!calls[0].prompt_ids.is_empty(), "{why}");
            for (i, call) in calls[..3].iter().enumerate() {
                let choice = call.choice.expect("a choice");
                assert_eq!((choice.index, choice.count), (i as u32, 3), "{why}");
                assert_eq!(call.prompt_ids, calls[0].prompt_ids, "{why}");
                assert_eq!(call.response_ids.len(), call.response_logprobs.len());
                assert!(!call.response_ids.is_empty(), "{why}");
                // The record holds what the harness read as that choice.
                let response: Value = serde_json::from_str(call.response.as_str()).unwrap();
                let text = &response["choices"][0]["message"]["content"];
                assert_eq!(text, &got["texts"][i], "{why}");
            }
            let ids: Vec<_> = calls[..3].iter().map(|c| &c.response_ids).collect();
            assert!(
                ids[0] != ids[1] && ids[1] != ids[2],
                "{why}: choices differ"
            );
            assert_eq!(calls[3].choice, None, "{why}");
            assert_eq!(
                calls[3].continues,
                Some(2),
                "{why}: continues the kept choice"
            );
            let mut kept = calls[2].prompt_ids.clone();
            kept.extend(&calls[2].response_ids);
            assert!(calls[3].prompt_ids.starts_with(&kept), "{why}");
            let rollout = std::sync::Arc::new(env.store.export_rollout(rollout).await.unwrap());
            for adapter in &adapters {
                let samples = adapter.build_samples(&rollout).await.unwrap();
                let sources: Vec<_> = samples.iter().map(|s| s.source_calls.clone()).collect();
                let trained: usize = samples
                    .iter()
                    .flat_map(|s| &s.trainable)
                    .map(|t| (t.end - t.start) as usize)
                    .sum();
                let sampled: usize = calls.iter().map(|c| c.response_ids.len()).sum();
                assert_eq!(trained, sampled, "{why}: every sampled token once");
                assert_eq!(sources, [vec![0], vec![1], vec![2, 3]], "{why}");
                assert!(samples.iter().all(|s| s.break_before.is_none()), "{why}");
            }
        }
        let got = client(&env, "r3", &["refused", r#"{"n": 5}"#]).await;
        assert_eq!(got["status"], 400);
        let message = got["message"].as_str().unwrap();
        assert!(
            message.contains("`n` = 5") && message.contains("gateway.max_n"),
            "{got}"
        );
    }
}

/// A constrained call through the gateway (greedy: val mode) records, for
/// each sampled token, the logprob under the mask it was drawn with: the
/// model's full forward, masked by replaying the same constraint, gives
/// the same numbers; unmasked ones would be lower.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn constrained_logprobs_are_recorded_under_the_mask() {
    use agl_engine::TokenConstraint;
    use tch::Tensor;

    let env = start().await;
    let got = client(&env, "r1", &["constrained", "1"]).await;
    assert_eq!(got["answers"], 1, "{got}");
    let rollout = env.store.export_rollout("r1").await.unwrap();
    let dir = model_dir(5);
    let server = server(dir.path());
    let family = agl::assembly::renderer(dir.path()).unwrap().family();
    let mut masked_below = 0;
    assert_eq!(rollout.calls.len(), 2);
    for call in &rollout.calls {
        assert!(call.constrained, "recorded as constrained");
        let request: Value = serde_json::from_str(call.request.as_str()).unwrap();
        // What the gateway sent the engine: a forced call's grammar (its
        // start is in the prompt), else the request's `response_format`.
        let conv = agl_conversation::openai_chat::conversation(&request).unwrap();
        let sent = match family.forced_grammar(&conv.tool_choice, conv.tools.as_ref()) {
            Some(grammar) => json!({"structured_outputs": {"grammar": grammar}}),
            None => request,
        };
        let mut constraint: Box<dyn TokenConstraint> = server
            .constraint(&sent)
            .unwrap()
            .expect("a constrained call");
        let ids: Vec<i64> = call
            .prompt_ids
            .iter()
            .chain(&call.response_ids)
            .map(|&t| t as i64)
            .collect();
        let logits = env
            .model
            .forward(&Tensor::from_slice(&ids).view([1, -1]), None)
            .unwrap();
        for (i, (&token, &recorded)) in call
            .response_ids
            .iter()
            .zip(&call.response_logprobs)
            .enumerate()
        {
            let row =
                Vec::<f32>::try_from(logits.get(0).get((call.prompt_ids.len() + i - 1) as i64))
                    .unwrap();
            let mask = constraint.allowed().unwrap();
            let allowed = |id: usize| mask.get(id / 32).is_some_and(|w| w >> (id % 32) & 1 == 1);
            assert!(allowed(token as usize), "token {i} was allowed");
            let max = row.iter().copied().fold(f32::MIN, f32::max);
            let z = |keep: &dyn Fn(usize) -> bool| -> f32 {
                let sum: f64 = row
                    .iter()
                    .enumerate()
                    .filter(|(id, _)| keep(*id))
                    .map(|(_, &x)| ((x - max) as f64).exp())
                    .sum();
                max + sum.ln() as f32
            };
            let under_mask = row[token as usize] - z(&allowed);
            assert!(
                (under_mask - recorded).abs() < 1e-4,
                "token {i}: {under_mask} vs {recorded}"
            );
            let unmasked = row[token as usize] - z(&|_| true);
            if unmasked < recorded - 1e-3 {
                masked_below += 1;
            }
            if constraint.commit(token).unwrap() {
                break;
            }
        }
    }
    assert!(masked_below > 0, "the mask changed some logprobs");
}

/// The rendered path passes a JSON `response_format` to the engine as
/// `structured_outputs` (recorded `constrained`; a forced tool call there is
/// written into the prompt instead, and not); `gateway.constrained =
/// "refuse"` answers a constrained call 400 naming its field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rendered_path_constrains_json_and_a_gateway_may_refuse_it() {
    let dir = model_dir(5);
    let env = start_on(dir.path()).await;
    let got = client(&env, "r1", &["constrained", "20"]).await;
    assert_eq!(
        (got["answers"].clone(), got["calls"].clone()),
        (json!(20), json!(20)),
        "{got}"
    );
    let rollout = env.store.export_rollout("r1").await.unwrap();
    assert!(rollout.calls.iter().all(|c| c.constrained));
    client(&env, "r2", &["greedy", "hello there"]).await;
    let plain = env.store.export_rollout("r2").await.unwrap();
    assert!(!plain.calls[0].constrained);

    // Anthropic's tool_choice `tool` and `any`, through the Messages front.
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/python/anthropic_client.py");
    let mut cmd = Command::new(python());
    cmd.arg(script)
        .args(["forced", "paint the wall", "paint a cat", "what color?"])
        .env(
            "ANTHROPIC_BASE_URL",
            format!("{}/proxy/r3/1/val/anthropic", env.base),
        )
        .env("ANTHROPIC_API_KEY", "admin-key");
    let got = crate::support::python_json(cmd).await;
    assert_eq!(got["valid"], 6, "{got}");
    let forced = env.store.export_rollout("r3").await.unwrap();
    assert_eq!(forced.calls.len(), 6);
    assert!(forced.calls.iter().all(|c| c.constrained));

    let env = start_configured(dir.path(), |c| {
        c.constrained = agl_gateway::ConstrainedCalls::Refuse;
    })
    .await;
    let format = json!({"response_format": {"type": "json_object"}});
    let got = client(&env, "r1", &["refused", &format.to_string()]).await;
    assert_eq!(got["status"], 400, "{got}");
    assert!(
        got["message"]
            .as_str()
            .unwrap()
            .contains("`response_format` asks for constrained decoding"),
        "{got}"
    );
    let ok = client(&env, "r2", &["greedy", "hello there"]).await;
    assert_eq!(ok["texts"].as_array().unwrap().len(), 1);
}
