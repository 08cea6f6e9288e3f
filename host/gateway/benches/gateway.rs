//! What the gateway adds to a model call: the same non-streamed chat
//! completions posted straight to an upstream ("direct") and through a
//! rollout's proxy URL ("gateway": auth, rollout checks, body rewrite, the
//! pinned engine, the `model_request` record appended to the store's event
//! log before the answer and ingested into a real SQLite file right after;
//! fsynced into SQLite first with `--durability power`), at 1 and 64
//! connections, in one run, on
//! loopback. Prints the ratios issue 35 holds the gateway to: added p50 at
//! one connection <= 0.2 ms, throughput at 64 connections >= 30% of direct.
//!
//! `cargo bench -p agl-gateway --bench gateway [-- --secs S --reps R
//! --conns 1,64 --upstream static|engine --engine-ms MS --durability process|power]`
//!
//! The upstream is static by default: a bare hyper server on a thread of
//! its own that answers every request with one fixed body, the test
//! engine's answer to the harness's first call recorded at start-up (token
//! ids and logprobs as vLLM gives them), so the upstream costs about what
//! nginx answering a file would, and the figures are the gateway's own
//! work. `--upstream engine` posts to the test engine instead (it parses
//! each body and answers after `--engine-ms`, a stand-in for generation).
//! The client is a keep-alive reqwest client on a thread of its own, as a
//! harness is a process of its own; the gateway runs on
//! `agl_gateway::runtime::build()`, the runtime of `agl serve`.
//!
//! Each connection posts back to back for `--secs` after a warm-up; each
//! call's user message carries its turn number, as an agent's next call
//! differs from its last. Direct and gateway runs alternate `--reps`
//! times; each figure is the median over the reps. "cpu/call" is the whole
//! process's CPU time per direct call (client + upstream), "+gw cpu" what
//! the gateway adds per call.

use std::sync::Arc;
use std::time::{Duration, Instant};

// The same allocator as the `agl` binary (host/agl/src/main.rs).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use agl_gateway::{Auth, Gateway, GatewayConfig};
use agl_store::{Durability, Mode, NewRollout, Store};
use agl_testengine::{Faults, Reply, TestEngine, TestEngineConfig};
use agl_wire::api::StatusPatch;
use agl_wire::rollout::RolloutStatus;
use bytes::Bytes;
use serde_json::{Value, json};

/// The limits the figures are held against (issue 35).
const ADDED_P50_LIMIT_MS: f64 = 0.2;
const THROUGHPUT_SHARE_LIMIT: f64 = 0.30;

#[derive(Clone, Copy, PartialEq)]
enum Upstream {
    Static,
    Engine,
}

struct Opts {
    secs: f64,
    reps: usize,
    engine_ms: u64,
    conns: Vec<usize>,
    upstream: Upstream,
    durability: Vec<Durability>,
}

