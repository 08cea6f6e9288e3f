//! `agl plugin test | inspect` run as a user runs them: the real binary, the
//! built-in plugins (`plugins/build.sh`) and the shipped fixtures.

use std::process::{Command, Output};

use crate::support::{fixtures, repo};
use agl_wire::rollout::{Rollout, read_jsonl};
use serde_json::Value;

fn plugin(name: &str) -> String {
    crate::support::built_plugin(name)
}

fn agl(args: &[&str]) -> Output {
    let cache = std::env::temp_dir().join("agl-cli-test-cache");
    Command::new(env!("CARGO_BIN_EXE_agl"))
        .args([
            "--config",
            &fixtures().join("agl.toml").display().to_string(),
        ])
        .args([
            "-o",
            &format!("plugins.cache_dir={:?}", cache.display().to_string()),
        ])
        .args(args)
        .output()
        .expect("agl runs")
}

fn plugin_test(adapter: &str, extra: &[&str]) -> Output {
    let rollouts = fixtures().join("rollouts.jsonl").display().to_string();
    let adapter = plugin(adapter);
    let reward = plugin("exact-match");
    let mut args = vec![
        "plugin",
        "test",
        "--plugin",
        &adapter,
        "--reward",
        &reward,
        "--rollouts",
        &rollouts,
    ];
    args.extend_from_slice(extra);
    agl(&args)
}

/// `--json` lines grouped by rollout id, in order.
fn json_samples(out: &Output) -> Vec<Value> {
    assert!(
        out.status.success(),
        "agl failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect()
}

fn of<'a>(samples: &'a [Value], rollout: &str) -> Vec<&'a Value> {
    samples
        .iter()
        .filter(|s| s["rollout_id"] == rollout)
        .collect()
}

fn ids(v: &Value) -> Vec<u32> {
    serde_json::from_value(v.clone()).expect("ids")
}

fn fixture(id: &str) -> Rollout {
    read_jsonl(&fixtures().join("rollouts.jsonl"))
        .expect("fixtures parse")
        .into_iter()
        .find(|r| r.id == id)
        .expect("fixture exists")
}

#[test]
fn trajectory_merges_the_clean_rollout_into_one_masked_sample() {
    let out = plugin_test("trajectory", &["--json"]);
    let samples = json_samples(&out);
    // The summary names samples per rollout.
    let rollouts = read_jsonl(&fixtures().join("rollouts.jsonl"))
        .expect("fixtures")
        .len();
    let want = format!(
        "{} rollouts, {} samples ({:.2} per rollout)",
        rollouts,
        samples.len(),
        samples.len() as f64 / rollouts as f64
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&want), "{want} in {stderr}");
    let clean = of(&samples, "clean");
    assert_eq!(clean.len(), 1);
    let s = &clean[0]["sample"];
    let r = fixture("clean");
    let (c0, c1, c2) = (&r.calls[0], &r.calls[1], &r.calls[2]);
    // Lengths fixed by the fixture: prompts 76/166/256, responses 70/70/9.
    assert_eq!(ids(&s["prompt_ids"]), c0.prompt_ids);
    let mut response = c2.prompt_ids[c0.prompt_ids.len()..].to_vec();
    response.extend(&c2.response_ids);
    assert_eq!(ids(&s["response_ids"]), response);
    assert_eq!(response.len(), 189);
    assert_eq!(
        s["trainable"],
        serde_json::json!([
            {"start": 0, "end": 70}, {"start": 90, "end": 160}, {"start": 180, "end": 189}
        ])
    );
    let logprobs: Vec<f32> = serde_json::from_value(s["logprobs"].clone()).unwrap();
    assert_eq!(&logprobs[..70], &c0.response_logprobs[..]);
    assert!(
        logprobs[70..90].iter().all(|&l| l == 0.0),
        "observation masked"
    );
    assert_eq!(&logprobs[90..160], &c1.response_logprobs[..]);
    assert_eq!(&logprobs[180..], &c2.response_logprobs[..]);
    assert_eq!(s["source_calls"], serde_json::json!([0, 1, 2]));
    assert!(s["break_before"].is_null());
    assert_eq!(clean[0]["reward"], 1.0);
}

#[test]
fn trajectory_classifies_each_break() {
    let samples = json_samples(&plugin_test("trajectory", &["--json"]));
    for (rollout, kind, call) in [("retokenize", "retokenize", 1), ("template", "template", 1)] {
        let got = of(&samples, rollout);
        assert_eq!(got.len(), 2, "{rollout}");
        assert!(got[0]["sample"]["break_before"].is_null());
        assert_eq!(got[1]["sample"]["break_before"]["kind"], kind, "{rollout}");
        assert_eq!(got[1]["sample"]["break_before"]["call_index"], call);
        assert_eq!(got[1]["sample"]["source_calls"], serde_json::json!([call]));
    }
    let summary = of(&samples, "summary");
    assert_eq!(summary.len(), 2);
    assert_eq!(
        summary[0]["sample"]["source_calls"],
        serde_json::json!([0, 1])
    );
    assert_eq!(summary[1]["sample"]["break_before"]["kind"], "summary");
    assert_eq!(summary[1]["sample"]["break_before"]["call_index"], 2);
}

