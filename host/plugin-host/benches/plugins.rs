//! Wasm vs native `build-samples`, and 1,000 rollouts end to end.
//!
//! `cargo bench -p agl-plugin-host --bench plugins [-- --runs R]` (needs
//! `plugins/build.sh`). Each of the R runs (default 7) alternates 400
//! native and wasm calls; the ratio held against the limit is the median
//! of the runs' ratios (one run's median moves ~10% with the machine).
//! The rollout: 50 calls whose prompts grow from 1k to ~30k tokens (each
//! call adds a 100-token response and a 480-token observation), with request
//! JSON the size of that history, as a long agent run records it.

// The same allocator as the `agl` binary (host/agl/src/main.rs).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agl_plugin::SampleAdapter;
use agl_plugin_host::samples::wire_calls;
use agl_plugin_host::{HostConfig, PluginHost, PluginSpec};
use agl_samples::links::prompt_links;
use agl_wire::rollout::{ModelCall, Rollout, RolloutStatus};
use serde_json::json;

const CALLS: usize = 50;
const FIRST_PROMPT: usize = 1_000;
const RESPONSE: usize = 100;
const OBSERVATION: usize = 480;
const VOCAB: u32 = 49_152;

/// A deterministic pseudo-random id stream (no rand dependency needed).
struct Ids(u64);

impl Ids {
    fn next(&mut self) -> u32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % u64::from(VOCAB)) as u32
    }

    fn take(&mut self, n: usize) -> Vec<u32> {
        (0..n).map(|_| self.next()).collect()
    }
}

fn long_rollout() -> Rollout {
    let mut ids = Ids(0x9E37_79B9_7F4A_7C15);
    let mut prompt = ids.take(FIRST_PROMPT);
    let mut messages = vec![json!({"role": "user", "content": "x".repeat(FIRST_PROMPT * 4)})];
    let mut calls = Vec::with_capacity(CALLS);
    for index in 0..CALLS {
        let response = ids.take(RESPONSE);
        let reply = json!({"role": "assistant", "content": "y".repeat(RESPONSE * 4)});
        calls.push(ModelCall {
            finish_reason: Some("stop".into()),
            ..ModelCall::chat(
                index as u32,
                (
                    json!({"model": "policy", "messages": messages}).into(),
                    json!({"choices": [{"message": reply, "finish_reason": "stop"}]}).into(),
                ),
                (prompt.clone(), response.clone()),
                vec![-0.5; RESPONSE],
            )
        });
        prompt.extend(&response);
        prompt.extend(ids.take(OBSERVATION));
        messages.push(reply);
        messages.push(json!({"role": "user", "content": "z".repeat(OBSERVATION * 4)}));
    }
    Rollout {
        id: "bench".into(),
        group_id: "g".into(),
        attempt: 0,
        input: json!({}).into(),
        status: RolloutStatus::Succeeded,
        failure: None,
        calls,
        events: vec![],
    }
}

/// The host record as the SDK's (guest) types, as the host hands it to a
/// 0.5 plugin: each prompt linked to an earlier call's by the host's rule
/// (`agl_samples::links`), its tail copied. The JSON and whole prompts
/// are served on demand (registered once, outside the timing: the host
/// serves them from the record it holds).
fn to_sdk(r: &Rollout) -> agl_plugin::Rollout {
    let links = prompt_links(&wire_calls(&r.calls));
    agl_plugin::Rollout {
        id: r.id.clone(),
        group_id: r.group_id.clone(),
        attempt: r.attempt,
        input_json: r.input.as_str().to_owned(),
        status: agl_plugin::RolloutStatus::Succeeded,
        calls: r
            .calls
            .iter()
            .zip(links)
            .map(|(c, link)| agl_plugin::ModelCall {
                index: c.index,
                api: agl_plugin::ApiKind::ChatCompletions,
                prompt: agl_plugin::Prompt {
                    extends: link.extends.map(|at| r.calls[at].index),
                    shared: link.shared as u32,
                    tail: c.prompt_ids[link.shared..].to_vec(),
                },
                response_ids: c.response_ids.clone(),
                response_logprobs: c.response_logprobs.clone(),
                weight_version: c.weight_version,
                finish_reason: c.finish_reason.clone(),
                started_at_ms: c.started_at_ms,
                finished_at_ms: c.finished_at_ms,
                tags: vec![],
                continues: c.continues,
                choice: c.choice.map(|c| agl_plugin::CallChoice {
                    index: c.index,
                    count: c.count,
                }),
                constrained: c.constrained,
                response_versions: c.response_versions.clone(),
            })
            .collect(),
        events: vec![],
    }
}

/// What the host serves of `r` on demand, for the native side.
fn serve_natively(r: &Rollout) {
    agl_plugin::testing::serve_rollout_data(r.calls.iter().map(|c| {
        let data = agl_plugin::testing::CallData {
            request_json: c.request.as_str().to_owned(),
            response_json: c.response.as_str().to_owned(),
            prompt_ids: c.prompt_ids.clone(),
        };
        (c.index, data)
    }));
}

struct Stats {
    median: Duration,
    p90: Duration,
}

fn stats(mut samples: Vec<Duration>) -> Stats {
    samples.sort();
    Stats {
        median: samples[samples.len() / 2],
        p90: samples[samples.len() * 9 / 10],
    }
}

/// One run's medians.
struct Run {
    native: Stats,
    wasm: Stats,
    linking: Stats,
}

fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1e3)
}

const ROUNDS: usize = 400;
const RUNS: usize = 7;
/// Issue 35's limit on the wasm / native ratio.
const LIMIT: f64 = 1.5;