fn opts() -> Opts {
    let mut o = Opts {
        secs: 2.0,
        reps: 3,
        engine_ms: 0,
        conns: vec![1, 64],
        upstream: Upstream::Static,
        durability: vec![Durability::Process],
    };
    let args: Vec<String> = std::env::args().collect();
    let mut i = 1;
    while i < args.len() {
        let value = args.get(i + 1).cloned().unwrap_or_default();
        match args[i].as_str() {
            "--secs" => o.secs = value.parse().unwrap_or(o.secs),
            "--reps" => o.reps = value.parse().unwrap_or(o.reps).max(1),
            "--engine-ms" => o.engine_ms = value.parse().unwrap_or(o.engine_ms),
            "--upstream" => {
                o.upstream = match value.as_str() {
                    "engine" => Upstream::Engine,
                    _ => Upstream::Static,
                }
            }
            "--durability" => {
                o.durability = match value.as_str() {
                    "power" => vec![Durability::Power],
                    "both" => vec![Durability::Process, Durability::Power],
                    _ => vec![Durability::Process],
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

/// User + system CPU time of this whole process (client, gateway,
/// upstream, store writer), µs.
fn process_cpu_us() -> f64 {
    // SAFETY: getrusage only writes the struct it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let us = |t: libc::timeval| t.tv_sec as f64 * 1e6 + t.tv_usec as f64;
    us(u.ru_utime) + us(u.ru_stime)
}

impl Run {
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

/// Replaced by the call's turn number in each body sent.
const TURN: &str = "@TURN@";

/// `targets.len()` connections posting back to back on the client's own
/// runtime: a warm-up, then `secs` measured.
fn drive(client_rt: &tokio::runtime::Runtime, targets: Vec<Target>, secs: f64) -> Run {
    client_rt.block_on(async move {
        let client = reqwest::Client::builder()
            .pool_max_idle_per_host(targets.len() + 8)
            .tcp_nodelay(true)
            .build()
            .expect("client");
        let warm_end = Instant::now() + Duration::from_millis(300);
        let end = warm_end + Duration::from_secs_f64(secs);
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
        tokio::time::sleep_until(warm_end.into()).await;
        let cpu_start = process_cpu_us();
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
    })
}

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
/// sends the same.
fn forwarded_body() -> Value {
    let mut b = harness_body();
    b["model"] = json!("served-model");
    b["temperature"] = json!(1.0);
    b["logprobs"] = json!(true);
    b["return_token_ids"] = json!(true);
    b
}

/// A server answering every request with `body`, on a thread and runtime
/// of its own (as nginx would be a process of its own); its base URL.
fn static_upstream(body: Bytes) -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    listener.set_nonblocking(true).expect("nonblocking");
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let body = body.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req: hyper::Request<_>| {
                        let body = body.clone();
                        async move {
                            // Read the request out, as any server does.
                            http_body_util::BodyExt::collect(req.into_body()).await?;
                            let mut resp = hyper::Response::new(http_body_util::Full::new(body));
                            resp.headers_mut().insert(
                                hyper::header::CONTENT_TYPE,
                                hyper::header::HeaderValue::from_static("application/json"),
                            );
                            Ok::<_, hyper::Error>(resp)
                        }
                    });
                    let io = hyper_util::rt::TokioIo::new(stream);
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(io, service)
                        .await;
                });
            }
        });
    });
    format!("http://{addr}/v1")
}

struct Setup {
    upstream_base: String,
    gateway_base: String,
    store: Store,
    auth: Arc<Auth>,
    _engine: TestEngine,
    _dir: tempfile::TempDir,
}

async fn setup(o: &Opts, durability: Durability) -> Setup {
    let faults = Faults {
        first_byte_latency: Duration::from_millis(o.engine_ms),
        ..Faults::default()
    };
    let engine = TestEngine::start(TestEngineConfig {
        log_requests: false,
        ..TestEngineConfig::default()
            .with_replies([Reply::text("391")])
            .with_faults(faults)
    })
    .await
    .expect("engine");
    let upstream_base = match o.upstream {
        Upstream::Engine => engine.base_url(),
        Upstream::Static => {
            let url = format!("{}/chat/completions", engine.base_url());
            let body = reqwest::Client::new()
                .post(url)
                .json(&forwarded_body())
                .send()
                .await
                .expect("record the answer")
                .bytes()
                .await
                .expect("its body");
            static_upstream(body)
        }
    };
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
            &agl_store::RegisterEngine::new("e1", &upstream_base, "served-model")
                .with_render(agl_store::Render::Engine),
        )
        .await
        .expect("register engine");
    Setup {
        upstream_base,
        gateway_base: format!("http://{addr}"),
        store,
        auth,
        _engine: engine,
        _dir: dir,
    }
}

