//! A reward written in Python (plugins/python/faulty, CPython inside, built
//! by plugins/build.sh with componentize-py) in the same sandbox as a Rust
//! plugin: the same deadline and memory cap, nothing of the filesystem,
//! network, environment or clock, and each fault fails only its call. The
//! Python SDK speaks the current contract (`agl:adapter` 0.5).

use agl_plugin_host::{
    Plugin, PluginError, PluginErrorKind, PluginHost, PluginSpec, WitVersion, World,
};

use crate::support::*;

fn python_spec(name: &str) -> PluginSpec {
    let mut spec = PluginSpec::new(name, wasm("faulty-py"));
    spec.limits = tight_limits();
    spec
}

async fn score(plugin: &Plugin, fault: &str) -> Result<Option<f64>, PluginError> {
    plugin.reward(&rollout(Some(fault))).await
}

/// Runs `fault` on a one-instance Python plugin, then checks that it and
/// another plugin of the same host still score: the failed instance was
/// replaced and nothing else was touched.
async fn provoke(host: &PluginHost, fault: &str) -> PluginError {
    let mut spec = python_spec("faulty-py");
    if fault == "loop" {
        spec.limits.deadline = SHORT_DEADLINE;
    }
    let faulty = load(host, spec).await;
    let other = load(host, python_spec("other")).await;
    let err = score(&faulty, fault)
        .await
        .expect_err("the fault should fail the call");
    assert!(err.to_string().starts_with("plugin `faulty-py` ("), "{err}");
    for plugin in [&faulty, &other, &faulty] {
        assert_eq!(score(plugin, "none").await.unwrap(), Some(1.0));
    }
    err
}

#[tokio::test]
async fn a_python_reward_describes_itself_and_scores_within_a_32_mib_cap() {
    let host = host();
    let plugin = load(&host, python_spec("faulty-py")).await;
    assert_eq!(plugin.world(), World::Reward);
    assert_eq!(plugin.info().name, "faulty-py");
    assert_eq!(score(&plugin, "none").await.unwrap(), Some(1.0));
    assert_eq!(score(&plugin, "calls").await.unwrap(), Some(2.0));
    // No input fault: the config's.
    let mut spec = python_spec("by-config");
    spec.config = toml::from_str("fault = \"calls\"").unwrap();
    let by_config = load(&host, spec).await;
    assert_eq!(by_config.reward(&rollout(None)).await.unwrap(), Some(2.0));
}

#[tokio::test]
async fn a_python_endless_loop_times_out() {
    let err = provoke(&host(), "loop").await;
    assert!(
        matches!(err.kind, PluginErrorKind::Timeout(d) if d == SHORT_DEADLINE),
        "{err}"
    );
}

#[tokio::test]
async fn a_python_memory_bomb_is_out_of_memory() {
    let err = provoke(&host(), "memory").await;
    assert!(
        matches!(err.kind, PluginErrorKind::OutOfMemory(cap) if cap == MEMORY_CAP),
        "{err}"
    );
}

#[tokio::test]
async fn a_python_exception_fails_the_call_with_its_traceback() {
    let host = host();
    let err = provoke(&host, "raise").await;
    let message = guest_message(&err);
    assert!(
        message.contains("Traceback (most recent call last)")
            && message.contains("app.py")
            && message.contains("KeyError: 'the answer'"),
        "{message}"
    );
    let err = provoke(&host, "exit").await;
    assert!(guest_message(&err).contains("SystemExit: 3"), "{err}");
}

#[tokio::test]
async fn a_python_reward_of_the_wrong_type_fails_the_call() {
    let err = provoke(&host(), "wrong-type").await;
    assert!(
        guest_message(&err).contains("returned str ('high'), not a number or None"),
        "{err}"
    );
}

#[tokio::test]
async fn python_sees_no_files_network_environment_or_clock() {
    let host = host();
    let plugin = load(&host, python_spec("faulty-py")).await;
    // A listening socket: a guest the sandbox let out would connect.
    let (listener, target) = listening();
    let input = json!({"fault": "net", "target": target});
    let err = plugin.reward(&rollout_with(Some(input))).await.unwrap_err();
    assert!(guest_message(&err).contains("net denied"), "{err}");
    assert_unreached(&listener);
    for (fault, seen) in [
        ("fs", "fs denied: FileNotFoundError"),
        ("env", "env: {}"),
        ("clock", "clock: time=0.0 monotonic=0.0"),
    ] {
        let err = score(&plugin, fault).await.unwrap_err();
        assert!(guest_message(&err).contains(seen), "{fault}: {err}");
    }
}

/// The Python SDK builds against 0.6 (0.5's call record): a call's prompt arrives linked to the
/// call it extends, and the SDK fetches the whole prompt and the JSON from
/// `rollout-data`, naming the call the host has nothing for.
#[tokio::test]
async fn a_python_plugin_gets_prompts_as_links_and_fetches_the_rest() {
    let host = host();
    let plugin = load(&host, python_spec("faulty-py")).await;
    assert_eq!(plugin.wit_version(), WitVersion::V0_6);
    let rollout = rollout(Some("data"));
    let err = plugin.reward(&rollout).await.unwrap_err();
    let json_len = |c: usize| {
        let call = &rollout.calls[c];
        (call.request.as_str().len(), call.response.as_str().len())
    };
    let ((req0, resp0), (req1, resp1)) = (json_len(0), json_len(1));
    // Call 1's prompt [1..6] is call 0's prompt [1, 2, 3] and response
    // [4, 5], then [6].
    let seen = format!(
        "data: call 0: extends=None shared=0 tail=3 prompt=[1, 2, 3] request={req0} \
         response={resp0}; call 1: extends=0 shared=5 tail=1 prompt=[1, 2, 3, 4, 5, 6] \
         request={req1} response={resp1}; beyond: call 2: the host has no request for it"
    );
    assert!(guest_message(&err).contains(&seen), "{err}");
}
