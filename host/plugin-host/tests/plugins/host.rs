//! Plugin host tests against real components built from this workspace.
//! Build them first: `plugins/build.sh faulty`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use crate::support::*;
use agl_plugin_host::{
    HostConfig, PluginError, PluginErrorKind, PluginHost, PluginSlot, PluginSpec, WIT_PACKAGE,
    WIT_VERSION, WitVersion, World,
};
use agl_wire::rollout::BreakKind;
use tempfile::TempDir;

/// Runs `fault` as a per-call override on a plugin limited to one instance,
/// then checks that the same plugin and another plugin of the same host
/// both still serve: the failed instance was replaced, not reused.
async fn provoke(fault: &str) -> PluginError {
    let host = host();
    let mut spec = faulty_spec("faulty", "none");
    if fault == "loop" {
        spec.limits.deadline = SHORT_DEADLINE;
    }
    let faulty = load(&host, spec).await;
    let good = load(&host, faulty_spec("good", "none")).await;
    let err = faulty
        .build_samples(&rollout(Some(fault)))
        .await
        .expect_err("the fault should fail the call");
    assert_eq!(err.name, "faulty");
    assert_eq!(err.path, wasm("faulty"));
    assert!(err.to_string().starts_with("plugin `faulty` ("), "{err}");
    assert_serves(&good).await;
    assert_serves(&faulty).await;
    assert_serves(&faulty).await;
    err
}

#[tokio::test]
async fn well_behaved_plugin_describes_itself_and_builds_samples() {
    let host = host();
    let plugin = load(&host, faulty_spec("faulty", "none")).await;
    assert_eq!(plugin.world(), World::SampleAdapter);
    assert_eq!(plugin.info().name, "faulty");
    assert_eq!(plugin.name(), "faulty");
    for _ in 0..3 {
        assert_serves(&plugin).await;
    }
}

#[tokio::test]
async fn endless_loop_times_out() {
    let err = provoke("loop").await;
    assert!(
        matches!(err.kind, PluginErrorKind::Timeout(d) if d == SHORT_DEADLINE),
        "{err}"
    );
}

#[tokio::test]
async fn fault_chosen_by_config_applies_to_every_call() {
    let host = host();
    let mut spec = faulty_spec("looping", "loop");
    spec.limits.deadline = SHORT_DEADLINE;
    let plugin = load(&host, spec).await;
    for _ in 0..2 {
        let err = plugin.build_samples(&rollout(None)).await.unwrap_err();
        assert!(matches!(err.kind, PluginErrorKind::Timeout(_)), "{err}");
    }
}

#[tokio::test]
async fn memory_bomb_is_out_of_memory() {
    let err = provoke("memory").await;
    assert!(
        matches!(err.kind, PluginErrorKind::OutOfMemory(cap) if cap == MEMORY_CAP),
        "{err}"
    );
}

#[tokio::test]
async fn panic_traps_with_the_message_from_stderr() {
    let err = provoke("panic").await;
    assert!(trap_message(&err).contains("unreachable"), "{err}");
    assert!(
        err.stderr.contains("faulty plugin: deliberate panic"),
        "{err}"
    );
    assert!(err.to_string().contains("deliberate panic"), "{err}");
}

#[tokio::test]
async fn unbounded_recursion_traps() {
    let err = provoke("stack").await;
    let message = trap_message(&err);
    assert!(
        message.starts_with("wasm trap: call stack exhausted"),
        "{err}"
    );
    assert!(
        message.contains("overflow_stack"),
        "backtrace names the function: {err}"
    );
}

#[tokio::test]
async fn shadow_stack_overflow_traps() {
    let err = provoke("shadow-stack").await;
    assert!(
        trap_message(&err).contains("out of bounds memory access"),
        "{err}"
    );
}

#[tokio::test]
async fn malformed_sample_is_rejected_with_the_problem() {
    let err = provoke("malformed").await;
    let PluginErrorKind::InvalidSample(invalid) = &err.kind else {
        panic!("expected InvalidSample, got {err}");
    };
    assert_eq!(invalid.index, 0);
    assert!(
        invalid
            .problem
            .contains("ends past the response (2 tokens)"),
        "{err}"
    );
}

