//! Data-parallel step time over libtorch's c10d Gloo: world size 1 vs 2 on
//! the same batch and weights (SmolLM2-135M in f32 when fetched, else a
//! random model of its shape), in one run. The two ranks are threads of
//! this process, each its own group member over TCP on loopback, sharing
//! this machine's cores: on a 2-core machine the point is correctness and
//! the collectives' overhead, not speed (each rank gets half the cores).
//!
//! `cargo bench -p agl-rl --bench data_parallel [-- --samples N --len T]`

mod common;

use std::time::{Duration, Instant};

use agl_model::Model;
use agl_rl::dist::{Backend, GroupConfig, ProcessGroup};
use agl_rl::{
    AdamWConfig, LrDecay, LrSchedule, OneRank, RlOptimizer, StepConfig, train_step, weights_hash,
};
use common::{random_batch, smollm2, smollm2_shape};
use tch::{Device, Kind, Tensor};

const STEPS: usize = 3;

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The same weights every time: loaded, or drawn once and copied.
fn model(weights: &[(String, Tensor)]) -> Model {
    let m = Model::new(smollm2_shape(), Kind::Float, Device::Cpu).expect("model");
    m.load_weights_in_place(weights).expect("weights");
    m
}

fn schedule() -> LrSchedule {
    LrSchedule {
        peak_lr: 1e-5,
        warmup_steps: 0,
        decay: LrDecay::Constant,
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> anyhow::Result<()> {
    let (samples, len) = (arg("--samples", 8), arg("--len", 256));
    let weights: Vec<(String, Tensor)> = match smollm2() {
        Some(dir) => {
            let m = Model::load(&dir, Kind::Float, Device::Cpu)?;
            m.var_store().variables().into_iter().collect()
        }
        None => {
            tch::manual_seed(0);
            let m = Model::new(smollm2_shape(), Kind::Float, Device::Cpu)?;
            m.var_store().variables().into_iter().collect()
        }
    };
    let b = random_batch(samples, len, 49152, true);
    let cfg = StepConfig {
        // A micro-batch of two rows: several per rank.
        token_budget: 2 * len,
        entropy: false,
        ..StepConfig::default()
    };

    let one = model(&weights);
    let mut opt = RlOptimizer::new(&one, AdamWConfig::default(), schedule())?;
    let times: Vec<f64> = (0..STEPS)
        .map(|_| {
            let t = Instant::now();
            train_step(&one, &mut opt, &b, &cfg, &mut OneRank).expect("step");
            t.elapsed().as_secs_f64()
        })
        .collect();
    let single = median(times);
    let hash_one = weights_hash(&one);

    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let ranks: Vec<(f64, u64)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..2)
            .map(|rank| {
                let weights: Vec<(String, Tensor)> =
                    weights.iter().map(|(n, t)| (n.clone(), t.copy())).collect();
                let b = &b;
                s.spawn(move || {
                    let m = model(&weights);
                    let mut g = ProcessGroup::join(&GroupConfig {
                        master_addr: "127.0.0.1".into(),
                        master_port: port,
                        rank,
                        world_size: 2,
                        backend: Backend::Gloo,
                        local_rank: 0,
                        timeout: Duration::from_secs(600),
                        rendezvous_timeout: Duration::from_secs(60),
                    })
                    .expect("join");
                    let mut opt = RlOptimizer::new(&m, AdamWConfig::default(), schedule())
                        .expect("optimizer");
                    let times = (0..STEPS)
                        .map(|_| {
                            let t = Instant::now();
                            train_step(&m, &mut opt, b, &cfg, &mut g).expect("step");
                            t.elapsed().as_secs_f64()
                        })
                        .collect();
                    (median(times), weights_hash(&m))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank"))
            .collect()
    });
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "data-parallel step, SmolLM2-135M shape in f32 on CPU ({cores} cores), {samples} samples \
         of up to {len} tokens, {} micro-batches of <= {} slots; median of {STEPS} steps",
        agl_rl::pack_ffd(&agl_rl::step::lengths(&b), cfg.token_budget)
            .micro_batches
            .len(),
        cfg.token_budget
    );
    println!("| world size | step s | vs 1 rank | weights hash |");
    println!("|------------|--------|-----------|--------------|");
    println!("| 1 | {single:.2} | 1.00x | {hash_one:016x} |");
    let two = ranks.iter().map(|r| r.0).fold(0.0, f64::max);
    println!(
        "| 2 (Gloo, threads) | {two:.2} | {:.2}x | {:016x} / {:016x} |",
        single / two,
        ranks[0].1,
        ranks[1].1
    );
    println!(
        "ranks agree: {}; differ from 1 rank only by float summation order: {}",
        ranks[0].1 == ranks[1].1,
        ranks[0].1 != hash_one
    );
    Ok(())
}