#[test]
fn trajectory_keeps_interleaved_subagents_in_their_own_chains() {
    let samples = json_samples(&plugin_test("trajectory", &["--json"]));
    let got = of(&samples, "subagents");
    assert_eq!(got.len(), 2);
    let by_agent = |agent: &str| {
        got.iter()
            .find(|s| s["sample"]["agent"] == agent)
            .unwrap_or_else(|| panic!("no {agent} sample"))
    };
    assert_eq!(
        by_agent("main")["sample"]["source_calls"],
        serde_json::json!([0, 2, 4])
    );
    assert_eq!(
        by_agent("helper")["sample"]["source_calls"],
        serde_json::json!([1, 3])
    );
    assert!(got.iter().all(|s| s["sample"]["break_before"].is_null()));
    // Each chain's sample is its first prompt plus everything after it.
    let r = fixture("subagents");
    let main = &by_agent("main")["sample"];
    assert_eq!(ids(&main["prompt_ids"]), r.calls[0].prompt_ids);
    let mut response = r.calls[4].prompt_ids[r.calls[0].prompt_ids.len()..].to_vec();
    response.extend(&r.calls[4].response_ids);
    assert_eq!(ids(&main["response_ids"]), response);
}

#[test]
fn transition_makes_one_sample_per_call_and_rewards_come_from_exact_match() {
    let samples = json_samples(&plugin_test("transition", &["--json"]));
    assert_eq!(samples.len(), 3 + 2 + 2 + 5 + 3);
    let r = fixture("template");
    let t = of(&samples, "template");
    for (s, call) in t.iter().zip(&r.calls) {
        assert_eq!(ids(&s["sample"]["prompt_ids"]), call.prompt_ids);
        assert_eq!(ids(&s["sample"]["response_ids"]), call.response_ids);
    }
    // Final answers: "the answer is 87", "4 is the answer" (no match), "the
    // answer is 42", "the result is 9", "the answer is 6".
    let reward = |id: &str| of(&samples, id)[0]["reward"].clone();
    assert_eq!(reward("clean"), 1.0);
    assert_eq!(reward("retokenize"), 0.0);
    assert_eq!(reward("template"), 1.0);
    assert_eq!(reward("subagents"), 1.0);
    assert_eq!(reward("summary"), 1.0);
}

#[test]
fn readable_view_sets_trained_tokens_apart_and_counts_breaks() {
    let out = plugin_test("trajectory", &[]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Decoded with the fixture tokenizer: the observation is context, the
    // model's tool call is trained.
    assert!(
        text.contains(
            "context | \"\\n<|im_start|>tool\\n84<|im_end|>\\n<|im_start|>assistant\\n\""
        ),
        "{text}"
    );
    assert!(
        text.contains("TRAIN   | \"the answer is 87<|im_end|>\""),
        "{text}"
    );
    assert!(text.contains("break retokenize at call 1"), "{text}");
    assert!(
        text.contains("breaks: retokenize 1, template 1, summary 1, sub-agent 0, other 0"),
        "{text}"
    );
    assert!(text.contains("5 rollouts, 9 samples"), "{text}");
}

#[test]
fn inspect_shows_world_and_plugin_info() {
    let out = agl(&["plugin", "inspect", &plugin("trajectory")]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("world    sample-adapter"), "{text}");
    assert!(text.contains("agl-trajectory 0.1.0"), "{text}");
    assert!(text.contains("build-samples"), "{text}");
    let out = agl(&["plugin", "inspect", "--json", &plugin("exact-match")]);
    let v: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["world"], "reward");
}

#[test]
fn bad_input_fails_with_a_clear_message() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.jsonl");
    std::fs::write(
        &bad,
        "{\"id\": \"a\", \"status\": \"succeeded\"}\nnot json\n",
    )
    .unwrap();
    let adapter = plugin("trajectory");
    let out = agl(&[
        "plugin",
        "test",
        "--plugin",
        &adapter,
        "--rollouts",
        &bad.display().to_string(),
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bad.jsonl:2"), "{err}");

    // A reward plugin where an adapter is expected.
    let rollouts = fixtures().join("rollouts.jsonl").display().to_string();
    let out = agl(&[
        "plugin",
        "test",
        "--plugin",
        &plugin("exact-match"),
        "--rollouts",
        &rollouts,
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("is a reward plugin, expected sample-adapter"),
        "{err}"
    );

    let out = agl(&[
        "-o",
        "plugins.limits.deadline_ms=soon",
        "plugin",
        "inspect",
        &adapter,
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("deadline_ms"));
}

#[test]
fn the_calc_example_config_loads() {
    let path = repo().join("examples/calc/agl.toml");
    let config = agl::config::Config::load(Some(&path), &[]).unwrap();
    let c = &config.controller;
    assert!(matches!(
        c.command,
        Some(agl_controller::CommandSpec::Shell(_))
    ));
    assert_eq!(config.engine.render(), agl_wire::api::Render::Gateway);
    assert_eq!(config.run.val_size, 40, "the main job validates on 40 rows");
    assert_eq!(
        c.workdir.as_deref(),
        Some(repo().join("examples/calc/../..").as_path())
    );
}
