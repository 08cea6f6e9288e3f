//! The Python and the Rust `tests-pass` reward on the same 1,000 rollouts:
//! component size, load (cold: compiled; cached: from the disk cache, in a
//! fresh engine), instantiation from the compiled component, and the reward
//! call per rollout once instantiated.
//!
//! `cargo bench -p agl-plugin-host --bench rewards` (needs `plugins/build.sh`
//! with componentize-py in the venv). One run, one table; targets: Python
//! call <= 5 ms per rollout at the median, instantiation <= 20 ms.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use agl_plugin_host::{HostConfig, Plugin, PluginHost, PluginLimits, PluginSpec};
use agl_wire::rollout::{Rollout, read_jsonl};

const ROLLOUTS: usize = 1_000;
/// Instances started to time instantiation (the pool's one from loading excluded).
const INSTANCES: usize = 9;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The recorded mini-swe rollouts (graded, 4-9 calls each), cycled to 1,000
/// with their own ids.
fn rollouts() -> Vec<Arc<Rollout>> {
    let recorded = read_jsonl(&repo().join("examples/fixtures/mini-swe/recorded.jsonl"))
        .expect("the recorded fixtures");
    (0..ROLLOUTS)
        .map(|i| {
            let mut r = recorded[i % recorded.len()].clone();
            r.id = format!("r{i:04}");
            Arc::new(r)
        })
        .collect()
}

fn host(cache: &Path) -> PluginHost {
    PluginHost::new(HostConfig {
        cache_dir: Some(cache.to_path_buf()),
        ..HostConfig::default()
    })
    .expect("plugin host")
}

fn spec(wasm: &Path, instances: usize) -> PluginSpec {
    let mut spec = PluginSpec::new("tests-pass", wasm);
    spec.config = toml::from_str("step_penalty = 0.05\nmin_reward = 0.5").expect("toml");
    spec.limits = PluginLimits {
        instances,
        ..PluginLimits::default()
    };
    spec
}

async fn timed_load(host: &PluginHost, spec: PluginSpec) -> (Plugin, Duration) {
    let t = Instant::now();
    let plugin = host.load(spec).await.expect("load");
    (plugin, t.elapsed())
}

struct Row {
    name: &'static str,
    size: u64,
    cold: Duration,
    cached: Duration,
    instantiate: Duration,
    median: Duration,
    p99: Duration,
    total: Duration,
    sum: f64,
}

async fn measure(name: &'static str, wasm: &Path, rollouts: &[Arc<Rollout>]) -> Row {
    let cache = tempfile::tempdir().expect("tempdir");
    let size = std::fs::metadata(wasm).expect("built").len();
    let (_, cold) = timed_load(&host(cache.path()), spec(wasm, 1)).await;
    let warm_host = host(cache.path());
    let (_, cached) = timed_load(&warm_host, spec(wasm, 1)).await;

    let (pool, _) = timed_load(&warm_host, spec(wasm, INSTANCES + 1)).await;
    let t = Instant::now();
    let started = pool.prewarm().await.expect("prewarm");
    assert_eq!(started, INSTANCES);
    let instantiate = t.elapsed() / INSTANCES as u32;

    let (plugin, _) = timed_load(&warm_host, spec(wasm, 1)).await;
    let mut times = Vec::with_capacity(rollouts.len());
    let mut sum = 0.0;
    let start = Instant::now();
    for r in rollouts {
        let t = Instant::now();
        sum += plugin.reward(r).await.expect("reward").unwrap_or(0.0);
        times.push(t.elapsed());
    }
    let total = start.elapsed();
    times.sort();
    Row {
        name,
        size,
        cold,
        cached,
        instantiate,
        median: times[times.len() / 2],
        p99: times[times.len() * 99 / 100],
        total,
        sum,
    }
}

fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1e3)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let built = repo().join("build/plugins");
    let rollouts = rollouts();
    let mut rows = Vec::new();
    for (name, file) in [
        ("Rust tests-pass", "tests-pass.wasm"),
        ("Python tests-pass", "tests-pass-py.wasm"),
    ] {
        let wasm = built.join(file);
        assert!(
            wasm.exists(),
            "{} missing: run plugins/build.sh",
            wasm.display()
        );
        rows.push(measure(name, &wasm, &rollouts).await);
    }
    assert_eq!(rows[0].sum, rows[1].sum, "both score the rollouts alike");
    println!(
        "{ROLLOUTS} rollouts (the recorded mini-swe ones, cycled), one instance, sequential calls"
    );
    println!(
        "| plugin | size MB | load cold ms | load cached ms | instantiate ms | call median ms | call p99 ms | 1,000 calls s |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for r in &rows {
        println!(
            "| {} | {:.2} | {} | {} | {} | {} | {} | {:.2} |",
            r.name,
            r.size as f64 / 1e6,
            ms(r.cold),
            ms(r.cached),
            ms(r.instantiate),
            ms(r.median),
            ms(r.p99),
            r.total.as_secs_f64()
        );
    }
    let python = &rows[1];
    let verdict = |ok: bool| if ok { "met" } else { "NOT met" };
    println!(
        "targets: Python call median <= 5 ms: {} ({} ms); instantiation from the compiled cache <= 20 ms: {} ({} ms)",
        verdict(python.median <= Duration::from_millis(5)),
        ms(python.median),
        verdict(python.instantiate <= Duration::from_millis(20)),
        ms(python.instantiate)
    );
}
