//! `mini-swe.wasm` and `tests-pass.wasm` through the real plugin host on the
//! mini-swe-agent fixture rollouts (`examples/fixtures/mini-swe/`).
//! Build them first: `plugins/build.sh mini-swe tests-pass`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use agl_plugin_host::{HostConfig, Plugin, PluginHost, PluginSpec};
use agl_wire::rollout::{BreakKind, ModelCall, Rollout, Sample, Span, read_jsonl};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

async fn load(name: &str, config: &str) -> Plugin {
    let path = repo().join("build/plugins").join(format!("{name}.wasm"));
    assert!(
        path.exists(),
        "{} is missing: run plugins/build.sh mini-swe tests-pass",
        path.display()
    );
    let host = PluginHost::new(HostConfig {
        cache_dir: Some(Path::new(env!("CARGO_TARGET_TMPDIR")).join("plugin-host-cache")),
        ..HostConfig::default()
    })
    .expect("plugin host");
    let mut spec = PluginSpec::new(name, path);
    spec.config = toml::from_str(config).expect("toml");
    match host.load(spec).await {
        Ok(plugin) => plugin,
        Err(e) => panic!("load failed: {e}"),
    }
}

fn fixture(id: &str) -> Arc<Rollout> {
    read_jsonl(&repo().join("examples/fixtures/mini-swe/rollouts.jsonl"))
        .expect("fixtures parse")
        .into_iter()
        .find(|r| r.id == id)
        .map(Arc::new)
        .expect("fixture exists")
}

async fn samples(id: &str) -> Vec<Sample> {
    let plugin = load("mini-swe", "").await;
    match plugin.build_samples(&fixture(id)).await {
        Ok(samples) => samples,
        Err(e) => panic!("{id}: {e}"),
    }
}

/// The sample that merging `calls` must give, computed from their ids: the
/// first prompt, then per call the new prompt tokens (masked) and the
/// response (trainable, with its log-probs).
fn merged(calls: &[&ModelCall]) -> Sample {
    let prompt = calls[0].prompt_ids.clone();
    let (mut response, mut trainable, mut logprobs) = (Vec::new(), Vec::new(), Vec::new());
    for call in calls {
        let seen = prompt.len() + response.len();
        assert!(call.prompt_ids.len() >= seen, "the fixture's calls extend");
        let observation = &call.prompt_ids[seen..];
        logprobs.extend(observation.iter().map(|_| 0.0));
        response.extend_from_slice(observation);
        let start = response.len() as u32;
        response.extend_from_slice(&call.response_ids);
        logprobs.extend_from_slice(&call.response_logprobs);
        trainable.push(Span {
            start,
            end: response.len() as u32,
        });
    }
    Sample {
        prompt_ids: prompt,
        response_ids: response,
        trainable,
        logprobs,
        source_calls: calls.iter().map(|c| c.index).collect(),
        weight_version: 0,
        agent: None,
        break_before: None,
    }
}

#[tokio::test]
async fn a_solved_rollout_is_one_sample_with_only_model_tokens_trainable() {
    let r = fixture("solved");
    let got = samples("solved").await;
    let calls: Vec<&ModelCall> = r.calls.iter().collect();
    assert_eq!(got, [merged(&calls)]);
    // Tool output is masked: between the spans lies more than the turn glue.
    let spans = &got[0].trainable;
    assert_eq!(spans.len(), 3);
    assert!(spans[1].start - spans[0].end > 10, "{spans:?}");
}

#[tokio::test]
async fn a_format_error_drop_starts_a_new_chain() {
    let r = fixture("format-error");
    let got = samples("format-error").await;
    assert_eq!(got.len(), 2);
    assert_eq!(got[0], merged(&[&r.calls[0], &r.calls[1]]));
    let b = got[1].break_before.clone().expect("a break");
    assert_eq!((b.kind, b.call_index), (BreakKind::Other, 2));
    assert!(
        b.detail.starts_with("format-error-drop: message 4 ")
            && b.detail.contains(r#"matched "Tool call error:""#),
        "{}",
        b.detail
    );
    let mut tail = merged(&[&r.calls[2], &r.calls[3]]);
    tail.break_before = Some(b);
    assert_eq!(got[1], tail);
}

#[tokio::test]
async fn a_resent_request_is_a_retry_break() {
    let r = fixture("retry");
    let got = samples("retry").await;
    assert_eq!(got.len(), 2);
    assert_eq!(got[0], merged(&[&r.calls[0]]));
    assert_eq!(got[1].source_calls, [1, 2]);
    let b = got[1].break_before.as_ref().expect("a break");
    assert_eq!((b.kind, b.call_index), (BreakKind::Other, 1));
    assert!(b.detail.starts_with("retry: "), "{}", b.detail);
}

#[tokio::test]
async fn tests_pass_reads_the_grade_and_shapes_solved_rollouts() {
    let plain = load("tests-pass", "").await;
    let shaped = load("tests-pass", "step_penalty = 0.125\nmin_reward = 0.5").await;
    for (id, reward, shaped_reward) in [
        // Solved in 3 model calls: 1 - 3 * 0.125.
        ("solved", 1.0, 0.625),
        ("format-error", 0.0, 0.0),
        ("retry", 0.0, 0.0),
    ] {
        let r = fixture(id);
        assert_eq!(plain.reward(&r).await.unwrap(), Some(reward), "{id}");
        assert_eq!(
            shaped.reward(&r).await.unwrap(),
            Some(shaped_reward),
            "{id}"
        );
    }
    let mut ungraded = fixture("solved");
    Arc::make_mut(&mut ungraded)
        .events
        .retain(|e| e.kind != "reward");
    assert_eq!(plain.reward(&ungraded).await.unwrap(), None);

    let bad = load("tests-pass", "step_penalty = -1.0").await;
    let err = bad.reward(&fixture("solved")).await.unwrap_err();
    assert!(err.to_string().contains("step_penalty"), "{err}");
}