#[tokio::test]
async fn guest_error_is_reported() {
    let err = provoke("error").await;
    assert!(
        matches!(&err.kind, PluginErrorKind::GuestError(m) if m == "faulty plugin: deliberate error"),
        "{err}"
    );
}

#[tokio::test]
async fn filesystem_is_denied() {
    let err = provoke("fs").await;
    assert!(
        guest_message(&err).starts_with("fs denied: read /etc/passwd"),
        "{err}"
    );
}

#[tokio::test]
async fn network_is_denied() {
    // A listening socket: a guest the sandbox let out would connect.
    let (listener, target) = listening();
    let plugin = load(&host(), faulty_spec("faulty", "none")).await;
    let input = json!({"fault": "net", "target": target});
    let err = plugin
        .build_samples(&rollout_with(Some(input)))
        .await
        .expect_err("the connect should be denied");
    assert!(
        guest_message(&err).starts_with(&format!("net denied: connect {target}")),
        "{err}"
    );
    assert_unreached(&listener);
}

#[tokio::test]
async fn environment_is_empty() {
    let err = provoke("env").await;
    assert_eq!(guest_message(&err), "env vars: []; args: []");
}

#[tokio::test]
async fn clocks_are_frozen() {
    let err = provoke("clock").await;
    assert_eq!(guest_message(&err), "wall=Ok(0) monotonic_elapsed=0ns");
}