impl Setup {
    fn direct_targets(&self, n: usize) -> Vec<Target> {
        let url = format!("{}/chat/completions", self.upstream_base);
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

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The medians over the reps of one connection count.
#[derive(Default)]
struct Figures {
    direct_rps: Vec<f64>,
    gw_rps: Vec<f64>,
    direct_p50: Vec<f64>,
    gw_p50: Vec<f64>,
    direct_p99: Vec<f64>,
    gw_p99: Vec<f64>,
    added_p50: Vec<f64>,
    cpu: Vec<f64>,
    added_cpu: Vec<f64>,
}

fn main() {
    let o = opts();
    let rt = agl_gateway::runtime::build().expect("runtime");
    let client_rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("client runtime");
    println!(
        "gateway vs direct: non-streamed chat completions, {} upstream{}, {} x {} s per point \
         (medians), {} cores",
        match o.upstream {
            Upstream::Static => "static",
            Upstream::Engine => "test-engine",
        },
        if o.upstream == Upstream::Engine {
            format!(" ({} ms)", o.engine_ms)
        } else {
            String::new()
        },
        o.reps,
        o.secs,
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    println!(
        "{:<10} {:>6} | {:>9} {:>9} {:>6} | {:>8} {:>8} | {:>8} {:>8} | {:>9} | {:>8} {:>8}",
        "durability",
        "conns",
        "direct/s",
        "gw/s",
        "share",
        "dir p50",
        "dir p99",
        "gw p50",
        "gw p99",
        "added p50",
        "cpu/call",
        "+gw cpu"
    );
    let mut verdicts = Vec::new();
    for &durability in &o.durability {
        let s = rt.block_on(setup(&o, durability));
        for &n in &o.conns {
            let mut f = Figures::default();
            for rep in 0..o.reps {
                let direct = drive(&client_rt, s.direct_targets(n), o.secs);
                let targets = rt.block_on(s.gateway_targets(&format!("c{n}r{rep}"), n));
                // The gateway serves on `rt`'s workers while the client
                // drives from its own thread.
                let gw = drive(&client_rt, targets, o.secs);
                f.direct_rps.push(direct.throughput());
                f.gw_rps.push(gw.throughput());
                f.direct_p50.push(direct.pct(0.5));
                f.gw_p50.push(gw.pct(0.5));
                f.direct_p99.push(direct.pct(0.99));
                f.gw_p99.push(gw.pct(0.99));
                f.added_p50.push(gw.pct(0.5) - direct.pct(0.5));
                f.cpu.push(direct.cpu_per_call());
                f.added_cpu.push(gw.cpu_per_call() - direct.cpu_per_call());
            }
            let (direct_rps, gw_rps) = (median(f.direct_rps), median(f.gw_rps));
            let share = gw_rps / direct_rps;
            let added = median(f.added_p50);
            println!(
                "{:<10} {:>6} | {:>9.0} {:>9.0} {:>5.0}% | {:>6.3}ms {:>6.3}ms | {:>6.3}ms {:>6.3}ms | {:>7.3}ms | {:>6.0}us {:>6.0}us",
                format!("{durability:?}").to_lowercase(),
                n,
                direct_rps,
                gw_rps,
                100.0 * share,
                median(f.direct_p50),
                median(f.direct_p99),
                median(f.gw_p50),
                median(f.gw_p99),
                added,
                median(f.cpu),
                median(f.added_cpu),
            );
            let name = format!("{durability:?}").to_lowercase();
            if n == 1 {
                verdicts.push(format!(
                    "{name}, 1 connection: added p50 {added:.3} ms (limit <= {ADDED_P50_LIMIT_MS} ms): {}",
                    if added <= ADDED_P50_LIMIT_MS { "met" } else { "NOT met" }
                ));
            }
            if n == 64 {
                verdicts.push(format!(
                    "{name}, 64 connections: {:.0}% of direct throughput (limit >= {:.0}%): {}",
                    100.0 * share,
                    100.0 * THROUGHPUT_SHARE_LIMIT,
                    if share >= THROUGHPUT_SHARE_LIMIT {
                        "met"
                    } else {
                        "NOT met"
                    }
                ));
            }
        }
    }
    for v in verdicts {
        println!("{v}");
    }
}
