//! Data parallel over libtorch's c10d Gloo: two ranks (threads of this
//! process, each its own c10d group member over TCP on loopback) update a
//! tiny model exactly as one process does on the whole batch, full
//! fine-tuning and LoRA, with and without ZeRO-1 optimizer sharding.

use std::time::Duration;

use agl_model::{LoraConfig, Model};
use agl_rl::data_parallel::{gather_optimizer_state, rank_share};
use agl_rl::dist::{Backend, GroupConfig, ProcessGroup};
use agl_rl::{
    AdamWConfig, LrDecay, LrSchedule, OneRank, RlOptimizer, StepStats, UpdateBatch, train_step,
    weights_hash,
};
use serde_json::json;
use tch::{Device, Kind, Tensor};

use crate::common::tiny_config;
use crate::rl_step::{cfg, prepared, test_model};

const STEPS: usize = 2;

/// 5x the main job's learning rate. Ranks sum their gradients in another
/// order than one process's micro-batch accumulation (float addition does
/// not associate), and AdamW's normalisation turns a last-bit difference in
/// a near-zero gradient into up to `lr` of weight: the gap scales with `lr`
/// (6.7e-6 at 1e-2, measured), so the bound of 1e-6 holds at RL's rates.
fn schedule() -> LrSchedule {
    LrSchedule {
        peak_lr: 1e-4,
        warmup_steps: 0,
        decay: LrDecay::Constant,
    }
}

fn adamw() -> AdamWConfig {
    AdamWConfig {
        weight_decay: 0.01,
        ..AdamWConfig::default()
    }
}

/// The test model, with a LoRA adapter when `lora`.
fn model(lora: bool) -> Model {
    let mut m = test_model(11);
    if lora {
        m.add_lora(&LoraConfig::default()).unwrap();
    }
    m
}

/// Every weight of `m`, base and adapter, as copies.
#[derive(Debug)]
struct Weights {
    base: Vec<(String, Tensor)>,
    trainable: Vec<(String, Tensor)>,
}

fn weights(m: &Model) -> Weights {
    let copy = |v: Vec<(String, Tensor)>| -> Vec<(String, Tensor)> {
        let mut v: Vec<_> = v.into_iter().map(|(n, t)| (n, t.detach().copy())).collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    };
    Weights {
        base: copy(m.var_store().variables().into_iter().collect()),
        trainable: copy(m.trainable_parameters()),
    }
}

/// A model holding exactly `w` (tch's random generator is shared with the
/// tests running beside this one, so no rank draws its own).
fn model_from(lora: bool, w: &Weights) -> Model {
    let mut m = Model::new(tiny_config(json!({})), Kind::Float, Device::Cpu).unwrap();
    m.load_weights_in_place(&w.base).unwrap();
    if lora {
        m.add_lora(&LoraConfig::default()).unwrap();
    }
    tch::no_grad(|| {
        for ((name, mut p), (n, v)) in m.trainable_parameters().into_iter().zip(&w.trainable) {
            assert_eq!(&name, n);
            p.copy_(v);
        }
    });
    m
}

