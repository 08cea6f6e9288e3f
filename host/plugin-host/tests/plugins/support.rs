//! Helpers for the plugin host tests: the built plugins, hosts, specs and
//! a rollout whose expected samples are known.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use agl_plugin_host::{
    HostConfig, Plugin, PluginError, PluginErrorKind, PluginHost, PluginLimits, PluginSpec,
};
use agl_tokenizer::Tokenizer;
use agl_wire::rollout::{Rollout, Sample, Span};
pub use serde_json::json;

pub fn wasm(name: &str) -> PathBuf {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../build/plugins")
        .join(format!("{name}.wasm"));
    assert!(
        path.exists(),
        "{} is missing: run plugins/build.sh faulty",
        path.display()
    );
    path
}

/// The compile cache of the tests that do not test the cache itself; it
/// lives in the target directory, so later runs start warm.
pub fn shared_cache() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("plugin-host-cache")
}

pub fn host_with_cache(cache_dir: &Path) -> PluginHost {
    PluginHost::new(HostConfig {
        cache_dir: Some(cache_dir.to_path_buf()),
        max_instances: 32,
        ..HostConfig::default()
    })
    .expect("plugin host")
}

pub fn host() -> PluginHost {
    host_with_cache(&shared_cache())
}

pub const MEMORY_CAP: usize = 32 * 1024 * 1024;

/// A small heap so that a memory bomb stops soon, and one instance so that a
/// call after a fault must run on a replacement. The deadline is generous:
/// only the `loop` tests rely on it, with a short one of their own.
pub fn tight_limits() -> PluginLimits {
    PluginLimits {
        deadline: Duration::from_secs(20),
        memory_bytes: MEMORY_CAP,
        instances: 1,
    }
}

pub const SHORT_DEADLINE: Duration = Duration::from_millis(300);

pub fn faulty_spec(name: &str, fault: &str) -> PluginSpec {
    let mut spec = PluginSpec::new(name, wasm("faulty"));
    spec.config = toml::from_str(&format!("fault = {fault:?}")).expect("toml");
    spec.limits = tight_limits();
    spec
}

pub async fn load(host: &PluginHost, spec: PluginSpec) -> Plugin {
    match host.load(spec).await {
        Ok(plugin) => plugin,
        Err(e) => panic!("load failed: {e}"),
    }
}

/// A two-call rollout; `fault`, if given, overrides the plugin's config for
/// this call only.
pub fn rollout(fault: Option<&str>) -> Arc<Rollout> {
    rollout_with(fault.map(|f| json!({"fault": f})))
}

/// A listening socket on a free port (nonblocking) and its address: a
/// guest the sandbox let out would connect to it.
pub fn listening() -> (std::net::TcpListener, String) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.set_nonblocking(true).expect("nonblocking");
    let addr = listener.local_addr().expect("addr").to_string();
    (listener, addr)
}

/// No connection reached `listener`.
pub fn assert_unreached(listener: &std::net::TcpListener) {
    match listener.accept() {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        other => panic!("the guest reached the host's listener: {other:?}"),
    }
}

/// The two-call rollout with `input` as its input.
pub fn rollout_with(input: Option<serde_json::Value>) -> Arc<Rollout> {
    let call = |index: u32, prompt: Vec<u32>, response: Vec<u32>| {
        let logprobs: Vec<f32> = response.iter().map(|_| -0.5).collect();
        json!({
            "index": index,
            "api": "chat_completions",
            "request": {"messages": [{"role": "user", "content": "hi"}]},
            "response": {"choices": []},
            "prompt_ids": prompt,
            "response_ids": response,
            "response_logprobs": logprobs,
            "weight_version": 3,
        })
    };
    // Through text: `JsonText` fields keep the raw JSON of a document.
    Arc::new(serde_json::from_str(
        &json!({
            "id": "r1",
            "group_id": "g1",
            "input": input,
            "status": "succeeded",
            "calls": [call(0, vec![1, 2, 3], vec![4, 5]), call(1, vec![1, 2, 3, 4, 5, 6], vec![7])],
        })
        .to_string(),
    )
    .expect("rollout"))
}

/// What the well-behaved faulty plugin returns for `rollout`.
pub fn expected_samples(rollout: &Rollout) -> Vec<Sample> {
    rollout
        .calls
        .iter()
        .map(|call| Sample {
            prompt_ids: call.prompt_ids.clone(),
            response_ids: call.response_ids.clone(),
            trainable: vec![Span {
                start: 0,
                end: call.response_ids.len() as u32,
            }],
            logprobs: call.response_logprobs.clone(),
            source_calls: vec![call.index],
            weight_version: call.weight_version,
            agent: None,
            break_before: None,
        })
        .collect()
}

pub async fn assert_serves(plugin: &Plugin) {
    let rollout = rollout(None);
    match plugin.build_samples(&rollout).await {
        Ok(samples) => assert_eq!(samples, expected_samples(&rollout)),
        Err(e) => panic!("plugin {} should serve: {e}", plugin.name()),
    }
}

pub fn trap_message(err: &PluginError) -> &str {
    match &err.kind {
        PluginErrorKind::Trap(message) => message,
        _ => panic!("expected a trap, got {err}"),
    }
}

pub fn guest_message(err: &PluginError) -> &str {
    match &err.kind {
        PluginErrorKind::GuestError(message) => message,
        _ => panic!("expected a guest error, got {err}"),
    }
}

/// A three-word tokenizer.json with a chat template beside it.
pub fn tiny_tokenizer(dir: &Path) -> Arc<Tokenizer> {
    let json = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [],
        "normalizer": null,
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": null,
        "decoder": null,
        "model": {"type": "WordLevel", "vocab": {"hi": 0, "there": 1, "[UNK]": 2}, "unk_token": "[UNK]"}
    });
    let path = dir.join("tokenizer.json");
    std::fs::write(&path, json.to_string()).unwrap();
    let template = "{% for m in messages %}{{ m.content }}{% endfor %}";
    std::fs::write(dir.join("chat_template.jinja"), template).unwrap();
    Arc::new(Tokenizer::from_file(&path).expect("tokenizer"))
}

/// `faulty.wasm` plus a custom section: the same plugin, different bytes.
pub fn variant_of_faulty(dir: &Path, tag: &str) -> PathBuf {
    let mut bytes = std::fs::read(wasm("faulty")).unwrap();
    let name = b"agl-test";
    let payload = tag.as_bytes();
    let size = 1 + name.len() + payload.len();
    assert!(size < 128, "one-byte LEB128 sizes only");
    bytes.extend([0u8, size as u8, name.len() as u8]);
    bytes.extend(name);
    bytes.extend(payload);
    let path = dir.join(format!("faulty-{tag}.wasm"));
    std::fs::write(&path, bytes).unwrap();
    path
}
