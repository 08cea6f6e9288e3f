//! Gateway vs direct-to-engine: throughput and added latency at 1, 64 and 512
//! concurrent connections, in one run, on loopback.
//!
//! `cargo bench -p agl --bench gateway [-- --secs S --engine-ms MS --conns 1,64,512
//! --durability process|power]`
//!
//! Each connection is a client task sending non-streamed chat completions
//! back to back for `--secs` (after a short warm-up). "direct" posts the body
//! the proxy would forward straight to the test engine; "gateway" posts the
//! harness's body to a rollout's proxy URL (auth, rollout checks, rewrite,
//! pinned engine, `model_request` event committed to a real SQLite file
//! before the answer). The engine waits `--engine-ms` before answering, a
//! stand-in for generation time (0 = measure pure overhead; everything then
//! competes for the same CPU cores). "added" = gateway minus direct, per
//! percentile. Each call's user message carries its turn number, as an
//! agent's next call differs from its last: the same body again on a rollout
//! would be taken for a client retry of that call (recorded, and the earlier
//! one marked superseded), which is not the traffic this measures. The
//! process runs on `agl::runtime::build()`, the runtime of `agl serve`.
//! "cpu/call" = the whole process's CPU time per direct call
//! (client + engine), "+gw cpu" = what the gateway adds per call; on a
//! machine where all of it shares few cores, that extra CPU is what turns
//! into queueing delay and lost throughput at high concurrency. Both store
//! durability levels are measured.

use std::time::{Duration, Instant};

// The same allocator as the `agl` binary (host/src/main.rs).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use agl_gateway::GatewayConfig;
use agl_wire::api::StatusPatch;
use std::sync::Arc;

use agl_gateway::{Auth, Gateway};
use agl_store::{Durability, Mode, NewRollout, Store};
use agl_testengine::{Faults, Reply, TestEngine, TestEngineConfig};
use agl_wire::rollout::RolloutStatus;
use serde_json::{Value, json};

struct Opts {
    secs: f64,
    engine_ms: u64,
    conns: Vec<usize>,
    durability: Vec<Durability>,
}

fn opts() -> Opts {
    let mut o = Opts {
        secs: 3.0,
        engine_ms: 20,
        conns: vec![1, 64, 512],
        durability: vec![Durability::Process, Durability::Power],
    };
    let args: Vec<String> = std::env::args().collect();
    let mut i = 1;
    while i < args.len() {
        let value = args.get(i + 1).cloned().unwrap_or_default();
        match args[i].as_str() {
            "--secs" => o.secs = value.parse().unwrap_or(o.secs),
            "--engine-ms" => o.engine_ms = value.parse().unwrap_or(o.engine_ms),
            "--durability" => {
                o.durability = match value.as_str() {
                    "process" => vec![Durability::Process],
                    "power" => vec![Durability::Power],
                    _ => o.durability,
                };
            }
            "--conns" => {
                o.conns = value.split(',').filter_map(|c| c.parse().ok()).collect();
            }
            _ => {
                i += 1;
                continue;
            }
        }
        i += 2;
    }
    o
}

/// Latencies (µs) and completed requests of one measured run.
struct Run {
    latencies: Vec<u64>,
    elapsed: Duration,
    /// Process CPU time (user + system) over the measured window, µs.
    cpu_us: f64,
}

/// User + system CPU time of this whole process (client, gateway, engine,
/// store writer), µs.
fn process_cpu_us() -> f64 {
    // SAFETY: getrusage only writes the struct it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let us = |t: libc::timeval| t.tv_sec as f64 * 1e6 + t.tv_usec as f64;
    us(u.ru_utime) + us(u.ru_stime)
}

impl Run {
    /// CPU µs per completed call, everything in the process counted.
    fn cpu_per_call(&self) -> f64 {
        self.cpu_us / self.latencies.len().max(1) as f64
    }

    fn throughput(&self) -> f64 {
        self.latencies.len() as f64 / self.elapsed.as_secs_f64()
    }

    fn pct(&self, p: f64) -> f64 {
        let mut v = self.latencies.clone();
        v.sort_unstable();
        let i = ((v.len() as f64 - 1.0) * p).round() as usize;
        v.get(i).copied().unwrap_or(0) as f64 / 1000.0
    }
}

/// One target per connection: a URL, its bearer token and the body to post.
type Target = (String, String, Value);

/// `targets.len()` client tasks posting back to back: a warm-up, then
/// `secs` measured.
async fn drive(targets: Vec<Target>, secs: f64) -> Run {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(targets.len() + 8)
        .tcp_nodelay(true)
        .build()
        .expect("client");
    let warm_end = Instant::now() + Duration::from_millis(500);
    let end = warm_end + Duration::from_secs_f64(secs);
    let cpu_start = tokio::spawn(async move {
        tokio::time::sleep_until(warm_end.into()).await;
        process_cpu_us()
    });
    let tasks: Vec<_> = targets
        .into_iter()
        .map(|(url, token, body)| {
            let client = client.clone();
            let text = serde_json::to_string(&body).expect("body");
            let (head, tail) = text.split_once(TURN).expect("turn marker");
            let (head, tail) = (head.to_string(), tail.to_string());
            tokio::spawn(async move {
                let mut lat = Vec::new();
                for turn in 0u64.. {
                    let t = Instant::now();
                    if t >= end {
                        break;
                    }
                    let resp = client
                        .post(&url)
                        .bearer_auth(&token)
                        .header("content-type", "application/json")
                        .body(format!("{head}{turn}{tail}"))
                        .send()
                        .await
                        .expect("send");
                    let status = resp.status();
                    resp.bytes().await.expect("body");
                    assert!(status.is_success(), "{url}: HTTP {status}");
                    if t >= warm_end {
                        lat.push(t.elapsed().as_micros() as u64);
                    }
                }
                lat
            })
        })
        .collect();
    let cpu_start = cpu_start.await.expect("cpu probe");
    tokio::time::sleep_until(end.into()).await;
    let cpu_us = process_cpu_us() - cpu_start;
    let mut latencies = Vec::new();
    for t in tasks {
        latencies.extend(t.await.expect("client task"));
    }
    Run {
        latencies,
        elapsed: Duration::from_secs_f64(secs),
        cpu_us,
    }
}