fn snapshot(m: &Model) -> Vec<(String, Tensor)> {
    weights(m).trainable
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Rank `rank` of two Gloo ranks on this machine, `secs` to meet and to
/// wait on a collective.
fn config(rank: usize, port: u16, secs: u64, rendezvous_secs: u64) -> GroupConfig {
    GroupConfig {
        master_addr: "127.0.0.1".into(),
        master_port: port,
        rank,
        world_size: 2,
        backend: Backend::Gloo,
        local_rank: 0,
        timeout: Duration::from_secs(secs),
        rendezvous_timeout: Duration::from_secs(rendezvous_secs),
    }
}

fn group(rank: usize, port: u16) -> ProcessGroup {
    ProcessGroup::join(&config(rank, port, 60, 60)).unwrap()
}

struct RankResult {
    weights: Vec<(String, Tensor)>,
    stats: Vec<StepStats>,
    hash: u64,
    /// The whole optimizer state as a checkpoint would save it.
    state: Vec<(String, Tensor)>,
}

fn run_rank(
    rank: usize,
    port: u16,
    lora: bool,
    zero: bool,
    initial: Weights,
    batch: UpdateBatch,
) -> RankResult {
    let m = model_from(lora, &initial);
    let mut g = group(rank, port);
    let mut opt = if zero {
        RlOptimizer::new_sharded(&m, adamw(), schedule(), rank, 2).unwrap()
    } else {
        RlOptimizer::new(&m, adamw(), schedule()).unwrap()
    };
    let stats = (0..STEPS)
        .map(|_| train_step(&m, &mut opt, &batch, &cfg(), &mut g).unwrap())
        .collect();
    let state = gather_optimizer_state(&m, &opt, &mut g).unwrap();
    RankResult {
        weights: snapshot(&m),
        stats,
        hash: weights_hash(&m),
        state,
    }
}

fn max_diff(a: &[(String, Tensor)], b: &[(String, Tensor)]) -> f64 {
    assert_eq!(a.len(), b.len());
    let mut d: f64 = 0.0;
    for ((na, ta), (nb, tb)) in a.iter().zip(b) {
        assert_eq!(na, nb);
        let ta = ta.to_kind(tch::Kind::Double);
        let tb = tb.to_kind(tch::Kind::Double);
        d = d.max(f64::try_from((ta - tb).abs().max()).unwrap());
    }
    d
}

fn same_update_as_one_process(lora: bool, zero: bool) {
    // One process, the whole batch.
    let reference = model(lora);
    let initial = weights(&reference);
    let batch = prepared(&reference);
    let mut opt = RlOptimizer::new(&reference, adamw(), schedule()).unwrap();
    let one: Vec<StepStats> = (0..STEPS)
        .map(|_| train_step(&reference, &mut opt, &batch, &cfg(), &mut OneRank).unwrap())
        .collect();
    let expected = snapshot(&reference);
    let moved = max_diff(&expected, &initial.trainable);
    assert!(moved > 5e-5, "the update must move the weights: {moved}");
    // The batch splits: both ranks get micro-batches.
    let packing = agl_rl::pack_ffd(&agl_rl::step::lengths(&batch), cfg().token_budget);
    assert!(!rank_share(&packing, 0, 2).micro_batches.is_empty());
    assert!(!rank_share(&packing, 1, 2).micro_batches.is_empty());

    let port = free_port();
    let ranks: Vec<RankResult> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..2)
            .map(|rank| {
                let copy = |v: &[(String, Tensor)]| -> Vec<(String, Tensor)> {
                    v.iter().map(|(n, t)| (n.clone(), t.copy())).collect()
                };
                let initial = Weights {
                    base: copy(&initial.base),
                    trainable: copy(&initial.trainable),
                };
                let batch = batch.clone();
                s.spawn(move || run_rank(rank, port, lora, zero, initial, batch))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (rank, r) in ranks.iter().enumerate() {
        for (a, b) in one.iter().zip(&r.stats) {
            assert!(
                (a.loss - b.loss).abs() < 1e-6,
                "loss {} vs {}",
                a.loss,
                b.loss
            );
            assert!((a.grad_norm - b.grad_norm).abs() < 1e-5 * a.grad_norm.max(1.0));
            assert_eq!(a.trainable_tokens, b.trainable_tokens);
            assert!((a.mismatch_max - b.mismatch_max).abs() < 1e-6);
        }
        let d = max_diff(&expected, &r.weights);
        assert!(
            d < 1e-6,
            "rank {rank} (lora {lora}, zero {zero}): max |w - w_1| = {d}"
        );
        let d = max_diff(
            &opt.state_tensors(),
            &sorted_like(&opt.state_tensors(), &r.state),
        );
        assert!(d < 1e-6, "rank {rank}: optimizer state differs by {d}");
    }
    assert_eq!(ranks[0].hash, ranks[1].hash, "the ranks' weights differ");
}

/// `b`'s tensors in the order of `a`'s names.
fn sorted_like(a: &[(String, Tensor)], b: &[(String, Tensor)]) -> Vec<(String, Tensor)> {
    a.iter()
        .map(|(n, _)| {
            let (_, t) = b
                .iter()
                .find(|(m, _)| m == n)
                .unwrap_or_else(|| panic!("no {n}"));
            (n.clone(), t.shallow_clone())
        })
        .collect()
}

#[test]
fn two_gloo_ranks_update_like_one_process_full() {
    same_update_as_one_process(false, false);
}

#[test]
fn two_gloo_ranks_update_like_one_process_full_zero1() {
    same_update_as_one_process(false, true);
}

#[test]
fn two_gloo_ranks_update_like_one_process_lora() {
    same_update_as_one_process(true, false);
}

#[test]
fn two_gloo_ranks_update_like_one_process_lora_zero1() {
    same_update_as_one_process(true, true);
}

#[test]
fn a_rank_that_never_arrives_is_a_clear_error() {
    let port = free_port();
    let err = ProcessGroup::join(&config(0, port, 60, 2))
        .err()
        .expect("rank 1 never joins");
    let msg = err.to_string();
    assert!(msg.starts_with("c10d:"), "{msg}");
}

#[test]
fn a_rank_that_dies_fails_the_next_collective_on_the_others() {
    let port = free_port();
    let (joined_tx, joined_rx) = std::sync::mpsc::channel();
    let dying = std::thread::spawn(move || {
        let g = group(1, port);
        joined_tx.send(()).unwrap();
        drop(g); // closes its connections, as a killed process's are
    });
    let mut g = ProcessGroup::join(&config(0, port, 10, 10)).unwrap();
    joined_rx.recv().unwrap();
    dying.join().unwrap();
    let mut t = Tensor::ones([4], (Kind::Float, Device::Cpu));
    let err = g
        .all_reduce(&mut t, agl_rl::dist::ReduceOp::Sum)
        .expect_err("the peer is gone");
    assert!(err.to_string().starts_with("c10d:"), "{err}");
}