fn main() -> anyhow::Result<()> {
    let wasm = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../build/plugins/trajectory.wasm");
    anyhow::ensure!(
        wasm.exists(),
        "{} missing: run plugins/build.sh",
        wasm.display()
    );
    let rollout = Arc::new(long_rollout());
    let ids: usize = rollout.calls.iter().map(|c| c.prompt_ids.len()).sum();
    let json_bytes: usize = rollout.calls.iter().map(|c| c.request.as_str().len()).sum();
    let last_prompt = rollout.calls.last().map_or(0, |c| c.prompt_ids.len());
    let links = prompt_links(&wire_calls(&rollout.calls));
    let tails: usize = ids - links.iter().map(|l| l.shared).sum::<usize>();

    // Native: the same plugin code compiled for this machine, fed from the
    // host's record as the host feeds a 0.5 plugin (links found, tails
    // copied: in the timing, as they are on the wasm side).
    serve_natively(&rollout);
    let native_once = || -> anyhow::Result<(Duration, usize)> {
        let t = Instant::now();
        let input = to_sdk(&rollout);
        let samples =
            agl_trajectory::Trajectory::build_samples(input).map_err(anyhow::Error::msg)?;
        Ok((t.elapsed(), samples.len()))
    };

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let runs = std::env::args()
        .skip_while(|a| a != "--runs")
        .nth(1)
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(RUNS)
        .max(1);
    let (mut runs_out, e2e, e2e_samples, instances) = runtime.block_on(async {
        let cache = tempfile::tempdir()?;
        let host = PluginHost::new(HostConfig {
            cache_dir: Some(cache.path().to_path_buf()),
            ..HostConfig::default()
        })?;
        let spec = PluginSpec::new("trajectory", &wasm);
        let instances = spec.limits.instances;
        let plugin = host.load(spec).await?;
        // Warm up every instance's memory once.
        for _ in 0..instances {
            plugin.build_samples(&rollout).await?;
        }
        // Native and wasm calls alternate, so a noisy spell of the machine
        // slows both alike; runs repeat that, each with its own medians.
        let mut runs_out = Vec::new();
        for _ in 0..runs {
            let (mut native, mut calls, mut linking) = (Vec::new(), Vec::new(), Vec::new());
            for _ in 0..ROUNDS {
                let (elapsed, expect) = native_once()?;
                native.push(elapsed);
                // The part both sides share: finding each prompt's link.
                let t = Instant::now();
                std::hint::black_box(prompt_links(&wire_calls(&rollout.calls)));
                linking.push(t.elapsed());
                let t = Instant::now();
                let samples = plugin.build_samples(&rollout).await?;
                calls.push(t.elapsed());
                anyhow::ensure!(samples.len() == expect, "wasm and native disagree");
            }
            runs_out.push(Run {
                native: stats(native),
                wasm: stats(calls),
                linking: stats(linking),
            });
        }
        // 1,000 rollouts, as many in flight as the plugin has instances.
        let shared = rollout.clone();
        let t = Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        let per_task = 1_000 / instances;
        for _ in 0..instances {
            let plugin = plugin.clone();
            let r = shared.clone();
            tasks.spawn(async move {
                let mut n = 0usize;
                for _ in 0..per_task {
                    n += plugin.build_samples(&r).await?.len();
                }
                anyhow::Ok(n)
            });
        }
        let mut samples = 0;
        while let Some(done) = tasks.join_next().await {
            samples += done??;
        }
        let e2e = t.elapsed();
        anyhow::Ok((runs_out, e2e, samples, instances))
    })?;

    let ratio = |r: &Run| r.wasm.median.as_secs_f64() / r.native.median.as_secs_f64();
    runs_out.sort_by(|a, b| ratio(a).total_cmp(&ratio(b)));
    let middle = &runs_out[runs_out.len() / 2];
    let (low, high) = (ratio(&runs_out[0]), ratio(&runs_out[runs_out.len() - 1]));
    println!(
        "rollout: {CALLS} calls, prompts {FIRST_PROMPT} -> {last_prompt} tokens, \
         {ids} prompt ids ({tails} in the prompts' tails), {:.1} MB request JSON (on demand); \
         {runs} runs of {ROUNDS} rounds",
        json_bytes as f64 / 1e6
    );
    println!(
        "{:<58} {:>12} {:>12}",
        "build-samples (trajectory), the median run", "median", "p90"
    );
    let row = |name: &str, s: &Stats| println!("{name:<58} {:>12} {:>12}", ms(s.median), ms(s.p90));
    row(
        "native (same plugin code, from the host's record)",
        &middle.native,
    );
    row(
        "  of which linking the prompts (both sides do)",
        &middle.linking,
    );
    row(
        "wasm via PluginHost (link, copy in, call, copy out, validate)",
        &middle.wasm,
    );
    let wasm_ratio = ratio(middle);
    println!(
        "ratio wasm / native, median of {runs} runs: {wasm_ratio:.2}x (runs {low:.2}-{high:.2}x)   \
         limit <= {LIMIT}x: {}",
        if wasm_ratio <= LIMIT {
            "met"
        } else {
            "NOT met"
        }
    );
    let n = (1_000 / instances) * instances;
    println!(
        "end to end: {n} rollouts in {:.2} s ({:.0} rollouts/s, {} samples, {instances} instances)",
        e2e.as_secs_f64(),
        n as f64 / e2e.as_secs_f64(),
        e2e_samples
    );
    Ok(())
}