/// Replaced by the call's turn number in each body sent.
const TURN: &str = "@TURN@";

fn harness_body() -> Value {
    json!({
        "model": "anything",
        "messages": [
            {"role": "system", "content": "You are a calculator agent."},
            {"role": "user", "content": format!("Turn {TURN}: what is 17 * 23? Use the tool.")}
        ],
        "max_tokens": 16
    })
}

/// What the proxy forwards (see `proxy/rewrite.rs`): the direct baseline
/// does the same work at the engine.
fn forwarded_body() -> Value {
    let mut b = harness_body();
    b["model"] = json!("served-model");
    b["temperature"] = json!(1.0);
    b["logprobs"] = json!(true);
    b["return_token_ids"] = json!(true);
    b
}

struct Setup {
    engine: TestEngine,
    gateway_base: String,
    store: Store,
    auth: Arc<Auth>,
    _dir: tempfile::TempDir,
}

async fn setup(engine_ms: u64, durability: Durability) -> Setup {
    let faults = Faults {
        first_byte_latency: Duration::from_millis(engine_ms),
        ..Faults::default()
    };
    let engine = TestEngine::start(
        TestEngineConfig::default()
            .with_replies([Reply::text("391")])
            .with_faults(faults),
    )
    .await
    .expect("engine");
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open_with(dir.path().join("agl.db"), durability).expect("store");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let config = GatewayConfig {
        listen: addr.to_string(),
        admin_key: Some("bench-admin".into()),
        ..GatewayConfig::default()
    };
    let gateway = Gateway::new(store.clone(), config);
    let auth = gateway.state().auth.clone();
    tokio::spawn(gateway.serve(listener, std::future::pending()));
    store
        .register_engine(
            &agl_store::RegisterEngine::new("e1", &engine.base_url(), "served-model")
                .with_render(agl_store::Render::Engine),
        )
        .await
        .expect("register engine");
    Setup {
        engine,
        gateway_base: format!("http://{addr}"),
        store,
        auth,
        _dir: dir,
    }
}

impl Setup {
    async fn direct_targets(&self, n: usize) -> Vec<Target> {
        let url = format!("{}/chat/completions", self.engine.base_url());
        (0..n)
            .map(|_| (url.clone(), String::new(), forwarded_body()))
            .collect()
    }

    /// One running rollout per connection (fresh ids per run).
    async fn gateway_targets(&self, run: &str, n: usize) -> Vec<Target> {
        let ids: Vec<String> = (0..n).map(|i| format!("{run}-{i}")).collect();
        let batch = ids
            .iter()
            .map(|id| NewRollout {
                id: Some(id.clone()),
                group_id: run.into(),
                mode: Mode::Train,
                input: Default::default(),
                config: Default::default(),
            })
            .collect();
        self.store.create_rollouts(batch).await.expect("create");
        let mut out = Vec::new();
        for id in ids {
            self.store
                .set_status(&id, &StatusPatch::to(1, RolloutStatus::Running))
                .await
                .expect("running");
            let url = format!(
                "{}/proxy/{id}/1/train/openai/v1/chat/completions",
                self.gateway_base
            );
            let token = self.auth.rollout_token(&id, 1);
            out.push((url, token, harness_body()));
        }
        out
    }
}

fn main() {
    let o = opts();
    let rt = agl::runtime::build().expect("runtime");
    rt.block_on(async {
        println!(
            "gateway vs direct: non-streamed chat completions, engine time {} ms, {} s per point, {} cores",
            o.engine_ms,
            o.secs,
            std::thread::available_parallelism().map_or(1, |n| n.get())
        );
        println!(
            "{:<10} {:>6} | {:>9} {:>9} {:>6} | {:>8} {:>8} | {:>8} {:>8} | {:>9} {:>9} | {:>8} {:>8}",
            "durability",
            "conns",
            "direct/s",
            "gw/s",
            "ratio",
            "dir p50",
            "dir p99",
            "gw p50",
            "gw p99",
            "added p50",
            "added p99",
            "cpu/call",
            "+gw cpu"
        );
        for &durability in &o.durability {
            let s = setup(o.engine_ms, durability).await;
            for &n in &o.conns {
                let direct = drive(s.direct_targets(n).await, o.secs).await;
                let gw = drive(s.gateway_targets(&format!("c{n}"), n).await, o.secs).await;
                println!(
                    "{:<10} {:>6} | {:>9.0} {:>9.0} {:>5.0}% | {:>6.2}ms {:>6.2}ms | {:>6.2}ms {:>6.2}ms | {:>7.3}ms {:>7.3}ms | {:>6.0}us {:>6.0}us",
                    format!("{durability:?}").to_lowercase(),
                    n,
                    direct.throughput(),
                    gw.throughput(),
                    100.0 * gw.throughput() / direct.throughput(),
                    direct.pct(0.5),
                    direct.pct(0.99),
                    gw.pct(0.5),
                    gw.pct(0.99),
                    gw.pct(0.5) - direct.pct(0.5),
                    gw.pct(0.99) - direct.pct(0.99),
                    direct.cpu_per_call(),
                    gw.cpu_per_call() - direct.cpu_per_call(),
                );
            }
        }
    });
}