#[tokio::test]
async fn imports_see_config_and_no_tokenizer() {
    let host = host();
    let mut spec = faulty_spec("faulty", "imports");
    spec.config.insert("greeting".into(), "hi".into());
    let plugin = load(&host, spec).await;
    let err = plugin.build_samples(&rollout(None)).await.unwrap_err();
    let message = guest_message(&err);
    assert!(message.contains(r#""greeting":"hi""#), "{message}");
    assert!(message.contains(r#""fault":"imports""#), "{message}");
    assert!(message.contains("available=false"), "{message}");
    assert!(
        message.contains(r#"vocab=Err("no tokenizer configured"#),
        "{message}"
    );
}

#[tokio::test]
async fn tokenizer_import_and_vocabulary_check() {
    let host = host();
    let dir = TempDir::new().unwrap();
    let mut spec = faulty_spec("faulty", "none");
    spec.tokenizer = Some(tiny_tokenizer(dir.path()));
    let plugin = load(&host, spec).await;

    let err = plugin
        .build_samples(&rollout(Some("imports")))
        .await
        .unwrap_err();
    let message = guest_message(&err);
    assert!(
        message.contains("available=true vocab=Ok(3) encode=Ok([0])"),
        "{message}"
    );

    // The rollout's ids run up to 7, past this vocabulary of 3.
    let err = plugin.build_samples(&rollout(None)).await.unwrap_err();
    let PluginErrorKind::InvalidSample(invalid) = &err.kind else {
        panic!("expected InvalidSample, got {err}");
    };
    assert!(
        invalid
            .problem
            .contains("outside the vocabulary (3 tokens)"),
        "{err}"
    );
}

#[tokio::test]
async fn reward_world_scores_and_rejects_non_finite_rewards() {
    let host = host();
    let mut spec = faulty_spec("judge", "none");
    spec.path = wasm("faulty-reward");
    let judge = load(&host, spec).await;
    assert_eq!(judge.world(), World::Reward);
    assert_eq!(judge.info().name, "faulty-reward");
    assert_eq!(judge.reward(&rollout(None)).await.unwrap(), Some(1.0));
    assert_eq!(
        judge.reward(&rollout(Some("unscored"))).await.unwrap(),
        None
    );
    let err = judge.reward(&rollout(Some("nan"))).await.unwrap_err();
    assert!(
        matches!(err.kind, PluginErrorKind::InvalidReward(v) if v.is_nan()),
        "{err}"
    );
    let err = judge.reward(&rollout(Some("panic"))).await.unwrap_err();
    assert!(matches!(err.kind, PluginErrorKind::Trap(_)), "{err}");
    assert_eq!(
        judge.reward(&rollout(Some("calls"))).await.unwrap(),
        Some(2.0)
    );

    let err = judge.build_samples(&rollout(None)).await.unwrap_err();
    assert!(
        matches!(
            err.kind,
            PluginErrorKind::WrongWorld {
                expected: World::SampleAdapter,
                actual: World::Reward
            }
        ),
        "{err}"
    );
    let adapter = load(&host, faulty_spec("faulty", "none")).await;
    let err = adapter.reward(&rollout(None)).await.unwrap_err();
    assert!(
        matches!(err.kind, PluginErrorKind::WrongWorld { .. }),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_calls_share_a_bounded_pool() {
    let host = host();
    let mut spec = faulty_spec("faulty", "none");
    spec.limits.instances = 2;
    let plugin = load(&host, spec).await;
    let calls: Vec<_> = (0..16)
        .map(|_| {
            let plugin = plugin.clone();
            tokio::spawn(async move { plugin.build_samples(&rollout(None)).await })
        })
        .collect();
    for call in calls {
        assert_eq!(
            call.await.unwrap().unwrap(),
            expected_samples(&rollout(None))
        );
    }
}

#[tokio::test]
async fn second_load_uses_the_disk_cache() {
    let cache = TempDir::new().unwrap();
    let host = host_with_cache(cache.path());
    let first = load(&host, faulty_spec("faulty", "none")).await;
    let report = first.load_report();
    assert!(!report.cache_hit);
    let file = report.cache_file.clone().expect("cache file written");
    assert!(file.starts_with(cache.path()) && file.exists());
    // Another host (as in a new process) finds it too.
    let second = load(
        &host_with_cache(cache.path()),
        faulty_spec("faulty", "none"),
    )
    .await;
    assert!(second.load_report().cache_hit);
    assert_eq!(second.load_report().cache_file.as_ref(), Some(&file));
    assert_serves(&second).await;
}

#[tokio::test]
async fn corrupt_cache_files_are_recompiled() {
    let cache = TempDir::new().unwrap();
    let host = host_with_cache(cache.path());
    let file = load(&host, faulty_spec("faulty", "none"))
        .await
        .load_report()
        .cache_file
        .clone()
        .expect("cache file");
    let good = std::fs::read(&file).unwrap();
    let mut flipped = good.clone();
    let middle = flipped.len() / 2;
    flipped[middle] ^= 0xff;
    for corrupt in [
        b"not a compiled component".to_vec(),
        flipped,
        good[..good.len() / 3].to_vec(),
    ] {
        std::fs::write(&file, corrupt).unwrap();
        let plugin = load(&host, faulty_spec("faulty", "none")).await;
        assert!(!plugin.load_report().cache_hit);
        assert_serves(&plugin).await;
        assert_eq!(std::fs::read(&file).unwrap().len(), good.len(), "rewritten");
        let again = load(&host, faulty_spec("faulty", "none")).await;
        assert!(again.load_report().cache_hit);
    }
}

#[tokio::test]
async fn broken_files_fail_to_load_with_the_reason() {
    let host = host();
    let dir = TempDir::new().unwrap();
    let random = dir.path().join("random.wasm");
    std::fs::write(
        &random,
        (0..4096u32)
            .map(|i| (i * 7919 % 251) as u8)
            .collect::<Vec<_>>(),
    )
    .unwrap();
    let empty = dir.path().join("empty.wat");
    std::fs::write(&empty, "(component)").unwrap();
    let missing = dir.path().join("missing.wasm");
    for (path, reason) in [
        (&random, "not a valid component"),
        (&empty, "exports neither"),
        (&missing, "cannot read"),
    ] {
        let err = host
            .load(PluginSpec::new("broken", path))
            .await
            .unwrap_err();
        assert!(
            matches!(&err.kind, PluginErrorKind::Load(m) if m.contains(reason)),
            "{err}"
        );
        assert_eq!(&err.path, path);
    }
    let mut greedy = PluginSpec::new("greedy", wasm("faulty"));
    greedy.limits.memory_bytes = usize::MAX;
    let err = host.load(greedy).await.unwrap_err();
    assert!(
        matches!(&err.kind, PluginErrorKind::Load(m) if m.contains("memory limit")),
        "{err}"
    );
}

#[tokio::test]
async fn inspect_reports_world_info_and_component_types() {
    let host = host();
    let inspection = host.inspect(&wasm("faulty")).await.unwrap();
    assert_eq!(inspection.world, World::SampleAdapter);
    assert_eq!(inspection.info.name, "faulty");
    let export = |name: &str| inspection.exports.iter().find(|e| e.name == name);
    let build = export("build-samples").expect("build-samples export");
    assert!(
        build.ty.starts_with("func(rollout: record { id, group-id,"),
        "{}",
        build.ty
    );
    assert!(build.ty.ends_with("-> result<list<record { prompt-ids, response-ids, trainable, logprobs, source-calls, weight-version, agent, break-before }>, string>"), "{}", build.ty);
    assert!(export("describe").is_some());
    let import = |prefix: &str| {
        inspection
            .imports
            .iter()
            .any(|i| i.name.starts_with(prefix))
    };
    assert!(import(&format!("agl:adapter/log@{WIT_VERSION}")));
    assert!(import(&format!("agl:adapter/rollout-data@{WIT_VERSION}")));
    assert!(import(&format!("agl:adapter/samples@{WIT_VERSION}")));
    assert_eq!(inspection.wit, WitVersion::V0_6);
    assert!(import("wasi:cli/stderr@0.2"));
    let reward = host.inspect(&wasm("faulty-reward")).await.unwrap();
    assert_eq!(reward.world, World::Reward);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hot_reload_swaps_under_load_and_keeps_serving_on_failure() {
    let host = Arc::new(host());
    let dir = TempDir::new().unwrap();
    let mut spec = faulty_spec("faulty", "none");
    spec.limits.instances = 2;
    let slot = Arc::new(PluginSlot::new(load(&host, spec).await));

    let stop = Arc::new(AtomicBool::new(false));
    let served = Arc::new(AtomicUsize::new(0));
    let callers: Vec<_> = (0..4)
        .map(|_| {
            let (slot, stop, served) = (slot.clone(), stop.clone(), served.clone());
            tokio::spawn(async move {
                let rollout = rollout(None);
                let expected = expected_samples(&rollout);
                let mut errors = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    match slot.build_samples(&rollout).await {
                        Ok(samples) if samples == expected => {
                            served.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(samples) => errors.push(format!("wrong samples {samples:?}")),
                        Err(e) => errors.push(e.to_string()),
                    }
                    // Pace the callers so that they do not starve the compiles.
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                errors
            })
        })
        .collect();

    let random = dir.path().join("random.wasm");
    std::fs::write(&random, b"\0asm garbage that is not a component").unwrap();
    let mut last_good = wasm("faulty");
    for round in 0..2 {
        let fresh = variant_of_faulty(dir.path(), &format!("v{round}"));
        slot.reload(&host, &fresh)
            .await
            .expect("reload a good build");
        assert_eq!(slot.current().path(), fresh);
        last_good = fresh;

        let err = slot.reload(&host, &random).await.unwrap_err();
        assert!(matches!(err.kind, PluginErrorKind::Load(_)), "{err}");
        let err = slot
            .reload(&host, &wasm("faulty-reward"))
            .await
            .unwrap_err();
        assert!(
            matches!(
                err.kind,
                PluginErrorKind::WrongWorld {
                    expected: World::SampleAdapter,
                    actual: World::Reward
                }
            ),
            "{err}"
        );
        assert_eq!(
            slot.current().path(),
            last_good,
            "the old plugin keeps serving"
        );
    }
    // Let calls run on the last build too. The timeout only keeps a broken
    // host from hanging the suite; the assertions below report what failed.
    let before = served.load(Ordering::Relaxed);
    let more_calls = async {
        while served.load(Ordering::Relaxed) < before + 8 {
            tokio::task::yield_now().await;
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(60), more_calls).await;
    stop.store(true, Ordering::Relaxed);
    for caller in callers {
        let errors = caller.await.unwrap();
        assert!(errors.is_empty(), "calls failed during reload: {errors:?}");
    }
    assert!(served.load(Ordering::Relaxed) > 0);
    assert_eq!(slot.current().path(), last_good);
}

/// `reported.wasm` as if built against `agl:adapter@{version}`: its import
/// names rewritten in place (same length, so the binary stays valid).
fn rebuilt_against(version: &str, dir: &Path) -> PathBuf {
    let current = format!("@{WIT_VERSION}");
    let wanted = format!("@{version}");
    assert_eq!(current.len(), wanted.len());
    let mut wasm = std::fs::read(wasm("reported")).unwrap();
    let needle = format!("{WIT_PACKAGE}/");
    let mut patched = 0;
    let mut i = 0;
    while let Some(at) = find(&wasm[i..], needle.as_bytes()) {
        let start = i + at + needle.len();
        let end = (start + 40).min(wasm.len());
        if let Some(v) = find(&wasm[start..end], current.as_bytes()) {
            wasm[start + v..start + v + wanted.len()].copy_from_slice(wanted.as_bytes());
            patched += 1;
        }
        i = start;
    }
    assert!(patched > 0, "no {needle}*{current} import in reported.wasm");
    let path = dir.join(format!("reported-{version}.wasm"));
    std::fs::write(&path, wasm).unwrap();
    path
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

#[tokio::test]
async fn a_component_built_against_another_major_is_refused_by_version() {
    let dir = tempfile::tempdir().unwrap();
    let host = PluginHost::new(HostConfig {
        cache_dir: None,
        ..HostConfig::default()
    })
    .unwrap();
    let bumped = rebuilt_against("1.1.0", dir.path());
    let Err(err) = host.load(PluginSpec::new("bumped", &bumped)).await else {
        panic!("a 1.x component is refused");
    };
    let text = err.to_string();
    assert!(text.contains("agl:adapter@1.1.0"), "{text}");
    assert!(
        text.contains(&format!("agl:adapter@{WIT_VERSION}")),
        "{text}"
    );
    // A minor this agl does not serve is refused too, naming both served.
    let Err(err) = host
        .load(PluginSpec::new(
            "next",
            rebuilt_against("0.7.0", dir.path()),
        ))
        .await
    else {
        panic!("a 0.7 component is refused");
    };
    assert!(
        err.to_string().contains(
            "serves agl:adapter@0.6.0, agl:adapter@0.5.0, agl:adapter@0.4.0, \
             agl:adapter@0.3.0, agl:adapter@0.2.0 and agl:adapter@0.1.0"
        ),
        "{err}"
    );
    // A patch release of the same track still loads and scores.
    let patch = rebuilt_against("0.6.9", dir.path());
    let plugin = host.load(PluginSpec::new("patch", &patch)).await.unwrap();
    assert_eq!(plugin.world(), World::Reward);
    assert_eq!(plugin.wit_version(), WitVersion::V0_6);
}

/// `faulty` built against the frozen `wit/v0.1`: a plugin from before 0.2.
#[tokio::test]
async fn a_plugin_built_against_0_1_still_loads_and_builds_samples() {
    let host = host();
    let mut spec = faulty_spec("old", "none");
    spec.path = wasm("faulty-v0.1");
    let old = load(&host, spec).await;
    assert_eq!(old.world(), World::SampleAdapter);
    assert_eq!(old.wit_version(), WitVersion::V0_1);
    let mut rollout = rollout(None);
    // 0.2's field is not part of what a 0.1 plugin sees; it still works.
    Arc::make_mut(&mut rollout).calls[1].continues = Some(0);
    let samples = old.build_samples(&rollout).await.expect("samples");
    assert_eq!(samples, expected_samples(&rollout));
    let inspection = host.inspect(&wasm("faulty-v0.1")).await.unwrap();
    assert_eq!(inspection.wit, WitVersion::V0_1);
    assert!(
        inspection
            .imports
            .iter()
            .any(|i| i.name == "agl:adapter/log@0.1.0"),
        "{:?}",
        inspection.imports
    );
    // The same host serves a 0.2 plugin beside it, which sees the links
    // and may return the kinds new in 0.2.
    let new = load(&host, faulty_spec("new", "links")).await;
    let samples = new.build_samples(&rollout).await.expect("samples");
    let breaks: Vec<(BreakKind, String)> = samples
        .iter()
        .map(|s| {
            let b = s.break_before.as_ref().expect("a break");
            (b.kind, b.detail.clone())
        })
        .collect();
    assert_eq!(
        breaks[..2],
        [
            (BreakKind::SubAgent, "continues=None".to_string()),
            (BreakKind::Summary, "continues=Some(0)".to_string()),
        ]
    );
}

/// `faulty` built against the frozen `wit/v0.2` (before 0.3) loads beside a
/// current one; only the 0.3 plugin sees `choice` and `constrained`.
#[tokio::test]
async fn a_plugin_built_against_0_2_still_loads_and_0_3_sees_the_choice() {
    let host = host();
    let mut spec = faulty_spec("old", "links");
    spec.path = wasm("faulty-v0.2");
    let old = load(&host, spec).await;
    assert_eq!(old.wit_version(), WitVersion::V0_2);
    let mut rollout = rollout(None);
    Arc::make_mut(&mut rollout).calls[1].continues = Some(0);
    Arc::make_mut(&mut rollout).calls[1].choice =
        Some(agl_wire::rollout::Choice { index: 1, count: 2 });
    Arc::make_mut(&mut rollout).calls[1].constrained = true;
    // 0.2's link field still reaches a 0.2 plugin.
    let samples = old.build_samples(&rollout).await.expect("samples");
    let detail =
        |s: &agl_wire::rollout::Sample| s.break_before.as_ref().expect("a break").detail.clone();
    assert_eq!(detail(&samples[1]), "continues=Some(0)");
    let inspection = host.inspect(&wasm("faulty-v0.2")).await.unwrap();
    assert_eq!(inspection.wit, WitVersion::V0_2);
    let new = load(&host, faulty_spec("new", "choices")).await;
    assert_eq!(new.wit_version(), WitVersion::V0_6);
    let samples = new.build_samples(&rollout).await.expect("samples");
    let details: Vec<String> = samples.iter().map(detail).collect();
    assert_eq!(
        details,
        [
            "choice=None constrained=false",
            "choice=Some((1, 2)) constrained=true"
        ]
    );
}

/// `faulty` built against the frozen `wit/v0.3` (before 0.4) loads beside a
/// current one; only the 0.4 plugin sees which version sampled each token.
#[tokio::test]
async fn a_plugin_built_against_0_3_still_loads_and_0_4_sees_token_versions() {
    let host = host();
    let mut spec = faulty_spec("old", "choices");
    spec.path = wasm("faulty-v0.3");
    let old = load(&host, spec).await;
    assert_eq!(old.wit_version(), WitVersion::V0_3);
    let mut rollout = rollout(None);
    Arc::make_mut(&mut rollout).calls[1].constrained = true;
    let n = rollout.calls[1].response_ids.len();
    let versions: Vec<u64> = (0..n as u64).map(|i| 3 + i % 2).collect();
    Arc::make_mut(&mut rollout).calls[1].response_versions = Some(versions.clone());
    // 0.3's fields still reach a 0.3 plugin.
    let samples = old.build_samples(&rollout).await.expect("samples");
    let detail =
        |s: &agl_wire::rollout::Sample| s.break_before.as_ref().expect("a break").detail.clone();
    assert_eq!(detail(&samples[1]), "choice=None constrained=true");
    let new = load(&host, faulty_spec("new", "versions")).await;
    assert_eq!(new.wit_version(), WitVersion::V0_6);
    let samples = new.build_samples(&rollout).await.expect("samples");
    let details: Vec<String> = samples.iter().map(detail).collect();
    assert_eq!(details[0], "versions=None");
    assert_eq!(details[1], format!("versions={:?}", Some(versions)));
}

/// `faulty` built against the frozen `wit/v0.5` (before 0.6) loads and
/// still gets its prompts as links; the 0.6 plugin has the host merge the
/// rollout (`samples.merge`), each broken chain named by its last call.
#[tokio::test]
async fn a_plugin_built_against_0_5_still_loads_and_0_6_has_the_host_merge() {
    let host = host();
    let mut spec = faulty_spec("old", "prompts");
    spec.path = wasm("faulty-v0.5");
    let old = load(&host, spec).await;
    assert_eq!(old.wit_version(), WitVersion::V0_5);
    let mut rollout = rollout(None);
    let samples = old.build_samples(&rollout).await.expect("samples");
    assert_eq!(samples[1].prompt_ids, rollout.calls[1].prompt_ids);
    let detail =
        |s: &agl_wire::rollout::Sample| s.break_before.as_ref().expect("a break").detail.clone();
    assert!(detail(&samples[1]).starts_with("extends=Some(0) shared=5 tail=1"));

    // Call 1 continues call 0; a third call that re-renders call 1's
    // response breaks the chain.
    let mut third = rollout.calls[1].clone();
    third.index = 2;
    third.prompt_ids = [&rollout.calls[1].prompt_ids[..], &[99, 98]].concat();
    Arc::make_mut(&mut rollout).calls.push(third);
    let new = load(&host, faulty_spec("new", "merged")).await;
    assert_eq!(new.wit_version(), WitVersion::V0_6);
    let samples = new.build_samples(&rollout).await.expect("samples");
    let sources: Vec<&[u32]> = samples.iter().map(|s| &s.source_calls[..]).collect();
    assert_eq!(sources, [&[0, 1][..], &[2][..]]);
    assert!(samples[0].break_before.is_none());
    let after = detail(&samples[1]);
    assert!(after.ends_with(" | after=Some(1)"), "{after}");
    assert_eq!(samples[1].break_before.as_ref().unwrap().call_index, 2);
}

/// `faulty` built against the frozen `wit/v0.4` (before 0.5) loads beside a
/// current one and still gets every whole prompt; the 0.5 plugin gets each
/// prompt as what it adds to the call it extends, and the JSON and whole
/// prompts on demand, of this rollout only.
#[tokio::test]
async fn a_plugin_built_against_0_4_still_loads_and_0_5_gets_prompts_as_links() {
    let host = host();
    let mut spec = faulty_spec("old", "versions");
    spec.path = wasm("faulty-v0.4");
    let old = load(&host, spec).await;
    assert_eq!(old.wit_version(), WitVersion::V0_4);
    let rollout = rollout(None);
    let samples = old.build_samples(&rollout).await.expect("samples");
    assert_eq!(samples[1].prompt_ids, rollout.calls[1].prompt_ids);

    let new = load(&host, faulty_spec("new", "prompts")).await;
    assert_eq!(new.wit_version(), WitVersion::V0_6);
    let samples = new.build_samples(&rollout).await.expect("samples");
    // The whole prompts came back through `rollout-data.prompt-ids`.
    assert_eq!(samples[0].prompt_ids, rollout.calls[0].prompt_ids);
    assert_eq!(samples[1].prompt_ids, rollout.calls[1].prompt_ids);
    let detail =
        |s: &agl_wire::rollout::Sample| s.break_before.as_ref().expect("a break").detail.clone();
    let json_len = |c: usize| {
        let call = &rollout.calls[c];
        (call.request.as_str().len(), call.response.as_str().len())
    };
    let ((req0, resp0), (req1, resp1)) = (json_len(0), json_len(1));
    // Call 1's prompt [1..6] is call 0's prompt [1, 2, 3] and response
    // [4, 5], then [6].
    assert_eq!(
        [detail(&samples[0]), detail(&samples[1])],
        [
            format!(
                "extends=None shared=0 tail=3 request=Some({req0}) response=Some({resp0}) \
                 beyond=None"
            ),
            format!(
                "extends=Some(0) shared=5 tail=1 request=Some({req1}) response=Some({resp1}) \
                 beyond=None"
            ),
        ]
    );
}
